"""Issue 44 row 2: a damaged unit of finished work (garbage, cut short or emptied) is done again
on the next run, with one line naming the file, and the run ends with the numbers of a run that
was never damaged: an analysed class's Fig. 5 array (classes/<label>_fig5.npz) and its record
(classes/<label>.json) after `mutual.analyze`, and LF-CBM's trained model (lf_cbm/lf_cbm.npz)
of `mutual.evaluate`'s baselines."""

import json
import logging
import os
import shutil

import numpy as np
import pytest

import stori_jax
from mutual.analysis import runner as analysis
from mutual.baselines import lf_cbm as lf_cbm_baseline
from stori_jax.plumbing.config_files import load_config
from test_mutual_baselines_table5 import _descriptors, _toy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DAMAGE = {
  "garbage": lambda data: bytes(range(256)) * 4,
  "truncated": lambda data: data[: len(data) // 2],
  "empty": lambda data: b"",
}


def _outputs(workdir) -> dict:
  """results.json (without the config, which names the workdir) and every per-image record."""
  results = json.loads((workdir / "results.json").read_text())
  results.pop("config", None)
  found = {"results.json": results}
  for path in sorted((workdir / "per_image").rglob("*.json")):
    found[str(path.relative_to(workdir))] = json.loads(path.read_text())
  return found


@pytest.fixture(scope="module")
def analysed(tmp_path_factory, tiny_synthetic):
  """A finished analysis of two classes of 2 images, the first a figure class (so it has a
  Fig. 5 array): its config and workdir."""
  config = load_config(os.path.join(ROOT, "configs/mutual_synthetic.py"), "smoke")
  config.data.classes = (2, 7)
  config.data.images_per_class = 2
  config.figure_classes = 1
  config.figures_per_class = 2
  out = tmp_path_factory.mktemp("analysed") / "whole"
  with pytest.MonkeyPatch.context() as patch:  # the session's model, not a second load
    patch.setattr(stori_jax, "load", lambda source: tiny_synthetic)
    analysis.run(config, str(out), progress=False)
  return config, out


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("name", ["classes/0002_fig5.npz", "classes/0002.json"])
def test_a_damaged_class_file_is_analysed_again(
  analysed, tmp_path, tiny_synthetic, monkeypatch, caplog, name, damage
):
  config, whole = analysed
  workdir = tmp_path / "run"
  shutil.copytree(whole, workdir)
  path = workdir / name
  path.write_bytes(DAMAGE[damage](path.read_bytes()))
  classes = []
  analyze_class = analysis.pipeline.analyze_class

  def counting(bundle, images, *args, **kwargs):
    classes.append(len(images))
    return analyze_class(bundle, images, *args, **kwargs)

  monkeypatch.setattr(analysis.pipeline, "analyze_class", counting)
  monkeypatch.setattr(stori_jax, "load", lambda source: tiny_synthetic)
  with caplog.at_level(logging.WARNING):
    analysis.run(config, str(workdir), progress=False)
  assert classes == [2]  # the damaged class alone, analysed again
  lines = [r.getMessage() for r in caplog.records if str(path) in r.getMessage()]
  assert len(lines) == 1 and "class 0002" in lines[0] and "done again" in lines[0], lines
  assert _outputs(workdir) == _outputs(whole)
  assert path.read_bytes() == (whole / name).read_bytes()


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_lf_cbm_model_is_trained_again(tmp_path, caplog, damage):
  cached, text = _toy(), _descriptors()
  settings = dict(clip_cutoff=-1.0, interpretability_cutoff=-1.0, proj_steps=60, n_iters=5)
  workdir = str(tmp_path / "baselines" / "lf_cbm")
  first, record = lf_cbm_baseline.train_lf_cbm(
    cached, text, 3, settings, progress=False, workdir=workdir
  )
  path = tmp_path / "baselines" / "lf_cbm" / "lf_cbm.npz"
  whole = path.read_bytes()
  path.write_bytes(DAMAGE[damage](whole))
  with caplog.at_level(logging.WARNING):
    again, again_record = lf_cbm_baseline.train_lf_cbm(
      cached, text, 3, settings, progress=False, workdir=workdir
    )
  lines = [r.getMessage() for r in caplog.records if str(path) in r.getMessage()]
  assert len(lines) == 1 and "LF-CBM is done again" in lines[0], lines
  for field in ("concepts", "projection", "mean", "std", "weight", "bias"):
    np.testing.assert_array_equal(getattr(again, field), getattr(first, field), err_msg=field)
  assert {k: v for k, v in again_record.items() if k != "seconds"} == {
    k: v for k, v in record.items() if k != "seconds"
  }
  # Written whole again: the next run loads it, with no line.
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    lf_cbm_baseline.train_lf_cbm(cached, text, 3, settings, progress=False, workdir=workdir)
  assert "done again" not in caplog.text
