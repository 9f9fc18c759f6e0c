"""Retrieval attributes chosen by zero-shot AUROC (SToRI App. A.2), recomputed from data.

"CelebA. We initially select 11 attributes with a zero-shot classification performance of
AUROC 0.75 or higher with CLIP on test set. For zero-shot classification, we create text prompt
for each attribute and calculate AUROC using the similarity between the test set images and the
text prompt [...] 'a photo of a smiling person'. Among the identified 11 attributes, we create
combinations of three and five attributes, each including either female or male. For the
combinations of three attributes, we filter out the combinations where all eight categories
contain fewer than 100 images." "CUB. Following the filtering process described by Koh et al.
(2020), we initially retain 112 attributes. We then select 15 attributes that achieve a
zero-shot classification performance with AUROC 0.75 or higher using CLIP."

The retrieval configs use the paper's published lists (Table 9's prompts, Table 10's
attributes: `paper_config`); `config.attributes.source = "auroc"` recomputes them here
(`recompute`) and reports which differ. Per candidate attribute, its zero-shot prompt's cosine
similarity to every pool image is the score of a binary classifier of the attribute's label,
whose AUROC is `sklearn.metrics.roc_auc_score` (`zero_shot_auroc`); attributes at or above the
threshold are kept, most discriminable first.

Where the paper is silent (docs/design.md, section 5):
* CelebA: the prompt of each of the 40 attributes (`CELEBA_PHRASES`: "a photo of a smiling
  person", "a photo of a person with bangs", "a photo of a person wearing hat"; "a photo of a
  woman" for not-Male); the 3-attribute filter read as "keep a combination only when each of its
  8 categories has at least 100 images" (of the pool the retrieval samples from); the 5-attribute
  rule of App. C.4 ("result in images for all 32 possible categories") as at least 1 image per
  category; prompts phrased by Table 9's grammar (`celeba_prompt`), which rebuilds every row of
  Table 9 and App. C.4's prompt exactly.
* CUB: the zero-shot prompt "a photo of a bird, which has {text}" (the retrieval template's
  form), the official test split as the pool (CelebA's is its test set), the selected attributes
  ordered by AUROC (Table 10's order is not explained) before App. A.2's colour rule forms the
  combinations.
* The embedded world (offline): candidates are the world's colours, patterns and shapes, scored
  on rendered single-object images with the world's prompt ensembles (every prompt names a colour
  and a shape, as its captions do); the retrieval triples then use only the values kept.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from typing import Any, Mapping, Sequence

import ml_collections
import numpy as np
from sklearn.metrics import roc_auc_score

from stori_jax.plumbing import paths
from stori_jax.plumbing.config_files import ConfigError
from stori_jax.data import synthetic
from stori_jax.data.attributes import celeba_split_rows, read_celeba_attributes
from stori_jax.data.cub import KOH_ATTRIBUTE_IDS, attribute_text, read_cub
from stori_jax.data.files import quoted
from stori_jax.data.images import resize_images
from stori_jax.data.synthetic_tasks import EMPHASIS_FAMILIES
from stori_jax.clip.encoding import encode_texts, l2_normalize
from stori_jax.plumbing.errors import InputError
from stori_jax.retrieval import datasets, index, paper_config
from stori_jax.retrieval.metrics import category_codes

#: App. A.2's threshold.
PAPER_THRESHOLD = 0.75
SOURCES = ("paper", "auroc")
SPLITS = ("test", "train", "valid", "all")
#: Seed stream of the embedded world's scored pool (disjoint from the retrieval triples').
SYNTHETIC_POOL_STREAM = 7005
#: The CUB zero-shot prompt (App. A.2 gives CelebA's form only).
CUB_PROMPT = "a photo of a bird, which has {}"

#: CelebA's 40 attributes as prompts say them: (kind, phrase). Kinds, in prompt order: an
#: adjective before the noun ("a smiling woman"), "with ..." and "wearing ..." after it; Table 9
#: writes "wearing hat" (no article), so do the others. The order within a kind is the order in
#: a prompt (Table 9: "with bangs", "with blond hair", "with gray hair"; "wearing hat and
#: eyeglasses").
CELEBA_PHRASES: Mapping[str, tuple[str, str]] = {
  "Attractive": ("adjective", "attractive"),
  "Bald": ("adjective", "bald"),
  "Blurry": ("adjective", "blurry"),
  "Chubby": ("adjective", "chubby"),
  "Smiling": ("adjective", "smiling"),
  "Young": ("adjective", "young"),
  "5_o_Clock_Shadow": ("with", "5 o'clock shadow"),
  "Arched_Eyebrows": ("with", "arched eyebrows"),
  "Bags_Under_Eyes": ("with", "bags under eyes"),
  "Bangs": ("with", "bangs"),
  "Big_Lips": ("with", "big lips"),
  "Big_Nose": ("with", "big nose"),
  "Black_Hair": ("with", "black hair"),
  "Blond_Hair": ("with", "blond hair"),
  "Brown_Hair": ("with", "brown hair"),
  "Bushy_Eyebrows": ("with", "bushy eyebrows"),
  "Double_Chin": ("with", "double chin"),
  "Goatee": ("with", "goatee"),
  "Gray_Hair": ("with", "gray hair"),
  "Heavy_Makeup": ("with", "heavy makeup"),
  "High_Cheekbones": ("with", "high cheekbones"),
  "Mouth_Slightly_Open": ("with", "mouth slightly open"),
  "Mustache": ("with", "mustache"),
  "Narrow_Eyes": ("with", "narrow eyes"),
  "No_Beard": ("with", "no beard"),
  "Oval_Face": ("with", "oval face"),
  "Pale_Skin": ("with", "pale skin"),
  "Pointy_Nose": ("with", "pointy nose"),
  "Receding_Hairline": ("with", "receding hairline"),
  "Rosy_Cheeks": ("with", "rosy cheeks"),
  "Sideburns": ("with", "sideburns"),
  "Straight_Hair": ("with", "straight hair"),
  "Wavy_Hair": ("with", "wavy hair"),
  "Wearing_Hat": ("wearing", "hat"),
  "Eyeglasses": ("wearing", "eyeglasses"),
  "Wearing_Earrings": ("wearing", "earrings"),
  "Wearing_Lipstick": ("wearing", "lipstick"),
  "Wearing_Necklace": ("wearing", "necklace"),
  "Wearing_Necktie": ("wearing", "necktie"),
}
#: The sexes as candidate attributes: the column ("not Male" is a woman) and its noun.
CELEBA_SEXES = {"not Male": "woman", "Male": "man"}


@dataclasses.dataclass(frozen=True)
class Candidate:
  """An attribute to score: the table column it labels and its zero-shot prompt(s) (several:
  an ensemble, the normalised mean of their normalised embeddings)."""

  name: str
  prompts: tuple[str, ...]


def _article(word: str) -> str:
  return "an" if word[:1].lower() in "aeiou" else "a"


# ---------------------------------------------------------------------------------------------
# Scores.


def zero_shot_auroc(
  image_embeddings: np.ndarray, text_embeddings: np.ndarray, labels: np.ndarray
) -> np.ndarray:
  """float64 [A]: per attribute a, roc_auc_score(labels[:, a], images @ text[a]); NaN where the
  pool has only one value of the label (no AUROC).

  Args:
    image_embeddings: float [N, E] unit rows; text_embeddings: float [A, E] unit rows;
    labels: bool [N, A].
  """
  scores = np.asarray(image_embeddings, np.float64) @ np.asarray(text_embeddings, np.float64).T
  labels = np.asarray(labels, bool)
  out = np.full(labels.shape[1], np.nan)
  for a in range(labels.shape[1]):
    if 0 < labels[:, a].sum() < len(labels):
      out[a] = roc_auc_score(labels[:, a], scores[:, a])
  return out


def candidate_embeddings(bundle, candidates: Sequence[Candidate], batch_size: int) -> np.ndarray:
  """float32 [A, E] unit rows: each candidate's prompt, or its ensemble's normalised mean."""
  texts = [p for c in candidates for p in c.prompts]
  embedded = encode_texts(bundle, texts, batch_size=batch_size, desc="zero-shot prompts")
  out, offset = [], 0
  for c in candidates:
    out.append(embedded[offset : offset + len(c.prompts)].mean(axis=0))
    offset += len(c.prompts)
  return l2_normalize(np.stack(out), axis=1)


def select(names: Sequence[str], aurocs: np.ndarray, threshold: float) -> list[str]:
  """The names whose AUROC is >= threshold, highest AUROC first (ties in `names` order)."""
  order = np.argsort(-np.nan_to_num(np.asarray(aurocs, np.float64), nan=-1.0), kind="stable")
  return [names[i] for i in order if np.isfinite(aurocs[i]) and aurocs[i] >= threshold]


# ---------------------------------------------------------------------------------------------
# CelebA.


def celeba_candidates() -> list[Candidate]:
  """The 40 attributes and the two sexes, one prompt each ("a photo of a smiling person")."""
  out = [Candidate(column, (f"a photo of a {noun}",)) for column, noun in CELEBA_SEXES.items()]
  for column, (kind, phrase) in CELEBA_PHRASES.items():
    if kind == "adjective":
      text = f"a photo of {_article(phrase)} {phrase} person"
    else:
      text = f"a photo of a person {kind} {phrase}"
    out.append(Candidate(column, (text,)))
  return out


def celeba_prompt(columns: Sequence[str]) -> tuple[str, tuple[tuple[str, str], ...]]:
  """A retrieval prompt of the sex and `columns`, as paper_config.CELEBA3_PROMPTS writes one:
  (template with {0}.., ((column or "SEX", phrase), ...)) in prompt order.

  Table 9's grammar: adjectives before the noun, "with X and Y" after it, then "wearing X and
  Y" (after a comma when a with-phrase precedes): "a photo of a smiling woman with bangs", "a
  photo of a woman with bangs, wearing hat", "a photo of a woman wearing hat and eyeglasses".
  """
  unknown = [c for c in columns if c not in CELEBA_PHRASES]
  if unknown:
    raise ValueError(f"no phrase for CelebA attributes {unknown}; known: {list(CELEBA_PHRASES)}")
  order = list(CELEBA_PHRASES)
  columns = sorted(columns, key=order.index)
  kinds = {k: [c for c in columns if CELEBA_PHRASES[c][0] == k] for k in ("adjective", "with")}
  kinds["wearing"] = [c for c in columns if CELEBA_PHRASES[c][0] == "wearing"]
  slots: list[tuple[str, str]] = [(c, CELEBA_PHRASES[c][1]) for c in kinds["adjective"]]
  slots.append(("SEX", ""))
  first = CELEBA_PHRASES[kinds["adjective"][0]][1] if kinds["adjective"] else "woman"
  text = f"a photo of {_article(first)} " + " ".join(f"{{{i}}}" for i in range(len(slots)))
  for kind in ("with", "wearing"):
    if not kinds[kind]:
      continue
    group = []
    for k, column in enumerate(kinds[kind]):
      phrase = CELEBA_PHRASES[column][1]
      slots.append((column, f"{kind} {phrase}" if k == 0 else phrase))
      group.append(f"{{{len(slots) - 1}}}")
    separator = ", " if kind == "wearing" and kinds["with"] else " "
    text += separator + " and ".join(group)
  return text, tuple(slots)


def celeba_combinations(
  table: Mapping[str, np.ndarray],
  selected: Sequence[str],
  size: int = 3,
  min_images: int = 100,
) -> tuple[list, list[dict[str, Any]]]:
  """App. A.2's combinations of `size` attributes, the sex and size - 1 others of `selected`
  (in CELEBA_PHRASES order), kept when each of their 2**size categories has at least
  `min_images` images of `table` (the pool the retrieval samples from).

  Returns:
    (prompts as paper_config.CELEBA3_PROMPTS writes them, the kept ones; per combination
    {"attributes", "smallest_category", "kept"}).
  """
  others = [c for c in CELEBA_PHRASES if c in selected]
  kept, notes = [], []
  male = np.asarray(table["Male"], bool)
  for combo in itertools.combinations(others, size - 1):
    labels = np.stack([male] + [np.asarray(table[c], bool) for c in combo], axis=1)
    smallest = int(np.bincount(category_codes(labels), minlength=2**size).min())
    ok = smallest >= min_images
    notes.append({"attributes": list(combo), "smallest_category": smallest, "kept": ok})
    if ok:
      kept.append(celeba_prompt(combo))
  return kept, notes


def celeba_prompt_dicts(prompts, sexes: Sequence[str]) -> list[dict]:
  """paper_config.celeba_prompt_dicts for the sexes selected ("not Male": the woman prompts)."""
  return [
    p
    for p in paper_config.celeba_prompt_dicts(prompts)
    if any(row[0] in sexes for row in p["attributes"] if row[0] in CELEBA_SEXES)
  ]


def _paper_celeba() -> list[str]:
  """The attributes the paper names (Table 9: the sex and six others; it selected 11)."""
  used = {name for _, rows in paper_config.CELEBA3_PROMPTS for name, _ in rows if name != "SEX"}
  return list(CELEBA_SEXES) + [c for c in CELEBA_PHRASES if c in used]


# ---------------------------------------------------------------------------------------------
# The embedded world.


def synthetic_candidates() -> list[Candidate]:
  """The world's colours, patterns and shapes ("colour::red"), each with an ensemble over the
  other slots of "a photo of a {colour} {shape}" ({colour} {pattern} {shape} for patterns):
  every caption the tiny CLIP learnt from names a colour and a shape."""
  colours, shapes = synthetic.COLOURS, synthetic.SHAPES
  out = []
  for family in EMPHASIS_FAMILIES:
    for value in synthetic.VOCABULARIES[family]:
      if family == "pattern":
        phrases = [f"{c} {value} {s}" for c in colours for s in shapes]
      elif family == "colour":
        phrases = [f"{value} {s}" for s in shapes]
      else:
        phrases = [f"{c} {value}" for c in colours]
      out.append(
        Candidate(f"{family}::{value}", tuple(f"a photo of {_article(p)} {p}" for p in phrases))
      )
  return out


def synthetic_pool(
  n_images: int, seed: Sequence[int], image_size: int
) -> tuple[datasets.RetrievalData, dict[str, np.ndarray]]:
  """Rendered single-object images (random attributes) and their labels {"colour::red": bool}."""
  batch = synthetic.generate(n_images, tuple(seed), image_size=image_size, max_objects=1)
  table = {
    f"{family}::{value}": batch.labels(family)[:, 0] == k
    for family in EMPHASIS_FAMILIES
    for k, value in enumerate(synthetic.VOCABULARIES[family])
  }
  images = batch.images
  spec = {"source": "synthetic-attributes", "n": int(n_images), "seed": list(seed)}
  keys = tuple(f"attributes/{i}" for i in range(n_images))

  def load(indices, size):
    return resize_images(images[np.asarray(indices).reshape(-1)], size)

  return datasets.RetrievalData("synthetic-attributes", spec, keys, load, ()), table


# ---------------------------------------------------------------------------------------------
# Recomputing a config's attributes.


def _subsample(rows: np.ndarray, max_images: int, seed: int) -> np.ndarray:
  if not max_images or len(rows) <= max_images:
    return rows
  return np.sort(np.random.default_rng(seed).choice(rows, max_images, replace=False))


def _differences(selected: Sequence[str], paper: Sequence[str] | None) -> dict[str, Any]:
  if paper is None:
    return {"paper": None}
  return {
    "paper": list(paper),
    "selected_not_in_paper": [n for n in selected if n not in paper],
    "in_paper_not_selected": [n for n in paper if n not in selected],
  }


@dataclasses.dataclass(frozen=True, eq=False)
class _Pool:
  """The images the candidates are scored on: their data (keys, loader), labels {name: bool
  [N]}, the candidates, and the paper's list (None: the paper has none for this data)."""

  data: datasets.RetrievalData
  table: Mapping[str, np.ndarray]
  candidates: Sequence[Candidate]
  paper: Sequence[str] | None


