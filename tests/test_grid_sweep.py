"""SToRI Table 1 (configs/table1.py) and Fig. 10 (configs/fig10.py, a grid with a sweep over the
first reweighted block) through python -m stori_jax.run_grid: their cells against the paper's
settings, sweep mistakes refused before any work, and tiny runs on the tiny random CLIP whose
tables and figure are the mean ± std of the cells' metrics.json, a rerun that trains nothing
and a changed grid refused."""

import json
import os

import numpy as np
import pytest

from stori_jax import run_grid
from stori_jax.plumbing.config_files import ConfigError, load_config
from stori_jax.fewshot import paper_config, trainer
from stori_jax.grid import cells, figure, runner
from stori_jax.models import get_architecture
from stori_jax.plumbing.plotting import pyplot
from test_cli import assert_ends_with_outputs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(REPO, "configs")
TABLE1 = os.path.join(CONFIGS, "table1.py")
FIG10 = os.path.join(CONFIGS, "fig10.py")
TINY_SYNTHETIC = os.path.join(REPO, "stori_jax", "assets", "tiny-synthetic", "stori_config.json")


def _text_layers_of_tiny_synthetic() -> int:
  with open(TINY_SYNTHETIC, encoding="utf-8") as f:
    return json.load(f)["config"]["text"]["layers"]


def _block(cell: cells.Cell) -> int:
  """The block a Fig. 10 cell's folder names (stori_start_block7 -> 7)."""
  prefix = "stori_start_block"
  assert cell.method.startswith(prefix), cell.method
  return int(cell.method[len(prefix) :])


def test_table1_cells_are_the_papers(monkeypatch):
  monkeypatch.chdir(REPO)
  grid = load_config(TABLE1)
  found = cells.expand(grid)
  # Table 1: Caltech101 and SUN397 x 16 shots x (CuPL, CuPL + nonsensical tokens) x seeds 1-3.
  assert tuple(grid.datasets) == ("caltech101", "sun397")
  assert tuple(grid.shots) == (16,) and tuple(grid.seeds) == (1, 2, 3)
  assert len(found) == 2 * 2 * 3
  assert grid.average_column is False
  assert [m.name for m in cells.grid_methods(grid)] == ["cupl", "cupl_rare_tokens"]
  for cell in found:
    config = cell.config
    assert config.data.name == cell.dataset and config.shots == 16 and config.epochs == 200
    assert config.method == "stori" and config.model.backbone == "clip"
    assert config.start_block == 7 and config.seed == cell.seed
    assert config.prompts.use_cupl and config.prompts.use_base
    assert config.prompts.per_class == (10 if cell.dataset == "sun397" else 0)
    assert config.prompts.rare_tokens == (5 if cell.method == "cupl_rare_tokens" else 0)
    assert cell.lr_source == "paper"
    assert cell.lr == paper_config.learning_rate(cell.dataset, 16, "clip")

  synthetic = load_config(TABLE1, "synthetic")
  found = cells.expand(synthetic)
  assert len(found) == 2 * 3
  for cell in found:
    config = cell.config
    assert cell.dataset == "synthetic" and config.model.source == "tiny-synthetic"
    assert config.shots == 16 and config.epochs == 100 and config.method == "stori"
    assert config.prompts.rare_tokens == (5 if cell.method == "cupl_rare_tokens" else 0)
  # The single-run ablation config still builds its one run.
  assert load_config(os.path.join(CONFIGS, "ablation_rare_tokens.py"), "demo").prompts.rare_tokens


def test_fig10_cells_sweep_every_block_of_the_text_tower(monkeypatch):
  monkeypatch.chdir(REPO)
  grid = load_config(FIG10)
  found = cells.expand(grid)
  layers = get_architecture("ViT-L-14").text.layers  # the paper's CLIP ViT-L/14
  assert layers == 12
  assert set(grid.datasets) == set(paper_config.DATASETS)
  assert len(found) == len(paper_config.DATASETS) * layers * 3  # datasets x blocks x seeds
  assert {_block(c) for c in found} == set(range(1, layers + 1))
  for cell in found:
    config = cell.config
    assert config.start_block == _block(cell)
    assert config.shots == 16 and config.epochs == 200 and config.method == "stori"
    assert cell.lr_source == "paper"
    assert cell.path == os.path.join(
      cell.dataset, "16shot", f"stori_start_block{_block(cell)}", f"seed{cell.seed}"
    )
  rows = cells.grid_methods(grid)
  assert [m.sweep_value for m in rows] == list(range(1, layers + 1))
  assert {m.family for m in rows} == {"stori"} and {m.label for m in rows} == {"SToRI"}

  synthetic = load_config(FIG10, "synthetic")
  found = cells.expand(synthetic)
  tiny_layers = _text_layers_of_tiny_synthetic()
  assert len(found) == tiny_layers * 3
  assert {_block(c) for c in found} == set(range(1, tiny_layers + 1))
  assert all(c.config.start_block == _block(c) for c in found)
  assert {c.config.model.source for c in found} == {"tiny-synthetic"}
  # The single-run ablation config still builds its one run.
  single = load_config(os.path.join(CONFIGS, "ablation_start_block.py"), "dataset=dtd,block=3")
  assert single.start_block == 3


