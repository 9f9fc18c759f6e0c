"""python -m stori_jax.run_grid: a tiny configs/grid_synthetic.py in this process (2 shot counts
x 3 seeds of SToRI on the tiny random CLIP, 2 epochs): the cells' workdirs, a rerun that
trains nothing, a killed cell resumed, the table's mean ± std against numpy's, a changed grid
refused; and configs/table2.py's cells against the paper's protocol."""

import json
import os

import numpy as np
import pytest
from absl import flags as absl_flags

from stori_jax import run_grid
from stori_jax.plumbing.config_files import ConfigError, load_config
from stori_jax.fewshot import paper_config, report, trainer
from stori_jax.grid import cells, runner, tables
from test_cli import assert_ends_with_outputs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRID = os.path.join(REPO, "configs", "grid_synthetic.py")
TABLE2 = os.path.join(REPO, "configs", "table2.py")
SHOTS, SEEDS = (1, 2), (1, 2, 3)


def _tiny(workdir, model, *extra):
  """The flags of a tiny configs/grid_synthetic.py on `model`."""
  return [
    f"--config={GRID}",
    f"--workdir={workdir}",
    f"--config.shots={SHOTS}",
    f"--config.base.overrides.model.source={model}",
    "--config.base.overrides.epochs=2",
    "--config.base.overrides.views=2",
    "--config.base.overrides.data.n_test_per_class=5",
    "--config.base.overrides.log_every=1",
    "--config.base.overrides.eval_every=1",
    "--config.base.overrides.checkpoint_every=1",
    *extra,
  ]


class Killed(Exception):
  """Stands for the process being killed in the middle of a cell."""


@pytest.mark.slow
def test_the_grid_runs_skips_resumes_averages_and_refuses(
  tmp_path, tiny_random_model, run_command, monkeypatch
):
  workdir = tmp_path / "grid"
  flags = _tiny(workdir, tiny_random_model)
  calls = []
  real_run = trainer.run

  def counted(config, directory, restart=False):
    calls.append(os.path.relpath(directory, workdir))
    return real_run(config, directory, restart=restart)

  monkeypatch.setattr(trainer, "run", counted)
  # First run: killed at step 2 of the fourth cell (2-shot seed 1), after its checkpoint at 1.
  real_append = report.append_history

  def append(directory, record):
    if len(calls) == 4 and record["step"] == 2:
      raise Killed(directory)
    real_append(directory, record)

  monkeypatch.setattr(report, "append_history", append)
  with pytest.raises(Killed):
    run_command(run_grid, *flags)
  monkeypatch.setattr(report, "append_history", real_append)
  paths = [os.path.join("synthetic", f"{k}shot", "stori", f"seed{s}") for k in SHOTS for s in SEEDS]
  assert calls == paths[:4]
  killed = workdir / paths[3]
  assert (killed / "checkpoints" / "1").is_dir() and not (killed / "metrics.json").exists()

  # Second run: the three finished cells are skipped, the killed one resumes from step 1.
  calls.clear()
  result = run_command(run_grid, *flags)
  assert result.returncode == 0, result.stderr[-3000:]
  assert calls == paths[3:]
  assert f"Resumed from step 1 of 2 in {killed}" in result.stderr
  assert "finished before, skipped" in result.stdout and "resumed" in result.stdout
  for path in paths:
    assert (workdir / path / "metrics.json").exists() and (workdir / path / "run.json").exists()
  # The cell's run.json is what `python -m stori_jax.train` records for the cell's config.
  stored = json.loads((workdir / paths[0] / "run.json").read_text())
  assert stored["config"]["seed"] == 1 and stored["config"]["shots"] == 1
  assert stored["config"]["optim"]["lr"] == 0.05 and stored["config"]["epochs"] == 2

  # Third run: every cell finished, no training call, the same tables.
  calls.clear()
  again = run_command(run_grid, *flags)
  assert again.returncode == 0, again.stderr[-3000:]
  assert calls == []
  assert again.stdout.count("finished before, skipped") == len(paths)
  assert_ends_with_outputs(again.stdout, *runner.OUTPUTS)
  table_md = (workdir / "tables.md").read_text()
  assert table_md.strip() in again.stdout and table_md.strip() in result.stdout

  # The table: mean ± std (ddof 0) over the seeds of each cell's metrics, in percent.
  data = json.loads((workdir / "tables.json").read_text())
  assert data["ddof"] == 0 and data["seeds"] == list(SEEDS) and data["shots"] == list(SHOTS)
  for k in SHOTS:
    rows = {r["method"]: r for r in data["tables"][str(k)]}
    assert list(rows) == ["zero_shot", "stori"]
    for method, which in (("stori", "trained"), ("zero_shot", "zero_shot")):
      values = [
        100
        * json.loads((workdir / f"synthetic/{k}shot/stori/seed{s}/metrics.json").read_text())[
          which
        ]["accuracy"]
        for s in SEEDS
      ]
      entry = rows[method]["cells"]["synthetic"]
      np.testing.assert_allclose(entry["values"], values)
      np.testing.assert_allclose(entry["mean"], np.mean(values))
      np.testing.assert_allclose(entry["std"], np.std(values, ddof=0))
      assert rows[method]["average"] == pytest.approx(np.mean(values))  # one dataset
      shown = f"{np.mean(values):.2f} ± {np.std(values):.2f}"
      row = next(
        line
        for line in table_md.split(f"{k} shot")[1].splitlines()
        if line.startswith("| ") and rows[method]["label"] in line
      )
      assert shown in row, (shown, row)
  assert "optim.lr = 0.05 on synthetic 1-shot, synthetic 2-shot (the paper gives none)" in table_md

  # A changed grid config is refused before any work; its cells are untouched.
  before = (workdir / "run.json").read_text()
  refused = run_command(run_grid, *_tiny(workdir, tiny_random_model, "--config.seeds=(1, 2)"))
  assert refused.returncode == 2 and calls == []
  assert "holds a grid run with other settings" in refused.stderr
  assert "config.seeds" in refused.stderr and "Traceback" not in refused.stderr
  assert (workdir / "run.json").read_text() == before
  # A schedule change (how often a cell logs) is no change of the grid.
  schedule = run_command(run_grid, *flags, "--config.base.overrides.log_every=2")
  assert schedule.returncode == 0, schedule.stderr[-3000:]
  assert calls == []


