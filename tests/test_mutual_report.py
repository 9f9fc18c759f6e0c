"""mutual.report's paper figures read back from their matplotlib axes: Fig. 5 (several classes'
MI curves overlaid with their AUCs, and the concept each class shares on its images) and App.
E's Fig. 7 (one image's deletion and insertion steps with its score curves); the analysis and
the evaluation write them."""

import json
import math
import os

import numpy as np
import pytest

from mutual.analysis import runner as analysis
from mutual.evaluation import runner as evaluation
from mutual import information, report, xai
from stori_jax.plumbing.config_files import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _closed_figures(monkeypatch):
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  closed, close = [], plt.close
  monkeypatch.setattr(plt, "close", lambda fig=None: (closed.append(fig), close(fig)))
  return closed


def _record(concepts, concept_map):
  """An image record with one method: concepts [(id, patches, descriptors)]."""
  m = dict(
    concept_map=concept_map,
    concepts=[dict(concept=c, patches=p, descriptors=d) for c, p, d in concepts],
  )
  return dict(methods=dict(pca=m))


GRID = [[0, 0, 1, 1], [0, 0, 1, 1], [2, 2, -1, -1], [2, 2, -1, -1]]


def test_shared_concept_is_the_one_in_most_images_with_its_usual_descriptors():
  records = [
    _record([(0, 4, ["fur", "tail"]), (1, 4, ["ear"])], GRID),
    _record([(1, 2, ["ear", "fur"]), (2, 9, ["leg"])], GRID),
    _record([(1, 3, ["ear", "tail"]), (0, 2, ["tail"])], GRID),
  ]
  # Concept 1 is in three images, concept 0 in two.
  assert report.shared_concept(records, "pca") == (1, ["ear", "fur", "tail"])
  assert report.shared_concept(records, "pca", top=1) == (1, ["ear"])
  # A tie in images goes to the most patches: concept 2 (9) over concept 0 (4).
  tie = [_record([(0, 4, ["fur"])], GRID), _record([(2, 9, ["leg"])], GRID)]
  assert report.shared_concept(tie, "pca")[0] == 2
  # Concepts without descriptors are not shown.
  assert report.shared_concept([_record([(0, 4, [])], GRID)], "pca") is None


def test_fig5_overlays_the_classes_curves_with_their_aucs(tmp_path, monkeypatch):
  rng = np.random.default_rng(0)
  curves = {
    "sock": [3.0, 2.5, 2.0, 0.5, 0.0],
    "siamang": [3.5, 1.0, 0.2, 0.0],
    "crayfish": [2.0, 0.0],
  }
  classes = []
  for name, curve in curves.items():
    records = [_record([(1, 4, [f"{name} part"]), (2, 4, ["other"])], GRID) for _ in range(3)]
    images = rng.integers(0, 255, (3, 16, 16, 3), dtype=np.uint8)
    classes.append(dict(name=name, curve=curve, images=images, records=records, refined=None))
  closed = _closed_figures(monkeypatch)
  report.plot_classes(str(tmp_path / "fig5.png"), classes, "pca", model="M-1")
  assert (tmp_path / "fig5.png").stat().st_size > 5000
  (fig,) = closed
  curves_ax, *image_axes = fig.axes
  lines = curves_ax.get_lines()
  assert len(lines) == 3
  labels = [t.get_text() for t in curves_ax.get_legend().get_texts()]
  for line, label, (name, curve) in zip(lines, labels, curves.items()):
    assert label == f"{name} ({information.curve_auc(np.asarray(curve)):.2f})"
    np.testing.assert_allclose(line.get_ydata(), curve)
  assert curves_ax.get_xlabel() == "visual descriptors removed"
  assert len(image_axes) == 3 * 3  # each class's 3 images
  titles = [ax.get_title(loc="left") for ax in image_axes[::3]]
  assert titles == [f"{name}: concept 1" for name in curves]
  # The shared concept's descriptors under each class's row; only its outline is drawn.
  captions = [t.get_text() for ax in image_axes[::3] for t in ax.texts if "part" in t.get_text()]
  assert captions == [f"{name} part" for name in curves]
  assert all(ax.texts[0].get_text() == "1" for ax in image_axes)  # concept 2 is not drawn
  assert "M-1" in fig._suptitle.get_text() and "PCA" in fig._suptitle.get_text()


