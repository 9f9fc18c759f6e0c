"""A model's text side of the mutual-knowledge analysis as files: the class-agnostic descriptor
bank D and the zero-shot text classifiers, written by `python -m mutual.export` and read back by
`load_text_bank`.

Two files in the output folder:
  text_bank.safetensors   float32 arrays, unit rows:
                            descriptor_embeddings         [D, E]  each descriptor, no template
                            class_embeddings_descriptors  [C, E]  Menon & Vondrick's classifier:
                                                                  mean of "{c}, which has {d}."
                            class_embeddings_templates    [C, E]  the template ensemble (Table 8)
  text_bank.json          what the rows are: the D descriptors and C class names in row order,
                          each class's descriptors, the model, the prompt settings
                          (descriptor_template, templates), which classifier the config's
                          analysis uses (config.analysis.class_prompts), dtype and shapes.

The arrays are exactly what `mutual.pipeline.encode_bank` computes for the config (a class
embedding is the re-normalised mean of its unit prompt embeddings). Classes and descriptors come
from the config's data: the embedded world's classes and bank for `source="synthetic"`; for a
real dataset the descriptor file's classes in the file's order (Menon & Vondrick's ImageNet file
is in ImageNet's label order) and its unique descriptors, first seen first, with no image read.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

import numpy as np
import safetensors.numpy
from safetensors.numpy import load_file, save_file

import stori_jax
from mutual import data, paper_config, pipeline
from stori_jax.plumbing import jsonio, paths, run_identity
from stori_jax.plumbing.config_files import ConfigError
from stori_jax.data.files import read_json
from stori_jax.plumbing.errors import InputError, UserError

ARRAYS_FILE = "text_bank.safetensors"
NAMES_FILE = "text_bank.json"
FILES = (ARRAYS_FILE, NAMES_FILE)
FORMAT = "stori-jax mutual-knowledge text bank"
FORMAT_VERSION = 1
#: The class-embedding modes of mutual.pipeline.class_prompts, each exported as one classifier.
CLASSIFIERS = ("descriptors", "templates")
DESCRIPTOR_ARRAY = "descriptor_embeddings"


def classifier_array(mode: str) -> str:
  """The safetensors key of a classifier: "class_embeddings_<mode>"."""
  return f"class_embeddings_{mode}"


@dataclasses.dataclass(frozen=True)
class ExportedTextBank:
  """A text bank read back from its files.

  Attributes:
    descriptors: the D descriptors (row order of descriptor_embeddings).
    descriptor_embeddings: float32 [D, E], unit rows.
    class_names: the C class names (row order of every classifier).
    class_descriptors: each class's descriptors, [C][n_c].
    classifiers: {"descriptors" / "templates": float32 [C, E], unit rows}.
    analysis_classifier: the mode the exporting config's analysis uses.
    names: the whole JSON record (model, prompt settings, dtype, shapes, data).
  """

  descriptors: tuple[str, ...]
  descriptor_embeddings: np.ndarray
  class_names: tuple[str, ...]
  class_descriptors: tuple[tuple[str, ...], ...]
  classifiers: Mapping[str, np.ndarray]
  analysis_classifier: str
  names: Mapping[str, Any]

  def text_bank(self, mode: str | None = None) -> pipeline.TextBank:
    """The pipeline's TextBank with one classifier (None: the analysis's), ready for
    `pipeline.analyze_class`."""
    mode = mode or self.analysis_classifier
    if mode not in self.classifiers:
      raise InputError(
        f"no classifier {mode!r} in this text bank; it has {sorted(self.classifiers)}."
      )
    return pipeline.TextBank(
      self.descriptors, self.descriptor_embeddings, self.class_names, self.classifiers[mode]
    )


def check_output(output: str, overwrite: bool) -> str:
  """The absolute output folder, refused before any work when it is a file, or already holds a
  text bank and `overwrite` is False."""
  if not output:
    raise UserError("no output folder given; pass --output=DIR (a new or empty folder).")
  path = paths.absolute(os.path.expanduser(output))
  paths.check_location(path)  # gs://: the bucket, the credentials and a write, before any work
  if paths.exists(path) and not paths.isdir(path):
    raise UserError(f"--output {path} is a file; pass a folder for the text bank's two files.")
  present = [name for name in FILES if paths.exists(os.path.join(path, name))]
  if present and not overwrite:
    raise UserError(
      f"{path} already holds a text bank ({', '.join(present)}); pass --overwrite to replace it, "
      "or choose another --output folder."
    )
  return path


def _check_prompts(analysis) -> None:
  """config.analysis's class-prompt settings, checked before the model loads."""
  mode = paper_config.analysis_value(analysis, "class_prompts")
  if mode not in CLASSIFIERS:
    raise ConfigError(f"config.analysis.class_prompts must be one of {CLASSIFIERS}, got {mode!r}.")
  templates = tuple(paper_config.analysis_value(analysis, "templates"))
  if not templates:
    raise ConfigError(
      "config.analysis.templates is empty; give at least one, e.g. 'a photo of a {c}.'."
    )
  for template in templates:
    try:
      template.format(c="x")
    except (KeyError, IndexError, ValueError) as error:
      raise ConfigError(
        f"config.analysis.templates holds {template!r}, which cannot be filled with a class "
        f"name ({type(error).__name__}: {error}); write the class as {{c}}."
      ) from None
  try:
    analysis.descriptor_template.format(c="x", d="y")
  except (KeyError, IndexError, ValueError) as error:
    raise ConfigError(
      f"config.analysis.descriptor_template {analysis.descriptor_template!r} cannot be filled "
      f"({type(error).__name__}: {error}); write the class as {{c}} and the descriptor as {{d}}."
    ) from None


