"""Outputs of the mutual-knowledge analysis: per-image JSON, aggregates, tables and figures.

- `image_records`: one JSON-ready dict per image (concepts with their regions and descriptors,
  the ordered vision-side descriptors, the language-side ones, the mutual ones, MI curve, AUC).
- `aggregate`: per class and for the dataset, in the columns of the paper's Table 3 (Top-1, MI and
  AUC for PCA and K-means). MI is the mean of the images' MI; a class's AUC is the mean of its
  zero-padded mean curve, the dataset's that of all its images' zero-padded mean curve (reference).
- `markdown_table`, `write_json`; figures with matplotlib (Agg): `plot_concepts` (Fig. 4),
  `plot_curves` (Fig. 3 / 5), `plot_mutual` (Fig. 6).
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import numpy as np

from stori_jax import jsonio
from stori_jax.plotting import pyplot

from mutual import information

#: Concept colours (RGB 0-1) for overlays, one per concept id.
COLOURS = np.array(
  [[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0], [1, 0.65, 0], [1, 0.75, 0.8], [0.63, 0.13, 0.94]]
)
_DIGITS = 6


def _round(x) -> float:
  return round(float(x), _DIGITS)


def image_records(
  cls,
  result: Mapping[str, Any],
  descriptors: Sequence[str],
  class_names: Sequence[str],
  methods: Sequence[str],
) -> list[dict[str, Any]]:
  """JSON-ready per-image results of one class (a data.ClassImages and analyze_class's output)."""
  records = []
  for i, image_id in enumerate(cls.ids):
    predicted = int(result["predicted"][i])
    record = dict(
      id=image_id,
      label=int(cls.label),
      class_name=cls.name,
      predicted=predicted,
      predicted_name=class_names[predicted],
      correct=predicted == int(cls.label),
      foreground_patches=int(result["foreground"][i].sum()),
      methods={},
    )
    for method in methods:
      r = result[method]
      n = int(r["n_visual"][i])
      visual = [descriptors[int(d)] for d in r["visual_ids"][i][:n]]
      language = [descriptors[int(d)] for d in r["language_ids"][i]]
      mutual = [d for d in visual if d in set(language)]
      concept_list = []
      for c in np.flatnonzero(r["concept_valid"][i]):
        chosen = r["concept_ids"][i][c][r["concept_ids_valid"][i][c]]
        rows, cols = np.nonzero(r["concept_maps"][i] == c)
        concept_list.append(
          dict(
            concept=int(c),
            patches=int(len(rows)),
            bbox_patches=[int(rows.min()), int(cols.min()), int(rows.max()), int(cols.max())]
            if len(rows)
            else None,
            descriptors=[descriptors[int(d)] for d in chosen],
          )
        )
      curve = r["curve"][i][: n + 1]
      record["methods"][method] = dict(
        concept_map=r["concept_maps"][i].astype(int).tolist(),
        concepts=concept_list,
        visual_descriptors=visual,
        visual_scores=[_round(s) for s in r["visual_scores"][i][:n]],
        language_descriptors=language,
        mutual_descriptors=mutual,
        candidates=int(r["candidates"][i].sum()),
        mi=_round(curve[0]),
        curve=[_round(v) for v in curve],
        auc=_round(information.curve_auc(curve)),
        entropy=_round(r["entropy"][i]),
        entropy_without_ot=_round(r["entropy_without_ot"][i]),
      )
    records.append(record)
  return records


def _summary(records: Sequence[Mapping[str, Any]], methods: Sequence[str]) -> dict[str, Any]:
  out: dict[str, Any] = dict(
    images=len(records), top1=_round(100.0 * np.mean([r["correct"] for r in records]))
  )
  for method in methods:
    per = [r["methods"][method] for r in records]
    curve = information.mean_curve([p["curve"] for p in per], [len(p["curve"]) for p in per])
    out[method] = dict(
      mi=_round(np.mean([p["mi"] for p in per])),
      auc=_round(information.curve_auc(curve)),
      mean_image_auc=_round(np.mean([p["auc"] for p in per])),
      curve=[_round(v) for v in curve],
      visual_descriptors=_round(np.mean([len(p["visual_descriptors"]) for p in per])),
      mutual_descriptors=_round(np.mean([len(p["mutual_descriptors"]) for p in per])),
      entropy=_round(np.mean([p["entropy"] for p in per])),
      entropy_without_ot=_round(np.mean([p["entropy_without_ot"] for p in per])),
    )
  return out


def aggregate(records: Sequence[Mapping[str, Any]], methods: Sequence[str]) -> dict[str, Any]:
  """{"classes": {name: summary}, "dataset": summary}; summaries hold images, top1 (%), and per
  method mi, auc (of the zero-padded mean curve), mean_image_auc, curve, descriptor counts and
  the OT entropy diagnostic with and without OT."""
  if not records:
    raise ValueError("no images were analysed")
  by_class: dict[str, list] = {}
  for r in records:
    by_class.setdefault(r["class_name"], []).append(r)
  return dict(
    classes={name: _summary(rs, methods) for name, rs in by_class.items()},
    dataset=_summary(records, methods),
  )


def markdown_table(summary: Mapping[str, Any], model: str, methods: Sequence[str]) -> str:
  """Table 3's columns for one model: Top-1 (%), MI and AUC per concept method."""
  names = {"pca": "PCA", "kmeans": "K-means"}
  head = ["Model", "Top-1 (%)"]
  head += [f"MI {names.get(m, m)}" for m in methods] + [f"AUC {names.get(m, m)}" for m in methods]
  row = [model, f"{summary['top1']:.2f}"]
  row += [f"{summary[m]['mi']:.3f}" for m in methods]
  row += [f"{summary[m]['auc']:.3f}" for m in methods]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), "| " + " | ".join(row) + " |"]
  return "\n".join(lines) + "\n"


