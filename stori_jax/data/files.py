"""Reading the small files users hand the project (JSON banks, split files, class lists), and
matching class names between them.

Every failure names the file and what is wrong with it (`InputError`, a user's mistake), so a
malformed or wrongly encoded file is never reported as a bare `JSONDecodeError`; a file or
dataset that is not there at all is a `DatasetMissingError` whose message says what to get and
where to put it. JSON name lists ({class name: [text, ...]}: descriptor banks, prompt files) are
checked by `check_name_lists`. Classes are matched by name, never by position: `normalise_name`
forgives case, underscores, hyphens and spaces ("Blue_Circle" ~ "blue circle"), and
`match_names` lists what is missing on either side.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
from typing import Any, Iterable, Sequence

from stori_jax.plumbing import paths
from stori_jax.plumbing.errors import InputError, UserError


class DatasetMissingError(UserError, FileNotFoundError):
  """A dataset, split file or prompt file is missing; the message says what to get, and where."""


def read_json(path: str | os.PathLike, what: str = "JSON file", error: type = InputError) -> Any:
  """The parsed content of a UTF-8 JSON file.

  Args:
    path: the file.
    what: what the file is, for messages ("descriptor file", "CoOp split file").
    error: the UserError subclass to raise (e.g. CheckpointError for checkpoint configs).

  Raises:
    `error`: the file cannot be read, is not UTF-8, is not valid JSON, names a key twice in
      one object, nests too deeply, or holds a value json cannot convert (an integer of
      thousands of digits); the message names the path and, for a syntax error, the line and
      column.
  """
  path = os.fspath(path)
  try:
    with paths.open(path, "rb") as f:
      raw = f.read()
  except OSError as e:
    raise error(f"Cannot read the {what} {path}: {e.strerror or e}.") from None
  try:
    text = raw.decode("utf-8-sig")  # a UTF-8 byte-order mark is harmless
  except UnicodeDecodeError as e:
    line = raw[: e.start].count(b"\n") + 1
    column = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
    raise error(
      f"The {what} {path} is not UTF-8 (byte 0x{raw[e.start]:02x} at line {line}, column "
      f"{column}); it must be UTF-8 JSON. Re-save it as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)."
    ) from None
  try:
    return json.loads(text, object_pairs_hook=_unique_keys)
  except json.JSONDecodeError as e:
    raise error(
      f"The {what} {path} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}; "
      "it must be UTF-8 JSON."
    ) from None
  except _DuplicateKey as e:
    raise error(
      f"The {what} {path} names the key {e.key!r} twice in one object; JSON keeps only the "
      "last, so the first entry's contents would vanish silently. Merge the two entries into "
      "one."
    ) from None
  except RecursionError:
    raise error(
      f"The {what} {path} nests its lists or objects too deeply to be read (thousands of "
      "levels); none of the project's files nests more than a few."
    ) from None
  except ValueError as e:  # after JSONDecodeError, its subclass: what json.loads refuses else
    # (an integer of more than sys.get_int_max_str_digits() digits, 4,300 by default).
    raise error(
      f"The {what} {path} cannot be read as JSON ({e}); none of the project's files holds such "
      "a value. Check that it is the file meant, or write it again."
    ) from None


def read_text_lines(path: str | os.PathLike, what: str = "text file") -> list[str]:
  """The lines of a UTF-8 text file (a leading byte-order mark dropped), without line ends.

  Raises:
    InputError: the file is not UTF-8; the message names the path and the line.
  """
  path = os.fspath(path)
  with paths.open(path, "rb") as f:
    raw = f.read()
  try:
    return raw.decode("utf-8-sig").splitlines()
  except UnicodeDecodeError as e:
    line = raw[: e.start].count(b"\n") + 1
    raise InputError(
      f"The {what} {path} is not UTF-8 (line {line}); re-save it as UTF-8."
    ) from None


def check_name_lists(
  value: Any, where: str, *, what: str, entry: str, allow_empty: bool = False
) -> dict[str, list[str]]:
  """`value` if it is a JSON name list {class name: [text, ...]}, else an InputError.

  Args:
    value: parsed JSON (`read_json`).
    where: the file or URL, for messages.
    what: what the file is ("descriptor file", "CuPL prompt file").
    entry: what one text is ("descriptor", "sentence").
    allow_empty: accept an empty object and classes with no texts (checked later, per class);
      otherwise every class needs at least one.

  Raises:
    InputError: the classes with no texts are named, or the layout is not {str: [str, ...]}.
  """
  if not allow_empty and isinstance(value, dict):
    empty = [k for k, v in value.items() if isinstance(v, list) and not v]
    if empty:
      raise InputError(
        f"{where}: the classes {quoted(empty)} have no {entry}s; give each class at least "
        "one, or remove it from the file."
      )
  well_formed = isinstance(value, dict) and all(
    isinstance(k, str) and isinstance(v, list) and all(isinstance(s, str) for s in v)
    for k, v in value.items()
  )
  if allow_empty and not well_formed:
    raise InputError(
      f"{where} is not a {what}: expected a JSON object {{class name: [{entry}, ...]}}."
    )
  if not allow_empty and not (well_formed and value and all(value.values())):
    raise InputError(
      f"{where} is not a {what}: expected a non-empty JSON object {{class name: [{entry}, "
      f"...]}} with at least one {entry} per class."
    )
  return value


class _DuplicateKey(Exception):
  def __init__(self, key: str):
    super().__init__(key)
    self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
  """json's object_pairs_hook: a dict, refusing a key that appears twice."""
  out = {}
  for key, value in pairs:
    if key in out:
      raise _DuplicateKey(key)
    out[key] = value
  return out