def test_fig7_shows_every_step_and_the_two_score_curves(tmp_path, monkeypatch):
  rng = np.random.default_rng(1)
  images = rng.integers(0, 255, (2, 32, 32, 3), dtype=np.uint8)
  masks = np.zeros((2, 3, 32, 32), bool)
  masks[:, 0, :8], masks[:, 1, 8:16], masks[:, 2, 16:20] = True, True, True
  valid = np.array([[True, True, True], [True, False, True]])
  blur = xai.blur_kernel(32, 16.0)
  steps = evaluation.first_image_steps(images, masks, valid, blur)
  x = images[0] / 255.0
  blurred = np.asarray(xai.blur_images(x[None].astype(np.float32), *blur))[0]
  assert steps["deletion"].shape == steps["insertion"].shape == (4, 32, 32, 3)
  np.testing.assert_allclose(steps["deletion"][0], x, atol=1e-6)  # nothing blurred yet
  np.testing.assert_allclose(steps["insertion"][0], blurred, atol=1e-6)  # everything blurred
  np.testing.assert_allclose(steps["deletion"][2][:16], blurred[:16], atol=1e-6)
  np.testing.assert_allclose(steps["deletion"][2][16:], x[16:], atol=1e-6)
  np.testing.assert_allclose(steps["insertion"][3][:20], x[:20], atol=1e-6)
  np.testing.assert_allclose(steps["insertion"][3][20:], blurred[20:], atol=1e-6)

  deletion, insertion = [2.0, 1.5, 1.0, 0.5], [0.5, 1.0, 1.8, 1.9]
  closed = _closed_figures(monkeypatch)
  report.plot_perturbation_steps(
    str(tmp_path / "fig7.png"), steps["deletion"], steps["insertion"], deletion, insertion, "t"
  )
  (fig,) = closed
  *step_axes, curve_ax = fig.axes
  assert len(step_axes) == 2 * 4
  assert [ax.get_title() for ax in step_axes[:2]] == ["deletion: step 0", "step 1"]
  assert step_axes[4].get_title() == "insertion: step 0"
  labels = [t.get_text() for t in curve_ax.get_legend().get_texts()]
  assert labels == [
    f"deletion (area {float(xai.curve_auc(deletion)):.2f})",
    f"insertion (area {float(xai.curve_auc(insertion)):.2f})",
  ]
  assert [line.get_ydata().tolist() for line in curve_ax.get_lines()] == [deletion, insertion]
  assert curve_ax.get_ylabel() and curve_ax.get_xlabel() and fig._suptitle.get_text() == "t"


@pytest.mark.slow
def test_the_analysis_writes_fig5_of_its_figure_classes(tmp_path, monkeypatch):
  config = load_config(os.path.join(ROOT, "configs/mutual_synthetic.py"), "smoke")
  config.data.classes = (2, 5)
  config.data.images_per_class = 2
  config.figure_classes = 2
  drawn = []
  plot = report.plot_classes
  monkeypatch.setattr(
    report,
    "plot_classes",
    lambda path, classes, method, **kw: (
      drawn.append((os.path.basename(path), classes, method)),
      plot(path, classes, method, **kw),
    ),
  )
  results = analysis.run(config, str(tmp_path), progress=False)
  assert [(name, method) for name, _, method in drawn] == [
    ("fig5_pca.png", "pca"),
    ("fig5_kmeans.png", "kmeans"),
  ]
  for name, classes, method in drawn:
    assert (tmp_path / "figures" / name).stat().st_size > 5000
    assert [c["name"] for c in classes] == list(results["classes"])
    for c in classes:
      assert c["curve"] == results["classes"][c["name"]][method]["curve"]
      assert len(c["images"]) == len(c["records"]) == len(c["refined"]) == 2
      assert all(r["class_name"] == c["name"] for r in c["records"])


