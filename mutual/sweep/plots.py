"""Figure 3 of the mutual-knowledge paper from the sweep's rows: `plot_figure3` draws its three
panels for one concept method: the MI curves of the models that share their pretraining data
(left: size and patch vary) and of the models of one size (middle: the data vary), the groups of
`figure3_groups` taken from the registry (`ModelEntry.size`, `.data_name`), and zero-shot Top-1
against the AUC of the MI curve with the least-squares lines of `fits.auc_accuracy_fits` (right).
`plot_auc_vs_accuracy` draws the right panel for every method side by side, `plot_curves` every
model's MI curve in one panel.

Every model keeps one (colour, marker) pair in both figures (`model_styles`: 13 distinct pairs
for the study's 13, hues grouped by family), named in one legend grouped by family; points carry
no text labels, which overlapped where AUCs are close.
"""

from __future__ import annotations

import itertools
from typing import Any, Mapping, Sequence

import numpy as np

from mutual import concept_methods
from mutual.sweep.fits import accuracy_of
from mutual.sweep.models import families
from mutual.sweep.table import RANDOM_WEIGHTS, fit_equation, table_order
from stori_jax.models import registry
from stori_jax.plumbing.plotting import pyplot, save_figure

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
  for fam in families():
    members = sorted(
      (r for r in rows if r["family"] == fam), key=lambda r: (_study_rank(r["name"]), r["name"])
    )
    own = FAMILY_STYLES.get(fam, ())
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
  for fam in families():
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


def _auc_panel(ax, rows, method_fits, method: str, accuracy: str, styles) -> None:
  """One method's Top-1 against AUC: a point per model in its style, the fitted lines (all
  models solid, per family dashed / dotted) with equation and Pearson r in a legend below."""
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
  for group, fit in method_fits.items():
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
  ax.set_xlabel(f"AUC of the MI curve ({concept_methods.title(method)} concepts)")
  ax.set_ylabel("zero-shot Top-1 (%)" + ("" if accuracy == "measured" else f", {accuracy}"))
  ax.set_title(f"{concept_methods.title(method)} concepts", fontsize=9)
  if ax.get_legend_handles_labels()[0]:  # the fits, below the panel: they cover no point
    ax.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.13), frameon=False)


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
  fig, axes = plt.subplots(1, len(methods), figsize=(4.8 * len(methods) + 1.6, 5.2), squeeze=False)
  for ax, method in zip(axes[0], methods):
    _auc_panel(ax, rows, fits[method], method, accuracy, styles)
  fig.suptitle(_title(f"{title}: zero-shot Top-1 against AUC".lstrip(": "), random_weights))
  right = 1 - 1.5 / fig.get_figwidth()
  _grouped_legend(fig, rows, styles, line=False, anchor=(right, 0.5))
  fig.tight_layout(rect=(0, 0, right, 1))
  save_figure(fig, path, dpi=120)
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
  name = concept_methods.title(method)
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
  save_figure(fig, path, dpi=120)
  plt.close(fig)


# ---------------------------------------------------------------------------------------------
# Figure 3 as the paper lays it out: fixed data (left), fixed size (middle), the fits (right).


def _grouping(row: Mapping[str, Any]) -> tuple[str, str, str]:
  """(model size, pretraining data, architecture) of a row: the registry's (`ModelEntry.size`,
  `.data_name`, `.arch`), else the row's own `size` / `data` / `arch` keys."""
  entry = registry.find(row["name"])
  if entry is not None:
    return entry.size, entry.data_name, entry.arch
  return (
    str(row.get("size", row["name"])),
    str(row.get("data", "")).split(" (")[0],
    str(row.get("arch", row["name"])),
  )


