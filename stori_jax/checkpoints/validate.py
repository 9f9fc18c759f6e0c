"""Checking what a checkpoint holds: its architecture config (types and ranges of every key),
its parameter tree against the shapes the architecture expects, and its values (finite)."""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, Mapping

import numpy as np
from flax import traverse_util

from stori_jax.checkpoints.errors import CheckpointError, CheckpointMismatchError
from stori_jax.plumbing.errors import NonFiniteError
from stori_jax.data.preprocess import PreprocessConfig
from stori_jax.models import CLIPConfig, TextConfig, param_shapes, tower_kinds


def flatten(params: Mapping[str, Any]) -> dict[str, Any]:
  """Nested params -> {'text/resblocks_0/attn/query/kernel': array}."""
  return traverse_util.flatten_dict(params, sep="/")


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
  return traverse_util.unflatten_dict(dict(flat), sep="/")


def check_params(
  params: Mapping[str, Any],
  config: CLIPConfig,
  source: str = "parameters",
  unexpected_source_keys=(),
) -> None:
  """Raises CheckpointMismatchError naming every missing, unexpected or misshaped key.

  unexpected_source_keys are keys of the original checkpoint that no rule consumed.
  """
  want = flatten(param_shapes(config))
  got = flatten(params)
  missing = set(want) - set(got)
  unexpected = (set(got) - set(want)) | set(unexpected_source_keys)
  mismatched = [
    (k, tuple(np.shape(got[k])), tuple(want[k].shape))
    for k in set(want) & set(got)
    if tuple(np.shape(got[k])) != tuple(want[k].shape)
  ]
  if missing or unexpected or mismatched:
    raise CheckpointMismatchError(source, missing, unexpected, mismatched)


# ---------------------------------------------------------------------------------------------
# Architecture configs read from files (stori_config.json, config.json, open_clip_config.json).

#: Integer fields that may be 0 (token ids); every other integer is a size or a count, >= 1.
_NON_NEGATIVE_FIELDS = frozenset({"eot_token_id"})

#: Sane upper bounds, checked before any model is built: a layer count of 1e9 once built
#: modules for minutes at 40 MB/s (issue 26 row 4). Far above any released CLIP (24 to 48
#: blocks, widths up to 2048, 77 tokens, 49408 words, 448 px).
_LAYER_FIELDS = frozenset({"layers", "depths", "heads"})
_MAX_LAYERS = 1024
_MAX_SIZE = 1 << 20


def _expected(hint) -> str:
  """A type hint in words: int -> 'an integer', int | None -> 'an integer or null', ..."""
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  if origin in (typing.Union, types.UnionType):
    return " or ".join(_expected(a) for a in args)
  if origin is tuple:
    count = "" if Ellipsis in args else f"{len(args)} "
    element = _expected(args[0]).split(" ", 1)[-1] if args else "value"  # drop "a"/"an"
    return f"a list of {count}{element}s"
  return {
    int: "an integer",
    float: "a number",
    str: "a string",
    bool: "true or false",
    type(None): "null",
  }.get(hint, getattr(hint, "__name__", str(hint)))


def _fits(value, hint) -> bool:
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  if origin in (typing.Union, types.UnionType):
    return any(_fits(value, a) for a in args)
  if origin is tuple:
    return isinstance(value, (list, tuple)) and (
      (Ellipsis in args or len(value) == len(args)) and all(_fits(v, args[0]) for v in value)
    )
  if hint is int:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)
  if hint is float:
    return isinstance(value, (int, float, np.number)) and not isinstance(value, bool)
  if hint is type(None):
    return value is None
  if isinstance(hint, type):
    return isinstance(value, hint)
  return True


def _positive(value) -> bool:
  values = value if isinstance(value, (list, tuple)) else [value]
  return all(v is None or isinstance(v, str) or v > 0 for v in values)


