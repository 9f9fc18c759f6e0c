"""mutual.analyze and mutual.sweep on several processes (jax.distributed, launch/
local_multiprocess.sh): the processes share the classes and process 0 writes the same results
as one process."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Two classes of the embedded world, so that each of two processes analyses one.
FLAGS = ["--config=configs/mutual_synthetic.py:smoke", "--config.data.classes=(0, 5)"]


def _results(workdir):
  with open(os.path.join(workdir, "results.json"), encoding="utf-8") as f:
    return json.load(f)


def _per_image(workdir):
  out = {}
  for root, _, files in os.walk(os.path.join(workdir, "per_image")):
    for name in files:
      with open(os.path.join(root, name), encoding="utf-8") as f:
        out[os.path.relpath(os.path.join(root, name), workdir)] = json.load(f)
  return out


def _launch(module, flags, workdir):
  """`launch/local_multiprocess.sh 2` running `python -m module`, one CPU device per process."""
  env = dict(os.environ, PYTHON=sys.executable, MODULE=module, DEVICES_PER_PROCESS="1")
  return subprocess.run(
    [
      "bash",
      os.path.join(REPO, "launch", "local_multiprocess.sh"),
      "2",
      *flags,
      f"--workdir={workdir}",
    ],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=900,
  )


def _one_and_two_processes(run_command, module, flags, tmp_path):
  """Runs `module` in this process (workdir tmp_path/single), then on two processes
  (tmp_path/multi); both must succeed. Returns the two processes' CompletedProcess."""
  single = run_command(module, *flags, f"--workdir={tmp_path / 'single'}")
  assert single.returncode == 0, single.stderr[-3000:]
  multi = _launch(module, flags, tmp_path / "multi")
  assert multi.returncode == 0, multi.stderr[-3000:]
  return multi


@pytest.mark.slow
def test_two_processes_write_what_one_writes(tmp_path, run_command):
  multi = _one_and_two_processes(run_command, "mutual.analyze", FLAGS, tmp_path)
  assert "MI" in multi.stdout  # process 0 printed the table, once
  assert multi.stdout.count("\nWrote:\n") == 1
  per_image = _per_image(tmp_path / "single")
  assert len(per_image) == 8 and _per_image(tmp_path / "multi") == per_image
  single_results, multi_results = _results(tmp_path / "single"), _results(tmp_path / "multi")
  assert multi_results["dataset"] == single_results["dataset"]
  assert multi_results["classes"] == single_results["classes"]
  # Resumed on two processes (issue 36): process 1's class file gone, the same command again
  # keeps process 0's class (its file untouched), redoes process 1's, and writes the same.
  classes = tmp_path / "multi" / "classes"
  kept = (classes / "0000.json").stat().st_mtime_ns
  os.remove(classes / "0005.json")
  again = _launch("mutual.analyze", FLAGS, tmp_path / "multi")
  assert again.returncode == 0, again.stderr[-3000:]
  assert "resuming: 1 of 1 classes" in again.stderr  # process 0's line
  assert (classes / "0000.json").stat().st_mtime_ns == kept and (classes / "0005.json").exists()
  assert _per_image(tmp_path / "multi") == per_image
  assert _results(tmp_path / "multi") == multi_results


# Two one-class chunks of the embedded world through two shrunk random-weight towers.
SWEEP_FLAGS = [
  "--config=configs/mutual_sweep.py:smoke",
  "--config.classes_per_chunk=1",
  "--config.models=('openai-vit-b-32','openai-rn50')",
]


@pytest.mark.slow
def test_two_process_sweep_writes_what_one_writes(tmp_path, run_command):
  multi = _one_and_two_processes(run_command, "mutual.sweep", SWEEP_FLAGS, tmp_path)
  assert multi.stdout.count("\nWrote:\n") == 1  # process 0 reports, once
  # Each process analysed one chunk; process 0 aggregated both.
  assert sorted(os.listdir(tmp_path / "multi" / "shards")) == [
    "chunk_00000.json",
    "chunk_00001.json",
  ]
  single_results, multi_results = _results(tmp_path / "single"), _results(tmp_path / "multi")
  assert multi_results["images_per_model"] == single_results["images_per_model"] == 4
  assert multi_results["models"] == single_results["models"]
  assert multi_results["fits"] == single_results["fits"]
  with open(tmp_path / "multi" / "table.md", encoding="utf-8") as f:
    multi_table = f.read()
  with open(tmp_path / "single" / "table.md", encoding="utf-8") as f:
    assert f.read() == multi_table
  # The same command again on two processes keeps both chunks (issue 36), the same results.
  again = _launch("mutual.sweep", SWEEP_FLAGS, tmp_path / "multi")
  assert again.returncode == 0, again.stderr[-3000:]
  assert "resuming: 1 of 2 class chunks" in again.stderr  # process 0's own chunk
  assert _results(tmp_path / "multi") == multi_results
