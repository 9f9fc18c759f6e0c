"""The mutual analysis's config checks (mutual.paper_config.check_analysis, mutual.data.prepare):
a degenerate setting that would write MI 0 / AUC 0 as results, a class listed twice, a negative
size or seed, or no concept method stops `mutual.analyze` with one paragraph and exit 2 before
any work (no model loaded, nothing written)."""

import os

import pytest

from mutual import pipeline


@pytest.mark.parametrize(
  "flag, phrase",
  [
    ("--config.analysis.top_k=0", "config.analysis.top_k"),
    ("--config.analysis.u=0", "config.analysis.u"),
    ("--config.analysis.u=-1", "config.analysis.u"),
    ("--config.analysis.n_concepts=0", "config.analysis.n_concepts"),
    ("--config.analysis.ellipse_seed=-2", "config.analysis.ellipse_seed"),
    ("--config.analysis.methods=()", "config.analysis.methods"),
    ("--config.analysis.methods=('pca','pca')", "config.analysis.methods"),
    ("--config.data.classes=(2,2)", "names [2] more than once"),
    ("--config.data.images_per_class=0", "config.data.images_per_class"),
    ("--config.data.images_per_class=-3", "config.data.images_per_class"),
    ("--config.data.seed=-1", "config.data.seed"),
  ],
)
def test_degenerate_settings_exit_2_before_any_work(
  tmp_path, run_command, monkeypatch, flag, phrase
):
  monkeypatch.setattr(
    pipeline, "analyze_class", lambda *a, **k: pytest.fail("the analysis started")
  )
  workdir = tmp_path / "out"
  done = run_command(
    "mutual.analyze", "--config=configs/mutual_synthetic.py", f"--workdir={workdir}", flag
  )
  assert done.returncode == 2, done.stderr[-2000:]
  assert "Traceback" not in done.stderr
  errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1 and phrase in errors[0], done.stderr[-2000:]
  assert not os.path.exists(workdir / "results.json")
