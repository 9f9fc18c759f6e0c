"""The code's format and lint, as ruff.toml sets them: `ruff format --check` and `ruff check`
over the repository find nothing."""

import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ruff() -> list[str]:
  # The test extra installs ruff into the venv; a bare `ruff` on PATH also serves.
  beside = os.path.join(os.path.dirname(sys.executable), "ruff")
  if os.path.exists(beside):
    return [beside]
  if shutil.which("ruff"):
    return ["ruff"]
  pytest.fail("ruff is missing: pip install -e '.[test]' installs it")


@pytest.mark.parametrize("args", [["format", "--check"], ["check"]], ids=["format", "lint"])
def test_ruff_finds_nothing(args):
  done = subprocess.run(
    _ruff() + args + ["."], cwd=REPO, capture_output=True, text=True, timeout=120
  )
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