def test_sweep_mistakes_are_refused_before_any_work(monkeypatch):
  monkeypatch.chdir(REPO)

  def refused(edit, match):
    grid = load_config(FIG10, "synthetic")
    edit(grid)
    with pytest.raises(ConfigError, match=match):
      cells.expand(grid)

  def method_sets_block(g):
    g.method_settings.stori.overrides.start_block = 3

  def base_sets_block(g):
    g.base.overrides.start_block = 3

  def sweeps_seed(g):
    g.sweep.key = "seed"

  def repeats_block(g):
    g.sweep["values"] = (1, 2, 2)

  def names_no_key(g):
    g.sweep.key = "start_blok"

  def value_with_slash(g):
    g.sweep.key = "name"
    g.sweep["values"] = ("a/b",)

  refused(method_sets_block, r"method_settings.stori.overrides.start_block: the grid sets")
  refused(base_sets_block, r"base.overrides.start_block: the grid sets start_block per row")
  refused(sweeps_seed, r"config.sweep.key is 'seed'")
  refused(repeats_block, r"config.sweep.values must be a tuple of one or more distinct")
  refused(names_no_key, r"no key 'start_blok' \(did you mean 'start_block'\?\)")
  refused(value_with_slash, r"cannot name a cell's folder")


def test_a_zero_shot_row_reads_the_trained_row_of_its_value(monkeypatch):
  monkeypatch.chdir(REPO)
  grid = load_config(os.path.join(CONFIGS, "grid_synthetic.py"))
  grid.sweep = {"key": "start_block", "values": (2, 5), "label": "first reweighted block"}
  rows = cells.grid_methods(grid)
  assert [(m.name, m.reads, m.sweep_value) for m in rows] == [
    ("zero_shot_start_block2", "stori_start_block2", 2),
    ("zero_shot_start_block5", "stori_start_block5", 5),
    ("stori_start_block2", "stori_start_block2", 2),
    ("stori_start_block5", "stori_start_block5", 5),
  ]
  assert not rows[0].overrides and rows[2].overrides.start_block == 2
  # Only the trained rows have cells: 2 shot counts x 2 blocks x 3 seeds.
  found = cells.expand(grid)
  assert len(found) == 12 and {c.method for c in found} == {
    "stori_start_block2",
    "stori_start_block5",
  }


def _tiny(config, workdir, model, *extra):
  return [
    f"--config={config}",
    f"--workdir={workdir}",
    f"--config.base.overrides.model.source={model}",
    "--config.seeds=(1, 2)",
    "--config.base.overrides.epochs=2",
    "--config.base.overrides.views=2",
    "--config.base.overrides.data.n_test_per_class=5",
    "--config.base.overrides.log_every=1",
    "--config.base.overrides.eval_every=2",
    "--config.base.overrides.checkpoint_every=2",
    *extra,
  ]


def _count_cell_runs(monkeypatch, workdir) -> list[str]:
  calls = []
  real_run = trainer.run

  def counted(config, directory, restart=False):
    calls.append(os.path.relpath(directory, workdir))
    return real_run(config, directory, restart=restart)

  monkeypatch.setattr(trainer, "run", counted)
  return calls


def _accuracies(workdir, path, seeds, which="trained"):
  return [
    100 * json.loads((workdir / path / f"seed{s}" / "metrics.json").read_text())[which]["accuracy"]
    for s in seeds
  ]


