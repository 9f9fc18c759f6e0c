"""Commands on gs:// workdirs, against a local GCS (gcp-storage-emulator, tests/gcs_emulator.py):
a training run killed with SIGKILL resumes to the weights of a straight run; two processes give
one process's results; run_grid and mutual.analyze write their outputs as objects; a missing
bucket, missing credentials and a refused write stop a command before any work with one
paragraph (exit 2); and a gs:// workdir's lock object admits one run at a time.

Nothing here may leave a local folder named `gs:` (what a URL made into a local path becomes)."""

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import types

import numpy as np
import pytest

import gcs_emulator as emulator_helpers
from stori_jax import run_grid, train
from stori_jax.plumbing import paths, run_identity
from demo_flags import short_demo_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(REPO, "configs", "demo.py")


@pytest.fixture(autouse=True)
def no_local_gs_folder():
  """Every test: no `gs:` folder appears where the commands run."""
  before = os.path.exists(os.path.join(REPO, "gs:"))
  yield
  assert before or not os.path.exists(os.path.join(REPO, "gs:")), "a gs:// path became local"


def _train_flags(workdir, model, *extra):
  return short_demo_flags(workdir, model, *extra)


def _env(emulator, url=None):
  return dict(os.environ, **emulator.env(url))


def _run(command, env, timeout=900):
  return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)


def _json(emulator, bucket, name):
  return json.loads(emulator.read(bucket, name))


def _token_weights(emulator, bucket, prefix):
  records = _json(emulator, bucket, f"{prefix}/weights.json")
  return np.concatenate([r["token_weights"] for r in records])


@pytest.mark.slow
def test_train_on_gs_resumes_after_sigkill_to_the_same_weights(gcs_emulator, tiny_random_model):
  bucket = gcs_emulator.create_bucket()
  env = _env(gcs_emulator)
  program = [sys.executable, "-m", "stori_jax.train"]
  extra = ("--config.epochs=8",)
  straight = _run(program + _train_flags(f"gs://{bucket}/straight", tiny_random_model, *extra), env)
  assert straight.returncode == 0, straight.stderr[-3000:]
  names = gcs_emulator.objects(bucket, "straight/")
  for name in train.OUTPUTS[:-1]:
    assert f"straight/{name}" in names, names
  assert any(n.startswith("straight/checkpoints/8/") for n in names), names
  assert "straight/.lock" not in names  # released at exit
  assert f"gs://{bucket}/straight/metrics.json" in straight.stdout  # the Wrote: block

  command = program + _train_flags(f"gs://{bucket}/resumed", tiny_random_model, *extra)
  process = subprocess.Popen(
    command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
  )
  deadline = time.time() + 600
  marker = "resumed/checkpoints/4/commit_success.txt"  # orbax's "complete" on GCS
  while process.poll() is None and time.time() < deadline:
    if marker in gcs_emulator.objects(bucket, "resumed/checkpoints/4/"):
      break
    time.sleep(0.05)
  process.send_signal(signal.SIGKILL)
  process.wait()
  assert "resumed/metrics.json" not in gcs_emulator.objects(bucket, "resumed/"), "not killed"
  # The killed run's lock object stays; its process is gone, so the next run takes it at once.
  assert "resumed/.lock" in gcs_emulator.objects(bucket, "resumed/")
  again = _run(command, env)
  assert again.returncode == 0, again.stderr[-3000:]
  assert f"Resumed from step 4 of 8 in gs://{bucket}/resumed" in again.stderr
  np.testing.assert_array_equal(
    _token_weights(gcs_emulator, bucket, "straight"),
    _token_weights(gcs_emulator, bucket, "resumed"),
  )
  history = gcs_emulator.read(bucket, "resumed/history.jsonl").decode().splitlines()
  assert [json.loads(line)["step"] for line in history] == list(range(1, 9))
  # The same command once more: the finished run is resumed at its last step.
  third = _run(command, env)
  assert third.returncode == 0, third.stderr[-3000:]
  assert "Resumed from step 8 of 8" in third.stderr