def normalise_name(name: str) -> str:
  """A class name compared across files: case, '_', '-' and runs of spaces ignored."""
  return " ".join(str(name).replace("_", " ").replace("-", " ").casefold().split())


def nearest(name: str, candidates: Iterable[str]) -> str | None:
  """The candidate spelled most like `name` (difflib), or None when none is close."""
  by_normalised = {normalise_name(c): c for c in candidates}
  close = difflib.get_close_matches(normalise_name(name), list(by_normalised), n=1, cutoff=0.6)
  return by_normalised[close[0]] if close else None


def quoted(names: Sequence[str], limit: int = 12) -> str:
  """'a', 'b', 'c' (and 9 more)."""
  shown = ", ".join(repr(n) for n in names[:limit])
  return shown + (f" (and {len(names) - limit} more)" if len(names) > limit else "")


@dataclasses.dataclass(frozen=True)
class NameMatch:
  """How data-side keys (folders, label names) pair with reference keys (a descriptor file).

  Attributes:
    pairs: (data key, reference key) for every data key that names exactly one reference key,
      in the data keys' order.
    extra: data keys that name no reference key.
    missing: reference keys that no data key names.
    ambiguous: (data key, the reference keys it could mean) where several normalise alike.
  """

  pairs: tuple[tuple[str, str], ...]
  extra: tuple[str, ...]
  missing: tuple[str, ...]
  ambiguous: tuple[tuple[str, tuple[str, ...]], ...]


def match_names(data_keys: Sequence[str], reference_keys: Sequence[str]) -> NameMatch:
  """Pairs each data key with the reference key of the same name (exact, else normalised)."""
  by_normalised: dict[str, list[str]] = {}
  for key in reference_keys:
    by_normalised.setdefault(normalise_name(key), []).append(key)
  reference = set(reference_keys)
  pairs, extra, ambiguous = [], [], []
  for key in data_keys:
    candidates = [key] if key in reference else by_normalised.get(normalise_name(key), [])
    if len(candidates) == 1:
      pairs.append((key, candidates[0]))
    elif candidates:
      ambiguous.append((key, tuple(candidates)))
    else:
      extra.append(key)
  used = {r for _, r in pairs} | {r for _, c in ambiguous for r in c}
  missing = tuple(k for k in reference_keys if k not in used)
  return NameMatch(tuple(pairs), tuple(extra), missing, tuple(ambiguous))


class ClassMismatchError(InputError):
  """The classes of two sources (folders, split files, descriptor or prompt files) differ."""


def check_no_problems(problems: Sequence[str], prefix: str, fix: str) -> None:
  """Raises ClassMismatchError "<prefix>: <problem>; <problem>. <fix>" when there are any."""
  if problems:
    raise ClassMismatchError(f"{prefix}: " + "; ".join(problems) + f". {fix}")
