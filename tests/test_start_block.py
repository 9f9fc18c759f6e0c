"""The start-block measurement (App. C.6 generalised): its recommendation rule, its table, and
a run on the shipped tiny CLIP whose stored default it must reproduce."""

import os
import types

import numpy as np
import pytest

import stori_jax
from stori_jax.clip.bundle import START_BLOCK_NONE, resolve_start_block
from stori_jax.plumbing.config_files import ConfigError, load_config
from stori_jax.models import default_start_block, reweighted_block_indices
from stori_jax.models.config import TextConfig
from stori_jax.retrieval import datasets, start_block_sweep
from stori_jax.retrieval.index import encode_data


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _response(block, slope):
  return {"start_block": block, "ap_per_log_weight": slope}


def test_recommend_picks_the_latest_block_with_half_the_strongest_response():
  responses = [_response(1, 0.10), _response(2, 0.08), _response(3, 0.051), _response(4, 0.049)]
  assert start_block_sweep.recommend(responses) == 3
  assert start_block_sweep.recommend(responses, fraction=0.9) == 1
  # No response anywhere: the earliest block (reweighting as much of the tower as possible).
  assert start_block_sweep.recommend([_response(2, 0.0), _response(3, -0.01)]) == 2


def test_stored_default_start_block_is_used_and_checked():
  assert default_start_block(TextConfig(layers=12)) == 7
  assert default_start_block(TextConfig(layers=6, default_start_block=2)) == 2
  assert reweighted_block_indices(TextConfig(layers=6, default_start_block=2)) == (1, 2, 3, 4, 5)
  assert reweighted_block_indices(6) == (3, 4, 5)
  with pytest.raises(ValueError, match="outside the text tower's blocks 1..6"):
    TextConfig(layers=6, default_start_block=7)


@pytest.fixture(scope="module")
def probe(tiny_synthetic):
  bundle = tiny_synthetic
  data = datasets.synthetic_data(n_triples=6, images_per_category=4, seed=(4242, 9))
  return bundle, encode_data(bundle, data), data.tasks


def test_block_response_measures_weights_on_the_word(probe):
  bundle, embeddings, tasks = probe
  first = start_block_sweep.block_response(bundle, embeddings, tasks, 1)
  last = start_block_sweep.block_response(bundle, embeddings, tasks, bundle.config.text.layers)
  assert set(first["by_attribute"]) == {"colour", "pattern", "shape"}
  # Excluding the word (w = 0) lowers its AP at every start block, emphasis raises it.
  assert first["removal"] < -0.1
  for r in (first, last):
    assert r["removal"] < 0
    assert r["ap_per_log_weight"] > 0
    assert r["delta_ap"]["1.0"] == 0.0
    assert np.isclose(
      r["ap_per_log_weight"], (r["delta_ap"]["1.5"] - r["delta_ap"]["0.5"]) / np.log(3)
    )
  # Reweighting every block moves retrieval more than reweighting the last one.
  assert first["ap_per_log_weight"] > last["ap_per_log_weight"]


def test_sweep_table_and_plot(probe, tmp_path):
  bundle, embeddings, tasks = probe
  sweep = start_block_sweep.start_block_sweep(bundle, embeddings, tasks, start_blocks=(2, 4, 6))
  assert [r["start_block"] for r in sweep["blocks"]] == [2, 4, 6]
  assert sweep["recommended"] in (2, 4, 6)
  table = start_block_sweep.format_table(sweep)
  assert "<- recommended" in table and len(table.splitlines()) == 5
  start_block_sweep.plot_sweep(sweep, str(tmp_path / "start_block.png"))
  assert (tmp_path / "start_block.png").stat().st_size > 10_000
  with pytest.raises(ValueError, match="1..6"):
    start_block_sweep.start_block_sweep(bundle, embeddings, tasks, start_blocks=(0,))


