"""The grid's tables in the paper's layout (SToRI Tables 2 and 8): one table per shot count,
rows = methods (with the prompts they use), columns = datasets and their average, each cell the
accuracy (%) as mean ± std over the seeds.

The average column is the mean of the row's dataset means (the paper's "AVG": 77.53 for
Table 2's 1-shot TaskRes / Base row is the mean of its six means). The standard deviation's
ddof is the grid's `std_ddof` (0 by default: numpy's `np.std`, which Dassl's
tools/parse_test_res.py, used by CoOp and TaskRes, summarises seeds with; the paper does not
say). The best mean of each
column is bold, as in the paper. A grid without the average (`average_column = False`, SToRI
Table 1) has dataset columns only. A grid with a sweep (`cells` and configs/fig10.py) has one row
per method and sweep value, which `grid.figure` draws against the value.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from stori_jax.grid.cells import Cell, Method, value_text

#: The paper's spelling of the datasets' names (columns); others as given.
DISPLAY_NAMES = {
  "imagenet": "ImageNet",
  "dtd": "DTD",
  "flowers102": "Flowers102",
  "sun397": "SUN397",
  "caltech101": "Caltech101",
  "food101": "Food101",
}
MISSING = "—"


def accuracy(metrics: Mapping[str, Any], which: str) -> float:
  """The accuracy (%) a row reports from a cell's metrics.json ("trained" or "zero_shot")."""
  return 100.0 * float(metrics[which]["accuracy"])


def build(
  methods: Sequence[Method],
  cells: Sequence[Cell],
  metrics: Mapping[str, Mapping[str, Any]],
  *,
  datasets: Sequence[str],
  shots: Sequence[int],
  seeds: Sequence[int],
  ddof: int = 0,
  sweep: Mapping[str, Any] | None = None,
  average_column: bool = True,
) -> dict[str, Any]:
  """The tables as JSON-able data.

  Args:
    methods: the rows (`cells.grid_methods`).
    cells: the grid's cells (`cells.expand`).
    metrics: cell.path -> that cell's metrics.json; a cell not in it (not run yet) leaves its
      entry of the table empty.
    datasets, shots, seeds: the grid's axes, in the tables' order.
    ddof: the standard deviation's delta degrees of freedom.
    sweep: the grid's sweep ({"key", "values", "label"}), None when it has none.
    average_column: whether the markdown tables show the average column.

  Returns:
    {"unit": "accuracy (%)", "ddof", "datasets", "shots", "seeds", "sweep" ({"key", "label",
    "values"} or None), "average_column", "tables": {shots (str): [{"method", "label" (the
    method's, for every row of a sweep), "text", "sweep_value" and "family" (the config.methods
    entry; both None without a sweep), "cells":
    {dataset: {"mean", "std" (None for one seed with ddof 1), "values" (per seed, in seeds'
    order)} or None}, "average" (None unless every dataset has a mean)}]}, "learning_rates":
    [{"dataset", "shots", "method", "key", "lr", "paper", "source"}]}.
  """
  by_key = {(c.dataset, c.shots, c.method, c.seed): c for c in cells}
  tables = {}
  for k in shots:
    rows = []
    for method in methods:
      entries: dict[str, Any] = {}
      for dataset in datasets:
        values = []
        for seed in seeds:
          cell = by_key.get((dataset, k, method.reads, seed))
          if cell is None or cell.path not in metrics:
            break
          values.append(accuracy(metrics[cell.path], method.accuracy))
        if len(values) < len(seeds) or not values:
          entries[dataset] = None
          continue
        array = np.asarray(values, np.float64)
        std = float(np.std(array, ddof=ddof)) if len(values) > ddof else None
        entries[dataset] = {"mean": float(np.mean(array)), "std": std, "values": values}
      means = [e["mean"] for e in entries.values() if e is not None]
      rows.append(
        {
          "method": method.name,
          "label": method.label,
          "text": method.text,
          "sweep_value": method.sweep_value if sweep else None,
          "family": (method.family or method.name) if sweep else None,
          "cells": entries,
          "average": float(np.mean(means)) if len(means) == len(datasets) else None,
        }
      )
    tables[str(k)] = rows
  seen = set()
  rates = []
  for c in cells:
    key = (c.dataset, c.shots, c.method)
    if key in seen:
      continue
    seen.add(key)
    rates.append(
      {
        "dataset": c.dataset,
        "shots": c.shots,
        "method": c.method,
        "key": c.lr_key,
        "lr": c.lr,
        "paper": c.paper_lr,
        "source": c.lr_source,
      }
    )
  return {
    "unit": "accuracy (%)",
    "ddof": ddof,
    "datasets": list(datasets),
    "shots": list(shots),
    "seeds": list(seeds),
    "sweep": (
      {"key": sweep["key"], "label": sweep["label"], "values": list(sweep["values"])}
      if sweep
      else None
    ),
    "average_column": bool(average_column),
    "tables": tables,
    "learning_rates": rates,
  }