def config_classes(config) -> tuple[list[str], list[list[str]], dict[str, Any]]:
  """(class names, descriptors per class, where they came from) of a config's data, without
  reading an image: the embedded world's classes, or the descriptor file's in its order.

  Raises:
    DatasetMissingError: the descriptor file is missing (the message names where to get it).
    InputError / ConfigError: a malformed file, or no descriptor file named.
  """
  d = config.data
  if d.source == "synthetic":
    dataset = data.prepare(config)  # the world's classes: nothing is drawn until iterated
    return list(dataset.names), dataset.lists(), {"source": "synthetic"}
  path = d.get("descriptors")
  if not path:
    raise ConfigError(
      "config.data.descriptors is empty: the text bank is built from a descriptor file; pass "
      "--config.data.descriptors=PATH (Menon & Vondrick's descriptors_<dataset>.json)."
    )
  per_class = data.load_descriptors(path, d.get("dataset"))
  where = {"source": d.source, "descriptors": paths.absolute(path)}
  where["descriptors_sha256"] = run_identity.file_digest(path)
  return list(per_class), [list(v) for v in per_class.values()], where


def export_text_bank(config, output: str, *, overwrite: bool = False, progress: bool = True):
  """Encodes the config's descriptor bank and both classifiers with config.model.source and
  writes them to `output` (module docstring). Everything a user can get wrong (the output
  folder, the prompt settings, the descriptor file) is checked before the model loads.

  Returns:
    (the output folder, the ExportedTextBank read back from it).
  """
  path = check_output(output, overwrite)
  _check_prompts(config.analysis)
  names, per_class, where = config_classes(config)
  bank = pipeline.bank_descriptors(config, dict(zip(names, per_class)))
  a = config.analysis
  bundle = stori_jax.load(config.model.source)
  encoded = {
    mode: pipeline.encode_bank(
      bundle,
      names,
      per_class,
      bank,
      mode=mode,
      templates=tuple(a.templates),
      descriptor_template=a.descriptor_template,
      batch_size=int(config.get("batch_size", 256)),
      progress=progress,
    )
    for mode in CLASSIFIERS
  }
  arrays = {DESCRIPTOR_ARRAY: np.ascontiguousarray(encoded["descriptors"].descriptor_embeddings)}
  for mode, text_bank in encoded.items():
    arrays[classifier_array(mode)] = np.ascontiguousarray(text_bank.class_embeddings)
  arrays = {k: v.astype(np.float32) for k, v in arrays.items()}
  record = dict(
    format=FORMAT,
    format_version=FORMAT_VERSION,
    model=dict(source=str(config.model.source), name=config.model.get("name", config.model.source)),
    data=where,
    arrays=ARRAYS_FILE,
    dtype="float32",
    shapes={k: list(v.shape) for k, v in arrays.items()},
    embeddings=(
      "unit rows; descriptors are encoded with no template; a class embedding is the "
      "re-normalised mean of its prompts' unit embeddings (mutual.pipeline.encode_bank)"
    ),
    descriptors=list(bank),
    class_names=list(names),
    class_descriptors=[list(d) for d in per_class],
    classifiers={
      "descriptors": dict(
        array=classifier_array("descriptors"), descriptor_template=a.descriptor_template
      ),
      "templates": dict(array=classifier_array("templates"), templates=list(a.templates)),
    },
    analysis_classifier=a.get("class_prompts", "descriptors"),
  )
  paths.makedirs(path, exist_ok=True)
  target = os.path.join(path, ARRAYS_FILE)
  # Written aside, then renamed (gs://: one upload): a kill mid-write leaves no half file under
  # the final name.
  if paths.is_remote(target):
    paths.write_bytes_atomic(
      target, safetensors.numpy.save(arrays, metadata={"format": FORMAT, "names": NAMES_FILE})
    )
  else:
    save_file(arrays, target + ".tmp", metadata={"format": FORMAT, "names": NAMES_FILE})
    os.replace(target + ".tmp", target)
  jsonio.write_json(os.path.join(path, NAMES_FILE), record, indent=1)
  return path, load_text_bank(path)


