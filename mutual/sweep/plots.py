"""Figure 3 of the mutual-knowledge paper from the sweep's rows: zero-shot Top-1 against the AUC
of the MI curve per concept method, with the least-squares lines of `fits.auc_accuracy_fits`
(right), and the models' MI curves (left).

Every model keeps one (colour, marker) pair in both figures (`model_styles`: 13 distinct pairs
for the study's 13, hues grouped by family), named in one legend grouped by family; points carry
no text labels, which overlapped where AUCs are close.
"""

from __future__ import annotations

import itertools
from typing import Any, Mapping, Sequence

import numpy as np

from mutual import pipeline
from mutual.sweep.fits import accuracy_of
from mutual.sweep.models import FAMILIES
from mutual.sweep.table import RANDOM_WEIGHTS, fit_equation, table_order
from stori_jax.models import registry
from stori_jax.plotting import pyplot

#: Per family, (colour, marker) pairs: blues / purples for ViTs, reds / browns for ResNets,
#: greens for ConvNeXts, so a family reads as one group; colours and markers each distinct
#: across all 13 (the study has 7 ViTs, 4 ResNets, 2 ConvNeXts).
FAMILY_STYLES = {
  "ViT": (
    ("#1f77b4", "o"),
    ("#17becf", "s"),
    ("#000080", "^"),
    ("#9467bd", "v"),
    ("#e377c2", "D"),
    ("#7f7f7f", "p"),
    ("#bcbd22", "h"),
  ),
  "ResNet": (("#d62728", "P"), ("#ff7f0e", "X"), ("#8c564b", "*"), ("#b8860b", "<")),
  "ConvNeXt": (("#2ca02c", ">"), ("#006400", "d")),
}
#: Styles for models beyond a family's list (a sweep of other registered models).
EXTRA_STYLES = tuple(
  zip(
    ("#393b79", "#637939", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354", "#756bb1"),
    ("H", "8", "1", "2", "3", "4", "+", "x"),
  )
)
#: Dash style of each fitted line (all models: solid).
FIT_STYLES = {"all": "-", "ViT": "--", "ResNet": ":", "ConvNeXt": "-."}


def _study_rank(name: str) -> int:
  study = registry.mutual_knowledge_models()
  return study.index(name) if name in study else len(study)


def model_styles(rows: Sequence[Mapping[str, Any]]) -> dict[str, tuple[str, str]]:
  """{model name: (colour, marker)}, distinct colours and distinct markers; within a family
  the styles follow the study's order, so the full sweep always draws a model alike."""
  styles: dict[str, tuple[str, str]] = {}
  extra = itertools.cycle(EXTRA_STYLES)  # repeats only past 21 models
  for fam in FAMILIES.values():
    members = sorted(
      (r for r in rows if r["family"] == fam), key=lambda r: (_study_rank(r["name"]), r["name"])
    )
    own = FAMILY_STYLES[fam]
    for k, r in enumerate(members):
      styles[r["name"]] = own[k] if k < len(own) else next(extra)
  return styles


def _title(text: str, random_weights: bool) -> str:
  note = f"\n({RANDOM_WEIGHTS}: an offline check, the numbers carry no meaning)"
  return text + note if random_weights else text


def _grouped_legend(fig, rows, styles, line: bool, anchor=(1.0, 0.5)) -> None:
  """One legend beside the axes: a header per family, then its models (table order)."""
  from matplotlib.lines import Line2D  # lazy: matplotlib loads when a figure is drawn

  handles, labels = [], []
  ordered = table_order(rows)
  for fam in FAMILIES.values():
    members = [r for r in ordered if r["family"] == fam]
    if not members:
      continue
    handles.append(Line2D([], [], ls="none"))  # a header row with no symbol
    labels.append(f"{fam}:")
    for r in members:
      colour, marker = styles[r["name"]]
      handles.append(Line2D([], [], color=colour, marker=marker, ls="-" if line else "none", ms=6))
      labels.append(r["label"])
  legend = fig.legend(
    handles, labels, loc="center left", bbox_to_anchor=anchor, fontsize=7, frameon=False
  )
  for text in legend.get_texts():
    if text.get_text().endswith(":"):
      text.set_fontweight("bold")


def plot_auc_vs_accuracy(
  path: str,
  rows: Sequence[Mapping[str, Any]],
  fits: Mapping[str, Mapping[str, Any]],
  methods: Sequence[str],
  accuracy: str = "measured",
  title: str = "",
  random_weights: bool = False,
) -> None:
  """Figure 3 (right): one panel per method, Top-1 against AUC, one (colour, marker) per model
  (legend grouped by family), the least-squares line over all models (solid) and per family
  (dashed / dotted), each with its equation and Pearson r in the panel's legend below it."""
  plt = pyplot()
  styles = model_styles(rows)
  names = pipeline.METHOD_TITLES
  fig, axes = plt.subplots(1, len(methods), figsize=(4.8 * len(methods) + 1.6, 5.2), squeeze=False)
  for ax, method in zip(axes[0], methods):
    for r in rows:
      y = accuracy_of(r, accuracy)
      if y is None:
        continue
      colour, marker = styles[r["name"]]
      ax.scatter(
        r[method]["auc"],
        y,
        color=colour,
        marker=marker,
        s=46,
        zorder=3,
        edgecolors="black",
        linewidths=0.4,
      )
    aucs = {r["name"]: r[method]["auc"] for r in rows}
    for group, fit in fits[method].items():
      if fit["slope"] is None:
        continue
      xs = [aucs[name] for name in fit["models"]]  # the line spans its own models
      line = np.linspace(min(xs), max(xs), 2)
      ax.plot(
        line,
        fit["slope"] * line + fit["intercept"],
        color="black" if group == "all" else "0.35",
        ls=FIT_STYLES.get(group, "--"),
        lw=1.2,
        label=f"{group}: Top-1 = {fit_equation(fit)}, r = {fit['pearson_r']:.2f} (n = {fit['n']})",
      )
    ax.set_xlabel(f"AUC of the MI curve ({names.get(method, method)} concepts)")
    ax.set_ylabel("zero-shot Top-1 (%)" + ("" if accuracy == "measured" else f", {accuracy}"))
    ax.set_title(f"{names.get(method, method)} concepts", fontsize=9)
    if ax.get_legend_handles_labels()[0]:  # the fits, below the panel: they cover no point
      ax.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.13), frameon=False)
  fig.suptitle(_title(f"{title}: zero-shot Top-1 against AUC".lstrip(": "), random_weights))
  right = 1 - 1.5 / fig.get_figwidth()
  _grouped_legend(fig, rows, styles, line=False, anchor=(right, 0.5))
  fig.tight_layout(rect=(0, 0, right, 1))
  fig.savefig(path, dpi=120)
  plt.close(fig)


