"""python -m stori_jax.train end to end: outputs, resume, 1 vs 8 devices, and the demo's result."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from stori_jax.checkpoints import native
from stori_jax.models import CLIPConfig, TextConfig, VisionConfig, init_params

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(REPO, "configs", "demo.py")
TINY = CLIPConfig(
  embed_dim=32,
  text=TextConfig(context_length=64, width=32, layers=4, heads=2),
  vision=VisionConfig(image_size=64, patch_size=16, width=32, layers=1, heads=2),
)


@pytest.fixture(scope="module")
def random_model(tmp_path_factory):
  directory = tmp_path_factory.mktemp("model")
  native.save(directory, TINY, init_params(TINY, seed=0))
  return str(directory)


def _command(workdir, model, *extra):
  return [
    sys.executable,
    "-m",
    "stori_jax.train",
    f"--config={DEMO}",
    f"--workdir={workdir}",
    f"--config.model.source={model}",
    "--config.views=2",
    "--config.shots=4",
    "--config.data.n_test_per_class=5",
    "--config.log_every=1",
    "--config.eval_every=2",
    "--config.checkpoint_every=2",
    *extra,
  ]


def test_train_writes_its_reports(tmp_path, random_model):
  result = subprocess.run(
    _command(tmp_path, random_model, "--config.epochs=3"),
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert "zero-shot accuracy" in result.stdout and "top words" in result.stdout
  for name in (
    "metrics.json",
    "weights.json",
    "history.jsonl",
    "training_curve.png",
    "interpretability.html",
    "interpretability.png",
  ):
    assert (tmp_path / name).exists(), name
  metrics = json.loads((tmp_path / "metrics.json").read_text())
  assert metrics["steps"] == 3 and metrics["num_prompts"] == 96
  assert set(metrics["trained"]["per_class"]) == set(metrics["zero_shot"]["per_class"])
  weights = json.loads((tmp_path / "weights.json").read_text())
  assert len(weights) == 96
  first = weights[0]
  assert first["tokens"][0] == "<start_of_text>" and first["token_weights"][0] == 1.0
  assert any(w != 1.0 for w in first["token_weights"][1:-1])  # Trained.


def test_taskres_baseline_runs(tmp_path, random_model):
  result = subprocess.run(
    _command(tmp_path, random_model, "--config.epochs=2", "--config.method=taskres"),
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  metrics = json.loads((tmp_path / "metrics.json").read_text())
  assert metrics["method"] == "taskres"


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_weights(tmp_path, random_model):
  straight, resumed = tmp_path / "straight", tmp_path / "resumed"
  args = ("--config.epochs=8",)
  subprocess.run(
    _command(straight, random_model, *args), cwd=REPO, check=True, capture_output=True, timeout=600
  )
  process = subprocess.Popen(
    _command(resumed, random_model, *args),
    cwd=REPO,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  deadline = time.time() + 600
  while (
    not (resumed / "checkpoints" / "4").exists()
    and process.poll() is None
    and time.time() < deadline
  ):
    time.sleep(0.05)
  process.send_signal(signal.SIGKILL)
  process.wait()
  assert not (resumed / "metrics.json").exists(), "the run finished before it could be killed"
  subprocess.run(
    _command(resumed, random_model, *args), cwd=REPO, check=True, capture_output=True, timeout=600
  )
  a = json.loads((straight / "weights.json").read_text())
  b = json.loads((resumed / "weights.json").read_text())
  np.testing.assert_array_equal(
    np.concatenate([w["token_weights"] for w in a]), np.concatenate([w["token_weights"] for w in b])
  )


@pytest.mark.slow
def test_one_and_eight_devices_agree(tmp_path, random_model):
  runs = {}
  for devices in (1, 8):
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    workdir = tmp_path / f"d{devices}"
    subprocess.run(
      _command(workdir, random_model, "--config.epochs=4"),
      cwd=REPO,
      check=True,
      capture_output=True,
      timeout=600,
      env=env,
    )
    runs[devices] = (
      json.loads((workdir / "metrics.json").read_text()),
      json.loads((workdir / "weights.json").read_text()),
    )
  assert runs[8][0]["num_devices"] == 8
  one = np.concatenate([w["token_weights"] for w in runs[1][1]])
  eight = np.concatenate([w["token_weights"] for w in runs[8][1]])
  # Sums over prompts are reduced in a different order on 8 devices: float32 rounding only.
  np.testing.assert_allclose(one, eight, rtol=0, atol=1e-4)
  assert runs[1][0]["trained"]["accuracy"] == runs[8][0]["trained"]["accuracy"]


@pytest.mark.slow
@pytest.mark.xfail(
  strict=False,
  reason="known shortfall (issue 5): the shipped tiny CLIP is 98.67% right zero-shot on the "
  "demo's 12 classes, so SToRI gains only 0.17 points and its weights do not single out the "
  "discriminative words (word-rank AUC 0.46); the demo task needs harder distinctions",
)
def test_demo_beats_zero_shot_and_weights_find_the_discriminative_words(tmp_path):
  from stori_jax.data import synthetic_tasks

  result = subprocess.run(
    [sys.executable, "-m", "stori_jax.train", f"--config={DEMO}", f"--workdir={tmp_path}"],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=1200,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  metrics = json.loads((tmp_path / "metrics.json").read_text())
  assert metrics["trained"]["accuracy"] > metrics["zero_shot"]["accuracy"] + 0.02
  auc = discriminative_word_auc(
    json.loads((tmp_path / "weights.json").read_text()), synthetic_tasks
  )
  assert auc > 0.6, auc


def discriminative_word_auc(weights_records, synthetic_tasks) -> float:
  """P(weight of a class-discriminating word > weight of an irrelevant word), over prompts.

  Discriminating words: those naming the class's attributes (colour, pattern,
  shape words); irrelevant: every other word of the prompt.
  """
  wins, total = 0.0, 0
  for record in weights_records:
    spec_words = set().union(*synthetic_tasks.class_words(record["class"]).values())
    words = record["word_weights"]
    relevant = [w for word, w in words if word in spec_words]
    irrelevant = [w for word, w in words if word not in spec_words and word.isalpha()]
    for r in relevant:
      for i in irrelevant:
        wins += 1.0 if r > i else 0.5 if r == i else 0.0
        total += 1
  return wins / total


@pytest.mark.slow
def test_two_processes_match_one(tmp_path, random_model):
  """The multi-host path: 2 processes x 2 CPU devices (jax.distributed) vs 1 process."""
  args = _command(tmp_path / "single", random_model, "--config.epochs=3")[3:]
  single = subprocess.run(
    [sys.executable, "-m", "stori_jax.train", *args],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert single.returncode == 0, single.stderr[-3000:]
  multi_args = _command(tmp_path / "multi", random_model, "--config.epochs=3")[3:]
  env = dict(os.environ, PYTHON=sys.executable, DEVICES_PER_PROCESS="2")
  multi = subprocess.run(
    ["bash", os.path.join(REPO, "launch", "local_multiprocess.sh"), "2", *multi_args],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=900,
    env=env,
  )
  assert multi.returncode == 0, multi.stderr[-3000:]
  a = json.loads((tmp_path / "single" / "weights.json").read_text())
  b = json.loads((tmp_path / "multi" / "weights.json").read_text())
  metrics = json.loads((tmp_path / "multi" / "metrics.json").read_text())
  assert metrics["num_devices"] == 4
  np.testing.assert_allclose(
    np.concatenate([w["token_weights"] for w in a]),
    np.concatenate([w["token_weights"] for w in b]),
    rtol=0,
    atol=1e-4,
  )


def test_missing_dataset_stops_with_what_to_download(tmp_path):
  result = subprocess.run(
    [
      sys.executable,
      "-m",
      "stori_jax.train",
      f"--config={REPO}/configs/dtd.py:16",
      f"--workdir={tmp_path / 'run'}",
      f"--config.data.root={tmp_path / 'data'}",
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert result.returncode == 1
  assert (
    "dtd-r1.0.1.tar.gz" in result.stderr and "split_zhou_DescribableTextures.json" in result.stderr
  )
  assert "Traceback" not in result.stderr
