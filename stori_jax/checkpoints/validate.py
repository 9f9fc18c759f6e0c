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
from stori_jax.errors import NonFiniteError
from stori_jax.models import (
  CLIPConfig,
  ConvNeXtConfig,
  ResNetConfig,
  TextConfig,
  VisionConfig,
  param_shapes,
)


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


def config_from_dict(values: Mapping[str, Any], where: str) -> CLIPConfig:
  """CLIPConfig.from_dict with every key and value checked first (see `check_fields`).

  Raises:
    CheckpointError: naming `where` and the offending key.
  """
  check_fields(CLIPConfig, values, where)
  check_fields(TextConfig, values.get("text", {}), where, "text.")
  vision = values.get("vision", {})
  if isinstance(vision, Mapping) and "depths" in vision:
    kind = ConvNeXtConfig
  elif isinstance(vision, Mapping) and isinstance(vision.get("layers"), (list, tuple)):
    kind = ResNetConfig
  else:
    kind = VisionConfig
  check_fields(kind, vision, where, "vision.")
  try:
    return CLIPConfig.from_dict(values)
  except (TypeError, ValueError) as e:  # inconsistent values, e.g. width not divisible by heads
    raise CheckpointError(f"{where}: the architecture is inconsistent: {e}") from None


# ---------------------------------------------------------------------------------------------
# Parameter values.


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
