"""The loop around a jitted train step, shared by few-shot training, pretraining and
weight-response training.

A run is a pytree state and one `jax.jit` step `(state, batch) -> (state, metrics)` that donates
its state, and a `LoopSpec`: its length, checkpoints, non-finite watch and intervals, the same
for `resume` and `train_loop`. `resume` restores the latest checkpoint; `train_loop` runs the
remaining steps: it
counts them on the host, logs, evaluates and checkpoints at the configured intervals and at the
last step, and stops a diverged run (`NonFiniteError`) before a NaN reaches the log or a
checkpoint. The first step, which compiles the step, is timed apart, so the progress bar's rate
and ETA are those of the compiled step.
"""

from __future__ import annotations

import dataclasses
import queue
import sys
import threading
import time
from typing import Any, Callable, Iterator, Sequence

import jax
from tqdm import tqdm

from stori_jax.trainloop.checkpointer import (
  NonFiniteWatch,
  TrainCheckpointer,
  require_finite_checkpoint,
)

State = Any
Batch = Any


@dataclasses.dataclass(frozen=True)
class LoopSpec:
  """How a run's loop runs, whichever trainer it is: what `resume` and `train_loop` share.

  Attributes:
    total_steps: the steps of the whole run.
    workdir: named in the messages (resumed, diverged).
    checkpointer: where checkpoints go; waited for and closed when the loop ends.
    watch: the run's non-finite watch.
    log_every, checkpoint_every, eval_every: the intervals, in steps (eval_every None: only
      at the last step, and only with an `evaluate`); the last step always has all three.
    log_also: done (1-based) -> whether that step is logged too, whatever log_every says (the
      few-shot trainer's: the first step of each epoch, so that every epoch's learning rate is
      in the history even when an epoch has fewer than log_every steps); None: none.
    prefetch: make batches this many steps ahead on a background thread (0: in the loop).
    desc: the progress bar's label.
    postfix: record keys shown on the progress bar.
  """

  total_steps: int
  workdir: str
  checkpointer: TrainCheckpointer
  watch: NonFiniteWatch
  log_every: int
  checkpoint_every: int
  eval_every: int | None = None
  log_also: Callable[[int], bool] | None = None
  prefetch: int = 0
  desc: str = "train"
  postfix: Sequence[str] = ("loss",)


def resume(
  spec: LoopSpec,
  state: State,
  *,
  trained: Callable[[State], Any],
  announce: bool = True,
) -> tuple[State, int]:
  """The newest intact checkpoint's state and step, or (state, 0) when there is none. A newer
  checkpoint that cannot be read (a truncated file) is moved aside with a warning naming it
  (`TrainCheckpointer.restore_latest_intact`), and the run goes on from the one before.

  Args:
    spec: the run's loop: its checkpoints, its non-finite watch (whose last good checkpoint
      becomes the restored one), and its total_steps and workdir, named in the message that
      says the run resumed.
    state: the freshly initialised state, the template the checkpoint is restored into.
    trained: state -> the part checked for NaN or infinity before the run goes on from it.
    announce: print that message (on stderr, whatever the log level: a user must know that
      this run continues another); off on all but one process of a multi-host run.

  Raises:
    NonFiniteError: the checkpoint holds NaN or infinity.
    UnreadableCheckpointsError: there are checkpoints, but none can be read.
  """
  checkpointer = spec.checkpointer
  state, step = checkpointer.restore_latest_intact(state, warn=announce)
  if step is None:
    return state, 0
  require_finite_checkpoint(trained(state), step, checkpointer.directory)
  spec.watch.last_saved = step
  if announce:
    print(f"Resumed from step {step} of {spec.total_steps} in {spec.workdir}", file=sys.stderr)
  return state, step


def is_due(done: int, every: int | None, total_steps: int) -> bool:
  """Whether an action every `every` steps falls after step `done` (1-based); the last step
  always has it. `every` None: never (but at the last step)."""
  return done == total_steps or (every is not None and done % every == 0)


def _batches(
  batch_for_step: Callable[[int], Batch], first_step: int, total_steps: int, prefetch: int
) -> Iterator[tuple[int, Batch]]:
  """(step, batch) for steps first_step..total_steps-1; with prefetch > 0 the batches are made
  that many steps ahead on a background thread (in step order: the same batches)."""
  if prefetch <= 0:
    for step in range(first_step, total_steps):
      yield step, batch_for_step(step)
    return
  out: queue.Queue = queue.Queue(maxsize=prefetch)
  stop = threading.Event()

  def put(item) -> bool:
    """Queues item unless the loop has stopped; False once it has."""
    while not stop.is_set():
      try:
        out.put(item, timeout=0.1)
        return True
      except queue.Full:
        continue
    return False

  def worker():
    try:
      for step in range(first_step, total_steps):
        if not put(batch_for_step(step)):
          return
    except BaseException as error:  # pylint: disable=broad-except
      put(error)  # raised in the loop: a dead worker must not leave it waiting forever

  threading.Thread(target=worker, daemon=True).start()
  try:
    for step in range(first_step, total_steps):
      item = out.get()
      if isinstance(item, BaseException):
        raise item
      yield step, item
  finally:
    stop.set()  # a loop stopped early (divergence, Ctrl-C) releases the worker


