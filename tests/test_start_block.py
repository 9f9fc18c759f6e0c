"""The start-block measurement (App. C.6 generalised): its recommendation rule, its table, and
a run on the shipped tiny CLIP whose stored default it must reproduce."""

import numpy as np
import pytest

from stori_jax.models import default_start_block, reweighted_block_indices
from stori_jax.models.config import TextConfig
from stori_jax.retrieval import datasets, block_sweep
from stori_jax.retrieval.index import encode_data


def _response(block, slope):
  return {"start_block": block, "ap_per_log_weight": slope}


def test_recommend_picks_the_latest_block_with_half_the_strongest_response():
  responses = [_response(1, 0.10), _response(2, 0.08), _response(3, 0.051), _response(4, 0.049)]
  assert block_sweep.recommend(responses) == 3
  assert block_sweep.recommend(responses, fraction=0.9) == 1
  # No response anywhere: the earliest block (reweighting as much of the tower as possible).
  assert block_sweep.recommend([_response(2, 0.0), _response(3, -0.01)]) == 2


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
  first = block_sweep.block_response(bundle, embeddings, tasks, 1)
  last = block_sweep.block_response(bundle, embeddings, tasks, bundle.config.text.layers)
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
  sweep = block_sweep.start_block_sweep(bundle, embeddings, tasks, start_blocks=(2, 4, 6))
  assert [r["start_block"] for r in sweep["blocks"]] == [2, 4, 6]
  assert sweep["recommended"] in (2, 4, 6)
  table = block_sweep.format_table(sweep)
  assert "<- recommended" in table and len(table.splitlines()) == 5
  block_sweep.plot_sweep(sweep, str(tmp_path / "start_block.png"))
  assert (tmp_path / "start_block.png").stat().st_size > 10_000
  with pytest.raises(ValueError, match="1..6"):
    block_sweep.start_block_sweep(bundle, embeddings, tasks, start_blocks=(0,))


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
