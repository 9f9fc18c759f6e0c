"""Text for few-shot classification: per-dataset Base templates and CuPL prompt files.

Base templates are CoOp's/TaskRes's hand-written ones (docs/design.md, section "Few-shot
protocol"). For ImageNet, TaskRes averages the class embedding over "a photo of a {}." and the
7 templates Tip-Adapter selected from CLIP's ImageNet ensemble, 8 in all;
`base_templates("imagenet")` returns those 8. Class names are written with underscores as
spaces (CoOp's `name.replace("_", " ")`).

CuPL prompts (Pratt et al., ICCV 2023) are GPT-written class descriptions, a JSON file
{class name: [sentences]} per dataset from https://github.com/sarahpratt/CuPL
(all_prompts/base_prompts/). The files carry no licence, so this project never ships them:
`download_cupl` fetches one for the user where the network allows, and `load_cupl_prompts` says
what to download and where to put it when a file is missing.
"""

from __future__ import annotations

import os
import re
from types import MappingProxyType
from typing import Mapping, Sequence

from stori_jax.data import synthetic_tasks
from stori_jax.data.download import fetch_json
from stori_jax.data.files import check_no_problems, nearest, normalise_name, read_json
from stori_jax.plumbing import paths
from stori_jax.plumbing.errors import InputError
from stori_jax.fewshot.datasets import DatasetMissingError, canonical_name

#: Tip-Adapter's selection from CLIP's 80 ImageNet templates (CoOp's IMAGENET_TEMPLATES_SELECT).
IMAGENET_ENSEMBLE_TEMPLATES = (
  "itap of a {}.",
  "a bad photo of the {}.",
  "a origami {}.",
  "a photo of the large {}.",
  "a {} in a video game.",
  "art of the {}.",
  "a photo of the small {}.",
)

BASE_TEMPLATES: Mapping[str, tuple[str, ...]] = MappingProxyType(
  {
    "imagenet": ("a photo of a {}.",) + IMAGENET_ENSEMBLE_TEMPLATES,
    "dtd": ("{} texture.",),
    "sun397": ("a photo of a {}.",),
    "flowers102": ("a photo of a {}, a type of flower.",),
    "caltech101": ("a photo of a {}.",),
    "food101": ("a photo of {}, a type of food.",),
    "synthetic": ("a photo of a {}.",),  # the embedded world's classes are plain noun phrases
  }
)

CUPL_REPOSITORY = "https://github.com/sarahpratt/CuPL"
_CUPL_RAW = "https://raw.githubusercontent.com/sarahpratt/CuPL/main/all_prompts/base_prompts/"

#: The CuPL "base" prompt file of each dataset (30 sentences per class).
CUPL_FILES: Mapping[str, str] = MappingProxyType(
  {
    "imagenet": "imagenet_prompts_base.json",
    "dtd": "texture_prompts_base.json",
    "sun397": "sun_prompts_base.json",
    "flowers102": "flower_prompts_base.json",
    "caltech101": "cal_prompts_base.json",
    "food101": "food_prompts_base.json",
  }
)

#: CoOp class names that CuPL (which follows CLIP's class lists) spells differently, and that no
#: normalisation rule maps: CoOp's Caltech101 folder names -> CLIP's Caltech101 names. CoOp's
#: "face" is Caltech's uncropped "Faces" folder, which CLIP calls "off-center face".
CUPL_ALIASES: Mapping[str, Mapping[str, str]] = MappingProxyType(
  {
    "caltech101": MappingProxyType(
      {
        "face": "off-center face",
        "car_side": "side of a car",
        "cougar_body": "body of a cougar cat",
        "cougar_face": "face of a cougar cat",
        "crocodile_head": "head of a crocodile",
        "flamingo_head": "head of a flamingo",
        "snoopy": "snoopy (cartoon beagle)",
        "yin_yang": "yin and yang symbol",
      }
    ),
  }
)


