"""The protocols' markdown tables: one writer per protocol, {model name: result} -> one row per
model, and `markdown(protocol, results)` to pick the writer by name."""

from __future__ import annotations

import math
from typing import Mapping

from mutual import paper_config, pipeline


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
    t = pipeline.METHOD_TITLES.get(m, m)
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
    t = pipeline.METHOD_TITLES.get(m, m)
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


def bank_quality_markdown(results: Mapping[str, Mapping]) -> str:
  """{model: bank_quality result} -> App. A.4's Table 4 columns."""
  lines = ["| Model | Top-1 | Top-5 | InterDiv | IntraDiv |", "|---|---|---|---|---|"]
  for model, r in results.items():
    row = [model, _f(r["top1"]), _f(r["top5"]), _f(r["inter_div"], 3), _f(r["intra_div"], 3)]
    lines.append("| " + " | ".join(row) + " |")
  return "\n".join(lines) + "\n"


#: Each protocol's section heading in protocols.md and the evaluation's output (the paper's
#: table or appendix and what it measures).
TITLES = {
  "table2": "Table 2 (App. K): zero-shot Top-1 (%) with the mutual concepts added to the class "
  "prompts",
  "ot_entropy": "App. A.2: entropy (nats) of the descriptors chosen for an image's concepts, "
  "without and with optimal transport",
  "blur": "App. A.3: zero-shot Top-1 (%) after blurring the non-prominent regions",
  "bank_quality": "App. A.4: quality of the descriptor bank (zero-shot Top-1 / Top-5 (%), inter- "
  "and intra-class similarity)",
}


MARKDOWN = {
  "table2": table2_markdown,
  "ot_entropy": ot_entropy_markdown,
  "blur": blur_markdown,
  "bank_quality": bank_quality_markdown,
}


def markdown(protocol: str, results: Mapping[str, Mapping]) -> str:
  """The markdown table of `protocol` (one of paper_config.PROTOCOLS) for {model name: result}."""
  if protocol not in MARKDOWN:
    raise ValueError(f"unknown protocol {protocol!r}; known: {paper_config.PROTOCOLS}")
  return MARKDOWN[protocol](results)


def section(protocol: str, results: Mapping[str, Mapping]) -> str:
  """`protocol`'s markdown section: its heading (TITLES), then its table."""
  return f"## {TITLES.get(protocol, protocol)}\n\n{markdown(protocol, results)}"