def _entry(entry: Mapping[str, Any] | None, best: bool) -> str:
  if entry is None:
    return MISSING
  std = entry["std"]
  text = f"{entry['mean']:.2f}" if std is None else f"{entry['mean']:.2f} ± {std:.2f}"
  return f"**{text}**" if best else text


def _best(values: Sequence[float | None]) -> float | None:
  """The column's best mean as shown (2 decimals); None unless two rows or more have one."""
  shown = [round(v, 2) for v in values if v is not None]
  return max(shown) if len(shown) > 1 else None


def seeds_text(seeds: Sequence[int]) -> str:
  """ "1-3" for a run of three or more seeds, else the seeds listed."""
  seeds = list(seeds)
  if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[0] + len(seeds))):
    return f"{seeds[0]}-{seeds[-1]}"
  return ", ".join(map(str, seeds))


def row_label(data: Mapping[str, Any], row: Mapping[str, Any]) -> str:
  """A row's label as the tables show it: with a sweep, "SToRI (first reweighted block = 7)"."""
  if data.get("sweep") is None:
    return row["label"]
  return f"{row['label']} ({data['sweep']['label']} = {value_text(row['sweep_value'])})"


def _rates_note(data: Mapping[str, Any], labels: Mapping[str, str]) -> list[str]:
  """One line per (method, rate) whose learning rate is not the paper's rule for the cell; the
  rows of a sweep as one method, their rates being the same rule's."""
  families = {r["method"]: r["family"] for rows in data["tables"].values() for r in rows}
  groups: dict[tuple, list[str]] = {}
  for r in data["learning_rates"]:
    if r["source"] == "paper":
      continue
    key = (families.get(r["method"]) or r["method"], r["key"], r["lr"], r["paper"])
    where = f"{DISPLAY_NAMES.get(r['dataset'], r['dataset'])} {r['shots']}-shot"
    if where not in groups.setdefault(key, []):
      groups[key].append(where)
  lines = []
  for (method, key, lr, paper), where in groups.items():
    why = "the paper gives none" if paper is None else f"the paper's is {paper:g}"
    rows = f" (every {data['sweep']['label']})" if data.get("sweep") else ""
    lines.append(f"- {labels[method]}{rows}: {key} = {lr:g} on {', '.join(where)} ({why}).")
  if lines:
    lines.insert(0, "Learning rates set by the config, not App. A.1's rule:")
  return lines


def markdown(data: Mapping[str, Any]) -> str:
  """The tables as markdown: a heading per shot count, then the table; a closing note lists the
  learning rates that are not the paper's."""
  datasets = data["datasets"]
  seeds = data["seeds"]
  average_column = data.get("average_column", True)
  lines = [
    f"Accuracy (%), mean ± std over seeds {seeds_text(seeds)} (std with ddof={data['ddof']})"
    + ("; Average: the mean of the dataset means." if average_column else "."),
  ]
  labels = {}
  for k in data["shots"]:
    rows = data["tables"][str(k)]
    columns = [DISPLAY_NAMES.get(d, d) for d in datasets] + (["Average"] if average_column else [])
    lines += ["", f"{k} shot{'s' if k != 1 else ''}:", ""]
    lines.append("| Method | Text | " + " | ".join(columns) + " |")
    lines.append("|---|---|" + "---|" * len(columns))
    best = {d: _best([r["cells"][d] and r["cells"][d]["mean"] for r in rows]) for d in datasets}
    best_average = _best([r["average"] for r in rows])
    shared = {r["label"] for r in rows if sum(o["label"] == r["label"] for o in rows) > 1}
    for r in rows:
      # Rows of one label (SToRI on two prompt sets) are told apart by their prompts.
      shared_label = r["label"] in shared and r.get("sweep_value") is None and r["text"]
      labels[r["family"] or r["method"]] = (
        f"{r['label']}, {r['text']}" if shared_label else r["label"]
      )
      shown = [
        _entry(
          r["cells"][d], r["cells"][d] is not None and round(r["cells"][d]["mean"], 2) == best[d]
        )
        for d in datasets
      ]
      average = r["average"]
      if average_column:
        text = MISSING if average is None else f"{average:.2f}"
        best_row = average is not None and round(average, 2) == best_average
        shown.append(f"**{text}**" if best_row else text)
      lines.append(f"| {row_label(data, r)} | {r['text']} | " + " | ".join(shown) + " |")
  note = _rates_note(data, labels)
  if note:
    lines += [""] + note
  return "\n".join(lines)
