"""launch/: the launchers take any command of the project (`-- python -m MODULE FLAGS...`), print
what each worker would run with --dry_run, install once per worker (launch/worker.sh), stop with
one line on a missing repository, and run the local multi-process path end to end.

The TPU and SLURM launchers run here against stand-ins for gcloud, srun and the worker's Python
(scripts on PATH that log their arguments), so everything but the cluster itself is exercised."""

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap

import pytest
from absl import flags

from stori_jax.plumbing import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = os.path.join(REPO, "launch")
BASH = shutil.which("bash")
MULTIHOST = ("stori_jax.train", "stori_jax.run_grid", "mutual.analyze", "mutual.sweep")


def _launch(script, *args, env=None, cwd=REPO, timeout=120):
  return subprocess.run(
    [BASH, os.path.join(LAUNCH, script), *map(str, args)],
    cwd=cwd,
    env=dict(os.environ, **(env or {})),
    capture_output=True,
    text=True,
    timeout=timeout,
    check=False,
  )


def _executable(path, text):
  path.write_text(textwrap.dedent(text).lstrip())
  path.chmod(path.stat().st_mode | stat.S_IXUSR)
  return path


def test_the_launchers_know_which_commands_run_on_every_host():
  """launch/command.sh's list is the commands that define --distributed."""
  import importlib  # pylint: disable=import-outside-toplevel

  listed = None
  with open(os.path.join(LAUNCH, "command.sh"), encoding="utf-8") as f:
    for line in f:
      if line.startswith("STORI_MULTIHOST_MODULES="):
        listed = set(line.split("=", 1)[1].strip().strip('"').split())
  assert listed == set(MULTIHOST)
  for name in (
    "stori_jax.train",
    "stori_jax.run_grid",
    "stori_jax.retrieve",
    "mutual.analyze",
    "mutual.evaluate",
    "mutual.export",
    "mutual.sweep.__main__",
  ):
    values = flags.FlagValues()
    importlib.import_module(name).define_flags(values)
    assert ("distributed" in values) == (name.removesuffix(".__main__") in MULTIHOST), name


def test_local_dry_run_prints_each_process_command():
  done = _launch(
    "local_multiprocess.sh",
    "--dry_run",
    "3",
    "--",
    "python",
    "-m",
    "mutual.analyze",
    "--config",
    "configs/my config.py",
    "--workdir=w",
    env={"PORT": "23456"},
  )
  assert done.returncode == 0, done.stderr
  lines = done.stdout.strip().splitlines()
  assert len(lines) == 3
  for i, line in enumerate(lines):
    assert line.startswith(f"process {i} of 3: JAX_PLATFORMS=cpu")
    assert "-m mutual.analyze --config configs/my\\ config.py --workdir=w" in line
    assert line.endswith(f"--coordinator=localhost:23456 --num_processes=3 --process_id={i}")


def test_tpu_dry_run_runs_multihost_commands_everywhere_and_others_on_worker_0():
  done = _launch(
    "tpu_pod.sh",
    "--dry_run",
    "my-tpu",
    "us-central2-b",
    "--",
    "python",
    "-m",
    "mutual.sweep",
    "--config=configs/mutual_sweep.py",
    env={"REPO_URL": "https://example.org/stori.git"},
  )
  assert done.returncode == 0, done.stderr
  assert "--worker=all" in done.stdout and "every worker" in done.stdout
  assert "STORI_REPO_URL=https://example.org/stori.git" in done.stdout
  assert "python3 -m mutual.sweep --config=configs/mutual_sweep.py --distributed" in done.stdout
  single = _launch(
    "tpu_pod.sh",
    "--dry_run",
    "my-tpu",
    "zone",
    "--",
    "python",
    "-m",
    "mutual.evaluate",
    "--config=c.py",
  )
  assert single.returncode == 0, single.stderr
  assert "--worker=0" in single.stdout and "single-process" in single.stdout
  assert "--distributed" not in single.stdout.split("runs")[-1]


