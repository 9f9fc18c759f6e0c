"""Training-state checkpoints with orbax: save every N steps, resume from the latest.

The state is any pytree (params, optimizer state, step, ...); restoring needs a
template of the same structure (e.g. the freshly initialised state), so a run
killed at any point resumes exactly where its last checkpoint left it.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp


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
