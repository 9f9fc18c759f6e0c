"""Multi-process runs: the flags that start one, and barriers between its processes.

Commands that run on several hosts (stori_jax.train, mutual.analyze) define `define_flags` and
call `initialize_from_flags` first. `launch/` starts the processes (a TPU pod, SLURM, or
several local processes for tests).

JAX's CPU collectives (gloo) give a process 30 s, not configurable, to meet the others at the
first collective of a device group; processes that reach it further apart (one still importing
or encoding on a loaded host) fail with `Gloo context initialization failed`. A barrier on the
distributed runtime's key-value store, whose timeout is ours, lines the processes up first.
"""

from __future__ import annotations

from typing import Callable, TypeVar

import jax
from absl import flags

T = TypeVar("T")

# Long enough for a slow host to finish encoding a dataset.
BARRIER_TIMEOUT_S = 3600


def wait_for_all_processes(name: str, timeout_s: int = BARRIER_TIMEOUT_S) -> None:
  """Blocks until every process of the run has called this with the same `name` (unique per
  barrier); returns at once in a single-process run."""
  if jax.process_count() == 1:
    return
  from orbax.checkpoint import multihost  # pylint: disable=import-outside-toplevel

  multihost.sync_global_processes(
    name, timeout=timeout_s, processes=set(range(jax.process_count()))
  )


def claim_on_process_zero(claim: Callable[[bool], T], name: str) -> T | None:
  """Claims a run's workdir once for all processes: `claim(check_only)` (e.g. a partial of
  run_identity.claim_workdir) first checks on every process, before anything is written, so
  that a refused workdir stops all of them alike with the same message; then process 0 claims
  while the others wait. (A process that checked while process 0 was writing run.json could
  see the temporary file without run.json and refuse a workdir that is fine.) Returns process
  0's claim result (None elsewhere); in a single-process run just `claim(False)`."""
  if jax.process_count() == 1:
    return claim(False)
  claim(True)
  wait_for_all_processes(f"{name}: workdir checked")
  result = claim(False) if jax.process_index() == 0 else None
  wait_for_all_processes(f"{name}: workdir claimed")
  return result


def define_flags(values: flags.FlagValues) -> None:
  """--distributed, --coordinator, --num_processes and --process_id on `values`."""
  fv = {"flag_values": values}
  flags.DEFINE_bool(
    "distributed",
    False,
    "Call jax.distributed.initialize() first: one process per host of a TPU pod or of a SLURM "
    "allocation (auto-detected), or the explicit --coordinator/--num_processes/--process_id.",
    **fv,
  )
  flags.DEFINE_string(
    "coordinator", None, "host:port of process 0 (explicit multi-process runs).", **fv
  )
  flags.DEFINE_integer(
    "num_processes", None, "Processes in the run (explicit multi-process runs).", **fv
  )
  flags.DEFINE_integer(
    "process_id", None, "This process's index (explicit multi-process runs).", **fv
  )


def initialize_from_flags(values: flags.FlagValues) -> None:
  """jax.distributed.initialize from --coordinator/--num_processes/--process_id, or
  auto-detected (TPU pod, SLURM) with --distributed; nothing for a single-process run."""
  if values.coordinator:
    # CPU processes need a collectives backend for cross-process psums (no effect on
    # accelerators). Set before initialize: querying the backend here would start it.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(values.coordinator, values.num_processes, values.process_id)
  elif values.distributed:
    jax.distributed.initialize()