def test_slurm_dry_run_prints_each_task():
  done = _launch(
    "slurm_gpu.sbatch",
    "--dry_run",
    "--",
    "python",
    "-m",
    "stori_jax.train",
    "--config=configs/demo.py",
    env={"NODES": "4"},
  )
  assert done.returncode == 0, done.stderr
  tasks = [line for line in done.stdout.splitlines() if line.startswith("task ")]
  assert len(tasks) == 4
  assert all(t.endswith("-m stori_jax.train --config=configs/demo.py --distributed") for t in tasks)
  assert "srun --nodes=4 --ntasks=4" in done.stdout and "--install_only" in done.stdout


@pytest.mark.parametrize(
  "script, before",
  [("tpu_pod.sh", ["t", "z"]), ("slurm_gpu.sbatch", []), ("local_multiprocess.sh", ["2"])],
)
@pytest.mark.parametrize(
  "command, says",
  [
    ([], "-- python -m MODULE"),
    (["--", "mutual.analyze"], "must be `python -m MODULE"),
    (["--", "python", "-m", "stori_jax.train", "--distributed"], "leave --distributed out"),
  ],
)
def test_a_wrong_command_line_stops_with_one_line(script, before, command, says):
  done = _launch(script, *before, *command)
  assert done.returncode == 2
  assert done.stderr.count("\n") == 1 and says in done.stderr, done.stderr


def test_local_refuses_a_single_process_command():
  done = _launch("local_multiprocess.sh", "2", "--", "python", "-m", "stori_jax.retrieve")
  assert done.returncode == 2
  assert "runs as one process" in done.stderr and done.stderr.count("\n") == 1


def _fake_python(bin_dir, log):
  """A `python3` that logs its arguments: `-c ...` (the install check) fails until a
  `-m pip install` ran; anything else is logged and succeeds."""
  return _executable(
    bin_dir / "python3",
    f"""
    #!/usr/bin/env bash
    echo "$*" >> {log}
    if [ "$1" = "-c" ]; then [ -f {log}.installed ]; exit $?; fi
    if [ "$1 $2 $3" = "-m pip install" ]; then touch {log}.installed; fi
    exit 0
    """,
  )


def _git_repo(path):
  """A repository to clone: a setup.py is all worker.sh looks for."""
  path.mkdir()
  (path / "setup.py").write_text("# stand-in\n")
  for args in (["init", "-q"], ["add", "setup.py"]):
    subprocess.run(["git", *args], cwd=path, check=True)
  subprocess.run(
    ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"],
    cwd=path,
    check=True,
  )
  return path


def test_tpu_launcher_clones_installs_once_and_runs(tmp_path):
  """tpu_pod.sh against a gcloud that runs the worker's command here, in a fresh home: the
  first run clones REPO_URL and installs, the second finds both and runs the command."""
  home, bin_dir = tmp_path / "home", tmp_path / "bin"
  home.mkdir()
  bin_dir.mkdir()
  log = tmp_path / "python.log"
  _fake_python(bin_dir, log)
  _executable(
    bin_dir / "gcloud",
    f"""
    #!/usr/bin/env bash
    echo "$*" >> {tmp_path}/gcloud.log
    while [ "$#" -gt 0 ]; do
      if [ "$1" = "--command" ]; then cd {home} && HOME={home} bash -c "$2"; exit $?; fi
      shift
    done
    exit 3
    """,
  )
  origin = _git_repo(tmp_path / "origin")
  env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "REPO_URL": str(origin)}
  command = ["my-tpu", "zone", "--", "python", "-m", "stori_jax.train", "--config=c.py"]
  first = _launch("tpu_pod.sh", *command, env=env)
  assert first.returncode == 0, first.stderr
  assert (home / "stori-jax" / "setup.py").exists()
  assert "installing stori-jax" in first.stderr
  second = _launch("tpu_pod.sh", *command, env=env)
  assert second.returncode == 0, second.stderr
  assert "already installed" in second.stderr
  calls = log.read_text().splitlines()
  installs = [c for c in calls if c.startswith("-m pip install")]
  assert installs == [
    "-m pip install --quiet -e .[gcs] jax[tpu] -f "
    "https://storage.googleapis.com/jax-releases/libtpu_releases.html"
  ]
  assert calls.count("-m stori_jax.train --config=c.py --distributed") == 2
  assert "--worker=all" in (tmp_path / "gcloud.log").read_text()


