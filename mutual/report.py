"""Outputs of the mutual-knowledge analysis: per-image JSON, aggregates, tables and figures.

- `image_records`: one JSON-ready dict per image (concepts with their regions and descriptors,
  the ordered vision-side descriptors, the language-side ones, the mutual ones, MI curve, AUC).
- `aggregate`: per class and for the dataset, in the columns of the paper's Table 3 (Top-1, MI and
  AUC for PCA and K-means). MI is the mean of the images' MI; a class's AUC is the mean of its
  zero-padded mean curve, the dataset's that of all its images' zero-padded mean curve (reference).
- `markdown_table`, `write_json`; figures with matplotlib (Agg): `plot_concepts` (Fig. 4: each
  concept outlined in a light colour on a black halo and numbered, so it shows on any object
  colour; `contrast_ratio` / `outline_contrast` measure that), `plot_curves` (one class's or
  the dataset's MI curves, one per concept method), `plot_classes` (Fig. 5: several classes'
  MI curves overlaid with their AUCs, and the concept each class shares most, `shared_concept`,
  on its images), `plot_mutual` (Fig. 6), `plot_ot_diversity` (App. A.2's Fig. 2: an image's
  concepts with their descriptors without and with optimal transport), `plot_perturbation_steps` (App. E's Fig. 7: one
  image's deletion and insertion steps and score curves); titles name the model (when given)
  and the concept method. The multi-model Fig. 3 is mutual.sweep.plots'.
"""

from __future__ import annotations

import textwrap
from typing import Any, Mapping, Sequence

import numpy as np

from mutual import concept_methods, information
from stori_jax.plumbing import jsonio, paths
from stori_jax.plumbing.plotting import pyplot, save_figure

#: Concept colours (RGB 0-1), one per concept id: Paul Tol's colour-blind-safe "light" scheme
#: without its orange. Every outline is light (relative luminance >= 0.37) on a black halo
#: (HALO), so against any object or background colour of the synthetic world one of the two
#: contrasts by 3:1 or more (WCAG's minimum for graphics, `outline_contrast`); the earlier red,
#: orange and yellow fills vanished on the world's red, orange and yellow objects.
COLOURS = (
  np.array(
    [
      [0xFF, 0xFF, 0xFF],  # white
      [0x99, 0xDD, 0xFF],  # light cyan
      [0xFF, 0xAA, 0xBB],  # pink
      [0xBB, 0xCC, 0x33],  # pear
      [0x77, 0xAA, 0xDD],  # light blue
      [0xEE, 0xDD, 0x88],  # light yellow
      [0x44, 0xBB, 0x99],  # mint
    ]
  )
  / 255.0
)
#: The dark stroke around every outline and label box.
HALO = np.zeros(3)
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
        raw = r.get("concept_ids_without_ot_valid")  # absent from a record of an older run
        without_ot = None if raw is None else r["concept_ids_without_ot"][i][c][raw[i][c]]
        rows, cols = np.nonzero(r["concept_maps"][i] == c)
        concept_list.append(
          dict(
            concept=int(c),
            patches=int(len(rows)),
            bbox_patches=[int(rows.min()), int(cols.min()), int(rows.max()), int(cols.max())]
            if len(rows)
            else None,
            descriptors=[descriptors[int(d)] for d in chosen],
            **(
              {}
              if without_ot is None
              else dict(descriptors_without_ot=[descriptors[int(d)] for d in without_ot])
            ),
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
  head = ["Model", "Top-1 (%)"]
  head += [f"MI {concept_methods.title(m)}" for m in methods] + [
    f"AUC {concept_methods.title(m)}" for m in methods
  ]
  row = [model, f"{summary['top1']:.2f}"]
  row += [f"{summary[m]['mi']:.3f}" for m in methods]
  row += [f"{summary[m]['auc']:.3f}" for m in methods]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), "| " + " | ".join(row) + " |"]
  return "\n".join(lines) + "\n"


def write_json(path: str, payload: Any) -> str:
  """Deterministic JSON (sorted keys, fixed indentation), strict (NaN or infinity raise
  NonFiniteError) and atomic (stori_jax.plumbing.jsonio); returns the file's hex SHA-256."""
  paths.makedirs(paths.parent(path))
  return jsonio.write_json(path, payload, indent=1, sort_keys=True)