@pytest.mark.slow
def test_two_processes_on_gs_match_one(gcs_emulator, tiny_random_model):
  """launch/local_multiprocess.sh 2 on one gs:// workdir: every process writes its share of
  the checkpoints there, process 0 the rest; the results are one process's."""
  bucket = gcs_emulator.create_bucket()
  env = _env(gcs_emulator)
  extra = ("--config.epochs=3",)
  single = _run(
    [sys.executable, "-m", "stori_jax.train"]
    + _train_flags(f"gs://{bucket}/single", tiny_random_model, *extra),
    env,
  )
  assert single.returncode == 0, single.stderr[-3000:]
  multi = _run(
    ["bash", os.path.join(REPO, "launch", "local_multiprocess.sh"), "2"]
    + _train_flags(f"gs://{bucket}/multi", tiny_random_model, *extra),
    dict(env, PYTHON=sys.executable, DEVICES_PER_PROCESS="2"),
  )
  assert multi.returncode == 0, multi.stderr[-3000:]
  one = _json(gcs_emulator, bucket, "single/metrics.json")
  two = _json(gcs_emulator, bucket, "multi/metrics.json")
  assert two["num_devices"] == 4
  assert two["trained"]["accuracy"] == one["trained"]["accuracy"]
  assert two["zero_shot"]["accuracy"] == one["zero_shot"]["accuracy"]
  np.testing.assert_allclose(
    _token_weights(gcs_emulator, bucket, "single"),
    _token_weights(gcs_emulator, bucket, "multi"),
    rtol=0,
    atol=1e-4,
  )
  names = gcs_emulator.objects(bucket, "multi/checkpoints/3/")
  assert any("ocdbt.process_1" in n for n in names), names  # process 1 wrote its share
  assert "multi/.lock" not in gcs_emulator.objects(bucket, "multi/")


@pytest.mark.slow
def test_run_grid_on_gs_writes_tables_and_skips_finished_cells(
  gcs_bucket, gcs_emulator, tiny_random_model, run_command
):
  flags = [
    f"--config={os.path.join(REPO, 'configs', 'grid_synthetic.py')}",
    f"--workdir=gs://{gcs_bucket}/grid",
    "--config.shots=(1,)",
    "--config.seeds=(1,)",
    f"--config.base.overrides.model.source={tiny_random_model}",
    "--config.base.overrides.epochs=2",
    "--config.base.overrides.views=2",
    "--config.base.overrides.data.n_test_per_class=5",
  ]
  first = run_command(run_grid, *flags)
  assert first.returncode == 0, first.stderr[-3000:]
  names = gcs_emulator.objects(gcs_bucket, "grid/")
  for name in ("run.json", "tables.md", "tables.json", "synthetic/1shot/stori/seed1/metrics.json"):
    assert f"grid/{name}" in names, names
  again = run_command(run_grid, *flags)
  assert again.returncode == 0, again.stderr[-3000:]
  assert "finished before, skipped" in again.stdout
  assert gcs_emulator.read(gcs_bucket, "grid/tables.md").decode().strip() in again.stdout


@pytest.mark.slow
def test_mutual_analyze_on_gs_writes_what_a_local_run_writes(
  gcs_bucket, gcs_emulator, tmp_path, run_command
):
  args = ["--config=configs/mutual_synthetic.py:smoke"]
  local = run_command("mutual.analyze", *args, f"--workdir={tmp_path / 'mk'}")
  assert local.returncode == 0, local.stderr[-3000:]
  remote = run_command("mutual.analyze", *args, f"--workdir=gs://{gcs_bucket}/mk")
  assert remote.returncode == 0, remote.stderr[-3000:]
  written = {n[len("mk/") :] for n in gcs_emulator.objects(gcs_bucket, "mk/")}
  expected = {
    os.path.relpath(os.path.join(folder, name), tmp_path / "mk")
    for folder, _, names in os.walk(tmp_path / "mk")
    for name in names
    if name != run_identity.LOCK_FILE
  }
  assert written == expected
  for name in ("results.json", "table.md"):
    assert gcs_emulator.read(gcs_bucket, f"mk/{name}") == (tmp_path / "mk" / name).read_bytes()


# ---- Before any work: a missing bucket, missing credentials, a refused write -----------------


def _commands(workdir):
  return {
    "train": ("stori_jax.train", f"--config={DEMO}", f"--workdir={workdir}"),
    "run_grid": (
      "stori_jax.run_grid",
      "--config=configs/grid_synthetic.py",
      f"--workdir={workdir}",
    ),
    "mutual.analyze": (
      "mutual.analyze",
      "--config=configs/mutual_synthetic.py:smoke",
      f"--workdir={workdir}",
    ),
  }