def _entropy(lists) -> float:
  """App. A.2's entropy of the picks of an image's concepts (transport.choice_entropy)."""
  picks = [d for ds in lists for d in ds]
  if not picks:
    return 0.0
  _, counts = np.unique(picks, return_counts=True)
  p = counts / len(picks)
  return float(-(p * np.log(p)).sum())


def test_ot_figure_shows_each_concepts_descriptors_without_and_with_ot(tmp_path, monkeypatch):
  closed = _closed_figures(monkeypatch)
  record = _record([(0, 4, ["red color", "painted red"]), (1, 4, ["circle shape"])], GRID)
  m = record["methods"]["pca"]
  m["concepts"][0]["descriptors_without_ot"] = ["red color", "circle shape"]
  m["concepts"][1]["descriptors_without_ot"] = ["red color", "circle shape"]
  m.update(entropy=_entropy([["red color", "painted red"], ["circle shape"]]))
  m.update(entropy_without_ot=_entropy([["red color", "circle shape"]] * 2))
  record.update(class_name="red circle", predicted_name="red circle")
  image = np.zeros((8, 8, 3), np.float32)
  report.plot_ot_diversity(str(tmp_path / "ot.png"), image, record, "pca", model="tiny")
  assert (tmp_path / "ot.png").stat().st_size > 5000
  fig = closed[-1]
  image_axes = [ax for ax in fig.axes if ax.images]
  assert [ax.get_title() for ax in image_axes] == [
    f"w/o optimal transport\nentropy {math.log(2):.2f} nats",
    f"w/ optimal transport\nentropy {math.log(3):.2f} nats",
  ]
  texts = [[t.get_text() for t in ax.texts] for ax in fig.axes if not ax.images]
  # Without OT both concepts pick the same two descriptors (starred); with OT none is shared.
  assert texts[0] == ["0", "red color*, circle shape*", "1", "red color*, circle shape*"]
  assert texts[1] == ["0", "red color, painted red", "1", "circle shape"]


@pytest.mark.slow
def test_fig5_of_named_classes_and_the_ot_figures_of_the_analysis(tmp_path, run_command):
  """configs/mutual_synthetic.py:fig5 through mutual.analyze: the three classes named in
  config.data.classes are analysed in that order and overlaid in fig5_<method>.png; each figure
  class has its App. A.2 Fig. 2 (ot_<method>_<label>.png), whose descriptor lists, as the
  records keep them, give the record's entropy without and with OT."""
  done = run_command(
    "mutual.analyze",
    "--config",
    os.path.join(ROOT, "configs/mutual_synthetic.py:fig5"),
    "--config.data.images_per_class=2",
    f"--workdir={tmp_path}",
  )
  assert done.returncode == 0, done.stderr[-3000:]
  config = load_config(os.path.join(ROOT, "configs/mutual_synthetic.py"), "fig5")
  results = json.loads((tmp_path / "results.json").read_text())
  assert sorted(results["classes"]) == sorted(config.data.classes)  # results.json sorts keys
  labels = sorted(int(p.stem) for p in (tmp_path / "classes").glob("????.json"))
  assert labels == [0, 4 + 1, 8]  # red striped circle, blue dotted circle, orange striped star
  figures = tmp_path / "figures"
  for method in ("pca", "kmeans"):
    assert (figures / f"fig5_{method}.png").stat().st_size > 5000
    for label in labels:
      assert (figures / f"ot_{method}_{label:04d}.png").stat().st_size > 5000
  records = [json.loads(p.read_text()) for p in sorted((tmp_path / "per_image").rglob("*.json"))]
  assert len(records) == 6
  for record in records:
    for method, m in record["methods"].items():
      with_ot = [c["descriptors"] for c in m["concepts"]]
      without = [c["descriptors_without_ot"] for c in m["concepts"]]
      assert m["entropy"] == pytest.approx(_entropy(with_ot), abs=1e-5), method
      assert m["entropy_without_ot"] == pytest.approx(_entropy(without), abs=1e-5), method
