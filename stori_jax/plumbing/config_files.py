"""Config files and their values: loading a config file (a Python file with `get_config()`)
from code (a config built on another, or a test checking a config), and `ConfigChecks`, which
checks every value of a config for type and range before a run starts."""

from __future__ import annotations

import difflib
import importlib.util
import math
import numbers
import os
from typing import Any, Mapping, Sequence

import ml_collections

from stori_jax.plumbing import paths
from stori_jax.plumbing.errors import UserError

_MISSING = object()


class ConfigError(UserError, ValueError):
  """A bad value in a config (the message names the field and what to write instead); command
  lines print it without a traceback."""


def load_config(path: str | os.PathLike, argument: str | None = None) -> ml_collections.ConfigDict:
  """`get_config()` of the config file at `path` (`get_config(argument)` when given), as
  `--config path[:argument]` would build it."""
  path = os.fspath(path)
  if not paths.isfile(path):
    raise FileNotFoundError(f"no config file {path}")
  path = paths.local_copy(path, expect="file")  # a URL (gs://): Python imports a local copy
  name = "_config_" + os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config() if argument is None else module.get_config(argument)


def sibling_config(config_file: str, name: str, argument: str | None = None):
  """The config `name`.py in the folder of `config_file` (pass `__file__`)."""
  folder = os.path.dirname(os.path.abspath(config_file))
  return load_config(os.path.join(folder, f"{name}.py"), argument)


def _signature(fields: Mapping[str, Any]) -> str:
  return ",".join(
    f"{name}={'|'.join(map(str, default)) if isinstance(default, tuple) else default}"
    for name, default in fields.items()
  )


def _typed(name: str, text: str, default: Any, problem) -> Any:
  if isinstance(default, tuple):
    if text not in default:
      problem(f"{name} must be one of {', '.join(repr(c) for c in default)}, got {text!r}")
    return text
  if isinstance(default, bool):
    if text.lower() not in ("true", "false"):
      problem(f"{name} must be True or False, got {text!r}")
    return text.lower() == "true"
  if isinstance(default, (int, float)):
    try:
      return type(default)(text)
    except ValueError:
      problem(
        f"{name} must be {'an integer' if isinstance(default, int) else 'a number'}, got {text!r}"
      )
  return text


def config_arguments(argument: str | None, config_file: str, **fields) -> dict[str, Any]:
  """The values of a config file's argument (`--config file.py:ARGUMENT`, `get_config(ARGUMENT)`).

  ARGUMENT is comma-separated `name=value` items; leading items may leave out `name=` and then
  fill the fields in order (configs/mutual_sweep.py's `:random` is `:variant=random`). Each
  field's default gives its type (str, int, float or bool); a tuple default lists the allowed
  strings, its first being the default.

  Args:
    argument: the text after ':' (None or "": every default).
    config_file: the config file's path (pass `__file__`), for messages.
    **fields: name -> default, in positional order.

  Returns:
    {name: value} for every field.

  Raises:
    ConfigError: an unknown or repeated name, a positional value after a named one or beyond the
      fields, a value of the wrong type or not allowed (all named in one message).
  """
  where = f"configs/{os.path.basename(config_file)}"
  problems: list[str] = []
  values = {n: d[0] if isinstance(d, tuple) else d for n, d in fields.items()}
  given: set[str] = set()
  names = list(fields)
  named = False
  for position, item in enumerate(i.strip() for i in (argument or "").split(",") if i.strip()):
    name, eq, text = item.partition("=")
    if eq:
      named, name, text = True, name.strip(), text.strip()
    elif named or position >= len(names):
      problems.append(f"{item!r} needs a name (name=value)")
      continue
    else:
      name, text = names[position], item
    if name not in fields:
      problems.append(f"unknown name {name!r}")
      continue
    if name in given:
      problems.append(f"{name} is given twice")
    given.add(name)
    values[name] = _typed(name, text, fields[name], problems.append)
  if problems:
    raise ConfigError(
      f"{where} takes :{_signature(fields)}, got {argument!r}: " + "; ".join(problems) + "."
    )
  return values


def _is_number(value: Any) -> bool:
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _bound_text(minimum, maximum, above) -> str:
  parts = []
  if above is not None:
    parts.append(f"> {above:g}")
  if minimum is not None:
    parts.append(f">= {minimum:g}")
  if maximum is not None:
    parts.append(f"<= {maximum:g}")
  return " and ".join(parts)