def check_fields(cls, values: Mapping[str, Any], where: str, prefix: str = "") -> None:
  """Checks a config dict against the dataclass `cls` before it is built.

  Raises:
    CheckpointError: an unknown key (the nearest known one suggested), or a value of the wrong
      type or out of range; the message names `where`, the dotted key, the value and what is
      expected.
  """
  if not isinstance(values, Mapping):
    raise CheckpointError(
      f"{where}: {prefix.rstrip('.') or 'the config'} must be a JSON object, got "
      f"{type(values).__name__} {values!r:.80}."
    )
  hints = typing.get_type_hints(cls)
  unknown = sorted(set(values) - set(hints))
  if unknown:
    near = difflib.get_close_matches(unknown[0], list(hints), n=1)
    raise CheckpointError(
      f"{where}: unknown key{'s' if len(unknown) > 1 else ''} "
      + ", ".join(repr(prefix + k) for k in unknown)
      + (f" (did you mean {prefix + near[0]!r}?)" if near else "")
      + f"; the keys of {prefix.rstrip('.') or cls.__name__} are {sorted(hints)}."
    )
  for key, value in values.items():
    hint = hints[key]
    if dataclasses.is_dataclass(hint) or key in ("text", "vision"):
      continue  # nested towers are checked on their own
    if not _fits(value, hint):
      raise CheckpointError(
        f"{where}: {prefix + key} is {value!r:.80} ({type(value).__name__}); it must be "
        f"{_expected(hint)}. Fix that key of the file, or convert the checkpoint again."
      )
    if key != "name" and key not in _NON_NEGATIVE_FIELDS and hint is not bool:
      if not _positive(value):
        raise CheckpointError(
          f"{where}: {prefix + key} is {value!r}; it must be positive. Fix that key of the "
          "file, or convert the checkpoint again."
        )
    elif key in _NON_NEGATIVE_FIELDS and value < 0:
      raise CheckpointError(f"{where}: {prefix + key} is {value!r}; it must be >= 0.")
    bound = _MAX_LAYERS if key in _LAYER_FIELDS else _MAX_SIZE
    numbers = value if isinstance(value, (list, tuple)) else [value]
    if key != "eot_token_id" and any(
      isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v > bound for v in numbers
    ):
      raise CheckpointError(
        f"{where}: {prefix + key} is {value!r:.80}; at most {bound} is accepted (far above any "
        "CLIP), so the value is a typo or a damaged file. Fix that key of the file, or convert "
        "the checkpoint again."
      )


def config_from_dict(values: Mapping[str, Any], where: str) -> CLIPConfig:
  """CLIPConfig.from_dict with every key and value checked first (see `check_fields`).

  Raises:
    CheckpointError: naming `where` and the offending key.
  """
  check_fields(CLIPConfig, values, where)
  check_fields(TextConfig, values.get("text", {}), where, "text.")
  vision = values.get("vision", {})
  kind = tower_kinds.get(tower_kinds.DEFAULT)
  if isinstance(vision, Mapping):
    try:
      kind = tower_kinds.kind_of_dict(vision)
    except ValueError as e:  # two kinds claim it
      raise CheckpointError(f"{where}: {e}") from None
  check_fields(kind.config, vision, where, "vision.")
  try:
    return CLIPConfig.from_dict(values)
  except (TypeError, ValueError) as e:  # inconsistent values, e.g. width not divisible by heads
    raise CheckpointError(f"{where}: the architecture is inconsistent: {e}") from None


def _is_number(value) -> bool:
  return isinstance(value, (int, float, np.number)) and not isinstance(value, bool)


def preprocess_from_dict(values: Any, config: CLIPConfig, where: str) -> PreprocessConfig:
  """The "preprocess" entry of a checkpoint config, checked against the model it belongs to.

  A missing image_size is the vision tower's; missing mean / std are OpenAI's.

  Raises:
    CheckpointError: not an object, an unknown key, an image_size other than the model's (both
      named, with the fix), a mean or std that is not 3 finite numbers, a std that is not > 0
      (each of which would give NaN or wrong features, or fail on the first image).
  """
  model_size = config.vision.image_size
  if values is None:
    values = {}
  if not isinstance(values, Mapping):
    raise CheckpointError(
      f'{where}: "preprocess" must be a JSON object such as {{"image_size": {model_size}, '
      f'"mean": [..3 numbers..], "std": [..3 numbers..]}}, got {values!r:.80}.'
    )
  known = ("image_size", "mean", "std")
  unknown = sorted(set(values) - set(known))
  if unknown:
    raise CheckpointError(
      f'{where}: unknown key(s) {unknown} in "preprocess"; its keys are {list(known)}.'
    )
  size = values.get("image_size", model_size)
  if not isinstance(size, (int, np.integer)) or isinstance(size, bool) or size != model_size:
    raise CheckpointError(
      f'{where}: "preprocess" image_size is {size!r}, but the model\'s vision tower takes '
      f"{model_size}x{model_size} images (config.vision.image_size {model_size}); "
      f"preprocessing at {size!r} px would give inputs the model cannot encode. Set "
      f'"preprocess": {{"image_size": {model_size}}} in that file (or remove the key).'
    )
  out = {"image_size": int(size)}
  for key, default in (("mean", PreprocessConfig.mean), ("std", PreprocessConfig.std)):
    value = values.get(key, default)
    if (
      not isinstance(value, (list, tuple))
      or len(value) != 3
      or not all(_is_number(v) and np.isfinite(v) for v in value)
    ):
      raise CheckpointError(
        f'{where}: "preprocess" {key} is {value!r:.80}; it must be a list of 3 finite '
        f"numbers, one per RGB channel (OpenAI's is {list(default)}). Fix that key of the file."
      )
    if key == "std" and not all(v > 0 for v in value):
      raise CheckpointError(
        f'{where}: "preprocess" std is {list(value)!r}; every value must be > 0 (pixels are '
        f"divided by it: 0 gives infinite or NaN features). OpenAI's is {list(default)}. Fix "
        "that key of the file."
      )
    out[key] = tuple(float(v) for v in value)
  return PreprocessConfig(**out)