@pytest.mark.slow
def test_a_tiny_fig10_run_tabulates_draws_resumes_and_refuses(
  tmp_path, tiny_random_model, tiny_random_config, run_command, monkeypatch
):
  workdir = tmp_path / "fig10"
  blocks, seeds = (2, tiny_random_config.text.layers), (1, 2)
  flags = _tiny(f"{FIG10}:synthetic", workdir, tiny_random_model, f"--config.sweep.values={blocks}")
  calls = _count_cell_runs(monkeypatch, workdir)
  result = run_command(run_grid, *flags)
  assert result.returncode == 0, result.stderr[-3000:]
  paths = [os.path.join("synthetic", "16shot", f"stori_start_block{b}") for b in blocks]
  assert calls == [os.path.join(p, f"seed{s}") for p in paths for s in seeds]
  written = assert_ends_with_outputs(result.stdout, *runner.OUTPUTS, "accuracy_by_start_block.png")
  for block, path in zip(blocks, paths):
    for s in seeds:
      stored = json.loads((workdir / path / f"seed{s}" / "run.json").read_text())
      assert stored["config"]["start_block"] == block and stored["config"]["seed"] == s

  # The table: per block, mean ± std (ddof 0) over the seeds of the cells' metrics, in percent.
  data = json.loads((workdir / "tables.json").read_text())
  assert data["sweep"] == {
    "key": "start_block",
    "label": "first reweighted block",
    "values": list(blocks),
  }
  rows = data["tables"]["16"]
  assert [(r["method"], r["sweep_value"], r["family"]) for r in rows] == [
    (f"stori_start_block{b}", b, "stori") for b in blocks
  ]
  table_md = (workdir / "tables.md").read_text()
  means, stds = [], []
  for block, path, row in zip(blocks, paths, rows):
    values = _accuracies(workdir, path, seeds)
    entry = row["cells"]["synthetic"]
    np.testing.assert_allclose(entry["values"], values)
    np.testing.assert_allclose(entry["mean"], np.mean(values))
    np.testing.assert_allclose(entry["std"], np.std(values))
    means.append(np.mean(values))
    stds.append(np.std(values))
    shown = f"| SToRI (first reweighted block = {block}) | Base+CuPL | "
    line = next(line for line in table_md.splitlines() if line.startswith(shown))
    assert f"{np.mean(values):.2f} ± {np.std(values):.2f}" in line
  assert table_md.strip() in result.stdout
  assert "- SToRI (every first reweighted block): optim.lr = 0.05 on synthetic 16-shot" in table_md

  # The figure: one line (the synthetic dataset), the means at each block, the stds shaded.
  (line,) = figure.curves(data, 16)
  assert line["dataset"] == "synthetic" and line["label"] == "SToRI"
  np.testing.assert_allclose(line["mean"], means)
  np.testing.assert_allclose(line["std"], stds)
  png = workdir / "accuracy_by_start_block.png"
  assert str(png) in written
  image = pyplot().imread(png)
  assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 400
  assert np.unique(image.reshape(-1, image.shape[-1]), axis=0).shape[0] > 50  # not blank

  # Again: every cell finished, nothing trained, the same tables; a new sweep label (how the
  # rows are named) is no change of the grid.
  calls.clear()
  again = run_command(run_grid, *flags, "--config.sweep.label=first block")
  assert again.returncode == 0, again.stderr[-3000:]
  assert calls == [] and again.stdout.count("finished before, skipped") == len(blocks) * 2
  assert "| SToRI (first block = 2) |" in again.stdout

  # Other blocks are another grid: refused before any work, the workdir's record untouched.
  before = (workdir / "run.json").read_text()
  other = _tiny(f"{FIG10}:synthetic", workdir, tiny_random_model, "--config.sweep.values=(1, 2)")
  refused = run_command(run_grid, *other)
  assert refused.returncode == 2 and calls == []
  assert "holds a grid run with other settings" in refused.stderr
  assert "config.sweep.values" in refused.stderr and "Traceback" not in refused.stderr
  assert (workdir / "run.json").read_text() == before


@pytest.mark.slow
def test_a_tiny_table1_run_appends_the_rare_tokens_and_tabulates(
  tmp_path, tiny_random_model, run_command, monkeypatch
):
  workdir = tmp_path / "table1"
  seeds = (1, 2)
  flags = _tiny(f"{TABLE1}:synthetic", workdir, tiny_random_model)
  calls = _count_cell_runs(monkeypatch, workdir)
  result = run_command(run_grid, *flags)
  assert result.returncode == 0, result.stderr[-3000:]
  methods = ("cupl", "cupl_rare_tokens")
  paths = [os.path.join("synthetic", "16shot", m) for m in methods]
  assert calls == [os.path.join(p, f"seed{s}") for p in paths for s in seeds]
  assert_ends_with_outputs(result.stdout, *runner.OUTPUTS)
  assert not list(workdir.glob("*.png"))  # no sweep, no figure

  # The trained prompts: the CuPL ones, with five rare tokens appended in the second row only.
  for method, path in zip(methods, paths):
    for s in seeds:
      prompts = json.loads((workdir / path / f"seed{s}" / "weights.json").read_text())
      tails = [p["prompt"].split()[-5:] for p in prompts]
      if method == "cupl_rare_tokens":
        assert all(set(t) <= set(trainer.RARE_TOKENS) for t in tails), tails[:3]
      else:
        assert not any(set(p["prompt"].split()) & set(trainer.RARE_TOKENS) for p in prompts)

  data = json.loads((workdir / "tables.json").read_text())
  assert data["sweep"] is None and data["average_column"] is False
  table_md = (workdir / "tables.md").read_text()
  assert "| Method | Text | synthetic |" in table_md and "Average" not in table_md
  for row, path in zip(data["tables"]["16"], paths):
    values = _accuracies(workdir, path, seeds)
    entry = row["cells"]["synthetic"]
    np.testing.assert_allclose(entry["values"], values)
    np.testing.assert_allclose(entry["mean"], np.mean(values))
    np.testing.assert_allclose(entry["std"], np.std(values))
    line = next(x for x in table_md.splitlines() if x.startswith(f"| SToRI | {row['text']} |"))
    assert line.rstrip().endswith(
      f"{np.mean(values):.2f} ± {np.std(values):.2f} |"
    ) or line.rstrip().endswith(f"**{np.mean(values):.2f} ± {np.std(values):.2f}** |")