def _shape_problem(arrays: Mapping[str, np.ndarray], record: Mapping[str, Any]) -> str | None:
  d, c = len(record["descriptors"]), len(record["class_names"])
  wanted = {DESCRIPTOR_ARRAY: d} | {classifier_array(m): c for m in record["classifiers"]}
  width = {v.shape[-1] for v in arrays.values() if v.ndim == 2}
  for key, rows in wanted.items():
    if key not in arrays:
      return f"the array {key!r} is missing"
    if arrays[key].ndim != 2 or arrays[key].shape[0] != rows:
      return f"{key} has shape {list(arrays[key].shape)}, but the names give {rows} rows"
    if arrays[key].dtype != np.float32:
      return f"{key} is {arrays[key].dtype}, not float32"
    if list(arrays[key].shape) != list(record["shapes"].get(key, [])):
      return f"{key} has shape {list(arrays[key].shape)}, but {NAMES_FILE} records {record['shapes'].get(key)}"
  if len(width) != 1:
    return f"the arrays have different embedding widths {sorted(width)}"
  return None


def load_text_bank(directory: str | os.PathLike) -> ExportedTextBank:
  """Reads a folder `python -m mutual.export` wrote.

  Raises:
    InputError: a file is missing, unreadable, of another format, or the arrays do not match
      the names (the message says to export again).
  """
  directory = paths.absolute(os.fspath(directory))
  again = "Export it again with python -m mutual.export --config=... --output=DIR."
  missing = [n for n in FILES if not paths.isfile(os.path.join(directory, n))]
  if missing:
    raise InputError(f"{directory} holds no text bank: {', '.join(missing)} missing. {again}")
  record = read_json(os.path.join(directory, NAMES_FILE), "text bank names file")
  if not isinstance(record, dict) or record.get("format") != FORMAT:
    raise InputError(f"{os.path.join(directory, NAMES_FILE)} is not a {FORMAT} file. {again}")
  if record.get("format_version") != FORMAT_VERSION:
    raise InputError(
      f"{directory}: text bank format version {record.get('format_version')!r}; this version "
      f"reads {FORMAT_VERSION}. {again}"
    )
  try:
    source = os.path.join(directory, ARRAYS_FILE)
    arrays = (
      safetensors.numpy.load(paths.read_bytes(source))
      if paths.is_remote(source)
      else load_file(source)
    )
  except Exception as e:  # safetensors raises its own error types (SafetensorError, ...)
    raise InputError(
      f"{os.path.join(directory, ARRAYS_FILE)} is not a readable safetensors file "
      f"({type(e).__name__}: {e}). {again}"
    ) from None
  problem = _shape_problem(arrays, record)
  if problem:
    raise InputError(f"{directory}: {problem}. {again}")
  return ExportedTextBank(
    descriptors=tuple(record["descriptors"]),
    descriptor_embeddings=arrays[DESCRIPTOR_ARRAY],
    class_names=tuple(record["class_names"]),
    class_descriptors=tuple(tuple(d) for d in record["class_descriptors"]),
    classifiers={m: arrays[classifier_array(m)] for m in record["classifiers"]},
    analysis_classifier=record["analysis_classifier"],
    names=record,
  )
