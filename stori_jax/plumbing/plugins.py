"""Registries of named extension points (few-shot methods, evaluation protocols): name -> one
frozen entry holding everything the rest of the code asks of it, as `models/tower_kinds.py`
holds the image-tower kinds.

A built-in entry registers itself when its module is imported (its package imports it). An
entry defined outside the project is named in a config as `module:name` (`toy_plugins:class_bias`,
`my_lab.methods:prefix_tuning`): the registry imports `module`, whose import registers `name`,
as big_vision finds a model by the module path its config gives. So a new entry is one file and
the line of config that names it.
"""

from __future__ import annotations

import importlib
from typing import Generic, TypeVar

from stori_jax.plumbing.config_files import ConfigError

Entry = TypeVar("Entry")


class Registry(Generic[Entry]):
  """Entries by name; `what` names the kind of entry in messages ("few-shot method"), `where`
  the config key that names one ("config.method")."""

  def __init__(self, what: str, where: str):
    self.what = what
    self.where = where
    self._entries: dict[str, Entry] = {}

  def register(self, entry: Entry) -> Entry:
    """Adds `entry` under `entry.name`; refuses a name another entry holds. Returns the entry."""
    name = entry.name
    if not name or ":" in name:
      raise ValueError(f"A {self.what}'s name must be non-empty and hold no ':', got {name!r}.")
    if self._entries.get(name, entry) is not entry:
      raise ValueError(f"A {self.what} named {name!r} is already registered.")
    self._entries[name] = entry
    return entry

  def unregister(self, name: str) -> None:
    """Removes an entry (tests that register their own)."""
    self._entries.pop(name, None)

  def names(self) -> tuple[str, ...]:
    """The registered names, in registration order."""
    return tuple(self._entries)

  def entries(self) -> tuple[Entry, ...]:
    """The registered entries, in registration order."""
    return tuple(self._entries.values())

  def find(self, name: str) -> Entry | None:
    """The entry registered as `name` (or, for `module:name`, as `name`), or None; imports
    nothing (for labels of results whose entry may not be loaded)."""
    return self._entries.get(name.rpartition(":")[2])

  def get(self, name: str) -> Entry:
    """The entry `name`, or for `module:name` the entry `name` that importing `module`
    registers.

    Raises:
      ConfigError: no such entry, or the module cannot be imported (the message names the
        registered entries and how to add one).
    """
    if not isinstance(name, str):
      raise ConfigError(f"{self.where} must be the name of a {self.what}, got {name!r}.")
    module, _, short = name.rpartition(":")
    if module:
      try:
        importlib.import_module(module)
      except ImportError as error:
        raise ConfigError(
          f"{self.where} is {name!r}, but its module {module!r} cannot be imported ({error}); "
          f"give `module:name` with a module on the Python path, or one of the registered "
          f"{self.what}s {list(self._entries)}."
        ) from None
    if short not in self._entries:
      where = f"importing {module!r} registers none of that name; " if module else ""
      raise ConfigError(
        f"{self.where} is {name!r}: unknown {self.what}; {where}the registered ones are "
        f"{list(self._entries)}. A {self.what} defined in a module of your own is named "
        f"`module:name` (the module registers it when imported)."
      )
    return self._entries[short]
