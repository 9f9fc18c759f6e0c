"""Fixtures shared by test files: the shipped tiny CLIP and a random-weight one (one per
session), running a command in-process, the explorer on the tiny CLIP (one per module), and
JAX's compiled programs released after each test file."""

import gc
import importlib
import importlib.util
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import jax
import pytest

from stori_jax.plumbing import profiling, run_identity

#: The test run's own persistent compilation cache: a fresh folder made for the run (by the
#: process pytest starts; its xdist workers inherit the variable, so both share it) and removed
#: when the run ends. Commands rebuild their jitted functions on every run, so a file whose tests
#: run a command several times (resume, damage, reruns) compiled each program again in every
#: test (tests/test_checkpointing.py's three slow tests: 161 programs compiled, 100 with the
#: cache). Nothing is written to ~/.cache and, unless a folder is given, nothing outlives the
#: run, so every program a test needs is compiled once in the run. STORI_TEST_COMPILATION_CACHE=<folder> keeps a folder of
#: your own (warm across runs: a developer's machine), =0 turns it off (every test compiles what
#: it runs). The tests of the cache itself point it at folders of their own. `make test` keeps
#: one in the clone's .cache/ (a second run reads what the first compiled; CI's clean clone
#: starts it empty), bounded by JAX's least-recently-used eviction.
TEST_CACHE_ENV = "STORI_TEST_COMPILATION_CACHE"
#: A kept folder's bound (JAX_COMPILATION_CACHE_MAX_SIZE overrides it): one run of the whole
#: suite writes about 30 MB, so this holds many runs' programs while the code changes.
KEPT_CACHE_MAX_BYTES = 1 << 30
_made_test_cache = False
if TEST_CACHE_ENV not in os.environ:
  os.environ[TEST_CACHE_ENV] = tempfile.mkdtemp(prefix="stori-jax-test-compilation-cache-")
  _made_test_cache = True
TEST_CACHE = os.environ[TEST_CACHE_ENV]
if TEST_CACHE.strip().lower() in ("0", "false", "off", "no", "disabled", ""):
  TEST_CACHE = None
  os.environ[profiling.CACHE_ENV] = "0"
else:
  # Commands (in-process and the subprocesses that inherit this environment) use this folder.
  os.environ[profiling.CACHE_ENV] = "1"
  os.environ["JAX_COMPILATION_CACHE_DIR"] = TEST_CACHE
  if not _made_test_cache:
    os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(KEPT_CACHE_MAX_BYTES))
    jax.config.update(
      "jax_compilation_cache_max_size", int(os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"])
    )


def _use_test_cache():
  """JAX's persistent cache on, in the run's folder, for what this process compiles next (a
  command run in-process may have turned it off, or pointed it elsewhere)."""
  if TEST_CACHE and (
    not jax.config.jax_enable_compilation_cache
    or jax.config.jax_compilation_cache_dir != TEST_CACHE
  ):
    profiling.use_compilation_cache(True)  # reads JAX_COMPILATION_CACHE_DIR


_use_test_cache()


def pytest_unconfigure(config):
  del config
  if _made_test_cache and os.environ.get("PYTEST_XDIST_WORKER") is None:
    shutil.rmtree(os.environ[TEST_CACHE_ENV], ignore_errors=True)


from stori_jax.explorer.app import create_app
from stori_jax.explorer.index import build_explorer


def pytest_addoption(parser):
  parser.addoption(
    "--time-breakdown",
    metavar="PATH",
    default=None,
    help="append one JSON line per test to PATH (one file per xdist worker: PATH.<worker>): "
    "its wall seconds (set-up, call and tear-down), the XLA compiles' seconds and count, the "
    "tracing and lowering seconds, and the CPU seconds of subprocesses it waited for; "
    "scripts/suite_profile.py sums them",
  )


_OUTCOME = pytest.StashKey[str]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  """The test's outcome for --time-breakdown: failed if a phase failed, else skipped if one
  skipped, else passed."""
  del call
  report = (yield).get_result()
  seen = item.stash.get(_OUTCOME, "passed")
  if report.failed or (report.skipped and seen != "failed"):
    item.stash[_OUTCOME] = report.outcome


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  """With --time-breakdown: where each test's time went (compiles, subprocesses, the rest)."""
  del nextitem
  path = item.config.getoption("--time-breakdown")
  if not path:
    yield
    return
  # An xdist worker's config carries `workerinput` (a pytest run inside a worker does not).
  worker = getattr(item.config, "workerinput", {}).get("workerid")
  children = resource.getrusage(resource.RUSAGE_CHILDREN)
  start = time.perf_counter()
  with profiling.compilations() as compiled:
    yield
  wall = time.perf_counter() - start
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  record = dict(
    test=item.nodeid,
    outcome=item.stash.get(_OUTCOME, "passed"),
    end=round(time.time(), 1),
    slow=item.get_closest_marker("slow") is not None,
    wall=round(wall, 3),
    compile=round(compiled.seconds, 3),
    compiles=compiled.count,
    from_cache=compiled.from_cache,
    trace_lower=round(compiled.tracing_seconds + compiled.lowering_seconds, 3),
    children_cpu=round(
      (after.ru_utime - children.ru_utime) + (after.ru_stime - children.ru_stime), 3
    ),
  )
  with open(f"{path}.{worker}" if worker else path, "a", encoding="utf-8") as out:
    out.write(json.dumps(record) + "\n")


@pytest.fixture(autouse=True)
def release_workdir_locks():
  """A test's in-process runs end with the test: the workdirs they claimed are free for the
  next test's processes (a real command's lock lasts until its process exits). The run's
  compilation cache back on for the next test, wherever this one pointed it."""
  yield
  run_identity.release_workdirs()
  _use_test_cache()


@pytest.fixture
def compilation_cache_off(monkeypatch):
  """For a test that counts XLA compilations: the run's persistent cache off while it runs
  (in-process commands too), since another test, on either worker, may have put the same program
  in it, which would then be read rather than compiled."""
  monkeypatch.setenv(profiling.CACHE_ENV, "0")
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)  # subprocesses' JAX reads it
  profiling.use_compilation_cache(False)
  yield
  monkeypatch.undo()
  _use_test_cache()