def _celeba_table(root: str) -> tuple[list[str], dict[str, np.ndarray]]:
  path = os.path.join(root, "list_attr_celeba.txt")
  if not paths.isfile(path):
    raise InputError(
      f"{path} does not exist; point data.root at the CelebA folder holding "
      "list_attr_celeba.txt, list_eval_partition.txt and img_align_celeba/"
    )
  files, table = read_celeba_attributes(path)
  table["not Male"] = ~table["Male"]
  return files, table


def _celeba_rows(root: str, files: Sequence[str], split: str, key: str) -> np.ndarray:
  try:
    return np.flatnonzero(celeba_split_rows(root, files, split))
  except ValueError as e:
    raise InputError(f"{key}: {e}") from None


def _celeba_pool(data, options) -> _Pool:
  files, table = _celeba_table(data.root)
  seed = int(data.seed)
  rows = _celeba_rows(data.root, files, options.split, "config.attributes.split")
  rows = _subsample(rows, int(options.max_images), seed)
  image_dir = os.path.join(data.root, "img_align_celeba")
  image_dir = image_dir if paths.isdir(image_dir) else data.root
  spec = {
    "source": "celeba-attributes",
    "root": paths.absolute(data.root),
    "split": options.split,
    "max_images": int(options.max_images),
    "seed": seed,
  }
  pool = datasets.RetrievalData(
    "celeba-attributes",
    spec,
    tuple(files[i] for i in rows),
    datasets.source_loader([os.path.join(image_dir, files[i]) for i in rows]),
    (),
  )
  candidates = celeba_candidates()
  return _Pool(pool, {c.name: table[c.name][rows] for c in candidates}, candidates, _paper_celeba())


