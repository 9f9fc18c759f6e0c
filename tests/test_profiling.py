"""stori_jax.plumbing.profiling: compilations counted per block, host time apart from device time."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from stori_jax.plumbing import profiling

# Counted compilations: the run's persistent cache must not serve them (conftest).
pytestmark = pytest.mark.usefixtures("compilation_cache_off")


def test_a_new_shape_compiles_once_and_a_cached_call_does_not():
  @jax.jit
  def double_sum(x):
    return (2.0 * x).sum()

  # Inputs made outside the blocks: eager ops compile small programs of their own.
  a, b, c = (jax.device_put(np.ones((n, 5), np.float32)) for n in (3, 4, 6))
  with profiling.compilations() as first:
    jax.block_until_ready(double_sum(a))
  assert first.count == 1
  assert first.seconds > 0.0
  with profiling.compilations() as cached:
    jax.block_until_ready(double_sum(a))
  assert cached.count == 0 and cached.seconds == 0.0
  # Nested counters both see a compilation; one that has ended sees nothing more.
  with profiling.compilations() as outer:
    with profiling.compilations() as inner:
      jax.block_until_ready(double_sum(b))
    jax.block_until_ready(double_sum(c))
  assert (inner.count, outer.count) == (1, 2)
  assert first.count == 1
  assert isinstance(outer.as_dict()["count"], int)


def test_host_clock_excludes_a_long_device_execution():
  @jax.jit
  def chain(x):
    for _ in range(8):
      x = jnp.tanh(x @ x)
    return x

  x = jnp.full((1536, 1536), 1.0 / 1536, jnp.float32)
  jax.block_until_ready(chain(x))  # compiled outside the clock
  with profiling.host_clock() as clock:
    np.asarray(chain(x))
  # About 0.5 s of XLA:CPU work on 2 cores, the caller asleep meanwhile (~1 ms of its CPU).
  assert clock.wall_seconds > 0.1
  assert clock.host_seconds < 0.25 * clock.wall_seconds
  assert abs(clock.device_seconds - (clock.wall_seconds - clock.host_seconds)) < 1e-9
  # Host work of the caller counts as host time (about 0.2 s of Python; the wall time may be
  # longer on a busy machine).
  with profiling.host_clock() as busy:
    total = 0
    for i in range(3_000_000):
      total += i
  assert busy.host_seconds > 0.05
  # split accumulates.
  clocks = profiling.HostClock()
  for _ in range(2):
    with clocks.split():
      pass
  assert clocks.wall_seconds >= 0.0 and clocks.host_seconds >= 0.0


def test_compilations_are_named_after_their_programs():
  @jax.jit
  def triple(x):
    return 3.0 * x

  host = np.ones((7, 3), np.float32)
  with profiling.compilations() as compiled:
    jax.block_until_ready(triple(host))
    jax.block_until_ready(jnp.sin(jax.device_put(host)))  # an eager op: a program of its own
  names = compiled.by_name()
  assert names["jit(triple)"]["count"] == 1 and names["jit(sin)"]["count"] == 1
  assert sum(entry["count"] for entry in names.values()) == compiled.count
  assert [name for name, _ in compiled.programs] == ["jit(triple)", "jit(sin)"]
  assert compiled.as_dict(programs=True)["programs"] == names
  assert "programs" not in compiled.as_dict()


def test_device_calls_count_every_execution_and_restore_dispatch():
  @jax.jit
  def affine(x):
    return 2.0 * x + 1.0

  x = jax.device_put(np.ones((4, 3), np.float32))
  jax.block_until_ready(affine(x))  # its fast path is set up: the count must see it anyway
  with profiling.device_calls() as calls:
    for _ in range(3):
      y = affine(x)
    jax.block_until_ready(jnp.sin(y))  # an eager op: a program of its own
  assert calls.count == 4
  assert calls.by_name() == {"jit(affine)": 3, "jit(sin)": 1}
  # Dispatch is back as it was: nothing more is counted, results unchanged.
  np.testing.assert_array_equal(np.asarray(affine(x)), np.full((4, 3), 3.0, np.float32))
  assert calls.count == 4
