"""Processes of one multi-process run must run the same run (stori_jax.plumbing.multihost): started by
hand with other flags they all stop at the workdir claim with one paragraph naming the process
and the keys that differ, before any work; a process that does not come to a barrier is named
after a timeout of seconds or minutes, not an hour."""

import os
import socket
import subprocess
import sys
import time

import pytest

from stori_jax.plumbing import multihost

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _start(args_per_process, env_extra=None):
  """One `python -m stori_jax.train` per entry of `args_per_process` (its flags), as
  launch/local_multiprocess.sh starts them but each with its own flags."""
  port = _free_port()
  env = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    XLA_FLAGS="--xla_force_host_platform_device_count=1",
    **(env_extra or {}),
  )
  count = len(args_per_process)
  return [
    subprocess.Popen(
      [
        sys.executable,
        "-m",
        "stori_jax.train",
        *args,
        f"--coordinator=localhost:{port}",
        f"--num_processes={count}",
        f"--process_id={index}",
      ],
      cwd=REPO,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for index, args in enumerate(args_per_process)
  ]


def _finish(processes, timeout_s=240):
  out = []
  for process in processes:
    try:
      stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
      for p in processes:
        p.kill()
      raise
    out.append((process.returncode, stdout, stderr))
  return out


@pytest.mark.slow
@pytest.mark.parametrize(
  "override, key",
  [("--config.seed=2", "config.seed"), ("--config.epochs=50", "config.epochs")],
)
def test_processes_started_with_other_flags_all_stop_naming_the_difference(tmp_path, override, key):
  workdir = tmp_path / "run"
  common = ["--config=configs/demo.py", f"--workdir={workdir}"]
  start = time.monotonic()
  results = _finish(_start([common, [*common, override]]))
  elapsed = time.monotonic() - start
  for index, (code, _, stderr) in enumerate(results):
    assert code == 2, (index, stderr[-3000:])
    assert "process 1's run differs from process 0's" in stderr, stderr[-3000:]
    assert key in stderr and "on process 1" in stderr
    assert "Traceback" not in stderr
  # Stopped at the claim: nothing written, no wait for a barrier timeout.
  assert not workdir.exists() or sorted(os.listdir(workdir)) == []
  assert elapsed < 120


def test_disagreement_names_the_first_process_and_keys_that_differ():
  same = {"config": {"seed": 1, "epochs": 100}, "model": "tiny"}
  assert multihost.disagreement([same, dict(same)]) is None
  other = {"config": {"seed": 2, "epochs": 100}, "model": "tiny"}
  message = multihost.disagreement([same, same, other, other])
  assert "process 2's run differs from process 0's" in message
  assert "config.seed: 1 on process 0, 2 on process 2" in message
  assert "process 3 differ too" in message and "epochs" not in message


def test_a_process_missing_at_a_barrier_is_named(monkeypatch):
  """A barrier that times out says which process did not arrive, and how to give more time."""

  class Client:
    def key_value_set(self, key, value, allow_overwrite=False):
      self.key = key

    def wait_at_barrier(self, barrier, timeout_ms):
      assert timeout_ms == 7000
      raise RuntimeError("DEADLINE_EXCEEDED: Barrier timed out")

    def key_value_dir_get(self, directory):
      return [(directory + "0", "1"), (directory + "2", "1")]

  monkeypatch.setattr(multihost.jax, "process_count", lambda: 3)
  monkeypatch.setattr(multihost.jax, "process_index", lambda: 0)
  monkeypatch.setattr(multihost, "_client", Client)
  monkeypatch.setenv("STORI_BARRIER_TIMEOUT_S", "7")
  with pytest.raises(multihost.ProcessMissingError) as error:
    multihost.wait_for_all_processes("stori_jax.train: features encoded")
  message = str(error.value)
  assert message.startswith("process 1 of the run's 3 did not reach")
  assert "within 7 s" in message and "STORI_BARRIER_TIMEOUT_S" in message
