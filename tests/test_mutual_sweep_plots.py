"""mutual.sweep.plots: Figure 3 in the paper's three panels, its two groups of models taken from
the registry (pretraining data fixed; model size fixed), read back from the matplotlib axes."""

import numpy as np
import pytest

from mutual import sweep
from mutual.sweep import plots
from stori_jax.models import registry

METHODS = ("pca", "kmeans")


def _rows(names=None, seed=0):
  """Sweep rows of registered models with random MI curves; Top-1 the paper's."""
  rng = np.random.default_rng(seed)
  rows = []
  for name in names or registry.mutual_knowledge_models():
    entry = registry.get(name)
    row = dict(
      name=name,
      label=entry.label,
      family=sweep.family(entry.config),
      data=entry.data,
      top1=float(entry.imagenet_paper),
      reported_top1=dict(paper=entry.imagenet_paper, open_clip=entry.imagenet_open_clip),
    )
    for method in METHODS:
      curve = np.append(np.sort(rng.random(9) * 8)[::-1], 0.0)
      row[method] = dict(mi=float(curve[0]), auc=float(curve.mean()), curve=curve.tolist())
    rows.append(row)
  return rows


def _closed_figures(monkeypatch):
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  closed, close = [], plt.close
  monkeypatch.setattr(plt, "close", lambda fig=None: (closed.append(fig), close(fig)))
  return closed


def test_registry_names_each_models_size_and_pretraining_data():
  sizes = {e.label: (e.size, e.data_name) for e in map(registry.get, registry.names())}
  assert sizes["ViT-B/32"] == sizes["ViT-B/16"] == ("ViT-B", "WIT-400M")
  assert sizes["ViT-L/14@336"] == ("ViT-L", "WIT-400M")
  assert sizes["ViT-B/16-dcp"] == ("ViT-B", "DataComp-1B")
  assert sizes["ViT-B/16-dfn"] == ("ViT-B", "DFN-2B")
  assert sizes["RN50x4"] == ("RN50x4", "WIT-400M")
  assert sizes["CNeXt-B2"] == ("convnext_base_w", "LAION-Aesthetic")


def test_the_study_splits_into_the_papers_two_groups():
  groups = plots.figure3_groups(_rows())
  data, fixed_data = groups["data"]
  # Section 4: "ViT-B/16, ViT-B/32, ViT-L/14 and ViT-L/14 (up) trained on WIT 400M".
  assert data == "WIT-400M"
  assert [r["label"] for r in fixed_data] == ["ViT-B/32", "ViT-B/16", "ViT-L/14", "ViT-L/14@336"]
  size, fixed_size = groups["size"]
  assert size == "ViT-B"
  assert [r["label"] for r in fixed_size] == [
    "ViT-B/32",
    "ViT-B/16",
    "ViT-B/32-dcp",
    "ViT-B/16-dcp",
    "ViT-B/16-dfn",
  ]
  # No ResNet or ConvNeXt is mixed into a ViT group.
  assert {r["family"] for r in fixed_data + fixed_size} == {"ViT"}


def test_figure3_draws_each_group_with_its_aucs_and_the_fits(tmp_path, monkeypatch):
  rows = _rows()
  fits = sweep.auc_accuracy_fits(rows, METHODS)
  closed = _closed_figures(monkeypatch)
  plots.plot_figure3(str(tmp_path / "fig3.png"), rows, fits, "kmeans", title="study")
  assert (tmp_path / "fig3.png").stat().st_size > 10000
  (fig,) = closed
  left, middle, right = fig.axes
  by_label = {r["label"]: r for r in rows}
  for ax, members in (
    (left, ["ViT-B/32", "ViT-B/16", "ViT-L/14", "ViT-L/14@336"]),
    (middle, ["ViT-B/32", "ViT-B/16", "ViT-B/32-dcp", "ViT-B/16-dcp", "ViT-B/16-dfn"]),
  ):
    lines = ax.get_lines()
    assert len(lines) == len(members)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    for line, label, member in zip(lines, labels, members):
      r = by_label[member]
      assert label.startswith(member) and label.endswith(f"(AUC {r['kmeans']['auc']:.2f})")
      np.testing.assert_allclose(line.get_ydata(), r["kmeans"]["curve"])
    assert ax.get_xlabel() == "visual descriptors removed" and ax.get_ylabel() == "MI (nats)"
  assert "pretraining data fixed (WIT-400M)" in left.get_title()
  assert "model size fixed (ViT-B)" in middle.get_title()
  # The middle legend names each model's data.
  middle_labels = [t.get_text() for t in middle.get_legend().get_texts()]
  assert "ViT-B/16-dfn, DFN-2B" in middle_labels[-1]
  # Right: one point per model, the fitted lines (all, ViT, ResNet; 2 ConvNeXts fit no line).
  assert sum(len(c.get_offsets()) for c in right.collections) == 13
  fit_labels = [t.get_text() for t in right.get_legend().get_texts()]
  assert [t.split(":")[0] for t in fit_labels] == ["all", "ViT", "ResNet"]
  assert "K-means" in fig._suptitle.get_text() and "study" in fig._suptitle.get_text()
  (legend,) = fig.legends  # every model once, grouped by family
  assert len(legend.get_texts()) == 13 + 3


def test_figure3_says_when_a_sweep_has_no_such_group(tmp_path, monkeypatch):
  rows = _rows(["openai-vit-b-32", "laion400m-convnext-base"])
  assert plots.figure3_groups(rows) == {}
  fits = sweep.auc_accuracy_fits(rows, METHODS)
  closed = _closed_figures(monkeypatch)
  plots.plot_figure3(
    str(tmp_path / "fig3.png"), rows, fits, "pca", title="two", random_weights=True
  )
  (fig,) = closed
  for ax in fig.axes[:2]:
    assert not ax.get_lines()
    assert any("no " in t.get_text() for t in ax.texts)
  assert "random weights" in fig._suptitle.get_text()


@pytest.mark.parametrize("accuracy", ["measured", "paper"])
def test_the_right_panel_equals_the_side_by_side_figure(tmp_path, monkeypatch, accuracy):
  rows = _rows(seed=1)
  fits = sweep.auc_accuracy_fits(rows, ("pca",), accuracy)
  closed = _closed_figures(monkeypatch)
  plots.plot_figure3(str(tmp_path / "a.png"), rows, fits, "pca", accuracy)
  sweep.plot_auc_vs_accuracy(str(tmp_path / "b.png"), rows, fits, ("pca",), accuracy)
  right, alone = closed[0].axes[2], closed[1].axes[0]
  np.testing.assert_allclose(
    np.concatenate([c.get_offsets() for c in right.collections]),
    np.concatenate([c.get_offsets() for c in alone.collections]),
  )
  assert [line.get_ydata().tolist() for line in right.get_lines()] == [
    line.get_ydata().tolist() for line in alone.get_lines()
  ]
