"""The figure of a grid with a sweep (SToRI App. C.6, Fig. 10: few-shot accuracy against the
first reweighted block): per shot count a panel, per dataset (and method) a line through the mean
over seeds at each sweep value, the standard deviation shaded about it, as the paper draws it.
"""

from __future__ import annotations

import numbers
from typing import Any, Mapping

import numpy as np

from stori_jax.grid.tables import DISPLAY_NAMES, seeds_text
from stori_jax.plumbing import paths
from stori_jax.plumbing.plotting import pyplot


def file_name(data: Mapping[str, Any]) -> str:
  """The figure's file in the grid's workdir: accuracy_by_<leaf of the sweep key>.png."""
  return f"accuracy_by_{data['sweep']['key'].rpartition('.')[2]}.png"


def curves(data: Mapping[str, Any], shots: int) -> list[dict[str, Any]]:
  """The lines of one panel: per method family (config.methods' order) and dataset, the mean and
  std (NaN where a value's cells are not all finished) at each sweep value.

  Returns:
    [{"family", "label" (the method's), "dataset", "mean", "std"}], "mean" and "std" float64
    arrays of shape [len(sweep values)].
  """
  values = data["sweep"]["values"]
  families: dict[str, dict[Any, Mapping[str, Any]]] = {}
  for row in data["tables"][str(shots)]:
    families.setdefault(row["family"], {})[row["sweep_value"]] = row
  found = []
  for family, rows in families.items():
    label = next(iter(rows.values()))["label"]
    for dataset in data["datasets"]:
      entries = [rows.get(v, {}).get("cells", {}).get(dataset) for v in values]
      found.append(
        {
          "family": family,
          "label": label,
          "dataset": dataset,
          "mean": np.array([np.nan if e is None else e["mean"] for e in entries], np.float64),
          "std": np.array(
            [np.nan if e is None or e["std"] is None else e["std"] for e in entries], np.float64
          ),
        }
      )
  return found


def plot(data: Mapping[str, Any], path: str) -> None:
  """Writes the figure of a grid with a sweep (`tables.build`'s data) to `path` (PNG)."""
  plt = pyplot()
  sweep = data["sweep"]
  values = sweep["values"]
  numeric = all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in values)
  x = np.asarray(values, np.float64) if numeric else np.arange(len(values), dtype=np.float64)
  shots = data["shots"]
  fig, axes = plt.subplots(1, len(shots), figsize=(5.6 * len(shots), 4.4), squeeze=False)
  for ax, k in zip(axes[0], shots):
    lines = curves(data, k)
    several = len({line["family"] for line in lines}) > 1
    for line in lines:
      name = DISPLAY_NAMES.get(line["dataset"], line["dataset"])
      (drawn,) = ax.plot(
        x, line["mean"], "o-", label=f"{name}, {line['label']}" if several else name
      )
      # No shading where the std is undefined (one seed with ddof 1): the line alone.
      ax.fill_between(
        x,
        line["mean"] - line["std"],
        line["mean"] + line["std"],
        color=drawn.get_color(),
        alpha=0.2,
        linewidth=0,
      )
    ax.set(
      xlabel=sweep["label"],
      ylabel="accuracy (%)",
      title=f"{k} shot{'s' if k != 1 else ''}",
      xticks=x,
      xticklabels=[str(v) for v in values],
    )
    ax.grid(alpha=0.3)
    ax.legend(title="dataset", fontsize=8)
  fig.suptitle(
    f"Few-shot accuracy by {sweep['label']}\nmean (line) ± std (shading) over seeds "
    f"{seeds_text(data['seeds'])}"
  )
  fig.tight_layout()
  paths.save_figure(fig, path, dpi=110)
  plt.close(fig)
