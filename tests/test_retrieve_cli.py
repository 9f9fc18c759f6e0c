"""End to end: `python -m stori_jax.retrieve` writes metrics, tables and figures (run in this
process, `run_command`; once as a program)."""

import json
import os
import subprocess
import sys

import pytest

from stori_jax import retrieve
from stori_jax.retrieval import runner as retrieval_runner
from stori_jax.plumbing.config_files import ConfigError
from stori_jax.retrieval import paper_config

from test_cli import assert_ends_with_outputs
from test_retrieval_protocol import write_celeba

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIGURES = (
  "fig4_ranking.png",
  "fig5_auc_sweep.png",
  "fig6_prompt_weighting.png",
  "fig9a_start_block.png",
  "fig9b_single_block.png",
)


@pytest.mark.slow
def test_cli_on_the_synthetic_world_and_its_cache(tmp_path, run_command):
  args = [
    "--config",
    os.path.join(ROOT, "configs", "retrieval_synthetic.py"),
    "--config.data.n_triples=3",
    "--config.data.images_per_category=4",
    "--config.sweep.ws=(0.0,0.5,1.0)",
    "--config.sweep.single_ws=(0.0,1.0,2.0)",
    "--config.sweep.start_blocks=(1,4)",
    "--config.sweep.single_blocks=(4,)",
    f"--config.cache_dir={tmp_path / 'cache'}",
    f"--workdir={tmp_path / 'out'}",
  ]
  done = run_command(retrieve, *args)
  assert done.returncode == 0, done.stderr[-3000:]
  out = tmp_path / "out"
  results = json.loads((out / "retrieval_metrics.json").read_text())
  assert results["n_tasks"] == 3 and results["n_images"] == 96
  assert not results["index"]["from_cache"]
  assert set(results["emphasis"]["ap"]["mean"]) == {"0.5", "1.0", "1.5", "2.0"}
  assert set(results["sweeps"]) == {
    "stori_pair",
    "stori_single",
    "prompt_weighting_pair",
    "prompt_weighting_single",
    "start_1",
    "start_4",
    "only_4",
  }
  tables = (out / "retrieval_tables.md").read_text()
  for heading in ("Emphasized (w = 1.5)", "De-emphasized (w = 0.5)", "Attribute with w = 2"):
    assert heading in tables
  for name in FIGURES:
    assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
  names = ("run.json", "retrieval_metrics.json", "retrieval_tables.md", *FIGURES)
  # Every file written, the index cache this run built (outside the workdir) among them.
  cache = os.path.abspath(results["index"]["path"])
  assert cache in assert_ends_with_outputs(done.stdout, *names)
  # the second run reads the index from the cache
  second = run_command(retrieve, *args)
  again = json.loads(second.returncode == 0 and (out / "retrieval_metrics.json").read_text())
  assert again["index"]["from_cache"]
  assert cache not in assert_ends_with_outputs(second.stdout, *names)
  assert again["emphasis"]["ap"] == results["emphasis"]["ap"]


def test_cli_reports_bad_configs(tmp_path):
  # The one run of `python -m stori_jax.retrieve` as a program.
  done = subprocess.run(
    [
      sys.executable,
      "-m",
      "stori_jax.retrieve",
      "--config",
      os.path.join(ROOT, "configs", "retrieval_celeba3.py"),
      "--config.model=tiny-synthetic",
      f"--config.data.root={tmp_path}",
      f"--workdir={tmp_path}",
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
  assert "list_attr_celeba.txt does not exist" in done.stderr


def test_celeba3_config_runs_on_a_fixture_folder(tmp_path, tiny_synthetic):
  """The paper's CelebA setup (config as shipped) on a small CelebA-format folder."""
  write_celeba(str(tmp_path / "celeba"), n=64)
  from configs.retrieval_celeba3 import get_config  # pylint: disable=import-outside-toplevel

  config = get_config()
  config.data.root = str(tmp_path / "celeba")
  config.data.images_per_category = 2
  config.cache_dir = ""
  config.methods = ("stori",)
  config.sweep.ws = (0.0, 1.0)
  config.sweep.single_ws = (1.0, 2.0)
  config.sweep.start_blocks = "none"
  config.sweep.single_blocks = "none"
  results = retrieval_runner.run(config, str(tmp_path / "out"), bundle=tiny_synthetic)
  assert results["n_tasks"] == 20 and len(config.data.prompts) == 20
  assert results["prompts"][14] == "a photo of a woman with blond hair, wearing eyeglasses"
  assert results["sweeps"]["stori_pair"]["category_names"][5] == (
    "woman, no blond hair, eyeglasses"
  )
  assert results["emphasis"]["ap"]["n"] == 60
  assert (tmp_path / "out" / "fig5_auc_sweep.png").exists()
  config.sweep.tasks = (20,)
  # another config: another workdir (the first one holds the results of the first config)
  with pytest.raises(ConfigError, match="not task indices"):
    retrieval_runner.run(config, str(tmp_path / "out2"), bundle=tiny_synthetic)
  # stopped before the index was built
  assert sorted(os.listdir(tmp_path / "out2")) == [".lock", "run.json"]


@pytest.mark.parametrize("module", ["retrieval_celeba5", "retrieval_cub", "retrieval_synthetic"])
def test_configs_load(module):
  config = __import__(f"configs.{module}", fromlist=["get_config"]).get_config()
  assert config.data.source in ("celeba", "cub", "synthetic")
  if module == "retrieval_celeba5":
    assert len(config.data.prompts) == 2 and len(config.data.prompts[0]["attributes"]) == 5
  if module == "retrieval_cub":
    assert len(config.data.prompts) == len(
      __import__("stori_jax.retrieval.datasets", fromlist=["x"]).cub_prompts(
        paper_config.CUB_ATTRIBUTES, paper_config.CUB_TEMPLATE
      )
    )
