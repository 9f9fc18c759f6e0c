"""Markdown tables shaped like the paper's Tables 3-6 from `protocol` results."""

from __future__ import annotations

import math
from typing import Any, Mapping

_ROW_TITLES = {1.0: "Plain", 0.0: "Removed"}


def _cell(summary: Mapping[str, Any], key: str, delta: bool, digits: int = 3) -> str:
  d = digits
  text = f"{summary['mean'][key]:.{d}f} ± {summary['std'][key]:.{d}f}"
  if delta and "delta_mean" in summary:
    text += f" (Δ {summary['delta_mean'][key]:+.{d}f} ± {summary['delta_std'][key]:.{d}f})"
  return text


def _row_title(w: float) -> str:
  if w in _ROW_TITLES:
    return f"{_ROW_TITLES[w]} (w = {w:g})"
  return f"{'Emphasized' if w > 1 else 'De-emphasized'} (w = {w:g})"


def _k_name(result: Mapping[str, Any]) -> str:
  k = result.get("precision_k")
  return "P@R (R = #positives)" if k is None else f"P@{k}"


def emphasis_table(result: Mapping[str, Any], digits: int = 3) -> str:
  """Table 3 / 5 / 6 layout: a row per weight (plain first, then emphasis, de-emphasis),
  AP and P@k as mean ± std over (prompt, attribute) pairs, with the change from plain."""
  weights = sorted(result["weights"], key=lambda w: (w != 1.0, w < 1.0, abs(w - 1.0)))
  lines = [f"| weight on one attribute | AP | {_k_name(result)} |", "|---|---|---|"]
  for w in weights:
    key = repr(float(w))
    cells = [_cell(result[m], key, w != 1.0, digits) for m in ("ap", "p_at_k")]
    lines.append(f"| {_row_title(w)} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def pair_table(result: Mapping[str, Any], digits: int = 3) -> str:
  """Table 4 layout: plain, then the attribute at the lower and at the higher weight."""
  lines = [f"| | AP | {_k_name(result)} |", "|---|---|---|"]
  plain = [_cell(result[m]["plain"], "1.0", False, digits) for m in ("ap", "p_at_k")]
  lines.append("| Plain (w = 1.0) | " + " | ".join(plain) + " |")
  for part in ("low", "high"):
    cells = [_cell(result[m][part], "weighted", True, digits) for m in ("ap", "p_at_k")]
    lines.append(f"| Attribute with w = {result[part]:g} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def attribute_names(sweep: Mapping[str, Any]) -> list[str] | None:
  """The attributes' names, read back from the category names (the all-present category,
  code 2^A - 1) and checked against every category; None when they cannot be read."""
  names = list(sweep["category_names"])
  n_attr = int(round(math.log2(len(names)))) if names else 0
  if n_attr < 1 or 2**n_attr != len(names):
    return None
  for sep in (", ", " "):  # one task's values ("red, checkered, heart"); generic ("colour pattern")
    parts = names[-1].split(sep)
    if len(parts) != n_attr:
      continue
    ok = True
    for code, name in enumerate(names):
      got = name.split(sep)
      present = [(code >> (n_attr - 1 - a)) & 1 for a in range(n_attr)]
      if len(got) != n_attr or any((g == p) != bool(b) for g, p, b in zip(got, parts, present)):
        ok = False
        break
    if ok:
      return parts
  return None


def weight_label(sweep: Mapping[str, Any], newline: bool = True) -> str:
  """Which attribute gets w (and which 1 - w), by name when it can be read: a figure's x axis
  (`newline`) or a table's head."""
  a, b = sweep["attributes"]
  names = attribute_names(sweep)

  def name(i):
    return f"'{names[i]}' (attribute {i})" if names else f"attribute {i}"

  text = f"weight w on {name(a)}"
  return text + (
    (",\n" if newline else ", ") + f"1 - w on {name(b)}" if sweep["complement"] else ""
  )


def sweep_table(result: Mapping[str, Any], every: int = 1) -> str:
  """Mean AUC per category (columns, all attributes present first) at each swept weight
  (rows), with a line under the table that says how to read it."""
  codes = list(range(len(result["category_names"])))[::-1]
  names = [result["category_names"][c] + (" *" if c == result["focus"] else "") for c in codes]
  head = weight_label(result, newline=False)
  lines = [f"| {head} | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
  rows = sorted(set(range(0, len(result["ws"]), every)) | {len(result["ws"]) - 1})
  for i in rows:
    cells = [f"{result['mean_auc'][i][c]:.4f}" for c in codes]
    lines.append(f"| {result['ws'][i]:g} | " + " | ".join(cells) + " |")
  lines += [
    "",
    "Columns are the categories of images (which attributes they have; a value with ' is the "
    "alternative one); * marks the category the weighting should favour; each cell is the "
    "mean AUC of ranking that category above the others.",
  ]
  return "\n".join(lines)


def settings_table(sweeps: Mapping[str, Mapping[str, Any]]) -> str:
  """One row per sweep (method / blocks, Figures 6 and 9): the favoured category's mean AUC
  at the first and last swept weight, its change, and whether it rose at every step."""
  lines = [
    "| sweep | weights | favoured category | AUC first | AUC last | change | monotonic |",
    "|---|---|---|---|---|---|---|",
  ]
  for sweep in sweeps.values():
    focus = [row[sweep["focus"]] for row in sweep["mean_auc"]]
    steps = [y - x for x, y in zip(focus, focus[1:])]
    ws = f"{sweep['ws'][0]:g}..{sweep['ws'][-1]:g}" + (" / 1 - w" if sweep["complement"] else "")
    lines.append(
      f"| {sweep['label']} | {ws} | {sweep['category_names'][sweep['focus']]} | "
      f"{focus[0]:.4f} | {focus[-1]:.4f} | {focus[-1] - focus[0]:+.4f} | "
      f"{'yes' if min(steps) >= 0 else 'no'} |"
    )
  return "\n".join(lines)


def selection_table(result: Mapping[str, Any], digits: int = 3) -> str:
  """The selection as a table (every candidate, highest AUROC first, selected ones marked and
  whether the paper lists them) and the lines that say which differ from the paper's lists."""
  paper = result.get("paper")
  head = "| attribute | zero-shot prompt | AUROC | selected |" + (
    " in the paper's list |" if paper is not None else ""
  )
  lines = [head, "|---|---|---|---|" + ("---|" if paper is not None else "")]
  ranked = sorted(result["auroc"].items(), key=lambda kv: -(kv[1] if kv[1] is not None else -1))
  for name, value in ranked:
    cells = [
      name,
      result["prompts"][name],
      "n/a" if value is None else f"{value:.{digits}f}",
      "yes" if name in result["selected"] else "",
    ]
    if paper is not None:
      cells.append("yes" if name in paper else "")
    lines.append("| " + " | ".join(cells) + " |")
  lines += [
    "",
    f"{len(result['selected'])} of {len(result['auroc'])} attributes reach zero-shot AUROC >= "
    f"{result['threshold']:g} on {result['n_images']} images ({result['split']}).",
  ]
  if paper is not None:
    lines.append(
      "Selected here but not in the paper's list: "
      + (", ".join(result["selected_not_in_paper"]) or "none")
      + "; in the paper's list but not selected here: "
      + (", ".join(result["in_paper_not_selected"]) or "none")
      + "."
    )
  for key, what in (
    ("prompts_not_in_paper", "Prompts recomputed that the paper's Table 9 does not have"),
    ("paper_prompts_not_used", "Table 9's prompts not recomputed"),
  ):
    if key in result:
      lines.append(f"{what}: " + ("; ".join(result[key]) or "none") + ".")
  return "\n".join(lines)


def report(results: Mapping[str, Any], digits: int = 3) -> str:
  """The markdown report of `retrieve`: every table present in results."""
  out = [f"# Preference retrieval: `{results['model']}` on {results['data']}", ""]
  out += [f"{results['n_tasks']} prompts, {results['n_images']} indexed images.", ""]
  for name, title in (
    ("emphasis", "Emphasis / de-emphasis of one attribute (cf. Tables 3, 5, 6), SToRI"),
    ("emphasis_prompt_weighting", "The same with prompt weighting (App. C.1 baseline)"),
  ):
    if name in results:
      out += [f"## {title}", "", emphasis_table(results[name], digits), ""]
  if "pairs" in results:
    out += ["## Two attributes at different weights (cf. Table 4)", ""]
    out += [pair_table(results["pairs"], digits), ""]
  if results.get("attribute_selection"):
    out += ["## Attributes chosen by zero-shot AUROC (App. A.2)", ""]
    out += [selection_table(results["attribute_selection"], digits), ""]
  sweeps = results.get("sweeps", {})
  if "stori_pair" in sweeps:
    sweep = sweeps["stori_pair"]
    out += [f"## Per-category AUC over the weight sweep ({sweep['label']}, cf. Figure 5)", ""]
    out += [sweep_table(sweep, every=max(1, len(sweep["ws"]) // 5)), ""]
  if sweeps:
    out += ["## The favoured category under each sweep (cf. Figures 6 and 9)", ""]
    out += [settings_table(sweeps), ""]
  return "\n".join(out).rstrip() + "\n"
