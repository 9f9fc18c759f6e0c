"""PNG figures like the paper's Figures 4, 5, 6 and 9 (matplotlib, Agg backend)."""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from stori_jax.plotting import pyplot
from stori_jax.retrieval.metrics import category_curves, ranking

plt = pyplot()


def _colours(n: int):
  return plt.get_cmap("tab10" if n <= 10 else "tab20")(np.arange(n) % 20)


def ranking_figure(
  path: str,
  panels: Sequence[tuple[str, np.ndarray]],
  categories: np.ndarray,
  names: Sequence[str],
  bins: int = 20,
) -> None:
  """Figure 4: per panel (title, scores [N]), the density of each category over the
  retrieval order (top) and its share of the top n images (bottom)."""
  n_cat = len(names)
  colours = _colours(n_cat)
  fig, axes = plt.subplots(2, len(panels), figsize=(5 * len(panels), 7), squeeze=False)
  for col, (title, scores) in enumerate(panels):
    order = ranking(scores)
    rank_of = np.empty_like(order)
    rank_of[order] = np.arange(len(order))
    curves = category_curves(scores, categories, n_cat)
    edges = np.linspace(0, len(order), bins + 1)
    for c in range(n_cat):
      ranks = rank_of[categories == c]
      if len(ranks):
        counts, _ = np.histogram(ranks, edges)
        axes[0, col].plot(0.5 * (edges[1:] + edges[:-1]), counts, color=colours[c], label=names[c])
      axes[1, col].plot(np.arange(1, len(order) + 1), curves[c], color=colours[c])
    axes[0, col].set_title(title, fontsize=9)
    axes[0, col].set_xlabel("retrieval order")
    axes[0, col].set_ylabel("images per bin")
    axes[1, col].set_xlabel("n (top-n retrieved)")
    axes[1, col].set_ylabel("share of the top n")
  axes[0, -1].legend(fontsize=7, loc="upper right")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def sweep_figure(
  path: str,
  panels: Sequence[tuple[str, Mapping[str, Any]]],
  ncols: int = 2,
  suptitle: str = "",
  relative: bool | Sequence[bool] = False,
) -> None:
  """Figures 5, 6, 9: per panel (title, auc_sweep result), the mean AUC of every category
  against the swept weight; the favoured category is drawn thick. relative (per panel or
  for all): plot the change from the first swept weight instead, which shows small effects
  that the spread between categories would flatten."""
  if isinstance(relative, bool):
    relative = [relative] * len(panels)
  rows = math.ceil(len(panels) / ncols)
  cols = min(ncols, len(panels))
  fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols + 2.6, 3.4 * rows), squeeze=False)
  for ax in axes.ravel()[len(panels) :]:
    ax.axis("off")
  for ax, (title, sweep), rel in zip(axes.ravel(), panels, relative):
    auc = np.asarray(sweep["mean_auc"])
    if rel:
      auc = auc - auc[:1]
    colours = _colours(auc.shape[1])
    for c, name in enumerate(sweep["category_names"]):
      focus = c == sweep["focus"]
      ax.plot(
        sweep["ws"],
        auc[:, c],
        color=colours[c],
        lw=2.6 if focus else 1.1,
        marker="o" if focus else None,
        ms=3,
        label=name + (" (favoured)" if focus else ""),
      )
    a, b = sweep["attributes"]
    ax.set_xlabel(f"w on attribute {a}" + (f", 1 - w on {b}" if sweep["complement"] else ""))
    what = f"AUC ({sweep['normalize']})"
    ax.set_ylabel(f"{what} - value at w = {sweep['ws'][0]:g}" if rel else what, fontsize=8)
    ax.set_title(title, fontsize=9)
  handles, labels = axes.ravel()[0].get_legend_handles_labels()
  fig.legend(handles, labels, fontsize=7, loc="center right")
  if suptitle:
    fig.suptitle(suptitle, fontsize=10)
  fig.tight_layout(rect=(0, 0, 1 - 2.5 / fig.get_figwidth(), 0.95 if suptitle else 1))
  fig.savefig(path, dpi=110)
  plt.close(fig)