# ---------------------------------------------------------------------------------------------
# Figures.


def relative_luminance(rgb) -> float:
  """WCAG 2 relative luminance of an sRGB colour (components 0-1)."""
  c = np.asarray(rgb, np.float64)
  linear = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
  return float(linear @ [0.2126, 0.7152, 0.0722])


def contrast_ratio(a, b) -> float:
  """WCAG 2 contrast ratio of two sRGB colours (components 0-1): 1 to 21."""
  la, lb = sorted((relative_luminance(a), relative_luminance(b)), reverse=True)
  return (la + 0.05) / (lb + 0.05)


def outline_contrast(concept: int, background) -> float:
  """How well a concept's outline (its colour inside the black HALO) stands out from a
  `background` colour: the better of the two contrasts."""
  colour = COLOURS[int(concept) % len(COLOURS)]
  return max(contrast_ratio(colour, background), contrast_ratio(HALO, background))


def _pixel_map(concept_map: np.ndarray, size: int) -> np.ndarray:
  rows = (np.arange(size) * concept_map.shape[0]) // size
  cols = (np.arange(size) * concept_map.shape[1]) // size
  return np.asarray(concept_map)[rows][:, cols]


def _halo(width: float):
  from matplotlib import patheffects  # lazy: matplotlib loads when a figure is drawn

  return [patheffects.withStroke(linewidth=width, foreground=HALO), patheffects.Normal()]


def concept_label_box(concept: int) -> dict:
  """A concept's label: black text on its colour, black edge (contrast >= 8:1 inside, the
  edge against the object)."""
  colour = COLOURS[int(concept) % len(COLOURS)]
  return dict(boxstyle="round,pad=0.2", facecolor=colour, edgecolor=HALO, linewidth=0.8)


def draw_concepts(ax, image: np.ndarray, pixels: np.ndarray) -> None:
  """The image with each concept's region outlined (its colour on a black halo) and its id in
  a box of its colour at the region's centre of mass; the object keeps its own colours."""
  ax.imshow(image)
  for c in np.unique(pixels[pixels >= 0]):
    mask = (pixels == c).astype(np.float32)
    # Padded so that a region touching the border is closed by its outline.
    padded = np.pad(mask, 1)
    grid = np.arange(-1, mask.shape[0] + 1)
    contour = ax.contour(
      np.arange(-1, mask.shape[1] + 1),
      grid,
      padded,
      levels=[0.5],
      colors=[COLOURS[c % len(COLOURS)]],
    )
    contour.set_linewidth(1.6)
    contour.set_path_effects(_halo(3.6))
    rows, cols = np.nonzero(mask)
    ax.text(
      cols.mean(),
      rows.mean(),
      str(int(c)),
      fontsize=7,
      fontweight="bold",
      color="black",
      ha="center",
      va="center",
      bbox=concept_label_box(c),
    )
  ax.set_xlim(-0.5, image.shape[1] - 0.5)
  ax.set_ylim(image.shape[0] - 0.5, -0.5)
  ax.set_axis_off()


def draw_captions(ax, caption, step: float, indent: float, gap: float = 0.0) -> None:
  """Each concept's number in a box of its colour, then its text lines beside it, top down in
  axes coordinates (`caption`: [(concept id, [line, ...])]; `step` per line, `gap` after each
  concept). Black on the white page; the numbered box ties the lines to the concept's outline."""
  y = 1.0
  for concept, lines in caption:
    ax.text(
      0.0,
      y,
      str(concept),
      fontsize=7,
      fontweight="bold",
      va="top",
      bbox=concept_label_box(concept),
      transform=ax.transAxes,
    )
    for line in lines:
      ax.text(indent, y, line, fontsize=7, color="black", va="top", transform=ax.transAxes)
      y -= step
    y -= gap


def wrapped(text: str, width: int) -> list[str]:

  return textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False) or [""]


def column_lines(items: Sequence[str], width: int, room: int) -> list[str]:
  """A column of descriptors as text lines: each wrapped at `width` characters, and once
  `room` lines are used, the rest counted on a last line (the per-image JSON has them all)."""
  lines: list[str] = []
  for k, text in enumerate(items):
    item_lines = wrapped(text, width)
    if len(lines) + len(item_lines) > (room if k == len(items) - 1 else room - 1):
      lines.append(f"... and {len(items) - k} more (per-image JSON)")
      break
    lines += item_lines
  return lines


