"""Multi-process runs: the flags that start one, and barriers between its processes.

Commands that run on several hosts (stori_jax.train, mutual.analyze) define `define_flags` and
call `initialize_from_flags` first. `launch/` starts the processes (a TPU pod, SLURM, or
several local processes for tests).

JAX's CPU collectives (gloo) give a process 30 s, not configurable, to meet the others at the
first collective of a device group; processes that reach it further apart (one still importing
or encoding on a loaded host) fail with `Gloo context initialization failed`. A barrier on the
distributed runtime's key-value store, whose timeout is ours, lines the processes up first.

The processes of one run must run the same run: at the workdir claim they compare their
resolved configs and identities (`claim_on_process_zero`) and all stop with one message if any
differs. Barriers time out in minutes, naming the process that did not come.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any, Callable, TypeVar

import jax
from absl import flags

from stori_jax.plumbing import jsonio
from stori_jax.plumbing.errors import UserError

T = TypeVar("T")

#: Seconds a process waits at a barrier for the others (e.g. a slow host still encoding a
#: dataset) before it stops naming the missing ones; $STORI_BARRIER_TIMEOUT_S overrides it.
BARRIER_TIMEOUT_S = 900
#: Seconds the processes have to meet at the workdir claim: only start-up (imports, the config,
#: hashing the model's files) comes before it.
CLAIM_TIMEOUT_S = 300
_KEY_PREFIX = "stori_jax"


class ProcessMissingError(UserError):
  """A process of a multi-process run did not reach a barrier in time (stopped or hung)."""


class ProcessesDisagreeError(UserError):
  """The processes of one run were started with other configs, files or workdir states."""


def _timeout(default_s: int) -> int:
  """`default_s`, or $STORI_BARRIER_TIMEOUT_S when it is set (a slow cluster)."""
  value = os.environ.get("STORI_BARRIER_TIMEOUT_S", "")
  return int(value) if value.strip().isdigit() and int(value) > 0 else default_s


def _client():
  """The distributed runtime's client (its key-value store and barriers)."""
  from jax._src import distributed  # lazy: jax's private module, read only in a distributed run

  client = distributed.global_state.client
  if client is None:
    raise RuntimeError("a multi-process run without jax.distributed.initialize()")
  return client


def _processes(indices) -> str:
  indices = sorted(indices)
  if len(indices) == 1:
    return f"process {indices[0]}"
  return "processes " + ", ".join(str(i) for i in indices[:-1]) + f" and {indices[-1]}"


def _missing_error(name: str, missing, timeout_s: int) -> ProcessMissingError:
  count = jax.process_count()
  return ProcessMissingError(
    f"{_processes(missing) if missing else 'a process'} of the run's {count} did not reach "
    f"'{name}' within {timeout_s} s (this is process {jax.process_index()}): it stopped (its "
    "own output says why), hangs, or is much slower than this one, so this process stopped "
    "too rather than wait for it. Fix or stop that process and start all of them again (a "
    "training run resumes from its last checkpoint); a host that is only slow can be given "
    "longer with STORI_BARRIER_TIMEOUT_S=<seconds>."
  )


def wait_for_all_processes(name: str, timeout_s: int | None = None) -> None:
  """Blocks until every process of the run has called this with the same `name` (unique per
  barrier); returns at once in a single-process run.

  Raises:
    ProcessMissingError: some process did not come within `timeout_s` (default
      BARRIER_TIMEOUT_S, or $STORI_BARRIER_TIMEOUT_S); the message names which.
  """
  count = jax.process_count()
  if count == 1:
    return
  timeout_s = _timeout(BARRIER_TIMEOUT_S) if timeout_s is None else timeout_s
  client = _client()
  # Arrivals are recorded apart from the barrier, so that a timeout can name who is missing.
  arrived_dir = f"{_KEY_PREFIX}/arrived/{name}/"
  client.key_value_set(f"{arrived_dir}{jax.process_index()}", "1", allow_overwrite=True)
  try:
    client.wait_at_barrier(f"{_KEY_PREFIX}/barrier/{name}", timeout_s * 1000)
  except Exception as error:  # pylint: disable=broad-except  # jax's XlaRuntimeError
    try:
      arrived = {
        int(key.rstrip("/").rsplit("/", 1)[-1]) for key, _ in client.key_value_dir_get(arrived_dir)
      }
      missing = sorted(set(range(count)) - arrived)
    except Exception:  # pylint: disable=broad-except  # the coordinator itself is gone
      missing = [0] if jax.process_index() != 0 else []
    raise _missing_error(name, missing, timeout_s) from error


