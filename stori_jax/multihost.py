"""Barriers between the processes of a multi-host run.

JAX's CPU collectives (gloo) give a process 30 s, not configurable, to meet the others at the
first collective of a device group; processes that reach it further apart (one still importing
or encoding on a loaded host) fail with `Gloo context initialization failed`. A barrier on the
distributed runtime's key-value store, whose timeout is ours, lines the processes up first.
"""

from __future__ import annotations

import jax

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
