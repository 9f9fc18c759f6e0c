"""The mutual analysis's config checks (mutual.paper_config.check_analysis, mutual.data.prepare):
a degenerate setting that would write MI 0 / AUC 0 as results, a class listed twice, a negative
size or seed, or no concept method stops `mutual.analyze` with one paragraph and exit 2 before
any work (no model loaded, nothing written)."""

import glob
import os
import re

import ml_collections
import pytest

from mutual import paper_config, pipeline, visual_prompts
from stori_jax.plumbing.config_files import ConfigError
from stori_jax.plumbing.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize(
  "flag, phrase",
  [
    ("--config.analysis.top_k=0", "config.analysis.top_k"),
    ("--config.analysis.u=0", "config.analysis.u"),
    ("--config.analysis.u=-1", "config.analysis.u"),
    ("--config.analysis.n_concepts=0", "config.analysis.n_concepts"),
    ("--config.analysis.ellipse_seed=-2", "config.analysis.ellipse_seed"),
    ("--config.analysis.ellipse_seed=2147483648", "cv2.setRNGSeed"),
    ("--config.analysis.kmeans_seed=-1", "config.analysis.kmeans_seed"),
    ("--config.analysis.kmeans_seed=4294967296", "np.random.seed"),
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


# One home for config.analysis's defaults ----------------------------------------------------


def _without(*keys) -> ml_collections.ConfigDict:
  """An analysis config lacking `keys` (one written before they existed)."""
  values = paper_config.analysis_config().to_dict()
  for key in keys:
    del values[key]
  return ml_collections.ConfigDict(values)


def test_analysis_config_writes_the_one_set_of_defaults():
  config = paper_config.analysis_config()
  for key, value in paper_config.ANALYSIS_DEFAULTS.items():
    assert config[key] == value, key
  assert config.prompt_chunk == visual_prompts.PROMPT_CHUNK  # the library's own call shape


def test_every_reader_takes_a_missing_key_from_the_one_home(monkeypatch):
  """A config without mode, compute_dtype, prompt_chunk... gets ANALYSIS_DEFAULTS' value, in the
  check and in the stages: move a default there and every reader follows."""
  for mode in paper_config.ANALYSIS_MODES:
    monkeypatch.setitem(paper_config.ANALYSIS_DEFAULTS, "mode", mode)
    stages = paper_config.check_analysis(_without("mode"))
    assert stages == paper_config.MODE_STAGES[mode]
  for key, bad, phrase in (
    ("compute_dtype", "fp8", "compute_dtype must be one of"),
    ("prompt_chunk", 0, "prompt_chunk must be an integer >= 1"),
    ("tower_batch", -1, "tower_batch must be an integer >= 0"),
    ("top_k", 0, "top_k"),
  ):
    monkeypatch.setitem(paper_config.ANALYSIS_DEFAULTS, key, bad)
    with pytest.raises(ConfigError, match=phrase):
      paper_config.check_analysis(_without(key))
    monkeypatch.undo()


def test_no_module_writes_a_second_analysis_default():
  """Readers of config.analysis go through paper_config.analysis_value: a literal fallback such
  as `analysis.get("compute_dtype", "float32")` anywhere else fails here."""
  keys = "|".join(paper_config.ANALYSIS_DEFAULTS)
  pattern = re.compile(r"analysis\.get\(\s*.(" + keys + r").\s*,")
  found = []
  for path in glob.glob(os.path.join(ROOT, "mutual", "**", "*.py"), recursive=True):
    if os.path.basename(path) == "paper_config.py":
      continue
    with open(path, encoding="utf-8") as f:
      found += [f"{os.path.relpath(path, ROOT)}: {m.group(0)}" for m in pattern.finditer(f.read())]
  assert not found


def test_the_analysis_check_runs_once_per_run(tmp_path, run_command, monkeypatch):
  calls = []
  check = paper_config.check_analysis
  monkeypatch.setattr(paper_config, "check_analysis", lambda a: calls.append(1) or check(a))

  class Stop(UserError):
    pass

  def first_class(*args, **kwargs):
    raise Stop(f"stopped at the first class after {len(calls)} check(s)")

  monkeypatch.setattr(pipeline, "analyze_class", first_class)
  done = run_command(
    "mutual.analyze", "--config=configs/mutual_synthetic.py:smoke", f"--workdir={tmp_path}/out"
  )
  assert done.returncode == 2 and "after 1 check(s)" in done.stderr, done.stderr[-2000:]