def _digest(value: Any) -> str:
  return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def exchange(name: str, value: Any, timeout_s: int | None = None) -> list[Any]:
  """Every process's JSON-able `value`, in process order (through the distributed runtime's
  key-value store; no device collective, so none of gloo's fixed 30 s limits); [value] in a
  single-process run.

  Raises:
    ProcessMissingError: a process did not share its value within `timeout_s`.
  """
  count = jax.process_count()
  if count == 1:
    return [value]
  timeout_s = _timeout(CLAIM_TIMEOUT_S) if timeout_s is None else timeout_s
  client = _client()
  key = f"{_KEY_PREFIX}/exchange/{name}/"
  client.key_value_set(f"{key}{jax.process_index()}", json.dumps(value), allow_overwrite=True)
  deadline = time.monotonic() + timeout_s
  values = []
  for index in range(count):
    left_ms = max(1000, int((deadline - time.monotonic()) * 1000))
    try:
      values.append(json.loads(client.blocking_key_value_get(f"{key}{index}", left_ms)))
    except Exception as error:  # pylint: disable=broad-except  # jax's XlaRuntimeError
      raise _missing_error(name, [index], timeout_s) from error
  # No process goes on (or exits, taking the coordinator with it) while another still reads.
  wait_for_all_processes(f"{name}: exchanged", timeout_s)
  return values


def disagreement(identities: list[Any]) -> str | None:
  """None when every process's identity equals process 0's; else the paragraph that names the
  first process that differs and the first keys where it does."""
  digests = [_digest(identity) for identity in identities]
  differing = [i for i, d in enumerate(digests) if d != digests[0]]
  if not differing:
    return None
  index = differing[0]
  first, other = identities[0], identities[index]
  if isinstance(first, dict) and isinstance(other, dict):
    diffs = jsonio.differences(first, other)
    shown = "; ".join(
      f"{key}: {a!r} on process 0, {b!r} on process {index}" for key, a, b in diffs[:5]
    )
    more = f"; and {len(diffs) - 5} more" if len(diffs) > 5 else ""
    detail = f" ({shown}{more})"
  else:
    detail = ""
  also = [i for i in differing if i != index]
  others = f" ({_processes(also)} differ too)" if also else ""
  return (
    f"the {len(identities)} processes of this run were not started alike: process {index}'s "
    f"run differs from process 0's{detail}{others}. They would train or analyse different "
    "runs under one workdir and wait on each other's steps, so every process stopped before "
    "any work. Start all processes with the same command line, config overrides and files "
    "(only --process_id differs)."
  )


def claim_on_process_zero(claim: Callable[[bool], T], name: str) -> T | None:
  """Claims a run's workdir once for all processes: `claim(check_only)` (e.g. a partial of
  run_identity.claim_workdir) first checks on every process, before anything is written; then
  the processes compare the identities their checks return (`claim(True)`: the resolved config
  and the contents that decide the results) and the checks' outcomes, so that
  processes started with other flags, or a workdir refused on one process only, stop every
  process alike with one message instead of a run recorded under the wrong config or a hang
  (ProcessesDisagreeError); then process 0 claims while the others wait. (A process that
  checked while process 0 was writing run.json could see the temporary file without run.json
  and refuse a workdir that is fine.) Returns process 0's claim result (None elsewhere); in a
  single-process run just `claim(False)`."""
  if jax.process_count() == 1:
    return claim(False)
  failure: Exception | None = None
  identity = None
  try:
    identity = claim(True)
  except Exception as error:  # pylint: disable=broad-except  # shared, then raised
    failure = error
  outcome = {
    "identity": identity,
    "error": None if failure is None else str(failure) or type(failure).__name__,
  }
  outcomes = exchange(f"{name}: workdir checked", outcome)
  # A refused check says why (a busy or mismatched workdir); comparing its missing identity
  # with the others' would blame the command line instead.
  if failure is not None:
    raise failure
  refused = [i for i, o in enumerate(outcomes) if o["error"] is not None]
  if not refused:
    problem = disagreement([o["identity"] for o in outcomes])
    if problem is not None:
      raise ProcessesDisagreeError(problem) from None
  if refused:
    raise ProcessesDisagreeError(
      f"{_processes(refused)} of this run stopped at the workdir check, so this process "
      f"(process {jax.process_index()}) stopped too: {outcomes[refused[0]]['error']}"
    )
  result = claim(False) if jax.process_index() == 0 else None
  wait_for_all_processes(f"{name}: workdir claimed", _timeout(CLAIM_TIMEOUT_S))
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
