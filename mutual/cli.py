"""Command-line plumbing shared by `python -m mutual.analyze / evaluate / sweep`.

Each runs under `stori_jax.cli.run`: a user's mistake (a missing or malformed file, classes that
do not match, a bad config value, a workdir made by another run) prints one paragraph and exits
2; the project's own bugs keep their traceback. A workdir belongs to the run that made it
(`stori_jax.run_identity`): the same command reruns there, another config stops before any
work unless `--restart` moves the old run aside.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Callable

import ml_collections
from absl import app, flags
from ml_collections import config_flags

from stori_jax import run_identity
from stori_jax.cli import require_flags
from stori_jax.errors import UserError


def define_flags(kind: str) -> None:
  """--config (a config file, locked), --workdir and --restart. Called only when run as a
  program: tests and other code import the command modules (for `run`), and importing must not
  claim flags."""
  config_flags.DEFINE_config_file("config", None, f"{kind} config file.", lock_config=True)
  flags.DEFINE_string("workdir", None, "Output directory.")
  flags.DEFINE_bool(
    "restart",
    False,
    "If the workdir holds a run with other settings, move it aside (to <workdir>.old-<time>) "
    "and start afresh instead of stopping.",
  )


def _file_digest(path: str) -> str | None:
  try:
    with open(path, "rb") as f:
      return hashlib.sha256(f.read()).hexdigest()
  except OSError:
    return None


def claim_workdir(config: ml_collections.ConfigDict, workdir: str, restart: bool, what: str):
  """Records the run's identity in `workdir` (see stori_jax.run_identity.claim_workdir).

  The identity is the command (`what`), the resolved config and the content of the descriptor
  file it names, since editing that file changes the results as much as the config does.
  Prints where an old run went.
  """
  # The command too: an analysis workdir is no place for an evaluation's files.
  identity: dict[str, Any] = {"command": what, "config": config}
  data = config.get("data")
  if data is not None and data.get("source") != "synthetic" and data.get("descriptors"):
    identity["data"] = {"descriptors_sha256": _file_digest(data.descriptors)}
  moved = run_identity.claim_workdir(workdir, identity, restart=restart, what=what)
  if moved:
    print(f"Moved the old run in {workdir} to {moved} (--restart).")
  return moved


def run_from_flags(
  argv: list[str],
  run: Callable[..., Any],
  usage: str,
) -> tuple[ml_collections.ConfigDict, str, Any]:
  """Runs `run(config, workdir, restart=...)` from the flags; returns (config, workdir, results).

  Missing flags are a user error naming an example command; a missing optional dependency
  (ImportError) is reported as one too, with the message that says what to install.
  """
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  require_flags("config", "workdir", example=usage)
  config, workdir = flags.FLAGS.config, os.path.expanduser(flags.FLAGS.workdir)
  try:
    results = run(config, workdir, restart=flags.FLAGS.restart)
  except ImportError as error:
    raise UserError(str(error)) from None
  return config, workdir, results
