"""scripts/suite_profile.py: the suite's time split into compiles, tracing, subprocesses and the
rest, the failed tests named, the files and tests that take the most; and conftest's
--time-breakdown writing the records it reads (pytest in-process on a generated test file)."""

import importlib.util
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytest_plugins = ["pytester"]


def _script():
  spec = importlib.util.spec_from_file_location(
    "suite_profile", os.path.join(ROOT, "scripts", "suite_profile.py")
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _record(test, wall, compile_s=0.0, trace=0.0, children=0.0, outcome="passed", slow=False):
  return dict(
    test=test,
    outcome=outcome,
    end=0.0,
    slow=slow,
    wall=wall,
    compile=compile_s,
    compiles=3 if compile_s else 0,
    from_cache=0,
    trace_lower=trace,
    children_cpu=children,
  )


def test_the_summary_splits_the_time_and_names_the_failures(tmp_path):
  records = [
    _record("tests/a.py::one", 10.0, compile_s=4.0, trace=1.0),
    _record("tests/a.py::two", 6.0, children=3.0, slow=True),
    _record("tests/b.py::three", 4.0, outcome="failed"),
  ]
  for worker, chunk in (("gw0", records[:2]), ("gw1", records[2:])):
    (tmp_path / f"t.jsonl.{worker}").write_text("".join(json.dumps(r) + "\n" for r in chunk))
  script = _script()
  loaded = script.load([str(tmp_path / "t.jsonl.gw0"), str(tmp_path / "t.jsonl.gw1")])
  text = script.summary(loaded, top=2)
  lines = text.splitlines()
  assert lines[0] == "3 tests, 20 s summed over workers (1 slow tests: 6 s)"
  assert "XLA compiles" in lines[1] and " 20.0%" in lines[1] and "(3 programs)" in lines[1]
  assert "tracing+lowering" in lines[2] and "  5.0%" in lines[2]
  assert "subprocess CPU" in lines[3] and " 15.0%" in lines[3]
  assert "the rest" in lines[4] and " 60.0%" in lines[4]
  assert "failed: 1" in text and "    tests/b.py::three" in text
  files = lines[lines.index("files (s, compile s, subprocess s, tests):") + 1 :][:2]
  assert files[0].split()[-1] == "tests/a.py" and files[0].split()[0] == "16.0"
  assert lines[-2].endswith("tests/a.py::one") and lines[-1].endswith("tests/a.py::two [slow]")


@pytest.mark.usefixtures("compilation_cache_off")
def test_the_breakdown_option_writes_a_record_per_test(pytester, tmp_path, monkeypatch):
  # Its program compiled, not read from the run's cache (the conftest it loads would turn that
  # on again unless told not to).
  monkeypatch.setenv("STORI_TEST_COMPILATION_CACHE", "0")
  pytester.makeconftest(
    "from importlib.machinery import SourceFileLoader\n"
    f"SourceFileLoader('root_conftest', {os.path.join(ROOT, 'tests', 'conftest.py')!r})"
    ".load_module()\n"
    "from root_conftest import pytest_addoption, pytest_runtest_makereport, "
    "pytest_runtest_protocol\n"
  )
  pytester.makepyfile(
    "import jax, jax.numpy as jnp, pytest\n"
    "def test_compiles():\n"
    "  assert float(jax.jit(lambda x: jnp.sin(x) * 3.0)(jnp.float32(1.0))) > 2.0\n"
    "def test_fails():\n"
    "  assert False\n"
    "@pytest.mark.skip(reason='because')\n"
    "def test_skipped():\n"
    "  pass\n"
  )
  out = tmp_path / "times.jsonl"
  result = pytester.runpytest_inprocess("-p", "no:xdist", f"--time-breakdown={out}")
  result.assert_outcomes(passed=1, failed=1, skipped=1)
  records = {r["test"].split("::")[1]: r for r in map(json.loads, out.read_text().splitlines())}
  assert {k: r["outcome"] for k, r in records.items()} == {
    "test_compiles": "passed",
    "test_fails": "failed",
    "test_skipped": "skipped",
  }
  assert records["test_compiles"]["compiles"] >= 1 and records["test_compiles"]["compile"] > 0
  assert records["test_fails"]["compiles"] == 0
