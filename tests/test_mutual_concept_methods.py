"""mutual.concept_methods: a new concept method is one registration, made here from one file
(tests/toy_plugins.py's toy bands), and `mutual.analyze` then fits it, checks its setting, names
it in its table and figures and writes its records like PCA and K-means."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest

from mutual import analyze, concept_methods, information, paper_config
from stori_jax.plumbing.config_files import ConfigError
from toy_plugins import TOY_CONCEPTS  # tests/ is on sys.path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The smallest analysis the CLI tests run: the embedded world's class 2, 4 images, 2 figures.
SMOKE = os.path.join(ROOT, "configs/mutual_synthetic.py:smoke")


@pytest.fixture
def toy_bands():
  """The one registration, undone after the test."""
  method = concept_methods.register(TOY_CONCEPTS)
  yield method
  concept_methods.unregister(method.name)


def _bands(mask: np.ndarray, n: int, axis: str) -> np.ndarray:
  """The toy's map written out with numpy: band = position * n // size, -1 off the mask."""
  _, height, width = mask.shape
  rows, cols = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
  band = cols * n // width if axis == "columns" else rows * n // height
  return np.where(mask, band[None], -1)


def test_the_registry_finds_refuses_and_names(toy_bands):
  assert concept_methods.get("toy_bands") is toy_bands
  assert concept_methods.names() == ("pca", "kmeans", "toy_bands")
  assert [concept_methods.title(m) for m in concept_methods.names()] == [
    "PCA",
    "K-means",
    "Toy bands",
  ]
  with pytest.raises(
    ConfigError,
    match=r"'nope': unknown concept method; the registered ones are \['pca', 'kmeans', 'toy_bands'\]",
  ):
    concept_methods.get("nope")
  with pytest.raises(ValueError, match="already registered"):
    concept_methods.register(dataclasses.replace(toy_bands))  # another entry of the same name
  # A setting another method reads is refused: each method's keys are its own.
  thief = dataclasses.replace(toy_bands, name="thief", defaults=dict(kmeans_seed=1))
  with pytest.raises(ValueError, match=r"\['kmeans_seed'\] are already 'kmeans'"):
    concept_methods.register(thief)
  assert "thief" not in concept_methods.names()
  # Its setting joins config.analysis with its default, and its check runs with the others'.
  analysis = paper_config.analysis_config(methods=("toy_bands",))
  assert analysis.toy_bands_axis == "columns"
  assert paper_config.concept_settings(analysis)["toy_bands_axis"] == "columns"
  analysis.toy_bands_axis = "diagonal"
  with pytest.raises(ConfigError, match="toy_bands_axis must be one of"):
    paper_config.check_analysis(analysis)
  # A method without a reference twin cannot be run by the PyTorch reference, and says so.
  with pytest.raises(ConfigError, match="'toy_bands' has no reference twin"):
    concept_methods.reference_labelers(None, ("pca", "toy_bands"), {})


def test_unregistered_methods_are_refused_before_work():
  analysis = paper_config.analysis_config(methods=("pca", "toy_bands"))
  with pytest.raises(ConfigError, match=r"concept methods \('pca', 'kmeans'\)"):
    paper_config.check_analysis(analysis)


@pytest.mark.parametrize("axis", ["columns", "rows"])
def test_the_toy_fit_is_its_bands(toy_bands, axis):
  mask = np.random.default_rng(0).random((2, 6, 8)) < 0.6
  features = np.zeros((2, 6, 8, 4), np.float32)
  maps = toy_bands.fit(features, mask, 3, dict(toy_bands_axis=axis))
  assert maps.shape == (2, 6, 8) and str(maps.dtype) == "int32"
  np.testing.assert_array_equal(np.asarray(maps), _bands(mask, 3, axis))


def test_analyze_runs_the_toy_method_beside_pca(tmp_path, run_command, toy_bands):
  workdir = tmp_path / "run"
  done = run_command(
    analyze,
    "--config",
    SMOKE,
    "--config.analysis.methods=('toy_bands', 'pca')",
    f"--workdir={workdir}",
  )
  assert done.returncode == 0, done.stderr[-3000:]
  assert "| MI Toy bands | MI PCA | AUC Toy bands | AUC PCA |" in done.stdout
  assert "| MI Toy bands | MI PCA |" in (workdir / "table.md").read_text()
  n = int(paper_config.ANALYSIS_DEFAULTS["n_concepts"])
  records = [json.loads(p.read_text()) for p in sorted((workdir / "per_image").rglob("*.json"))]
  assert len(records) == 4
  for record in records:
    toy, pca = record["methods"]["toy_bands"], record["methods"]["pca"]
    # PCA gives every foreground patch a concept: the toy's bands cover the same patches.
    foreground = np.asarray(pca["concept_map"])[None] >= 0
    np.testing.assert_array_equal(
      np.asarray(toy["concept_map"])[None], _bands(foreground, n, "columns")
    )
    assert toy["concepts"] and all(c["descriptors"] for c in toy["concepts"])
    assert {c["concept"] for c in toy["concepts"]} <= set(range(n))
    assert len(toy["curve"]) == len(toy["visual_descriptors"]) + 1
    assert set(toy["mutual_descriptors"]) <= set(toy["language_descriptors"])
  results = json.loads((workdir / "results.json").read_text())
  summary = results["dataset"]["toy_bands"]
  assert results["dataset"]["images"] == 4
  assert summary["auc"] == pytest.approx(information.curve_auc(summary["curve"]), abs=1e-5)
  assert summary["mi"] == pytest.approx(np.mean([r["methods"]["toy_bands"]["mi"] for r in records]))
  assert (workdir / "figures" / "concepts_toy_bands_0002.png").stat().st_size > 1000


def test_analyze_refuses_the_toy_setting_before_work(tmp_path, run_command, toy_bands):
  workdir = tmp_path / "bad"
  done = run_command(
    analyze,
    "--config",
    SMOKE,
    "--config.analysis.methods=('toy_bands',)",
    "--config.analysis.toy_bands_axis=diagonal",
    f"--workdir={workdir}",
  )
  assert done.returncode == 2, done.stderr[-3000:]
  assert "config.analysis.toy_bands_axis must be one of ('columns', 'rows')" in done.stderr
  assert "Traceback" not in done.stderr
  assert not (workdir / "results.json").exists() and not (workdir / "per_image").exists()