def test_a_worker_without_the_repository_or_repo_url_stops_with_one_line(tmp_path):
  home, bin_dir = tmp_path / "home", tmp_path / "bin"
  home.mkdir()
  bin_dir.mkdir()
  _executable(
    bin_dir / "gcloud",
    f"""
    #!/usr/bin/env bash
    while [ "$#" -gt 0 ]; do
      if [ "$1" = "--command" ]; then cd {home} && HOME={home} bash -c "$2"; exit $?; fi
      shift
    done
    """,
  )
  env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "REPO_URL": ""}
  done = _launch("tpu_pod.sh", "t", "z", "--", "python", "-m", "mutual.analyze", env=env)
  assert done.returncode == 2
  assert done.stderr.count("\n") == 1
  assert "no repository at stori-jax; set REPO_URL=<git url>" in done.stderr


def test_tpu_launcher_without_gcloud_says_so(tmp_path):
  # A PATH with the tools the launcher uses and no gcloud (this machine may have one).
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  for tool in ("dirname", "base64"):
    (bin_dir / tool).symlink_to(shutil.which(tool))
  env = {"PATH": str(bin_dir)}
  done = _launch("tpu_pod.sh", "t", "z", "--", "python", "-m", "stori_jax.train", env=env)
  assert done.returncode == 2 and done.stderr.count("\n") == 1
  assert "gcloud not found" in done.stderr


