"""Counting XLA compilations and separating host time from device time inside a block of code.

  with profiling.compilations() as compiled, profiling.host_clock() as clock:
    run()
  compiled.count, compiled.seconds     # XLA backend compilations inside, and their seconds
  clock.host_seconds, clock.wall_seconds, clock.device_seconds

Compilations are read from `jax.monitoring` duration events (the backend compile of every
jitted program, including the ones `.lower().compile()` asks for; a program served by the
in-memory cache records none). A program read from JAX's persistent compilation cache records
the same duration event (JAX 0.10.2 times `compile_or_get_cached`, a cache read included),
preceded on the same thread by a cache-hit event: it counts under `from_cache`, not as a
compilation. A listener can't be unregistered in every JAX release, so one
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
import os
import sys
import threading
import time
from typing import Iterator

import jax
from jax.experimental.compilation_cache import compilation_cache

#: jax.monitoring duration events (jax/_src/dispatch.py): an XLA backend compilation, the
#: lowering of a jaxpr to an MLIR module and the tracing of a function to a jaxpr.
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
LOWERING_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"
TRACING_EVENT = "/jax/core/compile/jaxpr_trace_duration"
#: jax.monitoring event (jax/_src/compiler.py): a program read from the persistent compilation
#: cache, recorded just before its BACKEND_COMPILE_EVENT on the same thread.
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


@dataclasses.dataclass(eq=False)  # counters are told apart by identity
class Compilations:
  """What compiled while the counter was active.

  count: XLA backend compilations (int); seconds: their total duration (float); from_cache:
  programs read from the persistent compilation cache instead (int), cache_seconds: the
  seconds those reads took (a program is compiled or read: `count + from_cache` programs were
  needed). Also the
  seconds spent lowering (jaxpr to MLIR) and tracing (Python to jaxpr), whose work precedes a
  compilation but also happens alone (a retrace that hits the compilation cache). programs:
  (name, seconds) of each compilation in order, the name being the jitted function's (`jit(f)`;
  an eager op outside jit compiles a program named after the op, e.g. `jit(broadcast_in_dim)`;
  "?" where the JAX release does not pass the name with the event)."""

  count: int = 0
  seconds: float = 0.0
  lowering_seconds: float = 0.0
  tracing_seconds: float = 0.0
  from_cache: int = 0
  cache_seconds: float = 0.0
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
      from_cache=self.from_cache,
      cache_seconds=round(self.cache_seconds, 4),
    )
    if programs:
      out["programs"] = self.by_name()
    return out


_lock = threading.Lock()
_active: list[Compilations] = []
_registered = False
_thread = threading.local()  # .cache_hit: the next backend event of this thread was a read


def _hit_listener(event: str, *args, **kwargs) -> None:
  del args, kwargs
  if event == CACHE_HIT_EVENT:
    _thread.cache_hit = True


def _listener(event: str, duration: float, *args, **kwargs) -> None:
  del args  # JAX passes event tags as keywords (fun_name: the program's name)
  if event not in (BACKEND_COMPILE_EVENT, LOWERING_EVENT, TRACING_EVENT):
    return
  hit = False
  if event == BACKEND_COMPILE_EVENT:
    hit, _thread.cache_hit = getattr(_thread, "cache_hit", False), False
  with _lock:
    for counter in _active:
      if event == BACKEND_COMPILE_EVENT and hit:
        counter.from_cache += 1
        counter.cache_seconds += float(duration)
      elif event == BACKEND_COMPILE_EVENT:
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
      jax.monitoring.register_event_listener(_hit_listener)
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


# ---------------------------------------------------------------------------------------------
# JAX's persistent compilation cache: every command compiles a program once per machine.

#: Set to 0 / false / off / no / disabled to keep the persistent compilation cache off (as
#: --compilation_cache=false does for one command); 1 / true / on / yes / enabled or unset: on.
CACHE_ENV = "STORI_COMPILATION_CACHE"
_OFF = ("0", "false", "off", "no", "disabled", "disable", "none")
_ON = ("", "1", "true", "on", "yes", "enabled", "enable")
#: Why the last `use_compilation_cache(True)` left the cache off (None: it is on, or was
#: turned off by the caller).
_unusable: str | None = None
#: The state this module last gave JAX's cache, (on, folder), and the folders it set (to tell a
#: user's own jax.config setting from ours).
_applied: tuple[bool, str | None] | None = None
_ours: set[str] = set()


def default_cache_dir() -> str:
  """$XDG_CACHE_HOME/stori_jax/jax_cache, or ~/.cache/stori_jax/jax_cache."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "stori_jax", "jax_cache")


