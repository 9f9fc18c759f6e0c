"""Table 3 of the mutual-knowledge paper from the sweep's per-model rows (markdown), and the
text of a fitted line."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from mutual import concept_methods
from mutual.sweep.models import families
from stori_jax.models import registry

#: What marks a random-weight sweep in its table, figure titles and log: the trained models'
#: names and training data would otherwise read as results of the trained models.
RANDOM_WEIGHTS = "random weights"


def table_order(rows: Sequence[Mapping[str, Any]]) -> list:
  rank = {f: i for i, f in enumerate(families())}
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
  head = ["Family", "Model", "Data", "Top-1 (%)"]
  head += [f"MI {concept_methods.title(m)}" for m in methods] + [
    f"AUC {concept_methods.title(m)}" for m in methods
  ]
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


def _cells(line: Sequence[str]) -> str:
  return "| " + " | ".join(line) + " |"


def grouped_tables(
  rows: Sequence[Mapping[str, Any]],
  groups: Sequence[tuple[str, Sequence[str]]],
  methods: Sequence[str],
  random_weights: bool = False,
) -> str:
  """App. G's Tables 6 and 7: per group of models (a title row in italics, none for an empty
  title), each model's training data, Top-1 (%), and MI and AUC per concept method; a model may
  sit in several groups (ViT-B/32 in both of Table 6's). The paper prints one MI and one AUC
  column without naming the concept method; both methods are shown. Its "Data Size" column
  is the data's name here (`ModelEntry.data_name`: WIT-400M, DataComp-1B, DFN-2B).

  Args:
    rows: the sweep's per-model rows (results.json's "models" values).
    groups: ((title, (registry name or label, ...)), ...).
    random_weights: the rows are random-weight instances; their Data cells say so.
  """
  by_name = {}
  for r in rows:
    by_name[r["name"]] = by_name[r["label"]] = r
  head = ["Model", "Data", "Top-1 (%)"]
  for m in methods:
    head += [f"MI {concept_methods.title(m)}", f"AUC {concept_methods.title(m)}"]
  lines = [_cells(head), "|" + "---|" * len(head)]
  for title, members in groups:
    if title:
      lines.append(_cells([f"*{title}*"] + [""] * (len(head) - 1)))
    for name in members:
      r = by_name[name]
      # The paper's "Data Size" (400M, 1B, 2B): the data's name without the samples seen.
      data = RANDOM_WEIGHTS if random_weights else registry.get(r["name"]).data_name
      cells = [r["label"], data, f"{r['top1']:.2f}"]
      for m in methods:
        cells += [f"{r[m]['mi']:.3f}", f"{r[m]['auc']:.3f}"]
      lines.append(_cells(cells))
  return "\n".join(lines) + "\n"


#: Table 2's column blocks, in the paper's order (ResNets left, ViTs right); ConvNeXts, which
#: the paper does not evaluate there, after them.
TABLE2_FAMILIES = (("ResNet", "ResNets"), ("ViT", "ViTs"), ("ConvNeXt", "ConvNeXts"))


def table2_paper_tables(
  rows: Sequence[Mapping[str, Any]], table2: Mapping[str, Mapping[str, Any]]
) -> str:
  """Table 2 as the paper lays it out: one block of columns per family side by side (ResNets |
  Base | Ours | Δ, then ViTs | Base | Ours | Δ), models in `rows`' order within a family; one
  table per concept method (the paper's "Ours" does not name it). Top-1 in percent.

  Args:
    rows: the sweep's rows of the models (family, label, name).
    table2: {model name: protocols.table2_descriptor_accuracy result}.
  """
  families = [
    (family, title, [r for r in rows if r["family"] == family]) for family, title in TABLE2_FAMILIES
  ]
  families = [f for f in families if f[2]]
  methods: dict[str, None] = {}
  for r in rows:
    methods.update(dict.fromkeys(table2[r["name"]]["methods"]))
  out = []
  for m in methods:
    out.append(f"Ours: {concept_methods.title(m)} concepts\n")
    head = []
    for _, title, _ in families:
      head += [title, "Base", "Ours", "Δ"]
    lines = [_cells(head), "|" + "---|" * len(head)]
    for k in range(max(len(members) for _, _, members in families)):
      cells = []
      for _, _, members in families:
        if k >= len(members):
          cells += [""] * 4
          continue
        result = table2[members[k]["name"]]
        ours = result["methods"].get(m)
        cells.append(members[k]["label"])
        cells.append(f"{result['base']['top1']:.2f}")
        cells += [f"{ours['top1']:.2f}", f"{ours['delta']:+.2f}"] if ours else ["-", "-"]
      lines.append(_cells(cells))
    out.append("\n".join(lines) + "\n")
  return "\n".join(out)