def test_the_command_defines_its_flags_only_when_asked():
  values = absl_flags.FlagValues()
  run_grid.define_flags(values)
  assert {"config", "workdir", "restart", "dry_run"} <= set(values)
  assert not {"workdir", "dry_run"} & set(absl_flags.FLAGS)


def test_a_dry_run_lists_the_cells_and_writes_nothing(tmp_path, run_command):
  result = run_command(run_grid, f"--config={GRID}", f"--workdir={tmp_path / 'g'}", "--dry_run")
  assert result.returncode == 0, result.stderr[-3000:]
  lines = result.stdout.splitlines()
  assert lines[0] == f"6 cells in {tmp_path / 'g'}:"
  assert lines[1].split() == [
    str(tmp_path / "g" / "synthetic" / "1shot" / "stori" / "seed1"),
    "optim.lr",
    "=",
    "0.05",
    "(set",
    "by",
    "the",
    "config)",
  ]
  assert not (tmp_path / "g").exists()


def test_table2_cells_follow_the_paper_protocol(monkeypatch):
  monkeypatch.chdir(REPO)
  for backbone in ("clip", "metaclip"):
    grid = load_config(TABLE2, f"backbone={backbone}")
    found = cells.expand(grid)
    assert len(found) == 6 * 5 * 3 * 3  # datasets x shots x seeds x methods
    assert set(grid.datasets) == set(paper_config.DATASETS)
    for cell in found:
      config = cell.config
      assert config.data.name == cell.dataset and config.shots == cell.shots
      assert config.seed == cell.seed and config.model.backbone == backbone
      assert config.epochs == (200 if cell.shots >= 8 else 100)
      assert cell.lr_source == "paper"
      if cell.method == "stori":
        assert config.method == "stori" and config.prompts.use_cupl
        assert config.optim.lr == paper_config.learning_rate(cell.dataset, cell.shots, backbone)
      else:
        assert config.method == "taskres"
        assert config.prompts.use_cupl == (cell.method == "taskres")
        assert config.taskres.lr == (2e-5 if cell.dataset == "imagenet" else 2e-4)


def test_a_cell_config_mistake_names_the_cell(monkeypatch):
  monkeypatch.chdir(REPO)
  grid = load_config(TABLE2)
  grid.base.overrides.epochs = 0
  with pytest.raises(ConfigError, match=r"cell imagenet/1shot/taskres_base/seed1 .*epochs"):
    cells.expand(grid)
  grid = load_config(TABLE2)
  grid.base.overrides.optim = {"lrr": 0.1}
  with pytest.raises(ConfigError, match=r"base.overrides.optim.lrr.*did you mean 'optim.lr'"):
    cells.expand(grid)
  grid = load_config(TABLE2)
  grid.method_settings.stori.overrides.seed = 4
  with pytest.raises(ConfigError, match="the grid sets seed per cell"):
    cells.expand(grid)