def _cub_pool(data, options) -> _Pool:
  cub = read_cub(data.root)
  if options.split == "valid":
    raise ConfigError("config.attributes.split='valid': CUB has 'train' and 'test' (or 'all')")
  chosen = {"test": ~cub.is_training, "train": cub.is_training}.get(options.split)
  rows = np.arange(len(cub.files)) if chosen is None else np.flatnonzero(chosen)
  seed = int(data.seed)
  rows = _subsample(rows, int(options.max_images), seed)
  count = len(cub.attribute_names)
  names = [cub.attribute_names[i - 1] for i in KOH_ATTRIBUTE_IDS if i <= count]
  spec = {
    "source": "cub-attributes",
    "root": paths.absolute(data.root),
    "split": options.split,
    "max_images": int(options.max_images),
    "seed": seed,
  }
  pool = datasets.RetrievalData(
    "cub-attributes",
    spec,
    tuple(cub.files[i] for i in rows),
    datasets.source_loader(cub.image_paths(rows)),
    (),
  )
  return _Pool(
    pool,
    {n: cub.column(n)[rows] for n in names},
    [Candidate(n, (CUB_PROMPT.format(attribute_text(n)),)) for n in names],
    [n for n, _ in paper_config.CUB_ATTRIBUTES],
  )


