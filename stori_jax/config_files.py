"""Loading a config file (a Python file with `get_config()`) from code: a config built on
another, or a test checking a config."""

from __future__ import annotations

import importlib.util
import os

import ml_collections

from stori_jax.errors import UserError


class ConfigError(UserError, ValueError):
  """A bad value in a config (the message names the field and what to write instead); command
  lines print it without a traceback."""


def load_config(path: str | os.PathLike, argument: str | None = None) -> ml_collections.ConfigDict:
  """`get_config()` of the config file at `path` (`get_config(argument)` when given), as
  `--config path[:argument]` would build it."""
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"no config file {path}")
  name = "_config_" + os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config() if argument is None else module.get_config(argument)


def sibling_config(config_file: str, name: str, argument: str | None = None):
  """The config `name`.py in the folder of `config_file` (pass `__file__`)."""
  folder = os.path.dirname(os.path.abspath(config_file))
  return load_config(os.path.join(folder, f"{name}.py"), argument)