def test_slurm_job_installs_once_then_starts_one_task_per_node(tmp_path):
  """slurm_gpu.sbatch as the job runs it, with an srun that logs its arguments."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  log = tmp_path / "python.log"
  _fake_python(bin_dir, log)
  _executable(bin_dir / "srun", f'#!/usr/bin/env bash\necho "$*" >> {tmp_path}/srun.log\n')
  repo = tmp_path / "repo"
  repo.mkdir()
  (repo / "setup.py").write_text("# stand-in\n")
  (repo / "launch").symlink_to(LAUNCH)
  env = {
    "PATH": f"{bin_dir}:{os.environ['PATH']}",
    "SLURM_SUBMIT_DIR": str(repo),
    "SLURM_NNODES": "2",
  }
  for _ in range(2):
    done = _launch(
      "slurm_gpu.sbatch", "--", "python", "-m", "mutual.analyze", "--config=c.py", env=env
    )
    assert done.returncode == 0, done.stderr
  installs = [c for c in log.read_text().splitlines() if c.startswith("-m pip install")]
  assert installs == ["-m pip install --quiet -e . jax[cuda12]"]
  runs = (tmp_path / "srun.log").read_text().splitlines()
  assert (
    runs
    == [
      "--nodes=2 --ntasks=2 --ntasks-per-node=1 python3 -m mutual.analyze --config=c.py "
      "--distributed"
    ]
    * 2
  )
  missing = _launch(
    "slurm_gpu.sbatch",
    "--",
    "python",
    "-m",
    "mutual.analyze",
    env={**env, "SLURM_SUBMIT_DIR": str(tmp_path)},
  )
  assert missing.returncode == 2 and missing.stderr.count("\n") == 1
  assert "no stori-jax repository at" in missing.stderr


@pytest.mark.slow
def test_local_launcher_runs_a_command_on_two_processes(tmp_path, tiny_random_model):
  """launch/local_multiprocess.sh end to end: `-- python -m stori_jax.train ...` on two
  processes of one CPU device each; process 0 writes the reports and compilation.json."""
  workdir = tmp_path / "run"
  env = {"PYTHON": sys.executable, "DEVICES_PER_PROCESS": "1"}
  done = _launch(
    "local_multiprocess.sh",
    "2",
    "--",
    "python",
    "-m",
    "stori_jax.train",
    "--config=configs/demo.py",
    f"--workdir={workdir}",
    f"--config.model.source={tiny_random_model}",
    "--config.views=2",
    "--config.shots=2",
    "--config.data.n_test_per_class=2",
    "--config.epochs=2",
    env=env,
    timeout=900,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.count("\nWrote:\n") == 1  # process 0 alone reports
  metrics = json.loads((workdir / "metrics.json").read_text())
  assert metrics["num_devices"] == 2
  record = json.loads((workdir / cli.COMPILATION_FILE).read_text())
  assert record["programs"] > 0


_TRAIN = ("--", "python", "-m", "stori_jax.train", "--config=configs/demo.py")


@pytest.mark.parametrize("dry_run", [True, False])
@pytest.mark.parametrize("count", ["0", "65", "99999999999999999999", "00"])
def test_local_refuses_a_number_of_processes_out_of_range(dry_run, count):
  done = _launch("local_multiprocess.sh", *(["--dry_run"] if dry_run else []), count, *_TRAIN)
  assert done.returncode == 2 and done.stdout == "", done.stdout[-500:]
  assert (
    done.stderr.count("\n") == 1 and f"must be 1 to 64 on one machine, got {count}" in done.stderr
  )


def test_local_takes_up_to_its_limit_and_a_raised_one():
  done = _launch("local_multiprocess.sh", "--dry_run", "064", *_TRAIN)
  assert done.returncode == 0, done.stderr
  assert len(done.stdout.splitlines()) == 64 and "--num_processes=64 --process_id=63" in done.stdout
  done = _launch(
    "local_multiprocess.sh", "--dry_run", "70", *_TRAIN, env={"STORI_MAX_PROCESSES": "80"}
  )
  assert done.returncode == 0 and len(done.stdout.splitlines()) == 70, done.stderr


@pytest.mark.parametrize(
  "nodes, says",
  [("abc", "NODES must be a whole number of nodes, 1 or more, got 'abc'"),
   ("0", "NODES must be 1 to 99999 nodes, got '0'"),
   ("-3", "got '-3'"),
   ("123456", "got '123456'")],
)  # fmt: skip
def test_slurm_refuses_a_bad_number_of_nodes(nodes, says):
  done = _launch("slurm_gpu.sbatch", "--dry_run", *_TRAIN, env={"NODES": nodes})
  assert done.returncode == 2 and done.stdout == ""
  assert done.stderr.count("\n") == 1 and says in done.stderr, done.stderr


def test_slurm_with_a_venv_missing_here(tmp_path):
  """A dry run shows the job with the cluster's environment, noting it is not here; the job
  itself stops with one line before installing anything."""
  missing = str(tmp_path / "nonexistent")
  done = _launch("slurm_gpu.sbatch", "--dry_run", *_TRAIN, env={"VENV": missing, "NODES": "2"})
  assert done.returncode == 0, done.stderr
  assert done.stderr.count("\n") == 1 and f"VENV={missing} does not exist here" in done.stderr
  assert (
    f"srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --chdir {REPO} {missing}/bin/python"
    in done.stdout
  )
  job = _launch("slurm_gpu.sbatch", *_TRAIN, env={"VENV": missing, "NODES": "2"})
  assert job.returncode == 2 and job.stdout == ""
  assert job.stderr.count("\n") == 1 and f"VENV={missing} is no virtual environment" in job.stderr


@pytest.mark.parametrize("names", [("", ""), ("my-tpu", ""), ("", "us-central2-b")])
def test_tpu_refuses_empty_names(names):
  done = _launch("tpu_pod.sh", "--dry_run", *names, *_TRAIN)
  assert done.returncode == 2 and done.stdout == ""
  assert done.stderr.count("\n") == 1 and "may not be empty" in done.stderr, done.stderr
