"""Figure 3 (right) of the mutual-knowledge paper: zero-shot Top-1 against the AUC of the MI curve,
per concept method, with the least-squares lines of `fits.auc_accuracy_fits`."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from mutual import pipeline
from mutual.sweep.fits import accuracy_of
from stori_jax.plotting import pyplot


def plot_auc_vs_accuracy(
  path: str,
  rows: Sequence[Mapping[str, Any]],
  fits: Mapping[str, Mapping[str, Any]],
  methods: Sequence[str],
  accuracy: str = "measured",
  title: str = "",
) -> None:
  """Figure 3 (right): one panel per method, Top-1 against AUC, models coloured by family, the
  least-squares line over all models (solid) and per family (dashed), Pearson r in the legend."""
  plt = pyplot()
  colours = {"ViT": "tab:blue", "ResNet": "tab:green", "ConvNeXt": "tab:orange"}
  names = pipeline.METHOD_TITLES
  fig, axes = plt.subplots(1, len(methods), figsize=(5.2 * len(methods), 4.2), squeeze=False)
  for ax, method in zip(axes[0], methods):
    for fam, colour in colours.items():
      members = [r for r in rows if r["family"] == fam and accuracy_of(r, accuracy) is not None]
      if not members:
        continue
      x = [r[method]["auc"] for r in members]
      y = [accuracy_of(r, accuracy) for r in members]
      ax.scatter(x, y, color=colour, s=22, zorder=3)
      for r, xi, yi in zip(members, x, y):
        ax.annotate(r["label"], (xi, yi), fontsize=6, xytext=(3, 2), textcoords="offset points")
    aucs = {r["name"]: r[method]["auc"] for r in rows}
    for group, fit in fits[method].items():
      if fit["slope"] is None:
        continue
      colour = "black" if group == "all" else colours[group]
      xs = [aucs[name] for name in fit["models"]]  # the line spans its own models
      line = np.linspace(min(xs), max(xs), 2)
      ax.plot(
        line,
        fit["slope"] * line + fit["intercept"],
        color=colour,
        ls="-" if group == "all" else "--",
        lw=1.2,
        label=f"{group}: {fit['slope']:.2f} AUC + {fit['intercept']:.2f}, "
        f"r = {fit['pearson_r']:.2f} (n = {fit['n']})",
      )
    ax.set_xlabel(f"AUC ({names.get(method, method)})")
    ax.set_ylabel("zero-shot Top-1 (%)" + ("" if accuracy == "measured" else f", {accuracy}"))
    ax.set_title(f"{title} {names.get(method, method)}".strip(), fontsize=9)
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=6, loc="best")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