@pytest.fixture(scope="session", autouse=True)
def built_in_registries_only():
  """The registries as shipped when the tests start: tests/toy_plugins.py registers its toy
  few-shot method and protocol when imported, and two test files import it for their toy
  concept method and tower kind while being collected (toy_plugins.forget)."""
  if "toy_plugins" in sys.modules:
    sys.modules["toy_plugins"].forget()
  yield


@pytest.fixture(scope="module", autouse=True)
def release_compiled_programs():
  """Frees the programs XLA compiled for a test file once it is done.

  Every program XLA:CPU compiles keeps about six memory mappings while it is cached, and one
  process running the whole suite (CI runs the slow tests too) compiles thousands: past the
  kernel's default limit of 65,530 mappings per process (vm.max_map_count), the next
  compilation segfaults inside LLVM. That is how CI died, at test 412 of 653. Test files share
  few programs, so clearing JAX's caches between them costs little recompilation.
  """
  yield
  jax.clear_caches()
  gc.collect()


@pytest.fixture(scope="module")
def explorer():
  """The explorer over the synthetic world's index, one image per colour x pattern x shape."""
  return build_explorer("tiny-synthetic", cache_dir=None, images_per_combination=1)


@pytest.fixture(scope="module")
def client(explorer):
  """Flask's test client of the explorer's app."""
  return create_app(explorer).test_client()


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def tiny_synthetic():
  """The shipped tiny CLIP (`stori_jax.load("tiny-synthetic")`), loaded once. A CLIPBundle is
  frozen: tests that need other params build a new one from it."""
  import stori_jax  # pylint: disable=import-outside-toplevel

  return stori_jax.load("tiny-synthetic")


@pytest.fixture(scope="session")
def tiny_random_config():
  """The few-shot runs' random-weight CLIP: at the synthetic world's 64 px (the "test-tiny"
  preset is 32 px), with one image block and a 64-token context (cheaper than the preset)."""
  # pylint: disable-next=import-outside-toplevel
  from stori_jax.models import CLIPConfig, TextConfig, VisionConfig

  return CLIPConfig(
    embed_dim=32,
    text=TextConfig(context_length=64, width=32, layers=4, heads=2),
    vision=VisionConfig(image_size=64, patch_size=16, width=32, layers=1, heads=2),
  )