class ConfigChecks:
  """Checks a config's values for type and range before any work, then reports every bad value
  in one ConfigError (so that one run names all the fixes, not one per attempt).

  Each check takes a dotted key ("optim.lr") and returns the value (None when it is bad or
  missing). Example::

    checks = ConfigChecks(config)
    checks.integer("epochs", minimum=1)
    checks.number("optim.lr", above=0)
    checks.choice("method", ("stori", "taskres"))
    checks.raise_if_any()
  """

  def __init__(self, config: Any, name: str = "config"):
    self.config = config
    self.name = name
    self.problems: list[str] = []

  def problem(self, message: str) -> None:
    """Records a problem found by the caller (a check across several fields)."""
    self.problems.append(message)

  def get(self, key: str, default: Any = _MISSING) -> Any:
    """The value at dotted `key`; a missing key is a problem (or returns `default`)."""
    node = self.config
    for part in key.split("."):
      try:
        node = node[part]
      except (KeyError, TypeError, AttributeError):
        if default is not _MISSING:
          return default
        self.problem(f"{self.name}.{key} is missing")
        return _MISSING
    return node

  def _bad(self, key: str, expected: str, value: Any) -> None:
    self.problem(f"{self.name}.{key} must be {expected}, got {value!r}")

  def integer(
    self,
    key: str,
    minimum: int | None = None,
    maximum: int | None = None,
    optional: bool = False,
  ) -> int | None:
    """An int in [minimum, maximum]; None allowed when optional."""
    value = self.get(key)
    if value is _MISSING or (optional and value is None):
      return None
    expected = "an integer" + (
      " " + _bound_text(minimum, maximum, None)
      if (minimum is not None or maximum is not None)
      else ""
    )
    if optional:
      expected += " (or None)"
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    ok = ok and (minimum is None or value >= minimum) and (maximum is None or value <= maximum)
    if not ok:
      self._bad(key, expected, value)
      return None
    return int(value)

  def _number_ok(self, value, minimum, maximum, above) -> bool:
    return (
      _is_number(value)
      and math.isfinite(value)
      and (minimum is None or value >= minimum)
      and (maximum is None or value <= maximum)
      and (above is None or value > above)
    )

  def number(
    self,
    key: str,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
  ) -> float | None:
    """A finite int or float in range (`above`: strictly greater than)."""
    value = self.get(key)
    if value is _MISSING:
      return None
    if not self._number_ok(value, minimum, maximum, above):
      bounds = _bound_text(minimum, maximum, above)
      self._bad(key, "a finite number" + (" " + bounds if bounds else ""), value)
      return None
    return float(value)

  def numbers(
    self,
    key: str,
    minimum: float | None = None,
    maximum: float | None = None,
    count: int | None = None,
    nonempty: bool = True,
  ) -> tuple[float, ...] | None:
    """A sequence (tuple or list) of finite numbers in range, of `count` items if given."""
    value = self.get(key)
    if value is _MISSING:
      return None
    ok = isinstance(value, (tuple, list)) and all(
      self._number_ok(v, minimum, maximum, None) for v in value
    )
    ok = ok and (count is None or len(value) == count) and (not nonempty or len(value) > 0)
    if not ok:
      bounds = _bound_text(minimum, maximum, None)
      size = f"{count} " if count is not None else ("one or more " if nonempty else "")
      self._bad(key, f"a tuple of {size}finite numbers" + (f" {bounds}" if bounds else ""), value)
      return None
    return tuple(float(v) for v in value)

  def integers(
    self,
    key: str,
    minimum: int | None = None,
    count: int | None = None,
    nonempty: bool = True,
    distinct: bool = False,
  ) -> tuple[int, ...] | None:
    """A sequence (tuple or list) of ints >= minimum, of `count` items if given."""
    value = self.get(key)
    if value is _MISSING:
      return None
    ok = isinstance(value, (tuple, list)) and all(
      isinstance(v, numbers.Integral)
      and not isinstance(v, bool)
      and (minimum is None or v >= minimum)
      for v in value
    )
    ok = ok and (count is None or len(value) == count) and (not nonempty or len(value) > 0)
    ok = ok and (not distinct or len(set(value)) == len(value))
    if not ok:
      size = f"{count} " if count is not None else ("one or more " if nonempty else "")
      expected = f"a tuple of {size}{'distinct ' if distinct else ''}integers"
      self._bad(key, expected + (f" >= {minimum}" if minimum is not None else ""), value)
      return None
    return tuple(int(v) for v in value)

  def choice(self, key: str, choices: Sequence[str]) -> str | None:
    """One of `choices` (the nearest named when it is not)."""
    value = self.get(key)
    if value is _MISSING:
      return None
    if value not in choices:
      known = ", ".join(repr(c) for c in choices)
      near = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
      hint = f" (did you mean {near[0]!r}?)" if near else ""
      self.problem(f"{self.name}.{key} must be one of {known}, got {value!r}{hint}")
      return None
    return value

  def subset(self, key: str, choices: Sequence[str], nonempty: bool = True):
    """A tuple or list of distinct items of `choices`."""
    value = self.get(key)
    if value is _MISSING:
      return None
    ok = isinstance(value, (tuple, list)) and all(v in choices for v in value)
    ok = ok and len(set(value)) == len(value) and (not nonempty or len(value) > 0)
    if not ok:
      known = ", ".join(repr(c) for c in choices)
      self._bad(
        key, f"a tuple of {'one or more ' if nonempty else ''}distinct items of {known}", value
      )
      return None
    return tuple(value)

  def text(self, key: str, nonempty: bool = False) -> str | None:
    """A string (non-empty if asked)."""
    value = self.get(key)
    if value is _MISSING:
      return None
    if not isinstance(value, str) or (nonempty and not value.strip()):
      self._bad(key, "a non-empty string" if nonempty else "a string", value)
      return None
    return value

  def boolean(self, key: str) -> bool | None:
    value = self.get(key)
    if value is _MISSING:
      return None
    if not isinstance(value, bool):
      self._bad(key, "True or False", value)
      return None
    return value

  def raise_if_any(self) -> None:
    """Raises one ConfigError naming every problem found (nothing has run yet)."""
    if self.problems:
      raise ConfigError(
        f"invalid {self.name}: " + "; ".join(self.problems) + ". Nothing was run: fix the "
        f"value(s) in the config file or on the command line (--{self.name}.KEY=VALUE)."
      )