def train_loop(
  train_step: Callable[[State, Batch], tuple[State, dict[str, jax.Array]]],
  state: State,
  batch_for_step: Callable[[int], Batch],
  spec: LoopSpec,
  *,
  first_step: int,
  evaluate: Callable[[State, int], dict[str, float]] | None = None,
  log: Callable[[dict[str, Any]], None] | None = None,
) -> State:
  """Runs steps first_step..spec.total_steps-1 of a run; returns the final state.

  After step `done` (1-based), at the spec's intervals and always at the last step:
  - log (every `log_every`, and where `spec.log_also` says) or evaluate (every `eval_every`, with `evaluate`): a record
    {"step": done, **metrics as floats, **evaluate(state, done)} is passed to `log`;
  - checkpoint (every `checkpoint_every`): `spec.checkpointer.save(done, state)`.
  Each of them first reads the non-finite codes of the steps since the last read (one int32
  per step, kept on the device until then): a diverged run raises NonFiniteError before a NaN
  reaches a record or a checkpoint, and keeps its last good checkpoint. The step is counted on
  the host; the state's own step counter is never read back.

  Args:
    train_step: jitted (state, batch) -> (state, metrics); metrics {name: float32 []} with
      "nonfinite": int32 [] (`checkpointing.nonfinite_code`). It should donate its state
      (`donate_argnums=0`): the loop never reuses a state it has passed to the step.
    state: the state after `first_step` steps (fresh, or from `resume`).
    batch_for_step: step (0-based) -> that step's batch; a function of the step, so that a
      resumed run sees the same batches.
    spec: the run's length, checkpoints, watch, intervals and progress bar (`LoopSpec`).
    first_step: the steps already done.
    evaluate: (state, done) -> host floats added to the record of an evaluation step.
    log: receives each record (writes it to the run's history, say).

  Raises:
    NonFiniteError: the run diverged.
    CheckpointWriteError: the disk filled up while a checkpoint was written (one paragraph
      naming the step; the last complete checkpoint is kept).
  """
  total_steps, workdir, desc = spec.total_steps, spec.workdir, spec.desc
  checkpointer, watch = spec.checkpointer, spec.watch
  bar = None
  try:
    for step, batch in _batches(batch_for_step, first_step, total_steps, spec.prefetch):
      if bar is None:
        # The first call compiles the step: timed apart and waited for, so that the bar's clock
        # starts on the compiled step and its rate and ETA are not inflated by the compile.
        start = time.perf_counter()
        state, metrics = train_step(state, batch)
        jax.block_until_ready((state, metrics))
        tqdm.write(
          f"{desc}: train step compiled in {time.perf_counter() - start:.1f} s (its first "
          f"step; left out of the ETA)",
          file=sys.stderr,
        )
        bar = tqdm(total=total_steps, initial=step + 1, desc=desc, unit="step", dynamic_ncols=True)
      else:
        state, metrics = train_step(state, batch)
        bar.update(1)
      done = step + 1
      metrics = dict(metrics)
      watch.add(done, metrics.pop("nonfinite"))
      evaluating = evaluate is not None and is_due(done, spec.eval_every, total_steps)
      logging = is_due(done, spec.log_every, total_steps) or (
        spec.log_also is not None and spec.log_also(done)
      )
      if evaluating or logging:
        watch.check(total_steps, workdir)  # nothing non-finite reaches the log
        record = {"step": done, **{k: float(v) for k, v in metrics.items()}}
        if evaluating:
          record.update(evaluate(state, done))
        bar.set_postfix({k: f"{record[k]:.4g}" for k in spec.postfix if k in record})
        if log is not None:
          log(record)
      if is_due(done, spec.checkpoint_every, total_steps):
        watch.check(total_steps, workdir)  # a checkpoint is always a good one
        checkpointer.save(done, state)
        watch.last_saved = done
    watch.check(total_steps, workdir)
  finally:
    if bar is not None:
      bar.close()
    checkpointer.wait()
    checkpointer.close()
  return state
