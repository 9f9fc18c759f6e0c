"""python -m stori_jax.train end to end: outputs, resume, 1 vs 8 devices, and the demo's result.

Runs are subprocesses where a process is the point (the run as a program, a kill, another
device count, several processes), else in this process (`run_command`)."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from stori_jax.plumbing import cli, config_files
from stori_jax import train
from stori_jax.data import synthetic_tasks
from stori_jax.fewshot import trainer
from test_cli import assert_ends_with_outputs
from demo_flags import short_demo_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(REPO, "configs", "demo.py")
PROGRAM = [sys.executable, "-m", "stori_jax.train"]


def _flags(workdir, model, *extra):
  return short_demo_flags(workdir, model, *extra)


def _command(workdir, model, *extra):
  return PROGRAM + _flags(workdir, model, *extra)


def _run(command, timeout=600, **kwargs) -> subprocess.CompletedProcess:
  """Runs a command from the repository root, capturing its text output."""
  return subprocess.run(
    command, cwd=REPO, capture_output=True, text=True, timeout=timeout, **kwargs
  )


#: The one-device run's length: the run the resume, device-count and multi-process tests
#: compare with (8 epochs leave steps after the checkpoint at 4 for a kill to land in).
EPOCHS = 8


@pytest.fixture(scope="module")
def one_device_run(tmp_path_factory, tiny_random_model):
  """(completed process, workdir) of the short demo run, EPOCHS steps, as a program on one CPU
  device: made once for the tests that check its outputs or compare another run with it."""
  workdir = tmp_path_factory.mktemp("one_device")
  result = _run(_command(workdir, tiny_random_model, f"--config.epochs={EPOCHS}"), env=_devices(1))
  return result, workdir


def _devices(count: int) -> dict:
  """The environment of a run on `count` CPU devices."""
  return dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={count}")


def _trained(workdir):
  """The trained token weights of a run, prompt after prompt."""
  weights = json.loads((workdir / "weights.json").read_text())
  return np.concatenate([w["token_weights"] for w in weights])


@pytest.mark.slow
def test_train_writes_its_reports(one_device_run):
  # The one short run of `python -m stori_jax.train` as a program.
  result, tmp_path = one_device_run
  assert result.returncode == 0, result.stderr[-3000:]
  assert "zero-shot accuracy" in result.stdout and "top words" in result.stdout
  assert "word-rank AUC" in result.stdout
  _assert_columns_align(_top_words_lines(result.stdout), 12)
  assert_ends_with_outputs(result.stdout, *train.OUTPUTS)
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
  assert metrics["steps"] == EPOCHS and metrics["num_prompts"] == 96
  assert set(metrics["trained"]["per_class"]) == set(metrics["zero_shot"]["per_class"])
  assert list(metrics["zero_shot"]["per_class"]) == list(metrics["config"]["data"]["class_names"])
  assert all(0 <= auc <= 1 for auc in metrics["word_rank_auc"].values())
  weights = json.loads((tmp_path / "weights.json").read_text())
  assert len(weights) == 96
  first = weights[0]
  assert first["tokens"][0] == "<start_of_text>" and first["token_weights"][0] == 1.0
  assert any(w != 1.0 for w in first["token_weights"][1:-1])  # Trained.


def test_a_bad_synthetic_class_name_stops_with_a_message(tmp_path, tiny_random_model, run_command):
  result = run_command(
    train,
    *_flags(tmp_path, tiny_random_model, "--config.data.class_names=('red hexagon', 'red star')"),
  )
  assert result.returncode == 2
  assert "error: config.data.class_names: synthetic class 'red hexagon'" in result.stderr
  assert "Traceback" not in result.stderr and not (tmp_path / "checkpoints").exists()


@pytest.mark.slow
def test_taskres_baseline_runs(tmp_path, tiny_random_model, run_command):
  result = run_command(
    train, *_flags(tmp_path, tiny_random_model, "--config.epochs=2", "--config.method=taskres")
  )
  assert result.returncode == 0, result.stderr[-3000:]
  metrics = json.loads((tmp_path / "metrics.json").read_text())
  assert metrics["method"] == "taskres"
  assert_ends_with_outputs(result.stdout, "run.json", "metrics.json", "checkpoints")


def _top_words_lines(stdout: str) -> list[str]:
  """The class table of the summary: its header and one line per class."""
  lines = stdout.splitlines()
  start = next(i for i, line in enumerate(lines) if line.split()[:3] == ["class", "top", "words"])
  end = lines.index(cli.WROTE_HEADING)
  return lines[start:end]


def _assert_columns_align(lines: list[str], classes: int) -> None:
  """Every column (the class, then each top word with its weight) starts at the same character
  on every line."""
  header, rows = lines[0], lines[1:]
  assert len(rows) == classes, lines
  # Cells are separated by two spaces or more; a cell holds single spaces ("red dotted star").
  starts = [[m.start() for m in re.finditer(r"(?:^|(?<=  ))\S", row)] for row in rows]
  assert all(s == starts[0] for s in starts), "\n".join(lines)
  assert len(starts[0]) == 6  # the class and its 5 top words
  assert header.index("top words") == starts[0][1]


def test_the_top_words_table_aligns_any_class_name_width():
  """Issue 29: the two-colour demo's names ("orange striped triangle") were longer than the
  column, and its words pushed the next ones along."""
  top = {
    "red dotted star": [("star", 1.31), ("dotted", 1.2), ("a", 1.0), ("of", 0.99), ("red", 0.9)],
    "orange striped triangle": [
      ("triangle", 1.4),
      ("stripes", 1.25),
      ("orange", 1.1),
      ("sticker", 0.97),
      ("x", 0.5),
    ],
    "ab": [("a", 1.0), ("b", 1.0), ("c", 1.0), ("d", 1.0), ("lovely", 10.0)],
  }
  lines = train.top_words_table(top)
  _assert_columns_align(lines, 3)
  assert lines[2].startswith("  orange striped triangle  triangle 1.40  ")


@pytest.mark.slow
def test_run_scores_words_with_the_report_hook_of_its_dataset(tmp_path, tiny_random_model):
  """`run` has no dataset branch: the split's dataset name picks the hook that adds its
  scores to metrics.json (by default the synthetic world's, `world_scoring.REPORT_HOOKS`)."""
  config = config_files.load_config(DEMO)
  config.model.source = tiny_random_model
  config.update_from_flattened_dict(
    {"views": 1, "shots": 2, "data.n_test_per_class": 2, "epochs": 1, "eval_every": 1}
  )
  calls = []

  def hook(**kwargs):
    calls.append(kwargs)
    return {"planted_score": 0.5}

  metrics = trainer.run(config, str(tmp_path), report_hooks={"synthetic": hook})
  assert len(calls) == 1 and set(calls[0]) == {"bank", "words", "top_words", "class_names"}
  assert calls[0]["top_words"] == metrics["top_words"]
  assert len(calls[0]["words"]) == metrics["num_prompts"]
  assert list(metrics)[-2:] == ["top_words", "planted_score"]  # after the top words, as before
  assert "word_rank_auc" not in metrics  # the default mapping was replaced
  written = json.loads((tmp_path / "metrics.json").read_text())
  assert written["planted_score"] == 0.5


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_weights(tmp_path, tiny_random_model, one_device_run):
  straight, resumed = one_device_run[1], tmp_path / "resumed"
  assert one_device_run[0].returncode == 0, one_device_run[0].stderr[-3000:]
  args = (f"--config.epochs={EPOCHS}",)
  process = subprocess.Popen(
    _command(resumed, tiny_random_model, *args),
    cwd=REPO,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
    env=_devices(1),  # as the straight run
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
  _run(_command(resumed, tiny_random_model, *args), check=True, env=_devices(1))
  np.testing.assert_array_equal(_trained(straight), _trained(resumed))


@pytest.mark.slow
def test_one_and_eight_devices_agree(tmp_path, tiny_random_model, one_device_run):
  assert one_device_run[0].returncode == 0, one_device_run[0].stderr[-3000:]
  runs = {1: one_device_run[1], 8: tmp_path / "d8"}
  _run(
    _command(runs[8], tiny_random_model, f"--config.epochs={EPOCHS}"), check=True, env=_devices(8)
  )
  metrics = {d: json.loads((w / "metrics.json").read_text()) for d, w in runs.items()}
  assert metrics[1]["num_devices"] == 1 and metrics[8]["num_devices"] == 8
  # Sums over prompts are reduced in a different order on 8 devices: float32 rounding only.
  np.testing.assert_allclose(_trained(runs[1]), _trained(runs[8]), rtol=0, atol=1e-4)
  assert metrics[1]["trained"]["accuracy"] == metrics[8]["trained"]["accuracy"]


@pytest.mark.slow
def test_demo_beats_zero_shot_and_weights_find_the_discriminative_words(tmp_path, run_command):
  """Issues 5 and 17 on the embedded world, with the shipped tiny CLIP and configs/demo.py."""
  result = run_command(train, f"--config={DEMO}", f"--workdir={tmp_path}")
  assert result.returncode == 0, result.stderr[-3000:]
  metrics = json.loads((tmp_path / "metrics.json").read_text())
  # Measured 91.33% -> 95.17% (seeds 2 and 3 of the few-shot sample: +3.8, +2.8 points).
  assert metrics["trained"]["accuracy"] > metrics["zero_shot"]["accuracy"] + 0.02
  # Measured 0.944: the class's pattern/shape words outweigh the size and background words its
  # prompts state wrongly for half its images.
  assert metrics["word_rank_auc"]["nuisance"] > 0.85, metrics["word_rank_auc"]
  # Issue 17: they outweigh every other word of the prompt too, fillers included (measured
  # 0.866, 0.824, 0.827 for seeds 1-3; 0.78 with the paper's objective).
  assert metrics["word_rank_auc"]["other"] >= 0.75, metrics["word_rank_auc"]
  # The misleading words are the ones turned down most (median 0.72; the shared colour 0.79).
  medians = metrics["median_word_weight"]
  assert min(medians, key=medians.get) == "nuisance" and medians["nuisance"] < 0.8, medians
  assert medians["pattern"] > 1.1 and medians["shape"] > 1.05, medians  # 1.20, 1.12
  # Issue 17: the weights read as an explanation, a discriminating word among the 3
  # top-weighted words of at least 10 of the 12 classes (measured 12, 12, 11 for seeds 1-3;
  # 1-5 of 12 without the log-weight prior).
  assert len(metrics["classes_with_discriminating_top3"]) >= 10, metrics["top_words"]
  # The metrics agree with the weights file the report is drawn from.
  records = json.loads((tmp_path / "weights.json").read_text())
  recomputed = synthetic_tasks.word_rank_auc(
    [r["word_weights"] for r in records],
    [r["class"] for r in records],
    metrics["zero_shot"]["per_class"],
  )
  assert recomputed == pytest.approx(metrics["word_rank_auc"]["nuisance"])


@pytest.mark.slow
def test_two_processes_match_one(tmp_path, tiny_random_model, one_device_run):
  """The multi-host path: 2 processes x 2 CPU devices (jax.distributed) vs 1 process."""
  single, single_dir = one_device_run
  assert single.returncode == 0, single.stderr[-3000:]
  multi_args = _flags(tmp_path / "multi", tiny_random_model, f"--config.epochs={EPOCHS}")
  env = dict(os.environ, PYTHON=sys.executable, DEVICES_PER_PROCESS="2")
  multi = _run(
    ["bash", os.path.join(REPO, "launch", "local_multiprocess.sh"), "2", *multi_args],
    timeout=900,
    env=env,
  )
  assert multi.returncode == 0, multi.stderr[-3000:]
  metrics = json.loads((tmp_path / "multi" / "metrics.json").read_text())
  assert metrics["num_devices"] == 4
  np.testing.assert_allclose(_trained(single_dir), _trained(tmp_path / "multi"), rtol=0, atol=1e-4)


def test_missing_dataset_stops_with_what_to_download(tmp_path, run_command):
  result = run_command(
    train,
    f"--config={REPO}/configs/dtd.py:16",
    f"--workdir={tmp_path / 'run'}",
    f"--config.data.root={tmp_path / 'data'}",
  )
  assert result.returncode == 2  # a user's mistake (cli.run): one paragraph, no traceback
  assert (
    "dtd-r1.0.1.tar.gz" in result.stderr and "split_zhou_DescribableTextures.json" in result.stderr
  )
  assert "Traceback" not in result.stderr


class _Killed(Exception):
  """Stands for the process being killed in the middle of a run."""


@pytest.mark.slow
def test_fresh_views_train_and_resume_to_the_same_weights(tmp_path, tiny_random_model, monkeypatch):
  """config.views = 0: a new view of every image at every step, drawn on the device in the step
  from (seed, step, image). A run interrupted after its checkpoint at step 2 resumes to the
  weights of an uninterrupted one; the history logs every step."""
  from stori_jax.trainloop import loop  # noqa: PLC0415

  config = config_files.load_config(DEMO)
  config.model.source = tiny_random_model
  config.update_from_flattened_dict(
    {
      "views": 0,
      "augment_scale": (0.5, 1.0),
      "shots": 2,
      "batch_size": 12,
      "data.n_test_per_class": 2,
      "epochs": 2,
      "log_every": 1,
      "eval_every": 100,
      "checkpoint_every": 2,
    }
  )
  straight = trainer.run(config, str(tmp_path / "straight"))
  assert straight["steps"] == 4  # 24 images in batches of 12
  real_loop = loop.train_loop

  def killed_at_step_3(train_step, *args, **kwargs):
    calls = []

    def step(state, batch):
      calls.append(1)
      if len(calls) == 3:
        raise _Killed()
      return train_step(state, batch)

    return real_loop(step, *args, **kwargs)

  monkeypatch.setattr(loop, "train_loop", killed_at_step_3)
  with pytest.raises(_Killed):
    trainer.run(config, str(tmp_path / "resumed"))
  monkeypatch.setattr(loop, "train_loop", real_loop)
  resumed = trainer.run(config, str(tmp_path / "resumed"))
  a = json.loads((tmp_path / "straight" / "weights.json").read_text())
  b = json.loads((tmp_path / "resumed" / "weights.json").read_text())
  np.testing.assert_array_equal(
    np.concatenate([w["token_weights"] for w in a]), np.concatenate([w["token_weights"] for w in b])
  )
  assert resumed["trained"] == straight["trained"]
  history = [json.loads(line) for line in (tmp_path / "straight" / "history.jsonl").open()]
  assert [r["step"] for r in history] == [1, 2, 3, 4]
  assert all(np.isfinite(r["loss"]) for r in history)


def test_every_epochs_rate_is_in_the_history_whatever_log_every_is(
  tmp_path, tiny_random_model, run_command
):
  """Issue 41 item 5: TaskRes on 12 classes x 4 shots in batches of 24, 2 steps per epoch, and
  log_every 10: the history still has each epoch's first step, with its exact rate (1e-5 in the
  warm-up epoch, then Dassl's cosine restarted after it, T_max = 4 epochs)."""
  result = run_command(
    train,
    *short_demo_flags(
      tmp_path,
      tiny_random_model,
      "--config.method=taskres",
      "--config.epochs=4",
      "--config.batch_size=24",
      "--config.log_every=10",
      "--config.eval_every=100",
      "--config.checkpoint_every=100",
      schedule=False,
    ),
  )
  assert result.returncode == 0, result.stderr[-3000:]
  history = [json.loads(line) for line in (tmp_path / "history.jsonl").open()]
  # Each epoch's first step, and the last step (always logged).
  assert [(r["step"], r["epoch"]) for r in history] == [(1, 1), (3, 2), (5, 3), (7, 4), (8, 4)]
  lr = 2e-4  # configs/demo.py's taskres.lr
  expected = [1e-5] + [lr * (1 + np.cos(np.pi * (e - 2) / 4)) / 2 for e in (2, 3, 4)]
  np.testing.assert_allclose([r["lr"] for r in history[:4]], expected, rtol=1e-6)
  assert history[4]["lr"] == history[3]["lr"]  # one rate per epoch


def test_fresh_views_pass_the_image_tower_a_few_views_at_a_time_on_a_cpu():
  """fresh_view_passes: a CPU's passes keep the tower's largest activation within
  CPU_PASS_BYTES (6 views of ViT-B/16), other devices one pass; in_passes gives every view the
  features one call gives it, whether the passes divide the batch or not."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  from stori_jax.clip.bundle import CLIPBundle  # pylint: disable=import-outside-toplevel
  from stori_jax.models import get_architecture, init_params  # pylint: disable=import-outside-toplevel

  vit_b = CLIPBundle(config=get_architecture("ViT-B-16"), params={})
  assert trainer.fresh_view_passes(vit_b, "cpu") == trainer.CPU_PASS_BYTES // (197 * 3072 * 4)
  assert trainer.fresh_view_passes(vit_b, "cpu") == 6
  assert trainer.fresh_view_passes(vit_b.with_dtype(jnp.bfloat16), "cpu") == 13
  assert trainer.fresh_view_passes(vit_b, "gpu") is None
  config = get_architecture("test-tiny")
  bundle = CLIPBundle(config=config, params=init_params(config, seed=0))
  size = config.vision.image_size
  views = jax.random.normal(jax.random.PRNGKey(1), (7, size, size, 3))
  tower = lambda v: bundle.image_function(bundle.params, v, False)  # noqa: E731
  whole = np.asarray(tower(views))
  for per_pass in (1, 3, 7, None):
    np.testing.assert_allclose(
      np.asarray(trainer.in_passes(tower, views, per_pass)), whole, rtol=1e-6, atol=1e-6
    )
