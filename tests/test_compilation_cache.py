"""Compile once per machine: every command runs with JAX's persistent compilation cache on
(stori_jax.plumbing.cli, profiling.use_compilation_cache) and writes `<workdir>/compilation.json`;
a second run of the same shapes reads its programs from the cache instead of compiling them.

conftest.py keeps the cache off for the other tests (STORI_COMPILATION_CACHE=0); these turn it
on in a folder of their own."""

import json
import os
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl import flags

from stori_jax.plumbing import cli, profiling, run_identity

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def cache_off_afterwards():
  """Whatever a test turns on, later tests run with the cache off (as conftest sets it)."""
  yield
  profiling.use_compilation_cache(False)
  jax.clear_caches()


def _command_module():
  """A command (define_flags / main, as every command module has them) that claims --workdir
  and runs two jitted programs."""

  def define_flags(values):
    flags.DEFINE_string("workdir", None, "Output directory.", flag_values=values)

  def main(argv, values):
    del argv
    run_identity.claim_run(values.workdir, {"config": {"n": 1}}, what="test run")
    x = jax.device_put(np.arange(12, dtype=np.float32).reshape(3, 4))
    jax.block_until_ready(jax.jit(lambda a: jnp.tanh(a) @ a.T)(x))
    jax.block_until_ready(jax.jit(lambda a: (a * 2.0).sum(axis=0))(x))

  return types.SimpleNamespace(__name__="fake_command", define_flags=define_flags, main=main)


def test_a_second_command_reads_its_programs_from_the_cache(
  tmp_path, monkeypatch, cache_off_afterwards
):
  monkeypatch.setenv(profiling.CACHE_ENV, "1")
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "cache"))
  command = _command_module()
  records = []
  for name in ("first", "second"):
    jax.clear_caches()  # as a new process: nothing compiled in memory
    assert cli.run_in_process(command, [f"--workdir={tmp_path / name}"]) == 0
    records.append(json.loads((tmp_path / name / cli.COMPILATION_FILE).read_text()))
  first, second = records
  assert first["cache_dir"] == str(tmp_path / "cache") and first["cache_off_reason"] is None
  assert first["programs"] >= 2 and first["programs_compiled"] == first["programs"]
  assert first["programs_from_cache"] == 0 and first["compile_seconds"] > 0
  # Small programs too (the cache's default thresholds would keep sub-second compiles out).
  assert second["programs"] == first["programs"]
  assert second["programs_from_cache"] == second["programs"]
  assert second["programs_compiled"] == 0 and second["compiled_programs"] == {}
  assert os.listdir(tmp_path / "cache")


def test_the_flag_turns_the_cache_off(tmp_path, monkeypatch, cache_off_afterwards):
  monkeypatch.setenv(profiling.CACHE_ENV, "1")
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "cache"))
  command = _command_module()
  jax.clear_caches()
  code = cli.run_in_process(command, [f"--workdir={tmp_path / 'w'}", "--compilation_cache=false"])
  assert code == 0
  record = json.loads((tmp_path / "w" / cli.COMPILATION_FILE).read_text())
  assert record["cache_dir"] is None and record["programs_from_cache"] == 0
  assert record["programs_compiled"] == record["programs"] >= 2
  assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("value", ["disabled", "OFF", "none"])
def test_the_environment_turns_the_cache_off(tmp_path, monkeypatch, cache_off_afterwards, value):
  monkeypatch.setenv(profiling.CACHE_ENV, value)
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "cache"))
  jax.clear_caches()
  assert cli.run_in_process(_command_module(), [f"--workdir={tmp_path / 'w'}"]) == 0
  record = json.loads((tmp_path / "w" / cli.COMPILATION_FILE).read_text())
  assert record["cache_dir"] is None and record["cache_off_reason"].startswith("turned off")
  assert record["programs_compiled"] == record["programs"] >= 2
  assert not (tmp_path / "cache").exists()


