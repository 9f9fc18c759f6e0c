"""Training checkpoints (stori_jax.trainloop.checkpointer) on the tiny demo run through its command
line: a truncated file in the latest checkpoint makes the run resume from the newest intact one,
with a warning naming the broken one, to the result of an uninterrupted run; a full disk during a
checkpoint write stops the run with one paragraph and exit status 2, and the same command then
finishes it; so does a full disk while a figure is written."""

import errno
import json
import os

import orbax.checkpoint as ocp
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(REPO, "configs", "demo.py")
#: 4 shots of the demo's 12 classes (one step per epoch), 4 steps, checkpoints every 2.
OVERRIDES = {
  "views": 2,
  "shots": 4,
  "data.n_test_per_class": 5,
  "log_every": 1,
  "eval_every": 2,
  "checkpoint_every": 2,
  "epochs": 4,
}


def _train(run_command, model, workdir):
  flags = [f"--config.{k}={v}" for k, v in {"model.source": model, **OVERRIDES}.items()]
  return run_command("stori_jax.train", f"--config={DEMO}", f"--workdir={workdir}", *flags)


def _result(workdir):
  """What the run decided: its weights and its accuracies (not its timings)."""
  with open(os.path.join(workdir, "weights.json"), encoding="utf-8") as f:
    weights = json.load(f)
  with open(os.path.join(workdir, "metrics.json"), encoding="utf-8") as f:
    metrics = json.load(f)
  return weights, {k: v for k, v in metrics.items() if "time" not in k and "second" not in k}


def _error_paragraph(done):
  assert done.returncode == 2, done.stderr[-3000:]
  assert "Traceback" not in done.stderr, done.stderr[-3000:]
  lines = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
  assert len(lines) == 1, done.stderr[-3000:]
  return lines[0]


@pytest.mark.slow
def test_a_truncated_checkpoint_file_resumes_from_the_intact_one_before(
  tmp_path, run_command, tiny_random_model
):
  straight = tmp_path / "straight"
  assert _train(run_command, tiny_random_model, straight).returncode == 0
  broken = tmp_path / "broken"
  assert _train(run_command, tiny_random_model, broken).returncode == 0
  checkpoints = broken / "checkpoints"
  assert sorted(os.listdir(checkpoints)) == ["2", "4"]
  manifest = checkpoints / "4" / "default" / "manifest.ocdbt"
  with open(manifest, "r+b") as f:
    f.truncate(os.path.getsize(manifest) // 2)
  done = _train(run_command, tiny_random_model, broken)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "Traceback" not in done.stderr
  assert f"warning: the checkpoint of step 4 in {checkpoints} cannot be read" in done.stderr
  assert "Resumed from step 2 of 4" in done.stderr
  assert os.listdir(tmp_path / "broken" / "checkpoints-broken") == ["4"]
  assert _result(broken) == _result(straight)


@pytest.mark.slow
def test_a_full_disk_during_a_checkpoint_write_is_one_paragraph(
  tmp_path, run_command, tiny_random_model, monkeypatch
):
  real_save = ocp.CheckpointManager.save

  def save(self, step, *args, **kwargs):
    if step == 4:  # the writer finds the disk full
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return real_save(self, step, *args, **kwargs)

  monkeypatch.setattr(ocp.CheckpointManager, "save", save)
  workdir = tmp_path / "run"
  message = _error_paragraph(_train(run_command, tiny_random_model, workdir))
  assert "the checkpoint of step 4 could not be written" in message
  assert "no space left on the device. The run stopped at step 4;" in message
  assert "the last complete checkpoint, of step 2, is kept" in message
  assert "Free space on that disk" in message
  assert not os.path.exists(workdir / "metrics.json")
  # Space freed: the same command resumes from step 2 and finishes as an uninterrupted run.
  monkeypatch.setattr(ocp.CheckpointManager, "save", real_save)
  done = _train(run_command, tiny_random_model, workdir)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "Resumed from step 2 of 4" in done.stderr
  straight = tmp_path / "straight"
  assert _train(run_command, tiny_random_model, straight).returncode == 0
  assert _result(workdir) == _result(straight)


class _FullFile:
  """A file opened for writing on a full disk: every write raises ENOSPC."""

  def __init__(self, file):
    self._file = file

  def write(self, data):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  def __getattr__(self, name):
    return getattr(self._file, name)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self._file.close()


def _disk_full_for(monkeypatch, name):
  """Every file opened for writing whose path holds `name` (the figure, or its temporary file)
  finds the disk full, however it is opened (matplotlib's PIL, or a temporary file)."""
  import builtins

  real_open = builtins.open

  def full_open(file, mode="r", *args, **kwargs):
    opened = real_open(file, mode, *args, **kwargs)
    writing = any(c in mode for c in "wxa+")
    if writing and isinstance(file, (str, os.PathLike)) and name in os.fspath(file):
      return _FullFile(opened)
    return opened

  monkeypatch.setattr(builtins, "open", full_open)


@pytest.mark.slow
def test_a_full_disk_while_writing_a_figure_is_one_paragraph(
  tmp_path, run_command, tiny_random_model, monkeypatch
):
  """Issue 36 row 8: a full disk while `train` wrote interpretability.png (or another figure)
  was PIL's traceback and exit 1; now one paragraph naming the file, exit 2, as for JSON and
  checkpoints, and the same command finishes the run once there is space."""
  workdir = tmp_path / "run"
  for figure in ("interpretability.png", "training_curve.png"):
    with monkeypatch.context() as patch:
      _disk_full_for(patch, figure)
      message = _error_paragraph(_train(run_command, tiny_random_model, workdir))
    assert f"cannot write the figure {workdir / figure}: the disk (or quota) is full" in message
    assert "free some space and run the same command again" in message
    assert not (workdir / figure).exists() and not (workdir / "metrics.json").exists()
    assert not [n for n in os.listdir(workdir) if n.endswith(".tmp")]  # no half file left
  done = _train(run_command, tiny_random_model, workdir)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "Resumed from step 4 of 4" in done.stderr
  for name in ("interpretability.png", "training_curve.png", "metrics.json"):
    assert (workdir / name).stat().st_size > 0