def _suptitle(model: str, text: str) -> str:
  return f"{model}: {text}" if model else text


def plot_concepts(
  path: str, images: np.ndarray, records, method: str, refined=None, model: str = ""
) -> None:
  """Fig. 4: each image with its visual concepts outlined and numbered, and each concept's
  descriptors listed below it (wrapped; the figure grows to hold every line)."""
  plt = pyplot()
  n = len(records)
  width = 46  # characters per caption line in a 3.2-inch panel at 7 pt
  captions = []
  for record in records:
    m = record["methods"][method]
    captions.append(
      [
        (c["concept"], wrapped(", ".join(c["descriptors"]), width))
        for c in m["concepts"]
        if c["descriptors"]
      ]
    )
  lines = max([sum(len(w) for _, w in cap) for cap in captions] + [1])
  line_h = 0.16  # inches per caption line
  text_h = 0.25 + line_h * lines
  fig = plt.figure(figsize=(3.2 * n, 3.2 + 0.55 + text_h))
  grid = fig.add_gridspec(2, n, height_ratios=[3.2, text_h], hspace=0.05, wspace=0.08)
  for k, (image, record, caption) in enumerate(zip(images, records, captions)):
    m = record["methods"][method]
    pixels = _pixel_map(np.array(m["concept_map"]), image.shape[0])
    if refined is not None:
      pixels = np.where(refined[k], pixels, -1)
    ax = fig.add_subplot(grid[0, k])
    draw_concepts(ax, image, pixels)
    ax.set_title(f"true: {record['class_name']}\npred: {record['predicted_name']}", fontsize=8)
    text_ax = fig.add_subplot(grid[1, k])
    text_ax.set_axis_off()
    draw_captions(text_ax, caption, step=line_h / text_h, indent=0.09)
  fig.suptitle(
    _suptitle(model, f"visual concepts ({concept_methods.title(method)}) and their descriptors"),
    fontsize=9,
  )
  fig.subplots_adjust(left=0.02, right=0.98, top=1 - 0.5 / fig.get_figheight(), bottom=0.01)
  save_figure(fig, path, dpi=120)
  plt.close(fig)


def plot_curves(
  path: str, curves: Mapping[str, Sequence[float]], title: str = "", model: str = ""
) -> None:
  """MI curves (MI after removing the t most important visual descriptors) of one class or the
  dataset, one per concept method (keys: method names or labels)."""
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(5, 3.6))
  for label, curve in curves.items():
    curve = np.asarray(curve)
    ax.plot(
      np.arange(len(curve)),
      curve,
      marker="o",
      ms=3,
      label=f"{concept_methods.title(label)} concepts (AUC {information.curve_auc(curve):.2f})",
    )
  ax.set_xlabel("visual descriptors removed")
  ax.set_ylabel("MI (nats)")
  ax.set_title(
    "MI curves" + (f" ({model})" if model else "") + (f": {title}" if title else ""), fontsize=9
  )
  ax.legend(fontsize=7)
  fig.tight_layout()
  save_figure(fig, path, dpi=120)
  plt.close(fig)


def plot_mutual(path: str, image: np.ndarray, record, method: str, model: str = "") -> None:
  """Fig. 6: the image, its vision-side, language-side and mutual descriptors."""
  plt = pyplot()
  m = record["methods"][method]
  mutual = set(m["mutual_descriptors"])
  vision = [d for d in m["visual_descriptors"] if d not in mutual]
  language = [d for d in m["language_descriptors"] if d not in mutual]
  fig, axes = plt.subplots(1, 4, figsize=(12, 3.8), gridspec_kw=dict(width_ratios=[1, 1.2, 1, 1.2]))
  axes[0].imshow(image)
  axes[0].set_title(f"true: {record['class_name']}\npred: {record['predicted_name']}", fontsize=8)
  columns = [
    ("vision only", vision, "tab:blue"),
    ("mutual", sorted(mutual), "tab:purple"),
    ("language only", language, "tab:red"),
  ]
  for ax, (title, items, colour) in zip(axes[1:], columns):
    ax.set_title(f"{title} ({len(items)})", fontsize=9, color=colour)
    lines = column_lines(items, width=34, room=18)
    for j, text in enumerate(lines):
      ax.text(
        0.02, 0.95 - 0.05 * j, text, fontsize=7, color=colour, va="top", transform=ax.transAxes
      )
  for ax in axes:
    ax.set_axis_off()
  fig.suptitle(
    _suptitle(
      model, f"{concept_methods.title(method)} concepts: MI {m['mi']:.2f}, AUC {m['auc']:.2f}"
    ),
    fontsize=9,
  )
  fig.tight_layout()
  save_figure(fig, path, dpi=120)
  plt.close(fig)