def figure3_groups(rows: Sequence[Mapping[str, Any]]) -> dict[str, tuple[str, list]]:
  """The two families of models that Figure 3 compares (section 4, "we divide the models into
  two families"), each within one tower family (ViTs first):

  "data": the pretraining data fixed, model size / patch / resolution varying: the largest set
    of models of one tower family with the same pretraining data and at least two
    architectures (the study's: ViT-B/32, ViT-B/16, ViT-L/14, ViT-L/14@336 on WIT-400M);
  "size": the model size fixed, the pretraining data varying: the set of one size with the most
    distinct pretraining data, then the most models (the study's: its five ViT-B models on
    WIT-400M, DataComp-1B and DFN-2B; the paper does not list the middle panel's models).

  Returns:
    {"data": (data name, rows), "size": (size, rows)}, rows in table order; a key is absent
    when no such set of two or more models exists.
  """
  ordered = table_order(rows)
  found: dict[str, tuple[str, list]] = {}
  best: dict[str, tuple] = {}
  for rank, fam in enumerate(families()):
    members = [r for r in ordered if r["family"] == fam]
    keys = {r["name"]: _grouping(r) for r in members}
    by_data: dict[str, list] = {}
    by_size: dict[str, list] = {}
    for r in members:
      size, data, _ = keys[r["name"]]
      by_data.setdefault(data, []).append(r)
      by_size.setdefault(size, []).append(r)
    for data, group in by_data.items():
      archs = {keys[r["name"]][2] for r in group}
      score = (len(group), -rank)
      if len(group) >= 2 and len(archs) >= 2 and score > best.get("data", (0, 0)):
        best["data"], found["data"] = score, (data, group)
    for size, group in by_size.items():
      datasets = {keys[r["name"]][1] for r in group}
      score = (len(datasets), len(group), -rank)
      if len(datasets) >= 2 and score > best.get("size", (0, 0, 0)):
        best["size"], found["size"] = score, (size, group)
  return found


def _group_panel(ax, group, method: str, styles, label_of, title: str, empty: str) -> None:
  """One group's MI curves in the models' styles, each labelled with its AUC."""
  if group is None:
    ax.text(0.5, 0.5, empty, ha="center", va="center", fontsize=8, wrap=True)
    ax.set_title(title, fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])
    return
  for r in group:
    curve = np.asarray(r[method]["curve"])
    colour, marker = styles[r["name"]]
    ax.plot(
      np.arange(len(curve)),
      curve,
      color=colour,
      marker=marker,
      ms=5,
      lw=1.4,
      markevery=max(1, len(curve) // 8),
      label=f"{label_of(r)} (AUC {r[method]['auc']:.2f})",
    )
  ax.set_xlabel("visual descriptors removed")
  ax.set_ylabel("MI (nats)")
  ax.set_title(title, fontsize=9)
  ax.legend(fontsize=7, loc="upper right")


def plot_figure3(
  path: str,
  rows: Sequence[Mapping[str, Any]],
  fits: Mapping[str, Mapping[str, Any]],
  method: str,
  accuracy: str = "measured",
  title: str = "",
  random_weights: bool = False,
) -> None:
  """Figure 3 for one concept method, in the paper's three panels: the MI curves of the models
  that share their pretraining data (left: size and patch vary) and of the models of one size
  (middle: the pretraining data vary), the groups of `figure3_groups`, each curve labelled with
  its AUC; right: Top-1 against AUC with the least-squares lines (as `plot_auc_vs_accuracy`).
  The models keep their (colour, marker) of every sweep figure; the legend beside the figure
  names all of them by family."""
  plt = pyplot()
  styles = model_styles(rows)
  groups = figure3_groups(rows)
  name = concept_methods.title(method)
  fig, axes = plt.subplots(1, 3, figsize=(16.5, 5.2))
  data_name, data_rows = groups.get("data", ("", None))
  size, size_rows = groups.get("size", ("", None))
  _group_panel(
    axes[0],
    data_rows,
    method,
    styles,
    lambda r: r["label"],
    f"pretraining data fixed ({data_name}):\nmodel size and patch vary" if data_rows else "",
    "no two architectures of one family share their pretraining data in this sweep",
  )
  _group_panel(
    axes[1],
    size_rows,
    method,
    styles,
    lambda r: f"{r['label']}, {_grouping(r)[1]}",
    f"model size fixed ({size}):\npretraining data vary" if size_rows else "",
    "no model size of this sweep comes with two pretraining datasets",
  )
  _auc_panel(axes[2], rows, fits[method], method, accuracy, styles)
  axes[2].set_title("zero-shot Top-1 against AUC", fontsize=9)
  fig.suptitle(
    _title(f"{title}: Figure 3, MI dynamics ({name} concepts)".lstrip(": "), random_weights)
  )
  right = 1 - 1.5 / fig.get_figwidth()
  _grouped_legend(fig, rows, styles, line=False, anchor=(right, 0.5))
  fig.tight_layout(rect=(0, 0, right, 1))
  save_figure(fig, path, dpi=120)
  plt.close(fig)