def test_an_explicit_learning_rate_is_kept_and_shown(monkeypatch):
  monkeypatch.chdir(REPO)
  grid = load_config(TABLE2)
  grid.datasets = ("dtd",)
  grid.shots = (1,)
  grid.method_settings.stori.overrides.optim = {"lr": 0.3}
  found = [c for c in cells.expand(grid) if c.method == "stori"]
  assert {c.lr for c in found} == {0.3} and {c.lr_source for c in found} == {"config"}
  data = tables.build(
    cells.grid_methods(grid), found, {}, datasets=("dtd",), shots=(1,), seeds=(1, 2, 3)
  )
  assert "SToRI: optim.lr = 0.3 on DTD 1-shot (the paper's is 0.05)." in tables.markdown(data)


def test_one_seed_with_sample_std_has_none():
  method = cells.Method("m", "M", "", "trained", "m", None)
  cell = cells.Cell("dtd", 1, "m", 1, None, "", 0.1, "optim.lr", 0.1)
  data = tables.build(
    [method],
    [cell],
    {cell.path: {"trained": {"accuracy": 0.5}}},
    datasets=("dtd",),
    shots=(1,),
    seeds=(1,),
    ddof=1,
  )
  assert data["tables"]["1"][0]["cells"]["dtd"] == {"mean": 50.0, "std": None, "values": [50.0]}
  assert "| M |  | 50.00 | 50.00 |" in tables.markdown(data)


# Issue 36 row 4: a grid of millions of cells, refused with its size or listed as it is built.

_HUGE_GRID = """
import importlib.util

def get_config():
  spec = importlib.util.spec_from_file_location("grid_synthetic", {path!r})
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  config.seeds = tuple(range(1_000_000))  # x 2 shot counts: 2,000,000 cells
  return config
"""


def _huge_grid(tmp_path):
  path = tmp_path / "huge_grid.py"
  path.write_text(_HUGE_GRID.format(path=GRID))
  return path


def test_a_grid_of_millions_of_cells_is_refused_with_its_size(tmp_path, run_command):
  config = _huge_grid(tmp_path)
  for extra in ((), ("--dry_run",)):
    done = run_command(run_grid, f"--config={config}", f"--workdir={tmp_path / 'g'}", *extra)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and done.stdout == ""
    message = done.stderr.strip()
    assert message.count("\n") == 0, message  # one paragraph
    assert message.startswith("error: ")
    assert "the grid has 2,000,000 cells (1 dataset x 2 shot counts x 1 trained row x " in message
    assert "1,000,000 seeds), more than --max_cells=10,000" in message
    assert "--max_cells=2000000" in message
  assert not (tmp_path / "g").exists()


@pytest.mark.slow
def test_a_dry_run_of_two_million_cells_streams_in_bounded_memory(tmp_path):
  """With --max_cells raised the dry run lists all 2,000,000 cells within 2 minutes in under
  2 GB (it used to print nothing for 11 minutes while growing past 3.5 GB)."""
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  import time  # pylint: disable=import-outside-toplevel

  from conftest import _PEAK_RSS_RUNNER  # pylint: disable=import-outside-toplevel

  config = _huge_grid(tmp_path)
  out_path = tmp_path / "stdout.txt"
  start = time.monotonic()
  with open(out_path, "w", encoding="utf-8") as out:
    done = subprocess.run(
      [
        sys.executable,
        "-c",
        _PEAK_RSS_RUNNER,
        "stori_jax.run_grid",
        f"--config={config}",
        f"--workdir={tmp_path / 'g'}",
        "--dry_run",
        "--max_cells=2000000",
      ],
      stdout=out,
      stderr=subprocess.PIPE,
      text=True,
      timeout=180,
      check=False,
      cwd=REPO,
    )
  seconds = time.monotonic() - start
  assert done.returncode == 0, done.stderr[-3000:]
  peak = int(done.stderr.rsplit("peak_rss_kb=", 1)[1].split()[0]) * 1024
  assert seconds < 120 and peak < 2 * 2**30, (seconds, peak / 2**20)
  with open(out_path, encoding="utf-8") as f:
    first = f.readline()
    lines = 1 + sum(1 for _ in f)
  assert first == f"2000000 cells in {tmp_path / 'g'}:\n"
  assert lines == 1 + 2_000_000
  with open(out_path, "rb") as f:
    f.seek(-200, os.SEEK_END)
    last = f.read().decode().splitlines()[-1]
  assert last.split()[0] == str(tmp_path / "g" / "synthetic" / "16shot" / "stori" / "seed999999")
  assert not (tmp_path / "g").exists()


def test_the_listing_is_the_cells_of_expand(monkeypatch):
  monkeypatch.chdir(REPO)
  grid = load_config(GRID)
  grid.seeds = (4, 7)
  grid.shots = (1, 2, 3)
  listed, built = list(cells.plan(grid)), cells.expand(grid)
  assert [(c.path, c.lr, c.lr_key, c.lr_source) for c in listed] == [
    (c.path, c.lr, c.lr_key, c.lr_source) for c in built
  ]
  assert cells.count(grid) == len(built) == 6