def compilation_cache_default() -> bool:
  """Whether the persistent compilation cache is on unless a flag says otherwise: yes, but
  where $STORI_COMPILATION_CACHE (or JAX's own $JAX_ENABLE_COMPILATION_CACHE) is 0 / false /
  off / no."""
  return all(
    os.environ.get(name, "").strip().lower() not in _OFF
    for name in (CACHE_ENV, "JAX_ENABLE_COMPILATION_CACHE")
  )


def cache_env_problem() -> str | None:
  """The message for a $STORI_COMPILATION_CACHE (or $JAX_ENABLE_COMPILATION_CACHE) that says
  neither on nor off (e.g. a typo that would otherwise leave the cache on), or None."""
  for name in (CACHE_ENV, "JAX_ENABLE_COMPILATION_CACHE"):
    value = os.environ.get(name, "").strip().lower()
    if value not in _OFF + _ON:
      return (
        f"{name}={os.environ[name]!r} says neither on nor off; set it to 0 (or false, off, "
        f"no, disabled) to keep JAX's persistent compilation cache off, to 1 (or true, on, "
        "yes) or leave it unset to use it. Nothing was run."
      )
  return None


def cache_unusable_reason() -> str | None:
  """Why the last `use_compilation_cache(True)` found its folder unusable and left the cache
  off (the folder and the system's words), or None."""
  return _unusable


def _folder_problem(directory: str) -> str | None:
  """Why `directory` cannot hold the cache (it cannot be made, or a file cannot be written in
  it), or None. A URL (a gs:// cache) is JAX's to reach and is not checked here."""
  if "://" in directory:
    return None
  try:
    os.makedirs(directory, exist_ok=True)
    probe = os.path.join(directory, f".stori-write-probe-{os.getpid()}")
    with open(probe, "wb") as f:
      f.write(b"probe")
    os.remove(probe)
  except OSError as error:
    return f"{directory} cannot be written ({error.strerror or error})"
  return None


def use_compilation_cache(enabled: bool = True) -> str | None:
  """Turns JAX's persistent compilation cache on (or off) for what this process compiles next,
  and returns its folder (None when off).

  On: the folder is the user's own (`JAX_COMPILATION_CACHE_DIR`, or jax.config's
  `jax_compilation_cache_dir` set before this call), else `default_cache_dir()`; every program
  is written, however fast it compiled or small it is (`jax_persistent_cache_min_compile_time_
  secs` = 0, `jax_persistent_cache_min_entry_size_bytes` = -1, unless the user's environment
  sets them), so that a second run of the same shapes compiles nothing. XLA:CPU serialises its
  executables too (JAX 0.10.2): the cache works on the CPU. A program is keyed by its HLO, the
  devices, the compile options and the jax / jaxlib versions, so a stale entry is never used.
  Off: `jax_enable_compilation_cache` = False. JAX decides whether to use the cache once per
  process, so a change of the folder or of on / off resets JAX's cache state (a process that
  runs several commands, e.g. tests).
  """
  global _applied, _unusable
  directory = None
  _unusable = None
  if enabled:
    configured = jax.config.jax_compilation_cache_dir
    directory = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    if not directory and configured and configured not in _ours:
      directory = configured  # set in Python before the command
    else:
      directory = directory or default_cache_dir()
      _ours.add(directory)
    _unusable = _folder_problem(directory)
    if _unusable is not None:
      # JAX would only log a warning per program and compile each again: the run goes on
      # without the cache, and says so once (on screen and in compilation.json).
      print(
        f"warning: the compilation cache folder {_unusable}; this run compiles without the "
        "cache. Point JAX_COMPILATION_CACHE_DIR at a writable folder, or set "
        f"{CACHE_ENV}=0 to keep it off.",
        file=sys.stderr,
        flush=True,
      )
      enabled, directory = False, None
    else:
      jax.config.update("jax_compilation_cache_dir", directory)
      if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
      if "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES" not in os.environ:
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
  jax.config.update("jax_enable_compilation_cache", bool(enabled))
  state = (bool(enabled), directory)
  if state != _applied:
    compilation_cache.reset_cache()
    _applied = state
  return directory


