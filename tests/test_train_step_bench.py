"""benchmarks/train_step.py at tiny sizes: both rows (fresh views, the paper configs' setting,
and cached features) for ours, the naive JAX step and PyTorch eager; the agreement check on the
cached features; FLOPs per step by part, XLA's count and the share of the matmul rate measured
in the same rounds; and scripts/readme_figures.py's machine_limit rows read from its JSON."""

import importlib.util
import math
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def result():
  from benchmarks import gpu_check, train_step  # pylint: disable=import-outside-toplevel
  from stori_jax.plumbing import profiling  # pylint: disable=import-outside-toplevel

  saved = gpu_check._global_precisions()  # pylint: disable=protected-access
  # The compilations are counted: the run's persistent cache (conftest) must not serve them
  # (conftest's autouse fixture turns it back on after the first test).
  profiling.use_compilation_cache(False)
  try:
    opts = train_step.options(
      arch="test-tiny",
      num_classes=3,
      prompts_per_class=2,
      batch=4,
      repeats=2,
      naive=True,
      matmul=128,
    )
    yield train_step.benchmark(opts)
  finally:
    gpu_check._global_precisions(saved)  # pylint: disable=protected-access


def _finite(x):
  return isinstance(x, float) and math.isfinite(x)


@pytest.mark.slow
def test_both_rows_time_every_implementation_at_equal_work(result):
  assert list(result["rows"]) == ["fresh_views", "cached_features"]
  assert result["agree_1e-4"] is True
  assert set(result["checks_vs_ours"]) == {"naive_jax", "torch"}
  assert result["compiles_in_timed_rounds"] == 0
  assert result["matmul"]["gflop_per_s"] > 0 and len(result["matmul"]["rounds"]) == 2
  fresh, cached = result["rows"]["fresh_views"], result["rows"]["cached_features"]
  for row in (fresh, cached):
    assert set(row["implementations"]) == {"ours", "naive_jax", "torch"}
    assert set(row["ratios"]) == {"naive_jax_over_ours", "torch_over_ours"}
    assert all(r > 0 for r in row["ratios"].values())
    for name, figures in row["implementations"].items():
      assert len(figures["rounds_s"]) == 2, name
      assert _finite(figures["seconds_per_step"]) and figures["seconds_per_step"] > 0
      assert figures["gflop_per_step"] == pytest.approx(sum(figures["gflop_parts"].values()))
      assert 0 < figures["fraction_of_matmul_rate"] < 10, name
  # The image side is in the fresh row's count only, the same tower for every implementation;
  # our text side costs less than 77 tokens through every block.
  image = fresh["implementations"]["ours"]["gflop_parts"]["image_tower"]
  assert image > 0
  for name in ("ours", "naive_jax", "torch"):
    f, c = fresh["implementations"][name], cached["implementations"][name]
    assert f["gflop_parts"]["image_tower"] == image
    assert "image_tower" not in c["gflop_parts"]
    assert f["gflop_parts"]["text"] == c["gflop_parts"]["text"]
  ours_text = cached["implementations"]["ours"]["gflop_parts"]["text"]
  assert ours_text < cached["implementations"]["torch"]["gflop_parts"]["text"]
  assert fresh["implementations"]["ours"]["gflop_parts"]["augment"] > 0
  # XLA counts our compiled steps; the fresh one holds the image tower as well.
  xla_fresh = fresh["implementations"]["ours"]["xla_gflop_per_step"]
  xla_cached = cached["implementations"]["ours"]["xla_gflop_per_step"]
  assert xla_fresh > xla_cached > 0
  assert fresh["implementations"]["torch"]["xla_gflop_per_step"] is None
  # Ours: one program per row, compiled ahead from shapes, none on the first call.
  for phases in result["ours_phases"].values():
    assert list(phases["step_compile"]["compiles"]["programs"]) == ["jit(train_step)"]
    assert phases["first_call"]["compiles"]["count"] == 0


@pytest.mark.slow
def test_the_machine_limit_table_reads_the_benchmark(result):
  spec = importlib.util.spec_from_file_location(
    "readme_figures_for_steps", os.path.join(ROOT, "scripts", "readme_figures.py")
  )
  figures = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = figures
  try:
    spec.loader.exec_module(figures)
    rows = figures.train_step_rows(result)
    assert [r.what for r in rows] == [w for _, w in figures.TRAIN_STEP_ROWS]
    for row, key in zip(rows, ("fresh_views", "cached_features")):
      measured = result["rows"][key]
      assert row.seconds == measured["implementations"]["ours"]["seconds_per_step"]
      assert row.reference_seconds == measured["implementations"]["torch"]["seconds_per_step"]
      assert row.ratio == measured["ratios"]["torch_over_ours"]
      assert row.gflop == measured["implementations"]["ours"]["gflop_per_step"]
    table = figures.machine_limit_table(rows)
    assert table.count("\n| SToRI train step") == 2 and "PyTorch eager" in table
  finally:
    sys.modules.pop(spec.name, None)
