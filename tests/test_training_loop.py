"""The training loop shared by the three trainers (stori_jax.trainloop.loop): steps counted on
the host, the log / eval / checkpoint intervals, the non-finite watch, the compile time kept
out of the ETA, and a killed run resumed to the same result. Tiny fake steps, no models."""

import errno
import logging
import os
import shutil

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
import pytest

from stori_jax.trainloop import checkpointer, loop
from stori_jax.trainloop.checkpointer import (
  CheckpointWriteError,
  NonFiniteWatch,
  TrainCheckpointer,
  UnreadableCheckpointsError,
  nonfinite_code,
)
from stori_jax.plumbing.errors import NonFiniteError


class HostOnlyStep:
  """A state leaf that refuses to be read on the host: the loop must count steps itself."""

  def _refuse(self, *args):
    raise AssertionError("the loop read the state's step counter")

  __int__ = __index__ = __float__ = __bool__ = __array__ = _refuse


class FakeCheckpointer:
  """Notes what was saved and that the loop closed it."""

  def __init__(self):
    self.saved, self.closed = [], False

  def save(self, step, state):
    self.saved.append((step, float(state["w"])))

  def wait(self):
    pass

  def close(self):
    self.closed = True


def fake_step(bad_from=None):
  """(state, batch) -> (state, metrics) on host floats; non-finite from step `bad_from` on."""

  def step(state, batch):
    w = state["w"] + batch
    bad = bad_from is not None and batch + 1 >= bad_from
    return {"w": w, "step": state["step"]}, {"loss": w, "nonfinite": np.int32(4 if bad else 0)}

  return step


def run_fake(tmp_path, *, total=7, bad_from=None, prefetch=0, first_step=0, w=0.0):
  """Runs the fake step (batch of step s: s) with log 3, eval 5, checkpoint 4."""
  checkpointer, records, evaluated, asked = FakeCheckpointer(), [], [], []

  def batch_for_step(step):
    asked.append(step)
    return float(step)

  def evaluate(state, done):
    evaluated.append(done)
    return {"eval": -float(state["w"])}

  watch = NonFiniteWatch("fake training", "Lower it.")
  error = None
  try:
    spec = loop.LoopSpec(
      total_steps=total,
      workdir=str(tmp_path),
      checkpointer=checkpointer,
      watch=watch,
      log_every=3,
      checkpoint_every=4,
      eval_every=5,
      prefetch=prefetch,
    )
    loop.train_loop(
      fake_step(bad_from),
      {"w": np.float32(w), "step": HostOnlyStep()},
      batch_for_step,
      spec,
      first_step=first_step,
      evaluate=evaluate,
      log=records.append,
    )
  except NonFiniteError as e:
    error = e
  return dict(
    records=records,
    evaluated=evaluated,
    saved=checkpointer.saved,
    asked=asked,
    error=error,
    closed=checkpointer.closed,
  )


def test_steps_are_counted_on_the_host_and_actions_fall_at_their_intervals(tmp_path):
  run = run_fake(tmp_path, total=7)
  assert run["asked"] == list(range(7))
  # w after step `done` is 0 + 1 + ... + (done - 1).
  w = lambda done: float(sum(range(done)))
  assert run["records"] == [
    {"step": 3, "loss": w(3)},
    {"step": 5, "loss": w(5), "eval": -w(5)},
    {"step": 6, "loss": w(6)},
    {"step": 7, "loss": w(7), "eval": -w(7)},
  ]
  assert run["evaluated"] == [5, 7]
  assert run["saved"] == [(4, w(4)), (7, w(7))]
  assert run["closed"] and run["error"] is None


def test_prefetched_batches_are_the_same_batches(tmp_path):
  assert run_fake(tmp_path, prefetch=2)["records"] == run_fake(tmp_path)["records"]


def test_a_resumed_loop_starts_at_its_first_step(tmp_path):
  run = run_fake(tmp_path, first_step=4, w=6.0)
  assert run["asked"] == [4, 5, 6]
  assert [r["step"] for r in run["records"]] == [5, 6, 7]
  assert run["saved"] == [(7, 21.0)]


def test_nothing_to_do_when_the_run_is_finished(tmp_path):
  run = run_fake(tmp_path, first_step=7, w=21.0)
  assert run["asked"] == run["records"] == run["saved"] == [] and run["closed"]


