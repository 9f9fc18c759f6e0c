"""Counting XLA compilations and separating host time from device time inside a block of code.

  with profiling.compilations() as compiled, profiling.host_clock() as clock:
    run()
  compiled.count, compiled.seconds     # XLA backend compilations inside, and their seconds
  clock.host_seconds, clock.wall_seconds, clock.device_seconds

Compilations are read from `jax.monitoring` duration events (the backend compile of every
jitted program, including the ones `.lower().compile()` asks for; a program served by the
in-memory cache records none; one served by the persistent compilation cache records none
either: it is no compilation). A listener can't be unregistered in every JAX release, so one
listener is registered on first use and routes events to the counters active at the time (any
thread's compilations count: a counter is for a block, not for a thread).

The host clock is `time.thread_time()` of the calling thread: the CPU seconds that thread runs
Python, dispatch, tracing, compilation and host-side numpy. Device executions run on XLA's own
threads (the CPU backend's too), and a thread that waits for them (`block_until_ready`, reading
an array) sleeps, which is no CPU time, so `wall - host` is the time the caller spent waiting:
for the device in a program that keeps nothing else on the caller's critical path. Measured
(JAX 0.10.2, XLA:CPU, 2 shared cores): a jitted chain of ten 2048 x 2048 fp32 products took
1.02 s of wall time and 0.5 ms of the caller's thread time, whether the caller blocked on it
(`block_until_ready`) or read it (`np.asarray`); `tests/test_profiling.py` checks it. XLA's
backend compilation runs on its own threads too (measured on XLA:CPU: a 7.7 s compilation
cost the caller 0.04 s of thread time), so a block that compiles shows the compilation in
wall - host: subtract `Compilations.seconds` for the device's share. Caveats: time the thread
is runnable but not scheduled (a busy machine) also counts as wall - host, and host work done
on other threads (a thread pool of the caller's) is not host time here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from typing import Iterator

import jax

#: jax.monitoring duration events (jax/_src/dispatch.py): an XLA backend compilation, the
#: lowering of a jaxpr to an MLIR module and the tracing of a function to a jaxpr.
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
LOWERING_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"
TRACING_EVENT = "/jax/core/compile/jaxpr_trace_duration"


@dataclasses.dataclass(eq=False)  # counters are told apart by identity
class Compilations:
  """What compiled while the counter was active.

  count: XLA backend compilations (int); seconds: their total duration (float). Also the
  seconds spent lowering (jaxpr to MLIR) and tracing (Python to jaxpr), whose work precedes a
  compilation but also happens alone (a retrace that hits the compilation cache). programs:
  (name, seconds) of each compilation in order, the name being the jitted function's (`jit(f)`;
  an eager op outside jit compiles a program named after the op, e.g. `jit(broadcast_in_dim)`;
  "?" where the JAX release does not pass the name with the event)."""

  count: int = 0
  seconds: float = 0.0
  lowering_seconds: float = 0.0
  tracing_seconds: float = 0.0
  programs: list[tuple[str, float]] = dataclasses.field(default_factory=list)

  def by_name(self) -> dict[str, dict]:
    """{program name: {"count", "seconds"}}, the most compiled first."""
    out: dict[str, dict] = {}
    for name, seconds in self.programs:
      entry = out.setdefault(name, {"count": 0, "seconds": 0.0})
      entry["count"] += 1
      entry["seconds"] += seconds
    ordered = sorted(out.items(), key=lambda item: (-item[1]["count"], -item[1]["seconds"]))
    return {name: dict(count=e["count"], seconds=round(e["seconds"], 4)) for name, e in ordered}

  def as_dict(self, programs: bool = False) -> dict:
    """The totals; with `programs`, also `by_name()` under "programs"."""
    out = dict(
      count=self.count,
      seconds=round(self.seconds, 4),
      lowering_seconds=round(self.lowering_seconds, 4),
      tracing_seconds=round(self.tracing_seconds, 4),
    )
    if programs:
      out["programs"] = self.by_name()
    return out


_lock = threading.Lock()
_active: list[Compilations] = []
_registered = False


def _listener(event: str, duration: float, *args, **kwargs) -> None:
  del args  # JAX passes event tags as keywords (fun_name: the program's name)
  if event not in (BACKEND_COMPILE_EVENT, LOWERING_EVENT, TRACING_EVENT):
    return
  with _lock:
    for counter in _active:
      if event == BACKEND_COMPILE_EVENT:
        counter.count += 1
        counter.seconds += float(duration)
        counter.programs.append((str(kwargs.get("fun_name", "?")), float(duration)))
      elif event == LOWERING_EVENT:
        counter.lowering_seconds += float(duration)
      else:
        counter.tracing_seconds += float(duration)


def _register() -> None:
  global _registered
  with _lock:
    if not _registered:
      jax.monitoring.register_event_duration_secs_listener(_listener)
      _registered = True


@contextlib.contextmanager
def compilations() -> Iterator[Compilations]:
  """Counts the XLA compilations (and their seconds) of any thread while the block runs.
  Counters nest: an inner block's compilations count in the outer one too."""
  _register()
  counter = Compilations()
  with _lock:
    _active.append(counter)
  try:
    yield counter
  finally:
    with _lock:
      _active.remove(counter)


@dataclasses.dataclass
class HostClock:
  """host_seconds: CPU time of the thread that opened the block (time.thread_time());
  wall_seconds: its wall time (time.perf_counter()); device_seconds: wall - host, the time the
  thread waited (for device executions, see the module docstring). Running totals until the
  block ends; `split` adds a block's figures to an accumulating clock."""

  host_seconds: float = 0.0
  wall_seconds: float = 0.0

  @property
  def device_seconds(self) -> float:
    return max(0.0, self.wall_seconds - self.host_seconds)

  @contextlib.contextmanager
  def split(self) -> Iterator["HostClock"]:
    """Adds the host and wall seconds of the block to this clock."""
    host, wall = time.thread_time(), time.perf_counter()
    try:
      yield self
    finally:
      self.host_seconds += time.thread_time() - host
      self.wall_seconds += time.perf_counter() - wall

  def as_dict(self) -> dict:
    return dict(
      host_seconds=round(self.host_seconds, 4),
      wall_seconds=round(self.wall_seconds, 4),
      device_seconds=round(self.device_seconds, 4),
    )


@contextlib.contextmanager
def host_clock() -> Iterator[HostClock]:
  """A HostClock of the block (the calling thread's CPU seconds and the wall seconds)."""
  clock = HostClock()
  with clock.split():
    yield clock
