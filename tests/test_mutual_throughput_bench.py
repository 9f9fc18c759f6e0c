"""benchmarks/mutual_throughput.py's accounting of tower rows and its machine-limit rows (issue
43, item 2): padding that runs is counted, skipped passes are not, and the table's rows read the
JSON's figures."""

import numpy as np

from benchmarks import mutual_throughput


def _call(chunk, real, per_pass):
  pairs = np.zeros((chunk, 3), np.int32)
  args = (None,) * 5 + (pairs, None, np.int32(real))
  return mutual_throughput._prompt_rows(args, dict(regions_per_pass=per_pass))


def test_prompt_rows_count_the_passes_that_run():
  # 32 regions a call in passes of 2: 13 real regions run 7 passes (one padding region).
  assert _call(32, 13, 2) == dict(padded=96, run=42, real=39)
  assert _call(32, 32, 2) == dict(padded=96, run=96, real=96)
  # One pass over the whole call (a GPU): its padding runs.
  assert _call(32, 5, None) == dict(padded=96, run=96, real=15)


def test_machine_limit_rows_from_the_json():
  figures = dict(
    images=4,
    compute_dtype="float32",
    achieved=dict(
      jax_seconds=2.0,
      towers_analytic_gflop=400.0,
      jax_fraction_of_matmul=0.5,
      towers_analytic_fraction_of_matmul=0.7,
      reference_equal_work_seconds=6.0,
      reference_equal_work_towers_gflop=380.0,
      reference_equal_work_fraction_of_matmul=0.16,
      reference_equal_work_towers_fraction_of_matmul=0.4,
    ),
  )
  ours, reference = mutual_throughput.machine_limit_rows(figures)
  assert (ours["seconds"], ours["gflop"], ours["fraction"], ours["ratio"]) == (0.5, 100.0, 0.5, 3.0)
  assert ours["towers_fraction"] == 0.7
  assert (reference["seconds"], reference["gflop"], reference["ratio"]) == (1.5, 95.0, 1.0)
  assert mutual_throughput.machine_limit_rows(dict(images=4, achieved={})) == []