def test_a_cache_setting_that_says_neither_on_nor_off_is_refused(
  tmp_path, monkeypatch, capsys, cache_off_afterwards
):
  monkeypatch.setenv(profiling.CACHE_ENV, "of")
  assert cli.run_in_process(_command_module(), [f"--workdir={tmp_path / 'w'}"]) == 2
  err = capsys.readouterr().err
  assert err.count("error:") == 1 and "STORI_COMPILATION_CACHE='of' says neither on nor off" in err
  assert not (tmp_path / "w").exists()


def test_an_unusable_cache_folder_is_reported_and_left_off(
  tmp_path, monkeypatch, capsys, cache_off_afterwards
):
  """A folder that cannot be made (a file stands in its way): one warning line, the run
  compiles without the cache, and compilation.json says so (cache_dir null, the reason)."""
  (tmp_path / "a_file").write_text("not a folder\n")
  folder = tmp_path / "a_file" / "cache"
  monkeypatch.setenv(profiling.CACHE_ENV, "1")
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(folder))
  jax.clear_caches()
  assert cli.run_in_process(_command_module(), [f"--workdir={tmp_path / 'w'}"]) == 0
  warnings = [line for line in capsys.readouterr().err.splitlines() if "compilation cache" in line]
  assert len(warnings) == 1, warnings
  assert f"the compilation cache folder {folder} cannot be written (Not a directory)" in warnings[0]
  assert "compiles without the cache" in warnings[0]
  record = json.loads((tmp_path / "w" / cli.COMPILATION_FILE).read_text())
  assert record["cache_dir"] is None
  assert record["cache_off_reason"] == f"the folder {folder} cannot be written (Not a directory)"
  assert record["programs_compiled"] == record["programs"] >= 2
  assert not jax.config.jax_enable_compilation_cache


def test_where_the_cache_lives(tmp_path, monkeypatch, cache_off_afterwards):
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert profiling.default_cache_dir() == str(tmp_path / "xdg" / "stori_jax" / "jax_cache")
  assert profiling.use_compilation_cache(True) == profiling.default_cache_dir()
  assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0
  assert jax.config.jax_persistent_cache_min_entry_size_bytes == -1
  # A user's own folder wins: the environment's, or jax.config's set before the command.
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "mine"))
  assert profiling.use_compilation_cache(True) == str(tmp_path / "mine")
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
  jax.config.update("jax_compilation_cache_dir", str(tmp_path / "set_in_python"))
  assert profiling.use_compilation_cache(True) == str(tmp_path / "set_in_python")
  assert profiling.use_compilation_cache(False) is None
  assert not jax.config.jax_enable_compilation_cache
  for value, on in (
    ("0", False), ("off", False), ("false", False), ("disabled", False), ("1", True), ("", True)
  ):  # fmt: skip
    monkeypatch.setenv(profiling.CACHE_ENV, value)
    assert profiling.compilation_cache_default() is on, value


def _demo(workdir, cache, timeout=900):
  env = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    JAX_COMPILATION_CACHE_DIR=str(cache),
    **{profiling.CACHE_ENV: "1"},
  )
  command = [
    sys.executable,
    "-m",
    "stori_jax.train",
    "--config=configs/demo.py",
    f"--workdir={workdir}",
    "--config.epochs=2",  # the demo's programs, fewer steps of them
  ]
  done = subprocess.run(
    command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False
  )
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads((workdir / cli.COMPILATION_FILE).read_text())


@pytest.mark.slow
def test_a_second_demo_run_compiles_nothing(tmp_path):
  """Two runs of configs/demo.py (as programs) in fresh workdirs sharing one cache folder: the
  second reads at least 90% of the programs it needs from the cache (measured: all of them)."""
  first = _demo(tmp_path / "first", tmp_path / "cache")
  second = _demo(tmp_path / "second", tmp_path / "cache")
  assert first["programs"] > 0 and first["programs_compiled"] == first["programs"]
  assert second["programs"] == first["programs"]
  assert second["programs_from_cache"] >= 0.9 * second["programs"]
  assert second["compile_seconds"] < 0.5 * first["compile_seconds"]
