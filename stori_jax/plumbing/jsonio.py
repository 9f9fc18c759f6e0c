"""Strict, atomic JSON files: no NaN or Infinity is ever written as a result, and a reader
never sees half a file (a kill during the write leaves the old file or the new one)."""

from __future__ import annotations

import errno
import json
from typing import Any, Mapping

from stori_jax.plumbing import paths
from stori_jax.plumbing.errors import NonFiniteError, UserError


class DiskFullError(UserError, OSError):
  """A result file could not be written: its disk or quota is full."""


def dumps_strict(obj: Any, **kwargs) -> str:
  """json.dumps that refuses NaN and +-Infinity (which are not JSON) with NonFiniteError."""
  try:
    return json.dumps(obj, allow_nan=False, **kwargs)
  except ValueError as e:
    if "Out of range float" not in str(e):
      raise
    raise NonFiniteError(
      f"refusing to write a non-finite number (NaN or infinity) as a result: {e}"
    ) from None


def write_text_atomic(path: str, text: str) -> None:
  """Writes `text` to `path` whole or not at all: locally through a temporary file in the same
  folder and os.replace, to object storage (gs://) as one upload (`paths.write_text_atomic`)."""
  try:
    paths.write_text_atomic(path, text)
  except OSError as error:
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
      raise DiskFullError(
        f"cannot write {path}: the disk (or quota) is full. The earlier version of the file, "
        "if any, is kept; free some space and run the same command again (a training run "
        "resumes from its last checkpoint)."
      ) from None
    raise


def write_json(path: str, obj: Any, **kwargs) -> None:
  """Strict JSON (see dumps_strict), written atomically."""
  write_text_atomic(path, dumps_strict(obj, **kwargs) + "\n")


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
  """{"a.b.c": leaf} of a nested dict (lists are leaves)."""
  if isinstance(tree, Mapping) and tree:
    out = {}
    for key, value in tree.items():
      out.update(flatten(value, f"{prefix}{key}."))
    return out
  return {prefix[:-1]: tree}


def differences(old: Mapping, new: Mapping) -> list[tuple[str, Any, Any]]:
  """[(dotted key, old value, new value)] where two nested dicts (e.g. run identities) differ,
  sorted by key."""
  missing = object()
  a, b = flatten(old), flatten(new)
  keys = sorted(set(a) | set(b))
  return [
    (k, a.get(k, "(absent)"), b.get(k, "(absent)"))
    for k in keys
    if a.get(k, missing) != b.get(k, missing)
  ]
