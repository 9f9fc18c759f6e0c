"""Table 5 (App. D.1) and the concept labeler's accuracy (App. D.2): how well the trained
baselines classify, on the evaluation images.

Table 5 gives the top-1 and top-5 accuracy of the Standard MLP, LF-CBM, MM-CBM and MM-ProtoSim
(mutual.baselines, trained on the training images); CLIP's zero-shot classifier, which the paper
leaves out, is added as an untrained reference row. The labeler's accuracy is read in two ways
(App. D.2 defines them in words only):

- top-all: an image counts when every descriptor of its class (K of them) is among the labeler's
  K best-scored descriptors ("all textual concepts of a class are accurately predicted");
- top-10: an image counts when every descriptor of its class is among its top max(10, K)
  (the same test with the labeler's 10 best, for "concepts from other classes ... penalized").

The JSON also gives the softer reading of each, the mean share of the class's descriptors found
among those top K / top 10 (`top_all_recall`, `top_10_recall`). Images of a class without
descriptors in the bank are left out of the labeler's accuracy (and counted).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import jax.numpy as jnp
import numpy as np

from mutual.protocols.zero_shot import hits_at_k, percent

#: Table 5's rows in the paper's order, with its Vis. / Lan. / MMB columns.
ROWS = {
  "Standard": (True, False, False),
  "LF-CBM": (True, True, False),
  "MM-CBM": (True, True, True),
  "MM-ProtoSim": (True, True, True),
}
#: The untrained reference row (not in the paper's Table 5).
ZERO_SHOT = "zero-shot"
#: The paper's ImageNet numbers (CLIP ViT-B/16): Table 5's (top-1, top-5), and App. D.2's labeler.
PAPER = {
  "Standard": (73.36, 92.75),
  "LF-CBM": (71.95, None),
  "MM-CBM": (77.88, 94.96),
  "MM-ProtoSim": (78.79, 95.43),
}
PAPER_LABELER = {"top_all": 65.76, "top_10": 83.84}


def topk_accuracy(logits, labels, ks: Sequence[int] = (1, 5)) -> dict[str, float]:
  """{"top<k>": accuracy in %} of float [N, C] logits against int [N] labels: an image counts
  when fewer than k classes score strictly above its own (ties count for it; k >= C: every
  image)."""
  hits = np.asarray(
    hits_at_k(jnp.asarray(logits, jnp.float32), jnp.asarray(labels, jnp.int32), tuple(ks))
  )
  return {f"top{k}": percent(hits[:, i].mean()) for i, k in enumerate(ks)}


def labeler_hits(scores, truth, k: int = 10, chunk: int = 4096) -> dict[str, np.ndarray]:
  """Per image, whether the labeler's best descriptors hold the true ones.

  Args:
    scores: float [N, D], the labeler's descriptor scores.
    truth: bool [N, D], each image's true descriptors (its class's).
    k: the relaxed cut (App. D.2's 10).
    chunk: images sorted at a time (bounds the [chunk, D] copy).

  Returns:
    dict of [N] arrays: top_all, top_k (bool: every true descriptor within the top K, resp. top
    max(k, K), K the image's true count), top_all_recall, top_k_recall (float32: the share of
    true descriptors within them), valid (bool: K > 0). A descriptor is within the top m when
    fewer than m descriptors score strictly higher (ties count for it), i.e. when its score
    reaches the m-th largest.
  """
  scores = np.asarray(scores, np.float32)
  truth = np.asarray(truth, bool)
  count = truth.sum(axis=1)
  valid = count > 0
  cuts = {"top_all": count, "top_k": np.maximum(count, int(k))}
  found = {name: np.zeros(len(scores), np.int64) for name in cuts}
  for start in range(0, len(scores), chunk):
    part = scores[start : start + chunk]
    descending = -np.sort(-part, axis=1)
    rows = np.arange(len(part))
    for name, cut in cuts.items():
      position = np.clip(cut[start : start + chunk], 1, part.shape[1]) - 1
      reach = descending[rows, position][:, None]  # the m-th largest score
      found[name][start : start + chunk] = ((part >= reach) & truth[start : start + chunk]).sum(1)
  out = {"valid": valid}
  for name in cuts:
    out[name] = valid & (found[name] == count)
    share = np.where(valid, found[name] / np.maximum(count, 1), 0.0)
    out[f"{name}_recall"] = share.astype(np.float32)
  return out


def labeler_accuracy(scores, labels, targets, k: int = 10) -> dict:
  """App. D.2's labeler accuracy (see the module docstring).

  Args:
    scores: float [N, D]; labels: int [N]; targets: float / bool [C, D], class c's descriptors
      (`mutual.baselines.cache.descriptor_targets`).

  Returns:
    dict: top_all, top_<k> (%), top_all_recall, top_<k>_recall (%), images (counted), and
    images_without_descriptors (left out).
  """
  truth = np.asarray(targets)[np.asarray(labels)] > 0
  hits = labeler_hits(scores, truth, k)
  valid = hits["valid"]
  mean = lambda x: percent(x[valid].mean()) if valid.any() else None  # noqa: E731
  return {
    "top_all": mean(hits["top_all"]),
    f"top_{k}": mean(hits["top_k"]),
    "top_all_recall": mean(hits["top_all_recall"]),
    f"top_{k}_recall": mean(hits["top_k_recall"]),
    "images": int(valid.sum()),
    "images_without_descriptors": int((~valid).sum()),
  }


def table5(
  logits: Mapping[str, object],
  labels,
  labeler_scores=None,
  targets=None,
  k: int = 10,
) -> dict:
  """Table 5 and the labeler's accuracy on the evaluation images.

  Args:
    logits: {row: float [N, C]} (ROWS' names and ZERO_SHOT; rows absent are left out).
    labels: int [N].
    labeler_scores: float [N, D], the labeler's scores, or None (no labeler row).
    targets: float [C, D], the classes' descriptors (needed with labeler_scores).
    k: the labeler's relaxed cut.

  Returns:
    dict: rows {row: {top1, top5 (%), vision, language, multimodal_bottleneck (the paper's
    columns; None for the zero-shot row), paper_top1, paper_top5 (ImageNet; None where none)}},
    in the paper's order then the zero-shot row; images; labeler (`labeler_accuracy`, with
    paper_top_all and paper_top_10) or None.
  """
  labels = np.asarray(labels)
  rows = {}
  for name in [n for n in ROWS if n in logits] + [n for n in logits if n not in ROWS]:
    flags = ROWS.get(name, (None, None, None))
    paper = PAPER.get(name, (None, None))
    rows[name] = dict(
      topk_accuracy(logits[name], labels),
      vision=flags[0],
      language=flags[1],
      multimodal_bottleneck=flags[2],
      paper_top1=paper[0],
      paper_top5=paper[1],
    )
  labeler = None
  if labeler_scores is not None:
    labeler = labeler_accuracy(labeler_scores, labels, targets, k)
    labeler.update(
      paper_top_all=PAPER_LABELER["top_all"], **{f"paper_top_{k}": PAPER_LABELER.get(f"top_{k}")}
    )
  return dict(rows=rows, images=int(len(labels)), labeler=labeler)


def _cell(x) -> str:
  return "-" if x is None else f"{x:.2f}"


def _mark(flag) -> str:
  return "" if flag is None else ("✓" if flag else "✗")


def table5_markdown(result: Mapping, model: str) -> str:
  """Table 5 in the paper's layout (with the paper's ImageNet numbers beside), then the labeler's
  accuracy; with a `training_set` (the evaluation's `training_set`), its note first."""
  lines = [
    f"Model: {model}, {result['images']} images. Paper: ImageNet val, CLIP ViT-B/16.",
    "",
  ]
  if result.get("training_set"):
    lines += [result["training_set"]["note"], ""]
  lines += [
    "| Model | Vis. | Lan. | MMB | Top-1 | Top-5 | Paper Top-1 | Paper Top-5 |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for name, r in result["rows"].items():
    title = "Zero-shot CLIP (untrained reference)" if name == ZERO_SHOT else name
    cells = [title, _mark(r["vision"]), _mark(r["language"]), _mark(r["multimodal_bottleneck"])]
    cells += [_cell(r["top1"]), _cell(r["top5"]), _cell(r["paper_top1"]), _cell(r["paper_top5"])]
    lines.append("| " + " | ".join(cells) + " |")
  labeler = result.get("labeler")
  if labeler:
    top = next(key for key in labeler if key.startswith("top_") and key[4:].isdigit())
    lines += [
      "",
      f"Concept labeler (App. D.2, Feature Maps), {labeler['images']} images:",
      "",
      "| Accuracy | All in top-K | Share in top-K | Paper |",
      "|---|---|---|---|",
      f"| top-all | {_cell(labeler['top_all'])} | {_cell(labeler['top_all_recall'])} | "
      f"{_cell(labeler['paper_top_all'])} |",
      f"| {top.replace('_', '-')} | {_cell(labeler[top])} | {_cell(labeler[top + '_recall'])} | "
      f"{_cell(labeler.get('paper_' + top))} |",
    ]
  return "\n".join(lines) + "\n"
