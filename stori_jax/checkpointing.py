"""Training-state checkpoints with orbax: save every N steps, resume from the latest; and the
watch that stops a diverged run before a NaN reaches a checkpoint or a result file.

The state is any pytree (params, optimizer state, step, ...); restoring needs a
template of the same structure (e.g. the freshly initialised state), so a run
killed at any point resumes exactly where its last checkpoint left it.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from stori_jax.errors import NonFiniteError

#: Bits of a train step's "nonfinite" metric: what held a NaN or an infinity.
NONFINITE_PARTS = ("the loss", "the gradients", "the weights")


class TrainCheckpointer:
  """Keeps the last `keep` checkpoints of a training run under `directory`."""

  def __init__(self, directory: str | os.PathLike, keep: int = 2):
    self.directory = os.path.abspath(directory)
    self._manager = ocp.CheckpointManager(
      self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
    )

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(self, step: int, state: Any) -> None:
    self._manager.save(step, args=ocp.args.StandardSave(state))

  def restore(self, template: Any, step: int | None = None) -> Any:
    """The state saved at `step` (default: the latest), shaped like `template`."""
    step = self.latest_step() if step is None else step
    abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, template)
    return self._manager.restore(step, args=ocp.args.StandardRestore(abstract))

  def wait(self) -> None:
    """Blocks until asynchronous saves are on disk."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.close()


def all_finite(tree: Any) -> jax.Array:
  """bool scalar: every element of every array leaf of `tree` is finite (traceable)."""
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


def nonfinite_code(loss: jax.Array, grads: Any, weights: Any) -> jax.Array:
  """int32 scalar for a train step's metrics: 0 when the loss, the gradients and the new
  weights are all finite, else a bit per part that is not (see NONFINITE_PARTS). Computed in
  the jitted step, so it costs one reduction and no device-to-host transfer."""
  bits = [~all_finite(part) for part in (loss, grads, weights)]
  return sum(b.astype(jnp.int32) << i for i, b in enumerate(bits))


class NonFiniteWatch:
  """Keeps the per-step "nonfinite" codes on the device and reads them back only when the
  loop is about to log, save or finish (a read every step would stall the device pipeline).

  `check()` raises NonFiniteError naming the first bad step, so a diverged run stops before a
  NaN reaches the history, a checkpoint or a result file; the last checkpoint saved was
  checked and stays the last good one.
  """

  def __init__(self, what: str, hint: str):
    """what: the run ("training", "pretraining"); hint: the likely cause and its fix."""
    self.what, self.hint = what, hint
    self._pending: list[tuple[int, jax.Array]] = []
    self.last_saved: int | None = None

  def add(self, step: int, code: jax.Array) -> None:
    """Notes step `step`'s code (a device scalar; not read yet)."""
    self._pending.append((step, code))

  def check(self, total_steps: int, workdir: str) -> None:
    """Raises NonFiniteError if any noted step was not finite; forgets the noted steps."""
    if not self._pending:
      return
    steps, codes = zip(*self._pending)
    self._pending.clear()
    codes = np.asarray(jax.device_get(list(codes)))
    bad = np.flatnonzero(codes)
    if not len(bad):
      return
    step, code = steps[bad[0]], int(codes[bad[0]])
    parts = [p for i, p in enumerate(NONFINITE_PARTS) if code >> i & 1]
    kept = (
      f"the last good checkpoint (step {self.last_saved}) is kept in "
      f"{os.path.join(workdir, 'checkpoints')}"
      if self.last_saved is not None
      else "no checkpoint had been saved yet"
    )
    raise NonFiniteError(
      f"{self.what} stopped at step {step} of {total_steps}: {_join(parts)} became NaN or "
      f"infinite. {self.hint} Nothing from step {step} on was written; {kept}, and no result "
      f"file was written. After fixing the config, start again with --restart (or another "
      f"--workdir)."
    )


def _join(parts: Sequence[str]) -> str:
  return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def require_finite_checkpoint(state: Any, step: int, directory: str) -> None:
  """Refuses to resume from a checkpoint whose weights hold NaN or infinity."""
  if not bool(all_finite(state)):
    raise NonFiniteError(
      f"the checkpoint of step {step} in {directory} holds NaN or infinite values, so the run "
      f"cannot resume from it; start afresh with --restart (the old run is kept aside)."
    )