def test_divergence_stops_before_the_log_and_keeps_the_last_good_checkpoint(tmp_path):
  run = run_fake(tmp_path, bad_from=5)
  message = str(run["error"])
  assert "fake training stopped at step 5 of 7: the weights became NaN" in message
  assert "last good checkpoint (step 4)" in message and "Lower it." in message
  assert [r["step"] for r in run["records"]] == [3]
  assert [s for s, _ in run["saved"]] == [4]
  assert run["closed"]
  # A bad step between two reads is caught at the next one (step 6: a log step).
  run = run_fake(tmp_path, bad_from=6)
  assert "stopped at step 6 of 7" in str(run["error"])
  assert [r["step"] for r in run["records"]] == [3, 5]


def test_the_interval_rule():
  assert [d for d in range(1, 11) if loop.is_due(d, 4, 10)] == [4, 8, 10]
  assert [d for d in range(1, 11) if loop.is_due(d, None, 10)] == [10]


def test_compile_time_is_reported_apart(tmp_path, capsys):
  run_fake(tmp_path, total=2)
  err = capsys.readouterr().err
  assert "train step compiled in" in err and "left out of the ETA" in err


# A jitted step with orbax checkpoints: killed and resumed -------------------------------------


def _decay(state, batch):
  w = 0.5 * state["w"] + batch
  metrics = {"loss": jnp.sum(w), "nonfinite": nonfinite_code(jnp.sum(w), w, w)}
  return {"w": w, "step": state["step"] + 1}, metrics


DECAY_STEP = jax.jit(_decay, donate_argnums=0)


class Killed(Exception):
  pass


def _run_jitted(workdir, total, kill_at=None):
  """Runs DECAY_STEP with checkpoints every 2 steps; returns (final w, records)."""
  spec = loop.LoopSpec(
    total_steps=total,
    workdir=str(workdir),
    checkpointer=TrainCheckpointer(workdir / "checkpoints"),
    watch=NonFiniteWatch("training", ""),
    log_every=1,
    checkpoint_every=2,
  )
  state, first = loop.resume(
    spec, {"w": jnp.zeros(3), "step": jnp.zeros((), jnp.int32)}, trained=lambda state: state["w"]
  )
  records = []

  def batch_for_step(step):
    if step == kill_at:
      raise Killed()
    return np.arange(3, dtype=np.float32) + step

  state = loop.train_loop(
    DECAY_STEP, state, batch_for_step, spec, first_step=first, log=records.append
  )
  return np.asarray(state["w"]), records


def test_a_killed_run_resumes_to_the_same_result(tmp_path, capsys):
  straight, records = _run_jitted(tmp_path / "straight", 6)
  with pytest.raises(Killed):
    _run_jitted(tmp_path / "resumed", 6, kill_at=3)  # after the checkpoint of step 2
  capsys.readouterr()
  resumed, later = _run_jitted(tmp_path / "resumed", 6)
  assert "Resumed from step 2 of 6" in capsys.readouterr().err
  np.testing.assert_array_equal(straight, resumed)
  assert later == records[2:]


def test_the_trainers_steps_donate_their_state():
  """The few-shot step (TaskRes: no model needed); pretraining and weight response test
  theirs in their own files."""
  from stori_jax.fewshot import trainer

  config = ml_collections.ConfigDict({"taskres": {"alpha": 0.5, "lr": 1e-3, "weight_decay": 0.0}})
  zero_shot = jnp.eye(3, 4)
  method = trainer.taskres_method(config, zero_shot, total_steps=4)
  step = trainer.make_train_step(method, logit_scale=10.0)
  params = method.init()
  state = {"params": params, "opt_state": method.optimizer.init(params), "step": jnp.int32(0)}
  new_state, _ = step(state, method.context, jnp.eye(2, 4), jnp.array([0, 1]))
  assert state["params"].is_deleted() and not new_state["params"].is_deleted()
  assert not zero_shot.is_deleted()  # the context is not donated


# A broken or unwritable checkpoint ------------------------------------------------------------


def _truncate(path):
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 2)