def class_text(class_name: str) -> str:
  """A class name as prompts write it: underscores as spaces (CoOp), whitespace collapsed."""
  return " ".join(class_name.replace("_", " ").split())


def base_templates(dataset: str) -> tuple[str, ...]:
  """The dataset's Base templates ('{}' stands for the class name)."""
  return BASE_TEMPLATES[canonical_name(dataset)]


def base_prompts(dataset: str, class_names: Sequence[str]) -> tuple[tuple[str, ...], ...]:
  """Per class, its Base prompts: [C][T] strings, T = len(base_templates(dataset))."""
  templates = base_templates(dataset)
  return tuple(tuple(t.format(class_text(name)) for t in templates) for name in class_names)


def synthetic_prompts(class_names: Sequence[str] | None = None) -> dict[str, tuple[str, ...]]:
  """The synthetic world's CuPL-like prompts, {class name: sentences}, like a CuPL file.

  class_names: the task's classes (`synthetic_tasks.class_from_name`); None: FEWSHOT_CLASSES.
  """
  return {
    spec.name: synthetic_tasks.class_prompts(spec)
    for spec in synthetic_tasks.resolve_classes(class_names)
  }


# ---------------------------------------------------------------------------------------------
# CuPL files.


def cupl_url(dataset: str) -> str:
  """The raw GitHub URL of the dataset's CuPL base prompt file."""
  return _CUPL_RAW + CUPL_FILES[canonical_name(dataset)]


def _dataset_of_file(path: str) -> str | None:
  base = os.path.basename(path)
  return next((d for d, f in CUPL_FILES.items() if f == base), None)


def _missing_cupl_message(dataset: str | None, path: str) -> str:
  path = paths.absolute(path)
  if dataset is None:
    files = ", ".join(f"{f} ({d})" for d, f in CUPL_FILES.items())
    return (
      f"Download the dataset's CuPL prompt file from {CUPL_REPOSITORY} (folder "
      f"all_prompts/base_prompts/: {files}) and put it at {path}."
    )
  return (
    f"Download {CUPL_FILES[dataset]} from {cupl_url(dataset)} (repository "
    f"{CUPL_REPOSITORY}, folder all_prompts/base_prompts/) and put it at {path}, or run "
    f"stori_jax.fewshot.prompts.download_cupl({dataset!r}, {paths.parent(path)!r}) "
    "where the network allows. The file has no licence, so it is not shipped here."
  )


def _validated(prompts, where: str) -> dict[str, list[str]]:
  if not isinstance(prompts, dict) or not all(
    isinstance(k, str) and isinstance(v, list) and all(isinstance(s, str) for s in v)
    for k, v in prompts.items()
  ):
    raise InputError(
      f"{where} is not a CuPL prompt file: expected a JSON object {{class name: [sentence, ...]}}."
    )
  return prompts


def _normalised(name: str) -> str:
  return normalise_name(name)


_PARENTHESISED = re.compile(r"^(.*\S)\s*\(([^()]+)\)$")


def _reordered(key: str) -> str | None:
  """'apartment building (outdoor)' -> 'outdoor apartment building': CoOp's SUN397 spelling of
  CLIP's (and CuPL's) 'name (qualifier)' class names."""
  match = _PARENTHESISED.match(key.strip())
  return _normalised(f"{match.group(2)} {match.group(1)}") if match else None


