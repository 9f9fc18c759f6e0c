"""Tiny-CLIP pretraining: the loss goes down, and a killed run resumes to the same weights."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from safetensors.numpy import load_file

from stori_jax.trainloop import metrics_log
from stori_jax.pretraining import contrastive
from stori_jax.plumbing.config_files import load_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_FILE = os.path.join(REPO, "configs", "tiny_clip_pretrain.py")
SMALL = [
  "--config.batch_size=16",
  "--config.model.embed_dim=32",
  "--config.model.text.width=32",
  "--config.model.text.layers=2",
  "--config.model.vision.width=32",
  "--config.model.vision.layers=2",
  "--config.model.vision.patch_size=16",
  "--config.warmup_steps=2",
  "--config.eval_images=16",
]


def small_config():
  config = load_config(CONFIG_FILE)
  for flag in SMALL:
    key, value = flag[len("--config.") :].split("=")
    node = config
    *path, leaf = key.split(".")
    for part in path:
      node = node[part]
    node[leaf] = type(node[leaf])(value)
  return config


@pytest.mark.slow
def test_a_few_steps_lower_the_loss():
  config = small_config()
  config.total_steps = 30
  config.learning_rate = 3e-3
  optimizer = contrastive.make_optimizer(config)
  step = contrastive.make_train_step(
    config, contrastive.CLIP(contrastive.model_config(config)), optimizer
  )
  state = contrastive.initial_state(config, optimizer)
  batch = contrastive.batch_for_step(config, 0)
  losses = []
  for i in range(25):
    previous = state
    state, metrics = step(state, batch)
    losses.append(float(metrics["loss"]))
    if i == 0:  # the step donates its state: the old one is gone, the new one is there
      assert previous["params"]["logit_scale"].is_deleted()
      assert not state["params"]["logit_scale"].is_deleted()
  # Memorising one batch of hard negatives (pairs differing only in pattern) is slower than
  # chance-level loss suggests; a third off in 25 steps is far beyond noise.
  assert losses[-1] < 0.65 * losses[0], losses


def test_batches_are_a_function_of_seed_and_step():
  config = small_config()
  a_images, a_ids = contrastive.batch_for_step(config, 5)
  b_images, b_ids = contrastive.batch_for_step(config, 5)
  c_images, _ = contrastive.batch_for_step(config, 6)
  np.testing.assert_array_equal(a_images, b_images)
  np.testing.assert_array_equal(a_ids, b_ids)
  assert not np.array_equal(a_images, c_images)


def _run(workdir, steps, extra=()):
  return [
    sys.executable,
    "-m",
    "stori_jax.pretrain",
    f"--config={CONFIG_FILE}",
    f"--workdir={workdir}",
    f"--config.total_steps={steps}",
    "--config.checkpoint_every=3",
    "--config.log_every=3",
    "--config.eval_every=1000",
    "--config.export_dtype=float32",
    *SMALL,
    *extra,
  ]


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_weights(tmp_path):
  steps = 12
  straight, resumed = tmp_path / "straight", tmp_path / "resumed"
  subprocess.run(_run(straight, steps), cwd=REPO, check=True, capture_output=True, timeout=600)

  # Start the same run, SIGKILL it once a mid-run checkpoint is on disk, start it again.
  process = subprocess.Popen(
    _run(resumed, steps), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
  )
  checkpoint = resumed / "checkpoints" / "6"
  deadline = time.time() + 600
  while not checkpoint.exists() and process.poll() is None and time.time() < deadline:
    time.sleep(0.05)
  process.send_signal(signal.SIGKILL)
  process.wait()
  assert not (resumed / "export").exists(), "the run finished before it could be killed"
  log = subprocess.run(
    _run(resumed, steps), cwd=REPO, check=True, capture_output=True, text=True, timeout=600
  )
  assert "Resumed from step" in log.stderr

  a = load_file(str(straight / "export" / "params.safetensors"))
  b = load_file(str(resumed / "export" / "params.safetensors"))
  assert a.keys() == b.keys()
  for key in a:
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)
  # the logged curve is the same too, and plotted
  curves = [metrics_log.read_records(str(d / "metrics.jsonl")) for d in (straight, resumed)]
  assert curves[0] == curves[1] and len(curves[0]) > 1
  assert (resumed / "training_curve.png").stat().st_size > 0


def test_pattern_groups_differ_only_in_pattern():
  batch = contrastive.pattern_groups(3, np.random.default_rng(0), seed=(0, 1, 3), image_size=32)
  assert len(batch) == 12
  for family in ("shape", "colour", "size", "position", "background"):
    labels = getattr(batch, family).reshape(3, 4)
    assert np.all(labels == labels[:, :1]), family  # shared within each group of four
  for group in batch.pattern.reshape(3, 4):
    assert sorted(group) == list(range(4))  # every pattern once
  assert batch.mentioned[:, 0, 2].all()  # every caption names the pattern
  # the batch mix: groups of four take the configured share, the rest stays as it was
  config = small_config()
  config.data.pattern_negative_fraction = 0.5
  images, ids = contrastive.batch_for_step(config, 2)
  assert images.shape[0] == ids.shape[0] == config.batch_size
  config.data.hard_negative_fraction = 0.75
  with pytest.raises(ValueError, match="at most 1"):
    contrastive.batch_for_step(config, 2)


def test_shipped_checkpoint_was_made_by_the_pretraining_config():
  """The shipped tiny CLIP echoes the config that made it; configs/tiny_clip_pretrain.py must
  still say the same (so `python -m stori_jax.pretrain` reproduces it)."""
  from stori_jax.clip.loading import ASSETS_DIR

  with open(os.path.join(ASSETS_DIR, "tiny-synthetic", "stori_config.json"), encoding="utf-8") as f:
    shipped = json.load(f)
  config = json.loads(load_config(CONFIG_FILE).to_json_best_effort())
  assert shipped["metadata"]["pretrain_config"] == config
  assert shipped["metadata"]["steps"] == config["total_steps"]
  assert shipped["config"]["name"] == config["model"]["name"] == "tiny-synthetic"


def test_training_curve_has_a_title_naming_the_run(tmp_path, monkeypatch):
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  closed, close = [], plt.close
  monkeypatch.setattr(plt, "close", lambda fig=None: (closed.append(fig), close(fig)))
  records = [dict(step=1, loss=2.0, zero_shot_colour=0.2), dict(step=2, loss=1.0)]
  (tmp_path / "tiny_run").mkdir()
  contrastive.plot_curve(records, str(tmp_path / "tiny_run" / "training_curve.png"))
  (fig,) = closed
  assert "pretraining" in fig._suptitle.get_text() and "tiny_run" in fig._suptitle.get_text()
  assert all(ax.get_ylabel() for ax in fig.axes)