def test_a_truncated_latest_checkpoint_falls_back_to_the_one_before(tmp_path, capsys):
  """Checkpoints 2 and 4 written, 4's manifest truncated: the run resumes from 2 with a
  warning naming 4 (moved aside, not deleted) and ends as an uninterrupted run."""
  straight, records = _run_jitted(tmp_path / "straight", 6)
  with pytest.raises(Killed):
    _run_jitted(tmp_path / "resumed", 6, kill_at=5)  # after the checkpoint of step 4
  checkpoints = tmp_path / "resumed" / "checkpoints"
  assert sorted(os.listdir(checkpoints)) == ["2", "4"]
  _truncate(checkpoints / "4" / "default" / "manifest.ocdbt")
  capsys.readouterr()
  resumed, later = _run_jitted(tmp_path / "resumed", 6)
  err = capsys.readouterr().err
  assert "warning: the checkpoint of step 4 in" in err and "cannot be read" in err
  assert "Resumed from step 2 of 6" in err
  np.testing.assert_array_equal(straight, resumed)
  assert later == records[2:]
  assert sorted(os.listdir(tmp_path / "resumed" / "checkpoints-broken")) == ["4"]
  assert sorted(os.listdir(checkpoints)) == ["4", "6"]  # 4 written again, intact


def test_no_readable_checkpoint_is_one_paragraph(tmp_path):
  with pytest.raises(Killed):
    _run_jitted(tmp_path, 6, kill_at=3)  # only the checkpoint of step 2
  _truncate(tmp_path / "checkpoints" / "2" / "default" / "_METADATA")
  with pytest.raises(UnreadableCheckpointsError, match="none of the 1 checkpoints") as error:
    _run_jitted(tmp_path, 6)
  assert "step 2:" in str(error.value) and "--restart" in str(error.value)


def test_a_full_disk_during_a_background_write_names_the_step_and_recovers(tmp_path, monkeypatch):
  """The write of step 2's checkpoint fails in the background (tensorstore's ENOSPC), which
  surfaces at the save of step 4: one CheckpointWriteError naming both steps; freed, the same
  run starts again and ends as an uninterrupted one."""
  straight, _ = _run_jitted(tmp_path / "straight", 6)
  real_save = ocp.CheckpointManager.save
  real_wait = ocp.CheckpointManager.wait_until_finished
  failing = {}

  def save(self, step, *args, **kwargs):
    real_save(self, step, *args, **kwargs)
    if step == 2:
      failing["error"] = ValueError(
        "RESOURCE_EXHAUSTED: Failed to write 204 bytes to file 8: No space left on device "
        "[os_error_code='28']"
      )

  def wait_until_finished(self):
    real_wait(self)
    if "error" in failing:
      raise failing["error"]  # orbax raises the background thread's error at every wait

  monkeypatch.setattr(ocp.CheckpointManager, "save", save)
  monkeypatch.setattr(ocp.CheckpointManager, "wait_until_finished", wait_until_finished)
  with pytest.raises(CheckpointWriteError) as error:
    _run_jitted(tmp_path / "full", 6)
  message = str(error.value)
  assert message.startswith("the checkpoint of step 2 could not be written to ")
  assert "no space left on the device. The run stopped at step 4;" in message
  monkeypatch.undo()
  shutil.rmtree(tmp_path / "full" / "checkpoints" / "2")  # as a write that never committed
  resumed, _ = _run_jitted(tmp_path / "full", 6)
  np.testing.assert_array_equal(straight, resumed)


def test_a_full_disk_while_saving_keeps_the_last_complete_checkpoint(tmp_path, monkeypatch):
  real_save = ocp.CheckpointManager.save

  def save(self, step, *args, **kwargs):
    if step == 4:
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return real_save(self, step, *args, **kwargs)

  monkeypatch.setattr(ocp.CheckpointManager, "save", save)
  with pytest.raises(CheckpointWriteError) as error:
    _run_jitted(tmp_path, 6)
  message = str(error.value)
  assert "the checkpoint of step 4 could not be written" in message
  assert "stopped at step 4; the last complete checkpoint, of step 2, is kept" in message


def test_orbax_logged_disk_full_tracebacks_are_dropped(caplog):
  """orbax logs each background thread's failure with its traceback (about 540 lines in all);
  the one CheckpointWriteError paragraph replaces them. Other errors are still logged."""
  checkpointer._install_quiet_hooks()
  absl_logger = logging.getLogger("absl")
  try:
    raise ValueError("RESOURCE_EXHAUSTED: Failed writing: No space left on device")
  except ValueError:
    absl_logger.error("_SignalingThread.run() raised an exception", exc_info=True)
  absl_logger.error("[step=6] Save Finalize thread failed: No space left on device")
  absl_logger.error("something else failed")
  assert [r.getMessage() for r in caplog.records] == ["something else failed"]