def load_cupl_prompts(
  path: str | os.PathLike,
  class_names: Sequence[str],
  *,
  dataset: str | None = None,
  aliases: Mapping[str, str] | None = None,
) -> tuple[tuple[str, ...], ...]:
  """CuPL sentences of each class, in `class_names` order: [C][n_c] strings.

  A class is matched to a file key by, in order: `aliases` (class name -> key, exactly); the
  key equal to the name; the dataset's built-in `CUPL_ALIASES`; the key equal up to case,
  underscores and whitespace ('apple_pie' ~ 'apple pie'); a key 'name (qualifier)' for the class
  'qualifier name' (CoOp's SUN397 names). Classes that share a name share the sentences
  (CLIP's ImageNet list repeats two names).

  Args:
    path: the CuPL JSON file.
    class_names: one name per label.
    dataset: canonical or CoOp/TFDS dataset name, for the built-in aliases and for the message
      when the file is missing (guessed from the file name when None).
    aliases: extra class name -> key matches, tried first.

  Raises:
    DatasetMissingError: the file does not exist (says what to download and where to put it).
    InputError: the file is not UTF-8 JSON {str: [str]} (line and column named), or some
      classes have no, empty or ambiguous prompts (ClassMismatchError: names each class and the
      file).
  """
  path = os.fspath(path)
  dataset = canonical_name(dataset) if dataset else _dataset_of_file(path)
  if not paths.isfile(path):
    raise DatasetMissingError(
      f"CuPL prompt file {paths.absolute(path)} does not exist. "
      + _missing_cupl_message(dataset, path)
    )
  prompts = _validated(read_json(path, "CuPL prompt file"), path)

  by_normalised: dict[str, list[str]] = {}
  by_reordered: dict[str, list[str]] = {}
  for key in prompts:
    by_normalised.setdefault(_normalised(key), []).append(key)
    reordered = _reordered(key)
    if reordered is not None:
      by_reordered.setdefault(reordered, []).append(key)
  builtin = CUPL_ALIASES.get(dataset, {}) if dataset else {}
  aliases = aliases or {}

  matched, unmatched, ambiguous, empty = [], [], [], []
  for name in class_names:
    if name in aliases:
      key = aliases[name]
      candidates = [key] if key in prompts else []
    elif name in prompts:
      candidates = [name]
    elif name in builtin and builtin[name] in prompts:
      candidates = [builtin[name]]
    else:
      candidates = by_normalised.get(_normalised(name)) or by_reordered.get(_normalised(name)) or []
    if len(candidates) == 1 and prompts[candidates[0]]:
      matched.append(tuple(prompts[candidates[0]]))
    elif len(candidates) == 1:
      empty.append(f"{name!r} (key {candidates[0]!r})")
    elif len(candidates) > 1:
      ambiguous.append(f"{name!r} ({' / '.join(map(repr, candidates))})")
    else:
      near = nearest(name, prompts)
      unmatched.append(repr(name) + (f" (nearest key: {near!r})" if near else ""))
  problems = []
  if unmatched:
    problems.append(
      f"no prompts for {len(unmatched)} of {len(class_names)} classes: " + ", ".join(unmatched)
    )
  if empty:
    problems.append("an empty prompt list for " + ", ".join(empty))
  if ambiguous:
    problems.append("several keys for " + ", ".join(ambiguous))
  check_no_problems(
    problems,
    f"CuPL file {path}",
    "Classes are matched by name (case, '_', '-' and spaces ignored); pass "
    "aliases={class name: key in the file} for these, or fix the file's keys.",
  )
  return tuple(matched)


def download_cupl(
  dataset: str, directory: str | os.PathLike, *, url: str | None = None, timeout: float = 30.0
) -> str:
  """Downloads the dataset's CuPL base prompt file into `directory` (if absent); returns its path.

  Args:
    dataset: canonical or CoOp/TFDS dataset name (see `CUPL_FILES`).
    directory: where the file goes (created if needed); an existing file is kept as is.
    url: source URL (default `cupl_url(dataset)`).
    timeout: seconds before the connection attempt gives up.

  Raises:
    DatasetMissingError: the download failed (no network, HTTP error, not a CuPL file); the
      message says what to download by hand and where to put it.
  """
  dataset = canonical_name(dataset)
  path = os.path.join(os.fspath(directory), CUPL_FILES[dataset])
  url = url or cupl_url(dataset)
  return fetch_json(
    url,
    path,
    validate=_validated,
    on_error=lambda error: DatasetMissingError(
      f"Could not download CuPL prompts from {url} ({error}). "
      + _missing_cupl_message(dataset, path)
    ),
    timeout=timeout,
  )