def plot_ot_diversity(
  path: str, image: np.ndarray, record, method: str, refined=None, model: str = ""
) -> None:
  """App. A.2's Fig. 2 (optimal transport diversifies the textual concepts across the visual
  ones): the image twice with its visual concepts outlined and numbered; under the left copy
  each concept's descriptors chosen without OT (each concept its own top descriptors), under the
  right copy those chosen with OT, as the analysis keeps them. A descriptor that two or more
  concepts share is starred; the titles give the image's entropy of the choice (App. A.2's
  metric, nats) each way. Needs a record with `descriptors_without_ot` (report.image_records)."""
  plt = pyplot()
  m = record["methods"][method]
  pixels = _pixel_map(np.array(m["concept_map"]), image.shape[0])
  if refined is not None:
    pixels = np.where(refined, pixels, -1)
  width = 40
  sides = [
    ("w/o optimal transport", "descriptors_without_ot", m["entropy_without_ot"]),
    ("w/ optimal transport", "descriptors", m["entropy"]),
  ]
  captions = []
  for _, key, _ in sides:
    chosen = [(c["concept"], list(c[key])) for c in m["concepts"] if c.get(key)]
    counts: dict[str, int] = {}
    for _, ds in chosen:
      for d in set(ds):
        counts[d] = counts.get(d, 0) + 1
    captions.append(
      [
        (k, wrapped(", ".join(f"{d}*" if counts[d] > 1 else d for d in ds), width))
        for k, ds in chosen
      ]
    )
  lines = max([sum(len(w) for _, w in cap) for cap in captions] + [1])
  line_h = 0.16
  text_h = 0.35 + line_h * lines
  fig = plt.figure(figsize=(7.0, 3.2 + 0.7 + text_h))
  grid = fig.add_gridspec(2, 2, height_ratios=[3.2, text_h], hspace=0.05, wspace=0.08)
  for k, ((title, _, entropy), caption) in enumerate(zip(sides, captions)):
    ax = fig.add_subplot(grid[0, k])
    draw_concepts(ax, image, pixels)
    ax.set_title(f"{title}\nentropy {entropy:.2f} nats", fontsize=8)
    text_ax = fig.add_subplot(grid[1, k])
    text_ax.set_axis_off()
    draw_captions(text_ax, caption, step=line_h / text_h, indent=0.1)
  fig.suptitle(
    _suptitle(
      model,
      f"{record['class_name']}: {concept_methods.title(method)} concepts' descriptors without and with "
      "optimal transport\n(* shared by several concepts)",
    ),
    fontsize=9,
  )
  fig.subplots_adjust(left=0.02, right=0.98, top=1 - 0.55 / fig.get_figheight(), bottom=0.01)
  save_figure(fig, path, dpi=120)
  plt.close(fig)


def shared_concept(records, method: str, top: int = 3) -> tuple[int, list[str]] | None:
  """The concept a class's images share most (Fig. 5, right): concepts are fitted jointly over
  the B images, so one id is one semantic part across them. The id present in the most images
  (ties: the most patches, then the lower id), with its `top` most frequent descriptors over
  those images (ties: first seen). None when no image has a concept with descriptors."""
  images: dict[int, int] = {}
  patches: dict[int, int] = {}
  counts: dict[int, dict[str, int]] = {}
  for record in records:
    for c in record["methods"][method]["concepts"]:
      if not c["descriptors"]:
        continue
      k = int(c["concept"])
      images[k] = images.get(k, 0) + 1
      patches[k] = patches.get(k, 0) + int(c["patches"])
      for d in c["descriptors"]:
        counts.setdefault(k, {})[d] = counts.setdefault(k, {}).get(d, 0) + 1
  if not images:
    return None
  chosen = min(images, key=lambda k: (-images[k], -patches[k], k))
  ranked = sorted(counts[chosen].items(), key=lambda item: -item[1])  # stable: first seen first
  return chosen, [d for d, _ in ranked[:top]]


