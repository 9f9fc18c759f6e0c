"""PNG figures like the paper's Figures 4, 5, 6 and 9 (matplotlib, Agg backend).

Each figure explains its own notation in a caption: `(words:w)` in a prompt (SToRI's weight w
on those words), a primed attribute name in a category (`colour'`: the attribute is absent;
categories averaged over several prompts are named by attributes, not values), the swept weights
(w on one attribute, 1 - w on another, named when the category names allow), and the thick
line with dots (the category the paper follows: the emphasised attribute present, the other swept
one absent, e.g. "female, blonde hair, no eyeglasses" in Figures 5 and 6, named in the panel). Legends sit
beside the panels, never over a curve.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from stori_jax.plumbing import paths
from stori_jax.plumbing.plotting import pyplot
from stori_jax.retrieval.metrics import category_curves, ranking
from stori_jax.retrieval.tables import weight_label

plt = pyplot()


def _colours(n: int):
  return plt.get_cmap("tab10" if n <= 10 else "tab20")(np.arange(n) % 20)


#: The notation a reader meets in the figures, one line each, for the captions.
PROMPT_NOTE = "(words:w) in a prompt: SToRI's weight w on those words (no weight: w = 1)."
PRIME_NOTE = (
  "Categories: which attributes an image has; a prime marks one it lacks "
  "(colour' pattern shape: another colour, the prompt's pattern and shape)."
)


def _caption(fig, lines: Sequence[str], height: float) -> None:
  """Notes under the panels (figure coordinates; `height` is their share of the figure)."""
  fig.text(0.01, height - 0.01, "\n".join(lines), fontsize=7.5, va="top", ha="left", wrap=True)


def ranking_figure(
  path: str,
  panels: Sequence[tuple[str, np.ndarray]],
  categories: np.ndarray,
  names: Sequence[str],
  bins: int = 20,
) -> None:
  """Figure 4: per panel (title, scores [N]), the density of each category over the
  retrieval order (top) and its share of the top n images (bottom); one legend of the
  categories to the right of the panels."""
  n_cat = len(names)
  colours = _colours(n_cat)
  legend_w = 2.6  # inches
  fig, axes = plt.subplots(2, len(panels), figsize=(5 * len(panels) + legend_w, 7.6), squeeze=False)
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
    axes[0, col].set_title(f"prompt: {title}", fontsize=9)
    axes[0, col].set_xlabel("retrieval order (rank)")
    axes[0, col].set_ylabel("images per bin")
    axes[1, col].set_xlabel("n (top-n retrieved)")
    axes[1, col].set_ylabel("share of the top n")
  right = 1 - legend_w / fig.get_figwidth()
  handles, labels = axes[0, 0].get_legend_handles_labels()
  fig.legend(
    handles,
    labels,
    fontsize=7,
    loc="center left",
    bbox_to_anchor=(right, 0.55),
    title="category",
    title_fontsize=8,
    frameon=False,
  )
  note = 0.06
  _caption(fig, [PROMPT_NOTE], note)
  fig.tight_layout(rect=(0, note, right, 1))
  paths.save_figure(fig, path, dpi=110)
  plt.close(fig)


def sweep_figure(
  path: str,
  panels: Sequence[tuple[str, Mapping[str, Any]]],
  ncols: int = 2,
  suptitle: str = "",
  relative: bool | Sequence[bool] = False,
) -> None:
  """Figures 5, 6, 9: per panel (title, auc_sweep result), the mean AUC of every category
  against the swept weight; the category the paper follows (`protocol.focus_category`: a
  present, b absent, the same in the w / 1 - w sweeps and in Figure 6b's w-only sweep) is drawn
  thick with dots and named in the panel.
  relative (per panel or for all): plot the change from the first swept weight instead, which
  shows small effects that the spread between categories would flatten."""
  from matplotlib.lines import Line2D  # lazy: matplotlib loads when a figure is drawn

  if isinstance(relative, bool):
    relative = [relative] * len(panels)
  rows = math.ceil(len(panels) / ncols)
  cols = min(ncols, len(panels))
  legend_w = 2.8  # inches
  note_h = 0.65  # inches
  fig, axes = plt.subplots(
    rows, cols, figsize=(4.6 * cols + legend_w, 3.7 * rows + note_h), squeeze=False
  )
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
        label=name,
        zorder=3 if focus else 2,
      )
    ax.set_xlabel(weight_label(sweep), fontsize=8)
    what = f"mean AUC ({sweep['normalize']})"
    ax.set_ylabel(f"{what}\nminus its value at w = {sweep['ws'][0]:g}" if rel else what, fontsize=8)
    favoured = sweep["category_names"][sweep["focus"]]
    ax.set_title(f"{title}\nfavoured: {favoured}", fontsize=8.5)
  handles, labels = axes.ravel()[0].get_legend_handles_labels()
  handles = [Line2D([], [], color=h.get_color(), lw=1.1) for h in handles]
  handles.append(Line2D([], [], color="0.3", lw=2.6, marker="o", ms=3))
  labels.append("thick, dots: the favoured\ncategory (named per panel)")
  right = 1 - legend_w / fig.get_figwidth()
  fig.legend(
    handles,
    labels,
    fontsize=7,
    loc="center left",
    bbox_to_anchor=(right, 0.5),
    title="category",
    title_fontsize=8,
    frameon=False,
  )
  if suptitle:
    fig.suptitle(suptitle, fontsize=10)
  note = note_h / fig.get_figheight()
  norm = panels[0][1]["normalize"]
  _caption(
    fig,
    [
      PRIME_NOTE,
      f"AUC ({norm}): the mean over n = 1..N of the category's "
      + ("share of the top n" if norm == "share" else "recall in the top n")
      + " (App. B; higher: retrieved earlier). Attributes are counted from 0 in the prompt's "
      "order.",
    ],
    note,
  )
  fig.tight_layout(rect=(0, note, right, 0.95 if suptitle else 1))
  paths.save_figure(fig, path, dpi=110)
  plt.close(fig)
