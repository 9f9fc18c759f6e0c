"""Strict, atomic JSON files: no NaN or Infinity is ever written as a result, and a reader
never sees half a file (a kill during the write leaves the old file or the new one); text,
bytes and numpy arrays (.npz) are written atomically alike."""

from __future__ import annotations

import json
from typing import Any, Mapping

import numpy as np

from stori_jax.plumbing import paths

# DiskFullError lives in errors (the figure writers raise it too); jsonio.DiskFullError stays.
from stori_jax.plumbing.errors import DiskFullError, NonFiniteError  # noqa: F401


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


def write_text_atomic(path: str, text: str) -> str:
  """`write_bytes_atomic` of UTF-8 text; returns its hex SHA-256."""
  return write_bytes_atomic(path, text.encode("utf-8"))


def write_arrays_atomic(path: str, arrays: Mapping[str, Any]) -> str:
  """Writes numpy arrays as an .npz file (np.savez, uncompressed) atomically, streamed to the
  file (`paths.AtomicWrite`: no second copy in memory); returns its hex SHA-256."""
  writer = paths.AtomicWrite(path)
  with writer as f:
    np.savez(f, **arrays)
  return writer.sha256


def write_bytes_atomic(path: str, data: bytes, what: str = "") -> str:
  """Writes `data` to `path` whole or not at all (`paths.AtomicWrite`: locally through a
  temporary file in the same folder and os.replace, to object storage as one upload); returns
  its hex SHA-256.

  what: the file's kind in the full-disk message ("the figure "), if any.

  Raises:
    DiskFullError: the disk (or quota) is full; the message names the file and the fix.
  """
  return paths.write_bytes_atomic(path, data, what)


def write_json(path: str, obj: Any, **kwargs) -> str:
  """Strict JSON (see dumps_strict), written atomically; returns the file's hex SHA-256."""
  return write_text_atomic(path, dumps_strict(obj, **kwargs) + "\n")


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