def plot_classes(path: str, classes: Sequence[Mapping[str, Any]], method: str, model: str = ""):
  """Fig. 5: several classes analysed together. Left: each class's MI curve (the mean over its
  B images, zero-padded) overlaid, with its AUC in the legend; right: per class, its first
  images with the concept they share most (`shared_concept`) outlined, and that concept's most
  frequent descriptors under them.

  Args:
    classes: per class a mapping with name (str), curve (float [T]), images (uint8
      [k, S, S, 3]), records (its k image records) and refined (bool [k, S, S] or None: the
      CRF-refined foreground that clips the concept regions, as in `plot_concepts`).
  """
  plt = pyplot()
  n = len(classes)
  k = max([len(c["images"]) for c in classes] + [1])
  fig = plt.figure(figsize=(5.2 + 1.9 * k, max(4.0, 2.35 * n + 0.7)))
  grid = fig.add_gridspec(n, k + 1, width_ratios=[2.7] + [1] * k, hspace=0.55, wspace=0.06)
  curves_ax = fig.add_subplot(grid[:, 0])
  for c in classes:
    curve = np.asarray(c["curve"])
    auc = information.curve_auc(curve)
    curves_ax.plot(np.arange(len(curve)), curve, marker="o", ms=3, label=f"{c['name']} ({auc:.2f})")
  curves_ax.set_xlabel("visual descriptors removed")
  curves_ax.set_ylabel("MI (nats), mean over the class's images")
  curves_ax.set_title("MI curves per class (legend: AUC)", fontsize=9)
  curves_ax.legend(fontsize=7)
  for row, c in enumerate(classes):
    shared = shared_concept(c["records"], method)
    for col in range(k):
      ax = fig.add_subplot(grid[row, col + 1])
      ax.set_axis_off()
      if col >= len(c["images"]):
        continue
      image = c["images"][col]
      m = c["records"][col]["methods"][method]
      pixels = _pixel_map(np.array(m["concept_map"]), image.shape[0])
      if c.get("refined") is not None:
        pixels = np.where(c["refined"][col], pixels, -1)
      keep = shared[0] if shared is not None else -2
      draw_concepts(ax, image, np.where(pixels == keep, pixels, -1))
      if col == 0:
        what = f"concept {shared[0]}" if shared is not None else "no concept with descriptors"
        ax.set_title(f"{c['name']}: {what}", fontsize=8, loc="left")
        if shared is not None:
          ax.text(
            0.0,
            -0.04,
            "\n".join(wrapped("; ".join(shared[1]), 30 * k)),
            fontsize=7,
            va="top",
            transform=ax.transAxes,
          )
  fig.suptitle(
    _suptitle(model, f"{concept_methods.title(method)} concepts across classes (Fig. 5)"),
    fontsize=9,
  )
  fig.subplots_adjust(left=0.07, right=0.99, top=1 - 0.55 / fig.get_figheight(), bottom=0.1)
  save_figure(fig, path, dpi=120)
  plt.close(fig)


