"""Table 3 of the mutual-knowledge paper from the sweep's per-model rows (markdown), and the
text of a fitted line."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from mutual import pipeline
from mutual.sweep.models import FAMILIES

#: What marks a random-weight sweep in its table, figure titles and log: the trained models'
#: names and training data would otherwise read as results of the trained models.
RANDOM_WEIGHTS = "random weights"


def table_order(rows: Sequence[Mapping[str, Any]]) -> list:
  rank = {f: i for i, f in enumerate(FAMILIES.values())}
  return sorted(rows, key=lambda r: (rank[r["family"]], r["top1"], r["name"]))


def signed(value: float, digits: int = 2) -> str:
  """'+ 7.72' or '- 7.72': the sign as the operator of a sum (never '+ -7.72')."""
  text = f"{abs(value):.{digits}f}"
  # A value that rounds to zero prints '+ 0.00', not '- 0.00'.
  return f"- {text}" if value < 0 and float(text) != 0 else f"+ {text}"


def fit_equation(fit: Mapping[str, Any], digits: int = 2) -> str:
  """'11.24 AUC + 25.97' from a fits.fit_line result (numbers not None)."""
  slope = f"{fit['slope']:.{digits}f}"
  slope = slope.lstrip("-") if float(slope) == 0 else slope  # '0.00', not '-0.00'
  return f"{slope} AUC {signed(fit['intercept'], digits)}"


def markdown_table(
  rows: Sequence[Mapping[str, Any]], methods: Sequence[str], random_weights: bool = False
) -> str:
  """Table 3: family, model, training data, Top-1 (%), MI and AUC per method, and the Top-1
  the paper reports; rows by family, then measured Top-1 (the paper's order).

  random_weights: the rows are of random-weight instances; their Data cells say so (the
  architectures' training data does not apply) and the paper's column is named as the trained
  models' accuracy.
  """
  names = pipeline.METHOD_TITLES
  head = ["Family", "Model", "Data", "Top-1 (%)"]
  head += [f"MI {names.get(m, m)}" for m in methods] + [f"AUC {names.get(m, m)}" for m in methods]
  head.append("Top-1 paper, trained weights (%)" if random_weights else "Top-1 paper (%)")
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in table_order(rows):
    paper = r["reported_top1"]["paper"]
    data = RANDOM_WEIGHTS if random_weights else r["data"]
    cells = [r["family"], r["label"], data, f"{r['top1']:.2f}"]
    cells += [f"{r[m]['mi']:.3f}" for m in methods] + [f"{r[m]['auc']:.3f}" for m in methods]
    cells.append("-" if paper is None else f"{paper:.2f}")
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"
