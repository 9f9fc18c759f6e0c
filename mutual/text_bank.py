"""A model's text side of the mutual-knowledge analysis as files: the class-agnostic descriptor
bank D and the zero-shot text classifiers, written by `python -m mutual.export` and read back by
`load_text_bank`.

Two files in the output folder:
  text_bank.safetensors   float32 arrays, unit rows:
                            descriptor_embeddings         [D, E]  each descriptor in the bank
                                                                  template (App. L: "a photo
                                                                  showing {d}")
                            class_embeddings_descriptors  [C, E]  Menon & Vondrick's classifier:
                                                                  mean of "{c}, which has {d}."
                            class_embeddings_templates    [C, E]  the template ensemble (Table 8)
  text_bank.json          what the rows are: the D descriptors and C class names in row order,
                          each class's descriptors, the model, the prompt settings
                          (bank_template, descriptor_template, templates), which classifier the
                          config's analysis uses (config.analysis.class_prompts), dtype and
                          shapes, and `arrays_sha256`, the digest of the arrays
                          (`arrays_digest`).

The two files are one unit. The arrays are written first (aside, then renamed) and carry in
their metadata the digest of the row names (`names_digest`: descriptors, class names, each
class's descriptors) and one digest per setting the arrays were computed with (`SETTINGS`: the
model, the data, the prompts, the classifiers and which one the analysis uses;
`settings_digests`); the names file is written last, atomically, with the digest of the
arrays. An export killed between the two writes, or arrays copied from another export, leave a
pair whose digests disagree, and `load_text_bank` refuses it; a setting edited in the names file
since (another model or template, a classifier dropped) is refused by its name.
`load_text_bank(DIR, expect=config.analysis)` also refuses a bank whose prompts are not the
config's (a bank exported with another bank_template), naming the setting. It also refuses a names file
with a missing or mistyped entry (class names that are not strings, a shape that is not
[rows, width]), arrays that are not float32, hold a NaN or an infinity, or whose rows are not
unit (|norm - 1| above `unit_tolerance`, 1,000 units in the last place of the dtype: 1.2e-4
for float32): each an InputError naming the file and saying to export again.

The arrays are exactly what `mutual.pipeline.encode_bank` computes for the config (a class
embedding is the re-normalised mean of its unit prompt embeddings). Classes and descriptors come
from the config's data: the embedded world's classes and bank for `source="synthetic"`; for a
real dataset the descriptor file's classes in the file's order (Menon & Vondrick's ImageNet file
is in ImageNet's label order) and its unique descriptors, first seen first, with no image read.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any, Mapping

import numpy as np
import safetensors.numpy
from safetensors import safe_open
from safetensors.numpy import load_file

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
#: 2: the digests (`arrays_sha256` in the names file, `names_sha256` in the arrays' metadata);
#: 3: the descriptors in config.analysis.bank_template, and the settings' digests.
FORMAT_VERSION = 3
#: The class-embedding modes of mutual.pipeline.class_prompts, each exported as one classifier.
CLASSIFIERS = ("descriptors", "templates")
DESCRIPTOR_ARRAY = "descriptor_embeddings"
#: The names file's entries that the arrays depend on besides the rows (what the export computed
#: them with): each has its digest in the arrays' metadata (`settings_digests`).
SETTINGS = ("model", "data", "bank_template", "classifiers", "analysis_classifier", "embeddings")
#: The config.analysis settings a run expecting an exported bank compares with it
#: (`check_expected`): {setting: where the names file records it}.
EXPECTED_PROMPTS = {
  "bank_template": ("bank_template",),
  "descriptor_template": ("classifiers", "descriptors", "descriptor_template"),
  "templates": ("classifiers", "templates", "templates"),
}


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
  paper_config.check_bank_template(analysis)


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
  bank_template = paper_config.check_bank_template(a)
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
      bank_template=bank_template,
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
      "unit rows; each descriptor is encoded as bank_template filled with it; a class "
      "embedding is the re-normalised mean of its prompts' unit embeddings "
      "(mutual.pipeline.encode_bank)"
    ),
    bank_template=bank_template,
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
  record["arrays_sha256"] = arrays_digest(arrays)
  problem = _values_problem(arrays)
  if problem:  # a model that gives non-finite or zero embeddings: nothing is written
    raise InputError(
      f"the text bank of {config.model.source} cannot be exported: {problem}. Check the "
      "model's weights (python -m stori_jax.parity) and the descriptor file."
    )
  paths.makedirs(path, exist_ok=True)
  # The arrays first, the names last: the names file, with the arrays' digest, completes the pair.
  _write_arrays(
    os.path.join(path, ARRAYS_FILE), arrays, names_digest(record), settings_digests(record)
  )
  jsonio.write_json(os.path.join(path, NAMES_FILE), record, indent=1)
  return path, load_text_bank(path)


def check_expected(record: Mapping[str, Any], analysis, names_path: str) -> None:
  """Refuses (InputError naming the setting) a bank whose prompts (EXPECTED_PROMPTS) are not
  config.analysis's: its rows would not be what the run computes."""
  for setting, where in EXPECTED_PROMPTS.items():
    value: Any = record
    for key in where:
      value = value.get(key) if isinstance(value, dict) else None
    wanted = paper_config.analysis_value(analysis, setting)
    wanted = list(wanted) if setting == "templates" else wanted
    if value is not None or where[0] == "bank_template":
      if value != wanted:
        raise InputError(
          f"{names_path} was exported with {setting} {value!r}, but this run's "
          f"config.analysis.{setting} is {wanted!r}: its rows are not what the run computes. "
          "Export the bank again with this config (python -m mutual.export --config=... "
          f"--output=DIR --overwrite), or set --config.analysis.{setting} to the bank's."
        )