def plot_perturbation_steps(
  path: str,
  deletion_images: np.ndarray,
  insertion_images: np.ndarray,
  deletion_scores: Sequence[float],
  insertion_scores: Sequence[float],
  title: str = "",
) -> None:
  """App. E's Fig. 7 for one image: the deletion steps (top row: the concepts blurred one more
  at a time, most important first) and the insertion steps (bottom row: restored one more at a
  time into the blurred image), left; the predicted class's score after each step, right, with
  each curve's area (the Table 1 number of this image) in the legend.

  Args:
    deletion_images, insertion_images: [T, S, S, 3], uint8 or float in [0, 1] (T = L + 1
      steps, step 0 before any change).
    deletion_scores, insertion_scores: float [T], the class score after each step.
  """
  plt = pyplot()
  steps = len(deletion_images)
  fig = plt.figure(figsize=(1.6 * steps + 5.2, 4.2))
  # An empty column before the curves keeps their axis label off the last step's image.
  grid = fig.add_gridspec(2, steps + 2, width_ratios=[1] * steps + [0.45, 2.6], wspace=0.08)
  for row, (images, name) in enumerate(
    ((deletion_images, "deletion"), (insertion_images, "insertion"))
  ):
    for t, image in enumerate(images):
      ax = fig.add_subplot(grid[row, t])
      ax.imshow(
        np.clip(np.asarray(image, np.float32) / (255.0 if image.dtype == np.uint8 else 1.0), 0, 1)
      )
      ax.set_axis_off()
      ax.set_title(f"{name}: step {t}" if t == 0 else f"step {t}", fontsize=7)
  ax = fig.add_subplot(grid[:, steps + 1])
  for scores, name, style in (
    (deletion_scores, "deletion", "-"),
    (insertion_scores, "insertion", "--"),
  ):
    scores = np.asarray(scores, np.float64)
    area = float(0.5 * (scores[1:] + scores[:-1]).sum())  # mutual.xai.curve_auc's trapezoid
    ax.plot(
      np.arange(len(scores)), scores, style, marker="o", ms=4, label=f"{name} (area {area:.2f})"
    )
  ax.set_xlabel("concepts blurred (deletion) / restored (insertion)")
  ax.set_ylabel("predicted class's score (scaled cosine)", fontsize=8)
  ax.set_title("score per step", fontsize=9)
  ax.legend(fontsize=7)
  fig.suptitle(title or "Deletion and insertion steps (App. E, Fig. 7)", fontsize=9)
  fig.subplots_adjust(left=0.02, right=0.98, top=0.85, bottom=0.13)
  save_figure(fig, path, dpi=120)
  plt.close(fig)


def plot_feature_maps(path: str, rows: Sequence[Mapping[str, Any]], title: str = "") -> None:
  """App. D.2's Fig. 6: per image (a row), the image and its feature activation maps, the channel
  of largest spatial norm first (the main object, framed) and then the concepts, each map
  normalised to [0, 1] and shown where it reaches the threshold, titled by its channel and
  labelled below by the concept labeler's most likely descriptor.

  Args:
    rows: per image, a dict: image uint8 [S, S, 3]; caption (the image's class); channels int
      [K]; maps float [K, h, w] in [0, 1]; regions bool [K, h, w]; valid bool [K]; labels [K]
      str (the labeler's descriptors); threshold float.
  """
  plt = pyplot()
  count = max(len(r["channels"]) for r in rows)
  fig, axes = plt.subplots(
    len(rows),
    count + 1,
    figsize=(1.8 * (count + 1), 2.1 * len(rows) + 1.0),
    squeeze=False,
    layout="constrained",
  )
  for axs, r in zip(axes, rows):
    image = np.asarray(r["image"], np.uint8)
    size = image.shape[0]
    axs[0].imshow(image)
    axs[0].set_title("\n".join(wrapped(r.get("caption", ""), 24)[:2]), fontsize=7)
    for k, ax in enumerate(axs[1:]):
      if k >= len(r["channels"]):
        ax.set_axis_off()
        continue
      grid = np.asarray(r["maps"][k], np.float32)
      scale = np.ones((size // grid.shape[0], size // grid.shape[1]), np.float32)
      values = np.kron(grid, scale)
      shown = np.kron(np.asarray(r["regions"][k], np.float32), scale) > 0
      ax.imshow(image, alpha=0.35)
      ax.imshow(
        np.ma.masked_where(~shown, values),
        cmap="plasma",
        vmin=float(r["threshold"]),
        vmax=1.0,
        interpolation="nearest",
      )
      ax.set_title(f"neuron {int(r['channels'][k])}" + (" (object)" if k == 0 else ""), fontsize=7)
      label = r["labels"][k] if r["valid"][k] else "(no region)"
      ax.set_xlabel("\n".join(wrapped(label, 24)[:2]), fontsize=7)
      if k == 0:
        for spine in ax.spines.values():
          spine.set_edgecolor("tab:red")
          spine.set_linewidth(2)
    for ax in axs:
      ax.set_xticks([])
      ax.set_yticks([])
  title = title or "Feature activation maps (App. D.2, Fig. 6)"
  fig.suptitle("\n".join(w for part in title.split("\n") for w in wrapped(part, 150)), fontsize=9)
  save_figure(fig, path, dpi=120)
  plt.close(fig)
