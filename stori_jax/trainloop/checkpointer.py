"""Training-state checkpoints with orbax: save every N steps, resume from the latest; and the
watch that stops a diverged run before a NaN reaches a checkpoint or a result file.

The state is any pytree (params, optimizer state, step, ...); restoring needs a
template of the same structure (e.g. the freshly initialised state), so a run
killed at any point resumes exactly where its last checkpoint left it. A checkpoint that cannot
be read (a truncated or half-copied file) is moved aside and the newest intact one is resumed
from; a disk that fills up during a write stops the run with one paragraph
(`CheckpointWriteError`), not orbax's background threads' tracebacks.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from stori_jax.plumbing import multihost, paths
from stori_jax.plumbing.errors import DISK_FULL_ERRNOS, NonFiniteError, UserError

# How tensorstore and orbax word a full disk in the errors they raise and log.
_DISK_FULL_TEXTS = ("No space left on device", "Disk quota exceeded", "os_error_code='28'")


class CheckpointWriteError(UserError):
  """A checkpoint could not be written because its disk is full."""


class UnreadableCheckpointsError(UserError):
  """No checkpoint of a run can be read back."""


def is_disk_full(error: BaseException) -> bool:
  """Whether `error`, or an exception it was raised from, says that the disk is full (an
  OSError ENOSPC / EDQUOT, or tensorstore's RESOURCE_EXHAUSTED text for one)."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS:
      return True
    if any(text in str(error) for text in _DISK_FULL_TEXTS):
      return True
    error = error.__cause__ or error.__context__
  return False


class _DropDiskFullRecords(logging.Filter):
  """Drops orbax's logged tracebacks of a full disk (one per background thread, hundreds of
  lines): CheckpointWriteError reports it once, as one paragraph."""

  def filter(self, record: logging.LogRecord) -> bool:
    if record.levelno < logging.ERROR:
      return True
    exc = record.exc_info[1] if record.exc_info else None
    return not (
      (exc is not None and is_disk_full(exc))
      or any(text in record.getMessage() for text in _DISK_FULL_TEXTS)
    )


_DISK_FULL_FILTER = _DropDiskFullRecords()


def _quiet_closed_loop_hook(previous):
  """sys.unraisablehook that drops "Event loop is closed" from asyncio's call_soon_threadsafe
  (tensorstore completing a write for one of orbax's background event loops after a failed
  save closed it: noise after the error is reported) and passes anything else to `previous`."""

  def hook(unraisable):
    error = unraisable.exc_value
    frames = []
    tb = unraisable.exc_traceback
    while tb is not None:
      frames.append(tb.tb_frame.f_code.co_name)
      tb = tb.tb_next
    if not (
      isinstance(error, RuntimeError)
      and str(error) == "Event loop is closed"
      and "call_soon_threadsafe" in frames
    ):
      previous(unraisable)

  hook.stori_quiet_closed_loop = True
  return hook


def _install_quiet_hooks() -> None:
  """Once per process: the disk-full log filter on absl's logger (orbax logs through it) and
  the closed-loop unraisable hook."""
  logging.getLogger("absl").addFilter(_DISK_FULL_FILTER)  # a no-op when already there
  if not getattr(sys.unraisablehook, "stori_quiet_closed_loop", False):
    sys.unraisablehook = _quiet_closed_loop_hook(sys.unraisablehook)


def _first_line(error: BaseException, limit: int = 200) -> str:
  text = (str(error).strip().splitlines() or [type(error).__name__])[0]
  return text if len(text) <= limit else text[: limit - 3] + "..."


#: Bits of a train step's "nonfinite" metric: what held a NaN or an infinity.
NONFINITE_PARTS = ("the loss", "the gradients", "the weights")


class TrainCheckpointer:
  """Keeps the last `keep` checkpoints of a training run under `directory`."""

  def __init__(self, directory: str | os.PathLike, keep: int = 2):
    # A URL (gs://) as given: orbax writes it through epath and tensorstore's own drivers.
    self.directory = paths.absolute(directory)
    self._manager = ocp.CheckpointManager(
      self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
    )
    _install_quiet_hooks()
    self._requested: int | None = None  # the latest step whose save was started
    self._failed = False  # a write failed and was reported; later waits stay quiet

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(self, step: int, state: Any) -> None:
    """Starts saving `state` as step `step` (asynchronously).

    Raises:
      CheckpointWriteError: the disk is full (this save or the one before, still being
        written, failed); the run stops at `step` with the last complete checkpoint kept.
    """
    # A gs:// history's waiting records are written before the checkpoint of their step.
    paths.flush_appends()
    # The previous save's background write ends first (orbax's save would wait for it too),
    # so that a failure is pinned on the step that failed.
    self._finish(stopped_at=step)
    try:
      self._manager.save(step, args=ocp.args.StandardSave(state))
    except Exception as error:  # pylint: disable=broad-except
      self._raise_if_disk_full(error, failed=step, stopped_at=step)
      raise
    self._requested = step

  def restore(self, template: Any, step: int | None = None) -> Any:
    """The state saved at `step` (default: the latest), shaped like `template`."""
    step = self.latest_step() if step is None else step
    abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, template)
    return self._manager.restore(step, args=ocp.args.StandardRestore(abstract))

  def restore_latest_intact(self, template: Any, warn: bool = True) -> tuple[Any, int | None]:
    """(state, step) of the newest checkpoint that can be read, or (template, None) when
    there is no checkpoint. Newer checkpoints that cannot be read (a truncated or missing
    file) are moved to `<directory>-broken/<step>` (kept for a look, out of the run's way: the
    run writes those steps again), each with a warning on stderr (`warn`).

    Raises:
      UnreadableCheckpointsError: there are checkpoints but none can be read.
    """
    steps = sorted(self._manager.all_steps(), reverse=True)
    broken: list[tuple[int, BaseException]] = []
    for step in steps:
      try:
        state = self.restore(template, step)
      except Exception as error:  # pylint: disable=broad-except  # orbax / tensorstore / JSON
        broken.append((step, error))
        continue
      for bad_step, error in broken:
        aside = self._move_aside(bad_step)
        if warn:
          print(
            f"warning: the checkpoint of step {bad_step} in {self.directory} cannot be read "
            f"({_first_line(error)}); it was moved to {aside}, and the run resumes from the "
            f"checkpoint of step {step}, the newest that can be read (steps after it are "
            "trained again).",
            file=sys.stderr,
          )
      if broken:
        self._manager.reload()  # the moved steps are no longer the run's
      return state, step
    if broken:
      listed = "; ".join(f"step {s}: {_first_line(e, 120)}" for s, e in broken)
      raise UnreadableCheckpointsError(
        f"none of the {len(broken)} checkpoints in {self.directory} can be read ({listed}), so "
        "the run cannot resume. Start it afresh with --restart (the old run is moved aside) or "
        "pass another --workdir."
      )
    return template, None

  def _move_aside(self, step: int) -> str:
    """Moves step `step`'s folder to `<directory>-broken/<step>[-n]` (on process 0; the
    others wait for it); returns the new path."""
    source = paths.join(self.directory, str(step))
    target = paths.join(f"{self.directory}-broken", str(step))
    n = 1
    while paths.exists(target):
      n += 1
      target = paths.join(f"{self.directory}-broken", f"{step}-{n}")
    if jax.process_index() == 0 and paths.exists(source):
      paths.makedirs(paths.parent(target), exist_ok=True)
      paths.move(source, target)
    multihost.wait_for_all_processes(f"checkpoint {source} moved aside")
    return target

  def wait(self) -> None:
    """Blocks until asynchronous saves are on disk.

    Raises:
      CheckpointWriteError: the disk filled up while the last save was written.
    """
    self._finish(stopped_at=self._requested)

  def close(self) -> None:
    paths.flush_appends()
    try:
      self._manager.close()
    except Exception:  # pylint: disable=broad-except
      if not self._failed:
        raise  # after a reported failure orbax raises the same error again

  def _finish(self, stopped_at: int | None) -> None:
    """Waits for the save in flight; a full disk becomes CheckpointWriteError."""
    try:
      self._manager.wait_until_finished()
    except Exception as error:  # pylint: disable=broad-except
      if self._failed:
        return  # reported once already
      self._raise_if_disk_full(error, failed=self._requested, stopped_at=stopped_at)
      raise

  def _raise_if_disk_full(self, error: BaseException, failed, stopped_at) -> None:
    if not is_disk_full(error):
      return
    self._failed = True
    complete = [
      int(name)
      for name in (paths.listdir(self.directory) if paths.isdir(self.directory) else [])
      if name.isdigit() and (failed is None or int(name) < failed)
    ]
    kept = (
      f"the last complete checkpoint, of step {max(complete)}, is kept, and the same command "
      f"resumes from it"
      if complete
      else "no complete checkpoint was written yet, so the same command starts from the beginning"
    )
    what = f"the checkpoint of step {failed}" if failed is not None else "a checkpoint"
    raise CheckpointWriteError(
      f"{what} could not be written to {self.directory}: no space left on the device. The run "
      f"stopped at step {stopped_at}; {kept}. Free space on that disk (the unfinished "
      f"checkpoint's *.orbax-checkpoint-tmp folder there can be deleted), then run the same "
      "command again."
    ) from None


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
      f"{paths.join(workdir, 'checkpoints')}"
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
