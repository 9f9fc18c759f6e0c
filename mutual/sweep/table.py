"""Table 3 of the mutual-knowledge paper from the sweep's per-model rows (markdown)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from mutual import pipeline
from mutual.sweep.models import FAMILIES


def table_order(rows: Sequence[Mapping[str, Any]]) -> list:
  rank = {f: i for i, f in enumerate(FAMILIES.values())}
  return sorted(rows, key=lambda r: (rank[r["family"]], r["top1"], r["name"]))


def markdown_table(rows: Sequence[Mapping[str, Any]], methods: Sequence[str]) -> str:
  """Table 3: family, model, training data, Top-1 (%), MI and AUC per method, and the Top-1
  the paper reports; rows by family, then measured Top-1 (the paper's order)."""
  names = pipeline.METHOD_TITLES
  head = ["Family", "Model", "Data", "Top-1 (%)"]
  head += [f"MI {names.get(m, m)}" for m in methods] + [f"AUC {names.get(m, m)}" for m in methods]
  head.append("Top-1 paper (%)")
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in table_order(rows):
    paper = r["reported_top1"]["paper"]
    cells = [r["family"], r["label"], r["data"], f"{r['top1']:.2f}"]
    cells += [f"{r[m]['mi']:.3f}" for m in methods] + [f"{r[m]['auc']:.3f}" for m in methods]
    cells.append("-" if paper is None else f"{paper:.2f}")
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"