def arrays_digest(arrays: Mapping[str, np.ndarray]) -> str:
  """sha256 of a text bank's arrays: each name, dtype, shape and little-endian bytes, in name
  order (what `arrays_sha256` in the names file records)."""
  digest = hashlib.sha256()
  for key in sorted(arrays):
    array = np.asarray(arrays[key])
    array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    digest.update(json.dumps([key, array.dtype.str, list(array.shape)]).encode())
    digest.update(array.tobytes())
  return digest.hexdigest()


def names_digest(record: Mapping[str, Any]) -> str:
  """sha256 of what the rows are (the descriptors, the class names, each class's descriptors):
  what the arrays' metadata `names_sha256` records."""
  rows = {k: record[k] for k in ("descriptors", "class_names", "class_descriptors")}
  return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()


def settings_digests(record: Mapping[str, Any]) -> dict[str, str]:
  """{setting: sha256 of its JSON} for each of SETTINGS in a names record (a missing entry
  digests as null): what the arrays' metadata `settings_sha256` records."""
  return {
    key: hashlib.sha256(json.dumps(record.get(key), sort_keys=True).encode()).hexdigest()
    for key in SETTINGS
  }


def unit_tolerance(dtype) -> float:
  """How far from 1 a unit row's norm may be: 1,000 units in the last place of `dtype`."""
  return 1000 * float(np.finfo(dtype).eps)


def _write_arrays(
  target: str, arrays: Mapping[str, np.ndarray], names_sha256: str, settings: Mapping[str, str]
) -> None:
  """The arrays file, serialised in memory and written whole or not at all (a kill mid-write
  leaves no half file under the final name; on gs:// one upload), readable as a plain open()
  makes files (the umask's mode, not safetensors' private 0600); a full disk is the user's
  DiskFullError."""
  metadata = {
    "format": FORMAT,
    "names": NAMES_FILE,
    "names_sha256": names_sha256,
    "settings_sha256": json.dumps(dict(settings), sort_keys=True),
  }
  data = safetensors.numpy.save(dict(arrays), metadata=metadata)
  jsonio.write_bytes_atomic(target, data)


def _is_strings(value: Any) -> bool:
  return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _record_problem(record: Mapping[str, Any]) -> str | None:
  """What is missing or mistyped in a names file's entries, if anything."""
  for key in ("descriptors", "class_names"):
    if not _is_strings(record.get(key)) or not record[key]:
      return f"{key!r} must be a non-empty list of strings, got {_describe(record.get(key))}"
  per_class = record.get("class_descriptors")
  if not isinstance(per_class, list) or not all(_is_strings(d) for d in per_class):
    return f"'class_descriptors' must be a list of lists of strings, got {_describe(per_class)}"
  if len(per_class) != len(record["class_names"]):
    return (
      f"'class_descriptors' has {len(per_class)} lists for {len(record['class_names'])} class names"
    )
  classifiers = record.get("classifiers")
  if (
    not isinstance(classifiers, dict) or not classifiers or not set(classifiers) <= set(CLASSIFIERS)
  ):
    return (
      f"'classifiers' must map some of {list(CLASSIFIERS)} to their settings, got "
      f"{_describe(classifiers)}"
    )
  if record.get("analysis_classifier") not in classifiers:
    return (
      f"'analysis_classifier' must be one of {sorted(classifiers)}, got "
      f"{_describe(record.get('analysis_classifier'))}"
    )
  shapes = record.get("shapes")
  if not isinstance(shapes, dict) or not all(
    isinstance(v, list) and len(v) == 2 and all(type(n) is int and n > 0 for n in v)
    for v in shapes.values()
  ):
    return f"'shapes' must map each array to its [rows, width], got {_describe(shapes)}"
  if record.get("dtype") != "float32":
    return f"'dtype' must be \"float32\", got {_describe(record.get('dtype'))}"
  digest = record.get("arrays_sha256")
  if not isinstance(digest, str) or len(digest) != 64:
    return f"'arrays_sha256' must be the 64 hex digits of a sha256, got {_describe(digest)}"
  return None