def compilation_record(
  compiled: Compilations, cache_dir: str | None, cache_off_reason: str | None = None
) -> dict:
  """What a command's `compilation.json` holds: `programs` (the XLA programs the run needed:
  compiled or read from the persistent cache; one the process had compiled already is none),
  `programs_from_cache`, `programs_compiled`, `compile_seconds` (backend compilations) and
  `cache_read_seconds`, the lowering and tracing seconds, the cache's folder (null: off), why
  it is off (`cache_off_reason`: turned off, or its folder unusable; null when on) and the
  compiled programs by name (the most compiled first)."""
  return dict(
    programs=compiled.count + compiled.from_cache,
    programs_from_cache=compiled.from_cache,
    programs_compiled=compiled.count,
    compile_seconds=round(compiled.seconds, 3),
    cache_read_seconds=round(compiled.cache_seconds, 3),
    lowering_seconds=round(compiled.lowering_seconds, 3),
    tracing_seconds=round(compiled.tracing_seconds, 3),
    cache_dir=cache_dir,
    cache_off_reason=None if cache_dir is not None else cache_off_reason or "turned off",
    compiled_programs=compiled.by_name(),
  )


# ---------------------------------------------------------------------------------------------
# Device calls: executions of compiled programs.


@dataclasses.dataclass(eq=False)
class DeviceCalls:
  """Executions of compiled XLA programs while the counter was active: count (int), and
  by_name() {program name: executions}, the most executed first (an eager op outside jit runs a
  program named after the op, e.g. `jit(multiply)`)."""

  count: int = 0
  names: dict[str, int] = dataclasses.field(default_factory=dict)

  def by_name(self) -> dict[str, int]:
    return dict(sorted(self.names.items(), key=lambda item: (-item[1], item[0])))


@contextlib.contextmanager
def device_calls() -> Iterator[DeviceCalls]:
  """Counts the executions of compiled programs (jitted functions and eager ops) of any thread
  while the block runs: the device calls a piece of code makes.

  JAX dispatches a jitted call from C++ once it has run it (the "fast path"), out of Python's
  sight; inside the block that path is off (its cached entries are dropped on entry and on
  exit: jax.clear_caches(), so programs compiled before are compiled again, or read from the
  persistent cache) and every execution passes `ExecuteReplicated.__call__`, where it is
  counted. That makes dispatch slower: a block for counting, not for timing. Relies on JAX's
  private dispatch (checked with JAX 0.10.2); raises RuntimeError where it is not there.
  """
  try:
    from jax._src import pjit  # lazy: JAX's private dispatch, read only when counting
    from jax._src.interpreters import pxla  # lazy: as above

    execute = pxla.ExecuteReplicated.__call__
    fastpath = pjit._get_fastpath_data  # pylint: disable=protected-access
  except (ImportError, AttributeError) as error:
    raise RuntimeError(f"device_calls needs JAX's dispatch internals: {error}") from error
  counter = DeviceCalls()

  def counted(self, *args):
    with _lock:
      counter.count += 1
      name = str(getattr(self, "name", "?"))
      counter.names[name] = counter.names.get(name, 0) + 1
    return execute(self, *args)

  jax.clear_caches()
  pxla.ExecuteReplicated.__call__ = counted
  pjit._get_fastpath_data = lambda *args, **kwargs: None  # pylint: disable=protected-access
  try:
    yield counter
  finally:
    pxla.ExecuteReplicated.__call__ = execute
    pjit._get_fastpath_data = fastpath  # pylint: disable=protected-access
    jax.clear_caches()
