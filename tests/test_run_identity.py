"""A workdir has one owner (stori_jax.plumbing.run_identity): the claiming process holds its lock until it
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

from stori_jax.plumbing import run_identity

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HOLD = textwrap.dedent(
  """
  import sys, time
  from stori_jax.plumbing import run_identity
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


def test_checks_at_once_do_not_refuse_each_other(tmp_path):
  """The processes of one multi-host run check a resumed workdir at the same moment (CI saw
  process 1 refused by process 0's check): a check held open elsewhere refuses no other check,
  and only a holder's claim refuses one."""
  workdir = tmp_path / "run"
  run_identity.claim_workdir(str(workdir), {"config": {"seed": 1}})
  run_identity.release_workdirs()
  # Another process's check, caught mid-way: the lock file open and its shared lock taken.
  checker = subprocess.Popen(
    [
      sys.executable,
      "-c",
      "import fcntl, os, sys, time\n"
      "fd = os.open(sys.argv[1], os.O_RDWR)\n"
      "fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)\n"
      "print('checking', flush=True)\n"
      "time.sleep(60)\n",
      str(workdir / run_identity.LOCK_FILE),
    ],
    stdout=subprocess.PIPE,
    text=True,
  )
  try:
    assert checker.stdout.readline().strip() == "checking"
    identity = run_identity.claim_workdir(str(workdir), {"config": {"seed": 1}}, check_only=True)
    assert identity == {"config": {"seed": 1}}
  finally:
    checker.kill()
    checker.wait()


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


def test_a_file_edited_in_place_changes_the_identity(tmp_path, monkeypatch):
  """A prompt file or model folder edited under the same path is refused like a changed
  config, naming what changed; the digest is computed once per size and modification time."""
  from stori_jax.fewshot import paper_config, trainer  # pylint: disable=import-outside-toplevel

  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  prompts = tmp_path / "dtd_prompts.json"
  prompts.write_text('{"banded": ["banded stripes"], "dotted": ["dots"]}', encoding="utf-8")
  model = tmp_path / "model"
  model.mkdir()
  (model / "weights.bin").write_bytes(b"\0" * 2048)
  config = paper_config.fewshot_config("dtd", shots=1)
  config.model.source, config.prompts.cupl_path = str(model), str(prompts)
  workdir = str(tmp_path / "run")
  run_identity.claim_workdir(workdir, trainer.identity(config))
  (tmp_path / "run" / "history.jsonl").write_text("{}\n")  # results to protect
  run_identity.claim_workdir(workdir, trainer.identity(config))  # unchanged: resumes
  prompts.write_text('{"banded": ["dots"], "dotted": ["banded stripes"]}', encoding="utf-8")
  with pytest.raises(run_identity.WorkdirMismatchError, match=r"data\.cupl_path\.sha256"):
    run_identity.claim_workdir(workdir, trainer.identity(config))
  prompts.write_text('{"banded": ["banded stripes"], "dotted": ["dots"]}', encoding="utf-8")
  run_identity.claim_workdir(workdir, trainer.identity(config))  # the original contents again
  (model / "weights.bin").write_bytes(b"\1" * 2048)  # new weights, same path and size
  os.utime(model / "weights.bin", ns=(1, 1))
  with pytest.raises(run_identity.WorkdirMismatchError, match=r"model\.sha256"):
    run_identity.claim_workdir(workdir, trainer.identity(config))
  # A registry name or hub id is its own identity (nothing local to read).
  assert run_identity.content_identity("tiny-synthetic") == "tiny-synthetic"


def test_large_digests_are_cached_by_size_and_time(tmp_path, monkeypatch):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  big = tmp_path / "weights.safetensors"
  big.write_bytes(os.urandom(2 << 20))
  first = run_identity.file_digest(str(big))
  cache = tmp_path / "cache" / "stori_jax" / "file_digests.json"
  stored = json.loads(cache.read_text())
  assert list(stored.values()) == [first]
  run_identity._DIGESTS.clear()
  # Read from the cache, not the file: a planted value shows it.
  (key,) = stored
  cache.write_text(json.dumps({key: "planted"}))
  assert run_identity.file_digest(str(big)) == "planted"
  big.write_bytes(os.urandom(2 << 20))  # new contents and modification time: read again
  assert run_identity.file_digest(str(big)) not in ("planted", first)


def test_restart_refuses_to_move_the_current_folder(tmp_path, monkeypatch):
  """`--workdir . --restart` on another run's folder: one clear error, nothing moved."""
  workdir = tmp_path / "run"
  run_identity.claim_workdir(str(workdir), {"config": {"seed": 1}})
  (workdir / "results.json").write_text("{}\n")
  run_identity.release_workdirs()
  monkeypatch.chdir(workdir)
  with pytest.raises(run_identity.WorkdirMismatchError, match="cannot move it aside"):
    run_identity.claim_workdir(".", {"config": {"seed": 2}}, restart=True)
  assert sorted(os.listdir(workdir)) == [".lock", "results.json", "run.json"]
  assert not list(tmp_path.glob("run.old-*"))


# One claim for every command ----------------------------------------------------------------