def write_json(path: str, payload: Any) -> None:
  """Deterministic JSON (sorted keys, fixed indentation), strict (NaN or infinity raise
  NonFiniteError) and atomic (stori_jax.jsonio)."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  jsonio.write_json(path, payload, indent=1, sort_keys=True)


# ---------------------------------------------------------------------------------------------
# Figures.


def overlay(image: np.ndarray, pixel_map: np.ndarray, alpha: float = 0.5) -> np.ndarray:
  """uint8 [H, W, 3] image with concept ids int [H, W] (-1: none) blended in: float [H, W, 3]."""
  out = image.astype(np.float32) / 255.0
  ids = np.asarray(pixel_map)
  painted = ids >= 0
  colours = COLOURS[np.clip(ids, 0, None) % len(COLOURS)]
  out[painted] = (1 - alpha) * out[painted] + alpha * colours[painted]
  return out


def _pixel_map(concept_map: np.ndarray, size: int) -> np.ndarray:
  rows = (np.arange(size) * concept_map.shape[0]) // size
  cols = (np.arange(size) * concept_map.shape[1]) // size
  return np.asarray(concept_map)[rows][:, cols]


def plot_concepts(path: str, images: np.ndarray, records, method: str, refined=None) -> None:
  """Fig. 4: each image with its visual concepts overlaid and their descriptors listed."""
  plt = pyplot()
  n = len(records)
  fig, axes = plt.subplots(1, n, figsize=(3.2 * n, 4.2), squeeze=False)
  for ax, image, record, k in zip(axes[0], images, records, range(n)):
    m = record["methods"][method]
    pixels = _pixel_map(np.array(m["concept_map"]), image.shape[0])
    if refined is not None:
      pixels = np.where(refined[k], pixels, -1)
    ax.imshow(overlay(image, pixels))
    ax.set_axis_off()
    lines = [
      f"{c['concept']}: " + ", ".join(c["descriptors"]) for c in m["concepts"] if c["descriptors"]
    ]
    ax.set_title(f"pred: {record['predicted_name']}", fontsize=8)
    for j, line in enumerate(lines):
      colour = COLOURS[int(line.split(":")[0]) % len(COLOURS)]
      ax.text(0, -0.04 - 0.07 * j, line, transform=ax.transAxes, fontsize=6, color=colour, va="top")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def plot_curves(path: str, curves: Mapping[str, Sequence[float]], title: str = "") -> None:
  """Fig. 3 / 5: MI curves (MI after removing the t most important visual descriptors)."""
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(5, 3.5))
  for label, curve in curves.items():
    curve = np.asarray(curve)
    ax.plot(
      np.arange(len(curve)), curve, marker="o", ms=3, label=f"{label} (AUC {curve.mean():.2f})"
    )
  ax.set_xlabel("visual descriptors removed")
  ax.set_ylabel("MI")
  ax.set_title(title, fontsize=9)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def plot_mutual(path: str, image: np.ndarray, record, method: str) -> None:
  """Fig. 6: the image, its vision-side, language-side and mutual descriptors."""
  plt = pyplot()
  m = record["methods"][method]
  mutual = set(m["mutual_descriptors"])
  vision = [d for d in m["visual_descriptors"] if d not in mutual]
  language = [d for d in m["language_descriptors"] if d not in mutual]
  fig, axes = plt.subplots(1, 4, figsize=(12, 3.6), gridspec_kw=dict(width_ratios=[1, 1.2, 1, 1.2]))
  axes[0].imshow(image)
  axes[0].set_title(f"pred: {record['predicted_name']}", fontsize=8)
  columns = [
    ("vision only", vision, "tab:blue"),
    ("mutual", sorted(mutual), "tab:purple"),
    ("language only", language, "tab:red"),
  ]
  for ax, (title, items, colour) in zip(axes[1:], columns):
    ax.set_title(f"{title} ({len(items)})", fontsize=9, color=colour)
    for j, text in enumerate(items[:18]):
      ax.text(
        0.02, 0.95 - 0.05 * j, text, fontsize=7, color=colour, va="top", transform=ax.transAxes
      )
  for ax in axes:
    ax.set_axis_off()
  fig.suptitle(f"MI {m['mi']:.2f}, AUC {m['auc']:.2f} ({method})", fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
