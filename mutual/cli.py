"""Command-line plumbing shared by `python -m mutual.analyze / evaluate / sweep`."""

from __future__ import annotations

from typing import Any, Callable

import ml_collections
from absl import app, flags
from ml_collections import config_flags

from stori_jax.fewshot.datasets import DatasetMissingError


def define_flags(kind: str) -> None:
  """--config (a config file, locked) and --workdir. Called only when run as a program: the
  config files import the modules for their defaults, and importing must not claim flags."""
  config_flags.DEFINE_config_file("config", None, f"{kind} config file.", lock_config=True)
  flags.DEFINE_string("workdir", None, "Output directory.")


def run_from_flags(
  argv: list[str],
  run: Callable[[ml_collections.ConfigDict, str], Any],
  usage: str,
  expected_errors: tuple[type[Exception], ...] = (),
) -> tuple[ml_collections.ConfigDict, str, Any]:
  """Runs `run(config, workdir)` from the flags; returns (config, workdir, results).

  Missing flags print `usage`; a missing dataset or optional dependency (and any of
  `expected_errors`, whose messages say what to fix) ends the program with its message
  instead of a traceback.
  """
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  config, workdir = flags.FLAGS.config, flags.FLAGS.workdir
  if config is None or not workdir:
    raise SystemExit(f"Usage: {usage}")
  try:
    results = run(config, workdir)
  except (DatasetMissingError, ImportError, *expected_errors) as error:
    raise SystemExit(str(error)) from None
  return config, workdir, results