def test_claim_run_keeps_the_run_when_only_its_schedule_or_ignored_keys_change(tmp_path):
  workdir = str(tmp_path / "run")
  config = {"seed": 1, "log_every": 10, "batch_size": 8}
  run_identity.claim_run(workdir, {"config": config}, what="run")
  (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")  # results to protect
  every = {key: 3 for key in run_identity.SCHEDULE_KEYS}
  changed = {**config, **every, "batch_size": 4}
  run_identity.claim_run(workdir, {"config": changed}, what="run", ignore=("batch_size",))
  # The stored identity now holds batch_size 4; a claim that does not ignore it is refused.
  with pytest.raises(run_identity.WorkdirMismatchError, match="config.batch_size"):
    run_identity.claim_run(workdir, {"config": {**changed, "batch_size": 2}}, what="run")
  with pytest.raises(run_identity.WorkdirMismatchError, match="config.seed"):
    run_identity.claim_run(workdir, {"config": {**changed, "seed": 2}}, what="run")


def _sources():
  for package in ("stori_jax", "mutual"):
    for folder, _, names in os.walk(os.path.join(REPO, package)):
      for name in sorted(n for n in names if n.endswith(".py")):
        path = os.path.join(folder, name)
        with open(path, encoding="utf-8") as f:
          yield os.path.relpath(path, REPO), f.read()


def test_every_command_claims_through_claim_run():
  """No module but run_identity calls claim_workdir or builds its ignore list: one scaffold.
  Each command's own ignored keys are config keys besides SCHEDULE_KEYS."""
  import importlib  # pylint: disable=import-outside-toplevel

  direct = [
    path
    for path, text in _sources()
    if path != os.path.join("stori_jax", "run_identity.py")
    and ("run_identity.claim_workdir(" in text or "def _path_identity" in text)
  ]
  assert not direct
  for name in (
    "stori_jax.fewshot.trainer",
    "stori_jax.retrieval.runner",
    "stori_jax.pretraining.weight_response",
  ):
    ignored = importlib.import_module(name).IDENTITY_IGNORED
    assert not set(ignored) & set(run_identity.SCHEDULE_KEYS), name
    assert not any(key.startswith("config.") for key in ignored), name


class _Claimed(Exception):
  """Raised by a stand-in claim_run: the command reached it."""


def _train(tmp_path):
  from stori_jax.fewshot import trainer  # pylint: disable=import-outside-toplevel
  from stori_jax.plumbing.config_files import load_config  # pylint: disable=import-outside-toplevel

  trainer.run(load_config(os.path.join(REPO, "configs", "demo.py")), str(tmp_path))


def _retrieve(tmp_path):
  from stori_jax.retrieval import runner  # pylint: disable=import-outside-toplevel
  from stori_jax.plumbing.config_files import load_config  # pylint: disable=import-outside-toplevel

  runner.run(load_config(os.path.join(REPO, "configs", "retrieval_synthetic.py")), str(tmp_path))


def _pretrain(tmp_path):
  from stori_jax.plumbing.config_files import load_config  # pylint: disable=import-outside-toplevel
  from stori_jax.pretraining import contrastive  # pylint: disable=import-outside-toplevel

  contrastive.train(
    load_config(os.path.join(REPO, "configs", "tiny_clip_pretrain.py")), str(tmp_path)
  )


def _weight_response(tmp_path):
  from stori_jax.plumbing.config_files import load_config  # pylint: disable=import-outside-toplevel
  from stori_jax.pretraining import weight_response  # pylint: disable=import-outside-toplevel

  config = load_config(os.path.join(REPO, "configs", "tiny_clip_weight_response.py"))
  weight_response.train(config, str(tmp_path))


def _mutual(tmp_path):
  from mutual import run_flags  # pylint: disable=import-outside-toplevel
  from stori_jax.plumbing.config_files import load_config  # pylint: disable=import-outside-toplevel

  config = load_config(os.path.join(REPO, "configs", "mutual_synthetic.py"))
  run_flags.claim_workdir(config, str(tmp_path), False, "mutual-knowledge analysis")


@pytest.mark.slow
@pytest.mark.parametrize(
  "command", [_train, _retrieve, _pretrain, _weight_response, _mutual], ids=lambda f: f.__name__
)
def test_each_command_reaches_claim_run(command, tmp_path, monkeypatch):
  def claimed(workdir, identity, **kwargs):
    raise _Claimed(kwargs["what"])

  monkeypatch.setattr(run_identity, "claim_run", claimed)
  with pytest.raises(_Claimed):
    command(tmp_path / "w")
  assert not (tmp_path / "w").exists()


def test_the_start_block_command_reaches_claim_run(tmp_path, monkeypatch, run_command):
  from stori_jax.plumbing.errors import UserError  # pylint: disable=import-outside-toplevel

  class Claimed(UserError):
    pass

  def claimed(workdir, identity, **kwargs):
    raise Claimed(f"claim_run for the {kwargs['what']}")

  monkeypatch.setattr(run_identity, "claim_run", claimed)
  done = run_command("stori_jax.start_block", f"--workdir={tmp_path / 'w'}")
  assert done.returncode == 2 and "claim_run for the start-block measurement" in done.stderr
