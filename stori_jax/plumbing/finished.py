"""One record of finished work, for resume: a grid cell, an analysed class, an evaluated class or
protocol, a sweep's class chunk, a trained baseline is a *unit*, and a unit is finished when its
record says so.

A record is a JSON file (`workdir_layout` names where each unit's lies), written last, once the
unit's outputs are written:

    {"key": "class 0003", "inputs": <SHA-256 of the unit's inputs>,
     "outputs": {<path relative to the workdir>: <SHA-256 of its contents>, ...},
     "payload": <a small result kept in the record itself, or null>}

A rerun of the same command keeps a unit when its record is there and readable, names the same
inputs (the same images, models, settings), and every output is there with the same contents;
a unit whose record is absent or names other inputs is simply run (again). A unit whose record
or outputs are damaged (cut short, emptied, overwritten, missing) is run again too, with one line
saying which file and that the unit is redone: never a traceback from reading a damaged file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Mapping

from absl import logging

from stori_jax.plumbing import jsonio, paths


def digest(inputs: Any) -> str:
  """The hex SHA-256 of a JSON-able value (keys sorted: the same value, the same digest)."""
  return hashlib.sha256(jsonio.dumps_strict(inputs, sort_keys=True).encode("utf-8")).hexdigest()


@dataclasses.dataclass(frozen=True)
class Unit:
  """A unit of a run's work.

  Attributes:
    workdir: the run's folder (a path or a URL); outputs are named relative to it.
    key: the unit's name in messages ("class 0003", "protocol blur").
    record: its record's path relative to the workdir (`workdir_layout`).
    inputs: JSON-able, what the unit's results depend on (kept as its digest).
  """

  workdir: str
  key: str
  record: str
  inputs: Any

  def path(self, relative: str) -> str:
    """A path relative to the workdir, joined to it."""
    return paths.join(self.workdir, *relative.split("/"))


def finish(unit: Unit, outputs: Mapping[str, str], payload: Any = None) -> str:
  """Writes the unit's record (atomically; call it after every output is written); returns its
  SHA-256.

  Args:
    outputs: {path relative to the workdir: hex SHA-256 of what was written there} (the
      writers return it: `jsonio.write_json`, `paths.AtomicWrite.sha256`).
    payload: JSON-able, kept in the record (a protocol's result, a chunk's records).
  """
  record = paths.join(unit.workdir, *unit.record.split("/"))
  paths.makedirs(paths.parent(record))
  return jsonio.write_json(
    record,
    dict(key=unit.key, inputs=digest(unit.inputs), outputs=dict(outputs), payload=payload),
  )


@dataclasses.dataclass(frozen=True)
class Kept:
  """A finished unit as its record holds it: payload (as `finish` was given it) and outputs
  ({relative path: SHA-256})."""

  payload: Any
  outputs: dict[str, str]


def check(unit: Unit, verify_outputs: bool = True) -> Kept | None:
  """The unit's record when an earlier run finished it on the same inputs, else None.

  None, silently, when the record is absent or names other inputs; None with one warning line
  naming the damaged file when the record cannot be read or an output is missing or holds
  other contents than the run wrote (each output is read whole to compare its SHA-256;
  `verify_outputs` False only checks that they exist).
  """
  record = unit.path(unit.record)
  try:
    stored = json.loads(paths.read_bytes(record))
  except FileNotFoundError:
    return None
  except (OSError, ValueError) as error:  # cut short, emptied, not UTF-8
    return _redo(unit, record, f"the record cannot be read ({type(error).__name__})")
  if not _is_record(stored):
    return _redo(unit, record, "it is not a record of finished work")
  if stored["inputs"] != digest(unit.inputs):
    return None
  for relative, expected in stored["outputs"].items():
    path = unit.path(relative)
    if not paths.isfile(path):
      return _redo(unit, path, "it is missing")
    if verify_outputs and paths.file_sha256(path) != expected:
      return _redo(unit, path, "its contents differ from what the run wrote (damaged)")
  return Kept(stored["payload"], dict(stored["outputs"]))


def _is_record(stored: Any) -> bool:
  return (
    isinstance(stored, dict)
    and isinstance(stored.get("inputs"), str)
    and isinstance(stored.get("outputs"), dict)
    and all(isinstance(k, str) and isinstance(v, str) for k, v in stored["outputs"].items())
  )


def _redo(unit: Unit, path: str, why: str) -> None:
  logging.warning("%s: %s; %s is done again.", path, why, unit.key)
  return None