@pytest.mark.parametrize("command", ["train", "run_grid", "mutual.analyze"])
@pytest.mark.parametrize(
  "problem,message",
  [
    ("missing_bucket", "does not exist"),
    ("unauthenticated", "no valid credentials"),
    ("read_only", "refused it (403 Forbidden"),
  ],
)
def test_storage_problems_stop_before_any_work(
  gcs_bucket, gcs_emulator, monkeypatch, run_command, command, problem, message
):
  bucket = "no-such-bucket" if problem == "missing_bucket" else gcs_bucket
  proxy = None
  if problem != "missing_bucket":
    proxy = emulator_helpers.RefusingProxy(gcs_emulator.url, problem)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
  try:
    module, *args = _commands(f"gs://{bucket}/run")[command]
    start = time.monotonic()
    result = run_command(module, *args)
  finally:
    if proxy is not None:
      proxy.stop()
  assert result.returncode == 2, result.stderr[-3000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and message in errors[0], result.stderr[-3000:]
  assert "Nothing was done." in errors[0]
  assert result.stdout.strip() == ""  # no model loaded, no image read, nothing trained
  assert time.monotonic() - start < 60
  assert gcs_emulator.objects(gcs_bucket) == []


#: Workdirs that would put objects elsewhere than they name, and the refusal's words (issue 44).
_MISLEADING_WORKDIRS = {
  # tensorstore reads '#' and '?' as URL syntax: run#1's and run#2's arrays would share `run/`.
  "fragment": ("gs://{bucket}/run#1", "may not hold '#'"),
  "query": ("gs://{bucket}/q?a", "may not hold '?'"),
  "one_slash": ("gs:/{bucket}/typo", "takes two slashes (gs://{bucket}/typo)"),
  "upper_case": ("GS://{bucket}/upper", "lower case (gs://{bucket}/upper)"),
  "parent": ("gs://{bucket}/x/../one", "without them (gs://{bucket}/one, if"),
  "above_bucket": ("gs://{bucket}/../one", "climbs above the bucket"),
  "no_bucket": ("gs:///run", "names no bucket"),
}


@pytest.mark.parametrize("command", ["train", "run_grid", "mutual.analyze"])
@pytest.mark.parametrize("case", sorted(_MISLEADING_WORKDIRS))
def test_a_workdir_url_that_would_write_elsewhere_is_refused_before_any_work(
  gcs_bucket, gcs_emulator, run_command, command, case
):
  template, message = _MISLEADING_WORKDIRS[case]
  workdir = template.format(bucket=gcs_bucket)
  module, *args = _commands(workdir)[command]
  result = run_command(module, *args)
  assert result.returncode == 2, result.stderr[-3000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1, result.stderr[-3000:]
  assert message.format(bucket=gcs_bucket) in errors[0] and "Nothing was done." in errors[0]
  assert result.stdout.strip() == ""
  # The whole bucket: nothing written anywhere (no `run` object, no `run/...` prefix).
  assert gcs_emulator.objects(gcs_bucket) == []
  assert not os.path.exists(os.path.join(REPO, "gs:"))


@pytest.mark.parametrize("root", ["gs://{bucket}", "gs://{bucket}/"])
def test_restart_on_a_bucket_root_asks_for_a_folder(gcs_bucket, gcs_emulator, run_command, root):
  paths.write_text_atomic(f"gs://{gcs_bucket}/other.txt", "someone else's object\n")
  workdir = root.format(bucket=gcs_bucket)
  start = time.monotonic()
  result = run_command(*_commands(workdir)["train"], "--restart")
  assert result.returncode == 2, result.stderr[-3000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "it is a whole bucket" in errors[0], result.stderr[-3000:]
  assert f"gs://{gcs_bucket}/run1" in errors[0]
  assert time.monotonic() - start < 30  # no retries against another bucket
  assert gcs_emulator.objects(gcs_bucket) == ["other.txt"]


@pytest.mark.slow
def test_a_storage_service_that_cannot_be_reached_is_one_paragraph(
  gcs_bucket, monkeypatch, run_command
):
  """The emulator stopped (nothing listens at its address): gcsfs's bounded retries, then one
  paragraph naming the endpoint, exit 2, no aiohttp traceback. The retries keep their number
  but not their back-off (1 + 2 + 4 + 8 + 16 s of sleeping, which tests nothing of ours)."""
  import gcsfs.retry  # pylint: disable=import-outside-toplevel

  attempts = []

  async def no_back_off(seconds, *args, **kwargs):
    attempts.append(seconds)
    return await asyncio.sleep(0, *args, **kwargs)

  without_back_off = types.ModuleType("asyncio")
  without_back_off.__dict__.update(asyncio.__dict__, sleep=no_back_off)
  monkeypatch.setattr(gcsfs.retry, "asyncio", without_back_off)
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{emulator_helpers.free_port()}")
  start = time.monotonic()
  result = run_command(*_commands(f"gs://{gcs_bucket}/run")["train"])
  assert result.returncode == 2, result.stderr[-3000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "cannot be reached, after the storage client's retries" in errors[0]
  assert "Traceback" not in result.stderr and "aiohttp" not in result.stderr, result.stderr[-3000:]
  assert result.stdout.strip() == ""
  assert len(attempts) >= 5  # gcsfs retried (its 6 tries: 5 back-offs) before we said so
  assert time.monotonic() - start < 60


def test_a_config_file_in_a_bucket(gcs_bucket, gcs_emulator, run_command):
  """--config=gs://...: read through a local copy; a missing one is one paragraph."""
  with open(os.path.join(REPO, "configs", "grid_synthetic.py"), "rb") as f:
    paths.write_bytes_atomic(f"gs://{gcs_bucket}/configs/grid.py", f.read())
  done = run_command(
    "stori_jax.run_grid", f"--config=gs://{gcs_bucket}/configs/grid.py", "--dry_run"
  )
  assert done.returncode == 0, done.stderr[-3000:]
  missing = run_command("stori_jax.run_grid", f"--config=gs://{gcs_bucket}/configs/absent.py")
  assert missing.returncode == 2 and "no config file" in missing.stderr
  # A run record in a bucket: named by its URL before anything is downloaded.
  record = f"gs://{gcs_bucket}/run/run.json"
  paths.write_text_atomic(record, '{"config": {"seed": 0}, "done": true}\n')
  wrong = run_command("stori_jax.run_grid", f"--config={record}")
  assert wrong.returncode == 2 and "Traceback" not in wrong.stderr
  assert f"{record} is not a config file" in wrong.stderr
  assert "the record a run keeps in its workdir" in wrong.stderr
  # A config in a bucket that fails as Python: the URL and the line named, not the local copy.
  paths.write_text_atomic(f"gs://{gcs_bucket}/configs/bad.py", "def get_config():\n  return nul\n")
  bad = run_command("stori_jax.run_grid", f"--config=gs://{gcs_bucket}/configs/bad.py")
  assert bad.returncode == 2 and "Traceback" not in bad.stderr
  assert f"the config file gs://{gcs_bucket}/configs/bad.py fails as Python at line 2" in bad.stderr


# ---- The lock of a gs:// workdir ---------------------------------------------------------------


def _write_lock(url, **record):
  paths.write_bytes_atomic(paths.join(url, run_identity.LOCK_FILE), json.dumps(record).encode())


def _lock_record(url):
  found = paths.read_object(paths.join(url, run_identity.LOCK_FILE))
  return None if found is None else json.loads(found[0])


def test_a_live_holder_elsewhere_keeps_the_workdir(gcs_bucket):
  url = f"gs://{gcs_bucket}/run"
  now = time.time()
  _write_lock(
    url, token="other", host="other-host", pid=7, since="then", heartbeat=now, lease_s=120
  )
  with pytest.raises(run_identity.WorkdirBusyError, match="pid 7 on other-host") as busy:
    run_identity.claim_workdir(url, {"config": {"a": 1}})
  assert "lapses at" in str(busy.value) and "nothing was done" in str(busy.value)
  assert _lock_record(url)["token"] == "other"
  assert not paths.exists(paths.join(url, run_identity.RUN_FILE))


def test_a_lapsed_holder_elsewhere_is_taken_over(gcs_bucket):
  url = f"gs://{gcs_bucket}/run"
  old = time.time() - 1000
  _write_lock(
    url, token="other", host="other-host", pid=7, since="then", heartbeat=old, lease_s=120
  )
  run_identity.claim_workdir(url, {"config": {"a": 1}})
  record = _lock_record(url)
  assert record["token"] == run_identity._TOKEN and record["pid"] == os.getpid()
  run_identity.release_workdirs()
  assert _lock_record(url) is None  # released: the object is deleted


def test_a_dead_process_on_this_host_frees_the_workdir_at_once(gcs_bucket):
  url = f"gs://{gcs_bucket}/run"
  gone = subprocess.Popen([sys.executable, "-c", "pass"])
  gone.wait()
  _write_lock(
    url, token="dead", host=socket.gethostname(), pid=gone.pid, since="now",
    heartbeat=time.time(), lease_s=120,
  )  # fmt: skip
  run_identity.lock_workdir(url)
  assert _lock_record(url)["token"] == run_identity._TOKEN


def test_the_holder_renews_its_heartbeat_and_notices_a_takeover(gcs_bucket, monkeypatch, capsys):
  monkeypatch.setenv("STORI_LOCK_LEASE_S", "0.4")  # renewed every 0.1 s
  url = f"gs://{gcs_bucket}/run"
  run_identity.lock_workdir(url)
  first = _lock_record(url)["heartbeat"]
  time.sleep(0.5)
  assert _lock_record(url)["heartbeat"] > first
  _write_lock(url, token="thief", host="other-host", pid=9, since="now", heartbeat=time.time(),
              lease_s=120)  # fmt: skip
  lock = run_identity._REMOTE_HELD[url]
  deadline = time.time() + 10
  while not lock.lost and time.time() < deadline:
    time.sleep(0.05)
  assert lock.lost and "was taken over by another run" in capsys.readouterr().err
  run_identity.release_workdirs()
  assert _lock_record(url)["token"] == "thief"  # not ours to delete


_CLAIM = """
import sys, time
from stori_jax.plumbing import run_identity
print("ready", flush=True)
sys.stdin.readline()  # both processes imported: claim at once
try:
  run_identity.lock_workdir(sys.argv[1])
  print("held", flush=True)
  time.sleep(3)
except run_identity.WorkdirBusyError:
  print("busy", flush=True)
"""


@pytest.mark.slow
def test_two_processes_claiming_at_once_get_one_lock(gcs_bucket, gcs_emulator):
  """The emulator does not check ifGenerationMatch (GCS does): the read-back after
  LOCK_SETTLE_S decides the race here."""
  url = f"gs://{gcs_bucket}/race"
  processes = [
    subprocess.Popen(
      [sys.executable, "-c", _CLAIM, url],
      cwd=REPO,
      env=_env(gcs_emulator),
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      text=True,
    )
    for _ in range(2)
  ]
  assert [p.stdout.readline().strip() for p in processes] == ["ready", "ready"]
  for p in processes:
    p.stdin.write("go\n")
    p.stdin.flush()
  outcomes = sorted(p.communicate(timeout=120)[0].strip() for p in processes)
  assert outcomes == ["busy", "held"]


def _upload_tree(local, url):
  for folder, _, names in os.walk(local):
    for name in names:
      relative = os.path.relpath(os.path.join(folder, name), local).replace(os.sep, "/")
      with open(os.path.join(folder, name), "rb") as f:
        paths.write_bytes_atomic(paths.join(url, relative), f.read())


@pytest.mark.slow
def test_inputs_in_a_bucket_give_what_local_inputs_give(gcs_bucket, tmp_path, tiny_random_model):
  """mutual.analyze with its model (this project's format), image folder and descriptor file
  all on gs://, into a gs:// workdir: the records and tables of the same inputs read locally."""
  from PIL import Image

  from mutual.analysis import runner
  from stori_jax.plumbing.config_files import load_config

  rng = np.random.default_rng(0)
  inputs = tmp_path / "inputs"
  for name in ("a", "b"):
    (inputs / "images" / name).mkdir(parents=True)
    for i in range(2):
      pixels = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
      Image.fromarray(pixels).save(inputs / "images" / name / f"{i}.png")
  (inputs / "descriptors.json").write_text(
    json.dumps({"a": ["round", "red"], "b": ["square", "blue", "striped"]})
  )
  remote = f"gs://{gcs_bucket}/inputs"
  _upload_tree(inputs, remote)
  _upload_tree(tiny_random_model, f"{remote}/model")

  def config(root, model):
    c = load_config(os.path.join(REPO, "configs", "mutual_synthetic.py"), "smoke")
    with c.unlocked():
      c.model.source, c.model.name = model, "tiny-random"
      c.data.source, c.data.classes, c.data.images_per_class = "folder", (), 2
      c.data.root, c.data.descriptors = f"{root}/images", f"{root}/descriptors.json"
    return c

  local_dir, remote_dir = str(tmp_path / "mk"), f"gs://{gcs_bucket}/mk"
  runner.run(config(str(inputs), tiny_random_model), local_dir, progress=False)
  run_identity.release_workdirs()
  runner.run(config(remote, f"{remote}/model"), remote_dir, progress=False)
  run_identity.release_workdirs()
  for name in ("table.md", "per_image/0000/00000.json", "per_image/0001/00001.json"):
    assert paths.read_bytes(f"{remote_dir}/{name}") == (tmp_path / "mk" / name).read_bytes()
  local_results = json.loads((tmp_path / "mk" / "results.json").read_text())
  remote_results = json.loads(paths.read_text(f"{remote_dir}/results.json"))
  assert remote_results["dataset"] == local_results["dataset"]
  # The identity names the inputs by URL, with the same contents' digests as the local files.
  local_run = json.loads((tmp_path / "mk" / "run.json").read_text())
  remote_run = json.loads(paths.read_text(f"{remote_dir}/run.json"))
  assert remote_run["model"]["path"] == f"{remote}/model"
  assert remote_run["model"]["sha256"] == local_run["model"]["sha256"]