def _block_count(shapes: Mapping[str, Any], prefix: str) -> int:
  """How many blocks `prefix{i}/...` the weights hold (the highest index + 1)."""
  indices = {
    k[len(prefix) :].split("/", 1)[0]
    for k in shapes
    if k.startswith(prefix) and "/" in k[len(prefix) :]
  }
  return max((int(i) + 1 for i in indices if i.isdigit()), default=0)


def check_config_fits_weights(
  config: CLIPConfig, shapes: Mapping[str, tuple[int, ...]], source: str, where: str
) -> None:
  """Compares a recorded architecture with the weights' block counts and embedding shapes
  before any model is built (building a config with text.layers 1e9 would hang for minutes).

  `shapes` maps flat keys to shapes, as a safetensors header gives them. The full per-key
  check (`check_params`) follows once the architecture is known to be the weights' size.

  Raises:
    CheckpointError: naming `where` (the config file), the key, both values and the fix.
  """
  checks = [
    ("text.layers", config.text.layers, _block_count(shapes, "text/resblocks_"), "text blocks"),
  ]
  for name, count, prefix in tower_kinds.of(config.vision).param_blocks(config.vision):
    checks.append((name, count, _block_count(shapes, prefix), "vision blocks"))
  text = config.text
  for key, name, want in [
    (
      "text/token_embedding/embedding",
      "text.vocab_size x text.width",
      (text.vocab_size, text.width),
    ),
    (
      "text/positional_embedding",
      "text.context_length x text.width",
      (text.context_length, text.width),
    ),
  ]:
    if key in shapes:
      checks.append((name, want, tuple(shapes[key]), f"as the shape of {key}"))
  for name, ours, theirs, what in checks:
    if ours != theirs:
      raise CheckpointError(
        f"{where}: the architecture says {name} = {ours!r}, but the weights {source} hold "
        f"{theirs!r} {what}: the config and the weights do not belong together. Fix {name} "
        "in the config file, or convert the checkpoint again."
      )


# ---------------------------------------------------------------------------------------------
# Parameter values.


def is_float_dtype(dtype) -> bool:
  """float16/32/64 and bfloat16 (ml_dtypes, which numpy does not count as floating)."""
  dtype = np.dtype(dtype)
  return dtype.kind == "f" or dtype.name == "bfloat16"


def check_float_weights(flat: Mapping[str, Any], source: str) -> None:
  """Raises CheckpointError naming the first weight tensor whose dtype is not floating point.

  Casting an int8 or bool tensor to float32 gives wrong weights without any error (features
  with cosine 0.3 to 0.6 to the real ones, issue 26 row 9): quantised or corrupt weights.
  """
  for key in sorted(flat):
    dtype = getattr(flat[key], "dtype", None)
    if dtype is None:
      dtype = np.asarray(flat[key]).dtype
    if not is_float_dtype(dtype):
      raise CheckpointError(
        f"The checkpoint {source} stores the weight tensor {key} as {np.dtype(dtype).name}; "
        "weights must be floating point (float32, float16 or bfloat16). An integer or "
        "boolean tensor is quantised or damaged, and casting it would give wrong features "
        "silently. Convert the original float weights again."
      )


def first_non_finite(params: Mapping[str, Any]) -> tuple[str, int, int] | None:
  """(key, count of non-finite values, size) of the first parameter (sorted keys) holding a NaN
  or infinity, else None."""
  for key, value in sorted(flatten(params).items()):
    value = np.asarray(value)
    if np.issubdtype(value.dtype, np.inexact):
      bad = int(value.size - np.count_nonzero(np.isfinite(value)))
      if bad:
        return key, bad, int(value.size)
  return None


def check_finite(params: Mapping[str, Any], source: str) -> None:
  """Raises NonFiniteError naming `source` and the first parameter with a NaN or infinity."""
  found = first_non_finite(params)
  if found is not None:
    key, bad, size = found
    raise NonFiniteError(
      f"The checkpoint {source} holds non-finite weights: {key} has {bad} NaN or infinite "
      f"value(s) of {size} (the first such parameter). Its features would be NaN; load the "
      "checkpoint the run saved before it diverged, or convert the original weights again."
    )