@pytest.mark.slow
def test_a_damaged_metrics_file_makes_its_cell_run_again(tmp_path, tiny_random_model, run_command):
  """Issue 36 row 6: a finished cell whose metrics.json was cut to 50 bytes or emptied to `{}`
  is no finished cell: the next run redoes it (from its final checkpoint) and the tables come
  out whole; the other cells are skipped."""
  workdir = tmp_path / "grid"
  flags = [f for f in _tiny(workdir, tiny_random_model) if not f.startswith("--config.shots=")]
  flags.append("--config.shots=(1,)")
  first = run_command(run_grid, *flags)
  assert first.returncode == 0, first.stderr[-3000:]
  cell = [
    workdir / "synthetic" / "1shot" / "stori" / f"seed{s}" / "metrics.json" for s in (1, 2, 3)
  ]
  whole = [json.loads(p.read_text()) for p in cell]
  cell[0].write_bytes(cell[0].read_bytes()[:50])
  cell[1].write_text("{}")
  again = run_command(run_grid, *flags)
  assert again.returncode == 0, again.stderr[-3000:]
  assert "Traceback" not in again.stderr
  assert again.stdout.count("its metrics.json was damaged: run again") == 2
  assert again.stdout.count("finished before, skipped") == 1
  for path, before in zip(cell, whole):
    after = json.loads(path.read_text())
    assert after["trained"] == before["trained"] and after["zero_shot"] == before["zero_shot"]
  assert (workdir / "tables.md").read_text().strip() in first.stdout


def test_the_paper_grids_train_stori_on_taskres_scheme(monkeypatch):
  """Every SToRI cell of the paper grids (Tables 1, 2, 8, Fig. 10, their offline variants and
  configs/grid_synthetic.py) trains on TaskRes's scheme: one constant warm-up epoch at 1e-5,
  then the cosine stepped per epoch (App. A.1)."""
  monkeypatch.chdir(REPO)
  grids = [
    (TABLE2, None),
    (TABLE2, "backbone=metaclip"),
    (os.path.join(REPO, "configs", "table1.py"), None),
    (os.path.join(REPO, "configs", "table1.py"), "synthetic"),
    (os.path.join(REPO, "configs", "fig10.py"), None),
    (os.path.join(REPO, "configs", "fig10.py"), "synthetic"),
    (GRID, None),
  ]
  for path, argument in grids:
    stori = [c for c in cells.expand(load_config(path, argument)) if c.config.method == "stori"]
    assert stori, path
    for cell in stori:
      optim = cell.config.optim
      assert (optim.schedule, optim.warmup_epochs, optim.warmup_lr) == ("taskres", 1, 1e-5), (
        path,
        argument,
        cell.path,
      )


@pytest.mark.slow
def test_a_grid_synthetic_cell_warms_up_for_an_epoch_then_steps_a_cosine_per_epoch(
  tmp_path, monkeypatch
):
  """A cell of configs/grid_synthetic.py at 1 shot, 4 epochs, log_every=1 (batches of 4 of the
  12 images, so that an epoch has 3 steps): history.jsonl's "lr" is 1e-5 through epoch 1, then
  one value per epoch, falling, Dassl's CosineAnnealingLR(T_max = 4) restarted after the
  warm-up: lr * (1 + cos(pi * (e - 2) / 4)) / 2 in epoch e."""
  monkeypatch.chdir(REPO)
  grid = load_config(GRID)
  grid.shots, grid.seeds = (1,), (1,)
  for key, value in dict(
    epochs=4, log_every=1, eval_every=100, checkpoint_every=100, views=1, batch_size=4
  ).items():
    grid.base.overrides[key] = value
  grid.base.overrides.data.n_test_per_class = 2
  (cell,) = cells.expand(grid)
  trainer.run(cell.config, str(tmp_path / "cell"))
  records = report.read_history(str(tmp_path / "cell"), 10**9)
  assert [r["step"] for r in records] == list(range(1, 13))
  by_epoch = {}
  for record in records:
    by_epoch.setdefault(record["epoch"], []).append(record["lr"])
  assert sorted(by_epoch) == [1, 2, 3, 4]
  assert by_epoch[1] == [pytest.approx(1e-5, rel=1e-6)] * 3
  rates = []
  for epoch in (2, 3, 4):
    assert len(set(by_epoch[epoch])) == 1, by_epoch  # one rate per epoch
    rates.append(by_epoch[epoch][0])
  lr = cell.config.optim.lr
  expected = [lr * (1 + np.cos(np.pi * (e - 2) / 4)) / 2 for e in (2, 3, 4)]
  np.testing.assert_allclose(rates, expected, rtol=1e-6)
  assert rates[0] > rates[1] > rates[2] > 0