@pytest.fixture(scope="session")
def tiny_random_model(tmp_path_factory, tiny_random_config):
  """`tiny_random_config` with `init_params(seed=0)`, saved in this project's format: a
  directory any `model.source` / `--source` accepts."""
  from stori_jax.checkpoints import native  # pylint: disable=import-outside-toplevel
  from stori_jax.models import init_params  # pylint: disable=import-outside-toplevel

  directory = tmp_path_factory.mktemp("tiny_random_model")
  native.save(directory, tiny_random_config, init_params(tiny_random_config, seed=0))
  return str(directory)


@pytest.fixture
def run_command(capsys, monkeypatch):
  """`run_command(module, *args)` runs a command module (or the name `python -m` takes) as
  `python -m module *args` would, in this process (`stori_jax.plumbing.cli.run_in_process`, from the
  repository root), and returns a CompletedProcess with its exit status and captured stdout /
  stderr."""
  from stori_jax.plumbing import cli  # pylint: disable=import-outside-toplevel

  def run(module, *args):
    if isinstance(module, str):
      module = importlib.import_module(module)
      if hasattr(module, "__path__"):  # a package: python -m runs its __main__
        module = importlib.import_module(f"{module.__name__}.__main__")
    monkeypatch.chdir(REPO)  # as the subprocesses ran: configs/... paths resolve
    capsys.readouterr()  # only this command's output
    code = cli.run_in_process(module, [str(a) for a in args])
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess([module.__name__, *args], code, out, err)

  return run


#: Runs `python -m module args` and reports the process's own peak RSS (VmHWM, reset at exec)
#: at exit: ru_maxrss of a child also counts the forked test process before exec (1.4 GB).
_PEAK_RSS_RUNNER = """
import atexit, runpy, sys
def report():
  with open("/proc/self/status") as f:
    kb = [line.split()[1] for line in f if line.startswith("VmHWM:")][0]
  sys.stderr.write(f"\\npeak_rss_kb={kb}\\n")
atexit.register(report)
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


@pytest.fixture
def measure_command():
  """`measure_command(module, *args)` runs `python -m module *args` as a program (memory is the
  point) from the repository root and returns (exit status, stderr without the report, wall
  seconds, peak RSS bytes)."""

  def run(module, *args):
    start = time.monotonic()
    done = subprocess.run(
      [sys.executable, "-c", _PEAK_RSS_RUNNER, module, *map(str, args)],
      capture_output=True,
      text=True,
      timeout=120,
      check=False,
      cwd=REPO,
    )
    seconds = time.monotonic() - start
    found = re.search(r"\npeak_rss_kb=(\d+)\n", done.stderr)
    assert found, done.stderr[-2000:]
    return done.returncode, done.stderr[: found.start()], seconds, int(found.group(1)) * 1024

  return run


@pytest.fixture(scope="session")
def gcs_emulator():
  """A local GCS (`gcp-storage-emulator`, in memory, on a loopback port) for the session's
  gs:// tests (tests/gcs_emulator.py); stopped when the session ends."""
  # Found, not imported: gcsfs reads GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT when it is imported.
  for module, extra in (("gcp_storage_emulator", "test"), ("gcsfs", "gcs")):
    if importlib.util.find_spec(module) is None:
      pytest.skip(f"{module} is not installed (the {extra} extra installs it)")
  import gcs_emulator  # pylint: disable=import-outside-toplevel  # tests/ is on sys.path

  emulator = gcs_emulator.Emulator()
  yield emulator
  emulator.stop()


@pytest.fixture
def gcs_bucket(gcs_emulator, monkeypatch):
  """A fresh bucket on the emulator, with this process pointed at the emulator (its
  environment and gcsfs's anonymous token); returns the bucket's name."""
  import fsspec.config  # pylint: disable=import-outside-toplevel

  for key, value in gcs_emulator.env().items():
    monkeypatch.setenv(key, value)
  monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", gcs_emulator.url)
  monkeypatch.setitem(fsspec.config.conf, "gcs", {"token": "anon", "use_listings_cache": False})
  yield gcs_emulator.create_bucket()
  # The test's lock objects released while this process still points at the emulator (the
  # autouse release runs after monkeypatch's undo, when gcsfs would look for the real GCS and
  # retry for most of a minute).
  run_identity.release_workdirs()
