"""The protocols' markdown tables: one writer per protocol, {model name: result} -> one row per
model, and `markdown(protocol, results)`, the table of a registered protocol by its name."""

from __future__ import annotations

import math
from typing import Mapping

from mutual import concept_methods
from mutual.protocols import localization, registry


def _f(x, digits: int = 2) -> str:
  if x is None or (isinstance(x, float) and math.isnan(x)):
    return "-"
  return f"{x:.{digits}f}"


def _signed(x, digits: int = 2) -> str:
  return "-" if x is None else f"{x:+.{digits}f}"


def _methods(results: Mapping[str, Mapping]) -> list[str]:
  seen: dict[str, None] = {}
  for r in results.values():
    for m in r["methods"]:
      seen.setdefault(m, None)
  return list(seen)


def table2_markdown(results: Mapping[str, Mapping]) -> str:
  """{model: table2_descriptor_accuracy result} -> Table 2 (top-1 %, one row per model)."""
  methods = _methods(results)
  head = ["Model", "Base"]
  for m in methods:
    t = concept_methods.title(m)
    head += [f"Ours ({t})", "Δ", f"Guarded ({t})", "Δ"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for model, r in results.items():
    row = [model, _f(r["base"]["top1"])]
    for m in methods:
      x = r["methods"].get(m)
      row += (
        [_f(x["top1"]), _signed(x["delta"]), _f(x["guarded_top1"]), _signed(x["guarded_delta"])]
        if x
        else ["-"] * 4
      )
    lines.append("| " + " | ".join(row) + " |")
  return "\n".join(lines) + "\n"


def ot_entropy_markdown(results: Mapping[str, Mapping]) -> str:
  """{model: ot_entropy result} -> App. A.2's table (mean entropy, nats)."""
  methods = _methods(results)
  head = ["Model"]
  for m in methods:
    t = concept_methods.title(m)
    head += [f"w/o OT ({t})", f"w/ OT ({t})"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for model, r in results.items():
    row = [model]
    for m in methods:
      x = r["methods"].get(m)
      row += [_f(x["without_ot"]), _f(x["with_ot"])] if x else ["-", "-"]
    lines.append("| " + " | ".join(row) + " |")
  return "\n".join(lines) + "\n"


def blur_markdown(results: Mapping[str, Mapping]) -> str:
  """{model: blur_accuracy result} -> App. A.3's Table 3 (top-1 %)."""
  lines = ["| Model | Base | NN Interp. | +FCC | +CRF | Δ |", "|---|---|---|---|---|---|"]
  for model, r in results.items():
    row = [model] + [_f(r[v]["top1"]) for v in ("base", "nn", "fcc", "crf")]
    lines.append("| " + " | ".join(row + [_signed(r["delta"])]) + " |")
  return "\n".join(lines) + "\n"


def _bank_cells(r: Mapping) -> list[str]:
  return [_f(r["top1"]), _f(r["top5"]), _f(r["inter_div"], 3), _f(r["intra_div"], 3)]


def bank_quality_markdown(results: Mapping[str, Mapping]) -> str:
  """{model: bank_quality result} -> App. A.4's Table 4 columns, one row per model; a result
  over descriptor sets ({"sets": [...]}, protocols.bank.bank_quality_rows) -> Table 4
  in the paper's layout, one row per set (Prompt | LLM | Top-1 | Top-5 | InterDiv | IntraDiv),
  one table per model."""
  if any("sets" in r for r in results.values()):
    out = []
    for model, r in results.items():
      lines = [
        f"{model}:\n",
        "| Prompt | LLM | Top-1 | Top-5 | InterDiv | IntraDiv |",
        "|---|---|---|---|---|---|",
      ]
      for row in r.get("sets", ()):
        lines.append("| " + " | ".join([row["prompt"], row["llm"]] + _bank_cells(row)) + " |")
      out.append("\n".join(lines) + "\n")
    return "\n".join(out)
  lines = ["| Model | Top-1 | Top-5 | InterDiv | IntraDiv |", "|---|---|---|---|---|"]
  for model, r in results.items():
    lines.append("| " + " | ".join([model] + _bank_cells(r)) + " |")
  return "\n".join(lines) + "\n"


def corloc_markdown(results: Mapping[str, Mapping]) -> str:
  """{model: corloc result} -> App. A.1's Table 1 in its layout: one row per facet and
  decomposition, one column per model (CorLoc %); then the trivial boxes' rows."""
  models = list(results)
  lines = [
    "| Facet (decomposition) | " + " | ".join(models) + " |",
    "|" + "---|" * (1 + len(models)),
  ]
  rows: dict[tuple[str, str], None] = {}
  for r in results.values():
    for facet, by_decomposition in r["corloc"].items():
      for decomposition in by_decomposition:
        rows.setdefault((facet, decomposition), None)
  for facet, decomposition in rows:
    name = (
      f"{localization.FACET_TITLES.get(facet, facet)} "
      f"({localization.DECOMPOSITION_TITLES.get(decomposition, decomposition)})"
    )
    cells = [_f(r["corloc"].get(facet, {}).get(decomposition), 1) for r in results.values()]
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  for key, name in localization.TRIVIAL_TITLES.items():
    cells = [_f(r["trivial"].get(key), 1) for r in results.values()]
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def layer_similarity_markdown(results: Mapping[str, Mapping]) -> str:
  """{model: layer_similarity result} -> the numbers behind App. A.1's Fig. 1: the last
  layer's mean [CLS] similarity to the earlier layers, and that of two earlier layers."""
  lines = [
    "| Model | Layers | Tokens: last vs earlier | Tokens: among earlier | Keys: last vs earlier "
    "| Keys: among earlier |",
    "|---|---|---|---|---|---|",
  ]
  for model, r in results.items():
    t, k = r["summary"]["tokens"], r["summary"]["keys"]
    row = [model, str(r["layers"])]
    row += [_f(t["last_vs_earlier"], 3), _f(t["among_earlier"], 3)]
    row += [_f(k["last_vs_earlier"], 3), _f(k["among_earlier"], 3)]
    lines.append("| " + " | ".join(row) + " |")
  return "\n".join(lines) + "\n"


#: Each protocol's section heading in protocols.md and the evaluation's output (the paper's
#: table or appendix and what it measures).
TITLES = {
  "table2": "Table 2 (App. K): zero-shot Top-1 (%) with the mutual concepts added to the class "
  "prompts",
  "corloc": "App. A.1 (its Table 1): CorLoc (%) of the most prominent region per feature facet "
  "and decomposition (GDC: graph decomposition)",
  "layer_similarity": "App. A.1 (its Fig. 1): cosine similarity of the [CLS] token across layers "
  "(layer_similarity.png)",
  "ot_entropy": "App. A.2: entropy (nats) of the descriptors chosen for an image's concepts, "
  "without and with optimal transport",
  "blur": "App. A.3: zero-shot Top-1 (%) after blurring the non-prominent regions",
  "bank_quality": "App. A.4: quality of the descriptor bank (zero-shot Top-1 / Top-5 (%), inter- "
  "and intra-class similarity)",
}


#: The paper's protocols' table writers (their registry entries, `builtin.py`, hold them).
MARKDOWN = {
  "table2": table2_markdown,
  "corloc": corloc_markdown,
  "layer_similarity": layer_similarity_markdown,
  "ot_entropy": ot_entropy_markdown,
  "blur": blur_markdown,
  "bank_quality": bank_quality_markdown,
}


def markdown(protocol: str, results: Mapping[str, Mapping]) -> str:
  """The markdown table of `protocol` (a registered protocol's name) for {model name: result}.

  Raises:
    ValueError: an unknown protocol (the message names the registered ones).
  """
  return registry.get(protocol).markdown(results)


def section(protocol: str, results: Mapping[str, Mapping]) -> str:
  """`protocol`'s markdown section: its heading (`Protocol.title`), then its table."""
  return f"## {registry.get(protocol).title}\n\n{markdown(protocol, results)}"
