"""Command-line plumbing shared by `python -m mutual.analyze / evaluate / sweep`.

Each command module defines its flags with `define_run_flags` in its own `define_flags(values)`
(the convention of `stori_jax.plumbing.cli`) and runs through `run_from_flags`.

Each runs under `stori_jax.plumbing.cli.run`: a user's mistake (a missing or malformed file, classes that
do not match, a bad config value, a workdir made by another run) prints one paragraph and exits
2; the project's own bugs keep their traceback. A workdir belongs to the run that made it
(`stori_jax.plumbing.run_identity`): the same command reruns there, another config stops before any
work unless `--restart` moves the old run aside.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import ml_collections
from absl import flags
from ml_collections import config_flags

from mutual import paper_config
from stori_jax.plumbing import run_identity
from stori_jax.plumbing.cli import require_flags
from stori_jax.plumbing.errors import UserError


def define_run_flags(kind: str, values: flags.FlagValues) -> None:
  """--config (a `kind` config file, locked), --workdir and --restart on `values`: the flags
  of every mutual command (their `define_flags`)."""
  fv = {"flag_values": values}
  config_flags.DEFINE_config_file("config", None, f"{kind} config file.", lock_config=True, **fv)
  flags.DEFINE_string("workdir", None, "Output directory.", **fv)
  flags.DEFINE_bool(
    "restart",
    False,
    "If the workdir holds a run with other settings, move it aside (to <workdir>.old-<time>) "
    "and start afresh instead of stopping.",
    **fv,
  )


def _file_digest(path: str) -> str | None:
  try:
    return run_identity.file_digest(path)
  except OSError:
    return None


def identity(config: ml_collections.ConfigDict, what: str) -> dict[str, Any]:
  """What decides a mutual run's results: the command (`what`: an analysis workdir is no place
  for an evaluation's files), the resolved config, the weights under a model path and the
  content of the descriptor file it names (editing it changes the results as much as the
  config does)."""
  found: dict[str, Any] = {"command": what, "config": config}
  if config.get("model") is not None and config.model.get("source"):
    found["model"] = run_identity.content_identity(str(config.model.source))
  data = config.get("data")
  if data is not None and data.get("source") != "synthetic" and data.get("descriptors"):
    found["data"] = {"descriptors_sha256": _file_digest(data.descriptors)}
  return found


def claim_workdir(
  config: ml_collections.ConfigDict, workdir: str, restart: bool, what: str
) -> str | None:
  """Checks config.analysis, once per run, then claims `workdir` for the run's `identity`
  (`stori_jax.plumbing.run_identity.claim_run`: on several processes every process checks, then process
  0 claims). Prints where an old run went; returns that path (--restart), else None."""
  if config.get("analysis") is not None:
    # A bad analysis mode, stage, dtype or chunk would otherwise surface after the model loads.
    paper_config.check_analysis(config.analysis)
  moved = run_identity.claim_run(workdir, identity(config, what), what=what, restart=restart)
  if moved:
    print(f"Moved the old run in {workdir} to {moved} (--restart).")
  return moved


def run_from_flags(
  argv: list[str],
  values: flags.FlagValues,
  run: Callable[..., Any],
  usage: str,
) -> tuple[ml_collections.ConfigDict, str, Any]:
  """Runs `run(config, workdir, restart=...)` from the flags in `values`; returns (config,
  workdir, results).

  Stray arguments and missing flags are user errors naming an example command; a missing
  optional dependency (ImportError) is reported as one too, with the message that says what to
  install.
  """
  if len(argv) > 1:
    raise UserError(
      f"unexpected arguments {argv[1:]}; flags are written --name=value, e.g. {usage}"
    )
  require_flags("config", "workdir", example=usage, values=values)
  config, workdir = values.config, os.path.expanduser(values.workdir)
  try:
    results = run(config, workdir, restart=values.restart)
  except ImportError as error:
    raise UserError(str(error)) from None
  return config, workdir, results