def _describe(value: Any) -> str:
  """A short rendering of a JSON value for a message."""
  text = "nothing (the entry is missing)" if value is None else json.dumps(value)
  return text if len(text) <= 80 else text[:77] + "..."


def _values_problem(arrays: Mapping[str, np.ndarray]) -> str | None:
  """A non-finite value or a row that is not unit, if any (the first array, row, found)."""
  for key in sorted(arrays):
    array = arrays[key]
    bad = ~np.isfinite(array)
    if bad.any():
      row = int(np.argwhere(bad)[0][0])
      return f"{key} holds {int(bad.sum())} NaN or infinite values (the first in row {row})"
    norms = np.linalg.norm(array.astype(np.float64), axis=-1)
    off = np.abs(norms - 1.0)
    tolerance = unit_tolerance(array.dtype)
    if off.size and off.max() > tolerance:
      row = int(np.argmax(off))
      return (
        f"{key} has rows that are not unit vectors (row {row} has norm {norms[row]:.6g}; "
        f"|norm - 1| must be at most {tolerance:.2g} for {array.dtype})"
      )
  return None


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


def load_text_bank(directory: str | os.PathLike, expect=None) -> ExportedTextBank:
  """Reads a folder `python -m mutual.export` wrote.

  Args:
    directory: the export's folder.
    expect: the config.analysis of the run that will use the bank, or None; given, the bank's
      prompts must be this config's (`check_expected`).

  Raises:
    InputError: a file is missing, unreadable, of another format, has a missing or mistyped
      entry, the arrays are not finite unit rows, the two files are not one export (their
      digests disagree), a setting was edited since the export (named), or the bank's prompts
      are not `expect`'s (named); the message names the file and says to export again.
  """
  directory = paths.absolute(os.fspath(directory))
  again = "Export it again with python -m mutual.export --config=... --output=DIR --overwrite."
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
  names_path, arrays_path = (os.path.join(directory, n) for n in (NAMES_FILE, ARRAYS_FILE))
  problem = _record_problem(record)
  if problem:
    raise InputError(f"{names_path}: {problem}. {again}")
  try:
    with paths.copied_locally(arrays_path, expect="file") as local:  # safetensors: local only
      arrays = load_file(local)
      with safe_open(local, framework="numpy") as f:
        metadata = f.metadata() or {}
  except Exception as e:  # safetensors raises its own error types (SafetensorError, ...)
    raise InputError(
      f"{arrays_path} is not a readable safetensors file ({type(e).__name__}: {e}). {again}"
    ) from None
  used = [DESCRIPTOR_ARRAY] + [classifier_array(m) for m in record["classifiers"]]
  problem = _shape_problem(arrays, record) or _values_problem({k: arrays[k] for k in used})
  if problem:
    raise InputError(f"{arrays_path}: {problem}. {again}")
  if arrays_digest(arrays) != record["arrays_sha256"]:
    raise InputError(
      f"{arrays_path} does not hold the arrays {names_path} was written with (their digest "
      "differs from its arrays_sha256): the arrays come from another export or were changed "
      f"since, or an export was stopped between writing the two files. {again}"
    )
  if metadata.get("names_sha256") != names_digest(record):
    raise InputError(
      f"{names_path}: its descriptors, class names or class descriptors are not the rows "
      f"{arrays_path} was exported with (reordered or edited since). {again}"
    )
  try:
    stored = json.loads(metadata.get("settings_sha256", "null")) or {}
  except ValueError:
    stored = {}
  edited = [key for key, digest in settings_digests(record).items() if stored.get(key) != digest]
  if edited:
    raise InputError(
      f"{names_path}: {', '.join(repr(k) for k in edited)} "
      f"{'is' if len(edited) == 1 else 'are'} not what {arrays_path} was exported with "
      "(edited since the export, or the arrays hold no record of it): the bank would claim "
      f"settings its arrays were not computed with. {again}"
    )
  if expect is not None:
    check_expected(record, expect, names_path)
  return ExportedTextBank(
    descriptors=tuple(record["descriptors"]),
    descriptor_embeddings=arrays[DESCRIPTOR_ARRAY],
    class_names=tuple(record["class_names"]),
    class_descriptors=tuple(tuple(d) for d in record["class_descriptors"]),
    classifiers={m: arrays[classifier_array(m)] for m in record["classifiers"]},
    analysis_classifier=record["analysis_classifier"],
    names=record,
  )