def _prompt_text(prompt: Mapping[str, Any]) -> str:
  return prompt["template"].format(*(row[1] for row in prompt["attributes"]))


def recompute(bundle, config, cache_dir: str | None = None, batch_size: int = 256):
  """The data block of a retrieval config with its attributes chosen by zero-shot AUROC.

  config.attributes: threshold (App. A.2's 0.75); split, the pool's images (App. A.2's "test":
  CelebA's list_eval_partition.txt, CUB's official split); max_images (0: all of them; else a
  seeded sample); min_category_images (CelebA's combination filter); n_images (the embedded
  world's rendered pool).

  Returns:
    (data ConfigDict for `datasets.build_data` with the recomputed prompts (CelebA, CUB) or
    prompt values (the embedded world), the selection report {"source", "threshold", "split",
    "n_images", "auroc": {name: float or None}, "prompts": {name: its zero-shot prompt},
    "selected", "paper", "selected_not_in_paper", "in_paper_not_selected", and CelebA's
    "combinations", "prompts_used", "prompts_not_in_paper", "paper_prompts_not_used"}).

  Raises:
    ConfigError: the data source cannot be recomputed (celeba_tfds), or the attributes kept
      form no prompt.
    InputError / DatasetMissingError: the data is not there.
  """
  options, data = config.attributes, config.data
  threshold = float(options.threshold)
  if data.source == "synthetic":
    # Its own seed stream: the retrieval's triple t renders from (*data.seed, t).
    pool_data, table = synthetic_pool(
      int(options.n_images),
      (SYNTHETIC_POOL_STREAM, *data.seed),
      int(bundle.config.vision.image_size),
    )
    pool = _Pool(pool_data, table, synthetic_candidates(), None)
  elif data.source == "celeba":
    pool = _celeba_pool(data, options)
  elif data.source == "cub":
    pool = _cub_pool(data, options)
  else:
    raise ConfigError(
      "config.attributes.source='auroc' recomputes the attributes of data.source 'synthetic', "
      f"'celeba' (a folder) or 'cub', not {data.source!r}"
    )
  embeddings = index.build_index(bundle, pool.data, cache_dir, batch_size).embeddings
  names = [c.name for c in pool.candidates]
  labels = np.stack([pool.table[n] for n in names], axis=1)
  aurocs = zero_shot_auroc(
    embeddings, candidate_embeddings(bundle, pool.candidates, batch_size), labels
  )
  selected = select(names, aurocs, threshold)
  result: dict[str, Any] = {
    "source": data.source,
    "threshold": threshold,
    "split": "rendered" if data.source == "synthetic" else str(options.split),
    "n_images": len(pool.data.keys),
    "auroc": {n: float(v) if np.isfinite(v) else None for n, v in zip(names, aurocs)},
    "prompts": {
      c.name: c.prompts[0] + (f" (+{len(c.prompts) - 1} more)" if len(c.prompts) > 1 else "")
      for c in pool.candidates
    },
    "selected": selected,
    **_differences(selected, pool.paper),
  }
  new = ml_collections.ConfigDict(data.to_dict())
  if data.source == "synthetic":
    values = {
      f: [n.split("::")[1] for n in selected if n.startswith(f + "::")] for f in EMPHASIS_FAMILIES
    }
    values["pattern"] = [p for p in values["pattern"] if p != "plain"]  # never a prompt's
    empty = [f for f, v in values.items() if not v]
    if empty:
      raise ConfigError(
        f"no value of {empty} reaches zero-shot AUROC >= {threshold:g} on the embedded world, "
        "so no retrieval prompt can be formed; lower config.attributes.threshold"
      )
    new.prompt_values = values
    result["prompt_values"] = values
    return new, result
  if data.source == "celeba":
    files, table = _celeba_table(data.root)
    rows = _celeba_rows(data.root, files, data.split, "config.data.split")
    kept, notes = celeba_combinations(
      {n: v[rows] for n, v in table.items()},
      selected,
      len(data.prompts[0]["attributes"]) if data.prompts else 3,
      int(options.min_category_images),
    )
    new.prompts = celeba_prompt_dicts(kept, [s for s in CELEBA_SEXES if s in selected])
    used = [_prompt_text(p) for p in new.prompts]
    paper = [_prompt_text(p) for p in data.prompts]
    result.update(
      combinations=notes,
      prompts_used=used,
      prompts_not_in_paper=[p for p in used if p not in paper],
      paper_prompts_not_used=[p for p in paper if p not in used],
    )
  else:
    texts = [(n, attribute_text(n)) for n in selected]
    new.prompts = [
      {"template": p.template, "attributes": [list(a) for a in p.attributes]}
      for p in datasets.cub_prompts(texts, paper_config.CUB_TEMPLATE)
    ]
    result["prompts_used"] = [_prompt_text(p) for p in new.prompts]
  if not new.prompts:
    raise ConfigError(
      f"the {len(selected)} attributes with zero-shot AUROC >= {threshold:g} "
      f"({quoted(selected) or 'none'}) form "
      "no retrieval prompt; lower config.attributes.threshold"
      + (" or config.attributes.min_category_images" if data.source == "celeba" else "")
    )
  return new, result