def test_cli_refuses_a_missing_probe_config_in_one_paragraph(tmp_path):
  # The one run of `python -m stori_jax.start_block` as a program.
  import subprocess
  import sys

  result = subprocess.run(
    [
      sys.executable,
      "-m",
      "stori_jax.start_block",
      "--data_config=nowhere.py",
      f"--workdir={tmp_path / 'w'}",
    ],
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert result.returncode == 2, result.stderr[-2000:]
  assert "error: --data_config: no config file nowhere.py" in result.stderr
  assert "Traceback" not in result.stderr and not (tmp_path / "w").exists()


# One check of a start block against the text tower, for every command ------------------------


def _model(layers, stored=None):
  """A stand-in bundle: what resolve_start_block reads (the text config and the source)."""
  text = TextConfig(layers=layers, default_start_block=stored)
  return types.SimpleNamespace(config=types.SimpleNamespace(text=text), source="m")


def test_none_resolves_to_the_models_default_not_the_second_half():
  assert resolve_start_block(_model(6, stored=2), None, "x") == 2  # stored: not 6 // 2 + 1
  assert resolve_start_block(_model(12), None, "x") == 7  # none stored: the paper's depth
  assert resolve_start_block(_model(6, stored=2), 6, "x") == 6
  for bad in (0, -1, 7):
    with pytest.raises(ConfigError) as error:
      resolve_start_block(_model(6, stored=2), bad, "config.start_block")
    assert str(error.value) == (
      f"config.start_block = {bad} is outside the text tower of m (blocks 1..6, 1-indexed): "
      "pick a block in 1..6; this model's default start block, which None gives, is 2."
    )


def _fewshot(tmp_path, monkeypatch, run_command):
  from stori_jax.fewshot import trainer  # pylint: disable=import-outside-toplevel

  monkeypatch.setattr(trainer, "encode_images", lambda *a, **k: pytest.fail("the run started"))
  config = load_config(os.path.join(REPO, "configs", "demo.py"))
  config.model.source, config.start_block = "tiny-synthetic", 9
  config.shots, config.data.n_test_per_class = 1, 1
  with pytest.raises(ConfigError) as error:
    trainer.run(config, str(tmp_path / "w"))
  return "tiny-synthetic", "config.start_block", str(error.value)


def _retrieval(tmp_path, monkeypatch, run_command):
  from stori_jax.retrieval import runner  # pylint: disable=import-outside-toplevel

  monkeypatch.setattr(runner.index, "build_index", lambda *a, **k: pytest.fail("run started"))
  config = load_config(os.path.join(REPO, "configs", "retrieval_synthetic.py"))
  config.start_block, config.data.n_triples, config.data.images_per_category = 9, 1, 1
  with pytest.raises(ConfigError) as error:
    runner.run(config, str(tmp_path / "w"))
  return "tiny-synthetic", "config.start_block", str(error.value)


def _evaluate_world(tmp_path, monkeypatch, run_command):
  from stori_jax.world_evaluation import metrics as world_metrics  # pylint: disable=import-outside-toplevel

  monkeypatch.setattr(world_metrics, "evaluate", lambda *a, **k: pytest.fail("run started"))
  done = run_command(
    "stori_jax.evaluate_world", "--start_block=9", f"--output_dir={tmp_path / 'w'}"
  )
  assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
  (line,) = [x for x in done.stderr.splitlines() if x.startswith("error: ")]
  return "tiny-synthetic", "--start_block", line[len("error: ") :]


def _weight_response(tmp_path, monkeypatch, run_command):
  from stori_jax.pretraining import weight_response  # pylint: disable=import-outside-toplevel

  config = load_config(os.path.join(REPO, "configs", "tiny_clip_weight_response.py"))
  config.start_block = 9
  with pytest.raises(ConfigError) as error:
    weight_response.train(config, str(tmp_path / "w"))
  assert not (tmp_path / "w").exists()
  return config.init_from, "config.start_block", str(error.value)


@pytest.mark.parametrize(
  "command", [_fewshot, _retrieval, _evaluate_world, _weight_response], ids=lambda f: f.__name__
)
def test_every_command_reports_a_start_block_outside_the_tower_in_one_sentence(
  command, tmp_path, monkeypatch, run_command
):
  """Each command's message is resolve_start_block's, word for word: a second check with a
  message of its own (or a stale "second half" for None) fails here."""
  model, name, message = command(tmp_path, monkeypatch, run_command)
  with pytest.raises(ConfigError) as expected:
    resolve_start_block(stori_jax.load(model), 9, name)
  assert message == str(expected.value)
  assert "second half" not in message


def test_start_block_flags_say_what_none_means():
  from absl import flags  # pylint: disable=import-outside-toplevel

  from stori_jax import evaluate_world  # pylint: disable=import-outside-toplevel

  values = flags.FlagValues()
  evaluate_world.define_flags(values)
  assert START_BLOCK_NONE in values["start_block"].help


@pytest.mark.parametrize(
  "config, lacks",
  [
    (
      "configs/demo.py",
      "its synthetic `data` block lacks n_triples, images_per_category, seed "
      "(it is a few-shot config, python -m stori_jax.train's)",
    ),
    ("configs/mutual_synthetic.py", "lacks n_triples"),
  ],
  ids=["fewshot", "mutual"],
)
def test_a_config_that_is_not_a_retrieval_config_is_refused_before_the_model_loads(
  config, lacks, tmp_path, monkeypatch, run_command
):
  """Issue 36 row 7: a few-shot config as --data_config was an AttributeError traceback after
  the model loaded, and left the workdir behind."""

  def no_model(*_, **__):
    raise AssertionError("the model loaded before the probe config was checked")

  monkeypatch.setattr(stori_jax, "load", no_model)
  workdir = tmp_path / "start_block"
  done = run_command(
    "stori_jax.start_block",
    "--model=tiny-synthetic",
    f"--data_config={config}",
    f"--workdir={workdir}",
  )
  assert done.returncode == 2, done.stderr[-2000:]
  message = done.stderr.strip()
  assert "Traceback" not in message and "\n" not in message  # one paragraph
  assert message.startswith(f"error: --data_config {config} is not a retrieval config: ")
  assert lacks in message and "configs/retrieval_synthetic.py" in message
  assert not workdir.exists()
