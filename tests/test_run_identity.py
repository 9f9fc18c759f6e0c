"""A workdir has one owner (stori_jax.run_identity): the claiming process holds its lock until it
exits, a second command on the same workdir stops with one paragraph naming the holder and exit
status 2, and a crashed holder's lock is released by the system."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from stori_jax import run_identity

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HOLD = textwrap.dedent(
  """
  import sys, time
  from stori_jax import run_identity
  run_identity.claim_workdir(sys.argv[1], {"config": {"seed": 1}})
  print("claimed", flush=True)
  time.sleep(120)
  """
)


def _holder(workdir):
  """A process that claims `workdir` and sleeps; returns once the claim is made."""
  process = subprocess.Popen(
    [sys.executable, "-c", HOLD, str(workdir)],
    cwd=REPO,
    stdout=subprocess.PIPE,
    text=True,
  )
  assert process.stdout.readline().strip() == "claimed"
  return process


def test_a_held_workdir_is_refused_naming_the_holder_and_freed_when_it_dies(tmp_path):
  workdir = tmp_path / "run"
  holder = _holder(workdir)
  try:
    with pytest.raises(run_identity.WorkdirBusyError) as error:
      run_identity.claim_workdir(str(workdir), {"config": {"seed": 1}})
    assert f"pid {holder.pid} on " in str(error.value)
    assert "--workdir" in str(error.value)
    # A check (the other processes of a multi-host run) is refused alike and creates nothing.
    with pytest.raises(run_identity.WorkdirBusyError):
      run_identity.claim_workdir(str(workdir), {"config": {"seed": 1}}, check_only=True)
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  # Killed: the system released its lock; the same run resumes here.
  assert run_identity.claim_workdir(str(workdir), {"config": {"seed": 1}}) is None
  with open(workdir / run_identity.LOCK_FILE, encoding="utf-8") as f:
    assert f"pid {os.getpid()} " in f.read()
  # The holder itself claims again freely (re-entrant within a process).
  run_identity.claim_workdir(str(workdir), {"config": {"seed": 1}})


def test_a_refused_check_changes_nothing(tmp_path):
  """Checking a workdir that no run holds leaves no lock file behind."""
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "other.txt").write_text("keep")
  with pytest.raises(run_identity.WorkdirMismatchError):
    run_identity.claim_workdir(str(workdir), {"config": {}})
  assert os.listdir(workdir) == ["other.txt"]


@pytest.mark.slow
def test_two_trainings_at_once_on_one_workdir(tmp_path):
  """Two `train` commands started together on one workdir: exactly one runs (exit 0), the other
  exits 2 with the busy paragraph, and history.jsonl is the one run's."""
  workdir = tmp_path / "run"
  command = [
    sys.executable,
    "-m",
    "stori_jax.train",
    "--config",
    "configs/demo.py",
    f"--workdir={workdir}",
    "--config.epochs=20",
  ]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  first = subprocess.Popen(
    command + ["--config.seed=1"],
    cwd=REPO,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  time.sleep(0.5)
  second = subprocess.Popen(
    command + ["--config.seed=2"],
    cwd=REPO,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  outputs = [p.communicate(timeout=900) for p in (first, second)]
  codes = sorted([first.returncode, second.returncode])
  assert codes == [0, 2], outputs
  loser = outputs[[first.returncode, second.returncode].index(2)]
  assert "is in use by another run (pid " in loser[1] and "Traceback" not in loser[1]
  winner_seed = 1 if first.returncode == 0 else 2
  with open(workdir / "run.json", encoding="utf-8") as f:
    assert json.load(f)["config"]["seed"] == winner_seed
  with open(workdir / "history.jsonl", encoding="utf-8") as f:
    steps = [json.loads(line)["step"] for line in f if line.strip()]
  assert steps == sorted(steps) and len(steps) == len(set(steps))  # one run's, not interleaved