def plot_curves(
  path: str,
  rows: Sequence[Mapping[str, Any]],
  method: str,
  title: str = "",
  random_weights: bool = False,
) -> None:
  """Figure 3 (left): each model's MI curve (mean over images, zero-padded) for one concept
  method, in its (colour, marker), the legend grouped by family with each model's AUC."""
  plt = pyplot()
  styles = model_styles(rows)
  name = pipeline.METHOD_TITLES.get(method, method)
  fig, ax = plt.subplots(figsize=(7.4, 4.2))
  for r in table_order(rows):
    curve = np.asarray(r[method]["curve"])
    colour, marker = styles[r["name"]]
    ax.plot(
      np.arange(len(curve)),
      curve,
      color=colour,
      marker=marker,
      ms=5,
      lw=1.2,
      markevery=max(1, len(curve) // 8),  # a few markers per line: they tell lines apart
    )
  ax.set_xlabel("visual descriptors removed")
  ax.set_ylabel("MI (nats)")
  ax.set_title(
    _title(f"{title}: MI curves, {name} concepts".lstrip(": "), random_weights), fontsize=9
  )
  labelled = [dict(r, label=f"{r['label']} (AUC {r[method]['auc']:.2f})") for r in rows]
  right = 1 - 2.0 / fig.get_figwidth()
  _grouped_legend(fig, labelled, styles, line=True, anchor=(right, 0.5))
  fig.tight_layout(rect=(0, 0, right, 1))
  fig.savefig(path, dpi=120)
  plt.close(fig)
