"""One image explained by the mutual-knowledge analysis: the library behind
`python -m mutual.explain` (the authors' notebook, which explains one photo, as a command).

Each image goes through the whole analysis on its own (`pipeline.analyze_class` with B = 1): its
own foreground split and concept fits, the visual prompts, the descriptors chosen per concept by
optimal transport, the predicted class's language-side descriptors, the MI and its curve. The
classes that compete for the prediction and the descriptor bank are a config's (the embedded
world's by default) or a descriptor file's (`class_bank`).

- `image_files`: the `--image` values as image files (a folder gives its images);
- `check_files`, `read_images`: every file checked before the model loads, then sized for it;
- `explain`: one `Explanation` per image (the per-image record `mutual.report.image_records`
  writes, the prediction's ranking, the image and its refined foreground);
- `plot`: one figure per image: per concept method a row with the concepts outlined as Fig. 4
  draws them, their descriptors, Fig. 6's vision / mutual / language columns and the MI curve;
- `summary`: the prediction and the top concepts, on one screen; `payload`: the same as JSON.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Sequence

import numpy as np

from mutual import concept_methods, data, descriptors, information, pipeline, report
from stori_jax.data import images as image_io
from stori_jax.plumbing import paths
from stori_jax.plumbing.errors import InputError
from stori_jax.plumbing.plotting import pyplot, save_figure

#: File endings taken as images when a folder is given.
IMAGE_ENDINGS = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff")
#: Classes listed after the prediction (by cosine with the image).
RUNNERS_UP = 3


@dataclasses.dataclass(frozen=True)
class Explanation:
  """One image's analysis.

  Attributes:
    source: the image file as given.
    image: uint8 [S, S, 3], the model's input (shorter side resized, centre-cropped).
    refined: bool [S, S], the refined foreground the concepts are drawn on.
    pixel_maps: {method: int [S, S]} the concept of each pixel (-1: none).
    record: the per-image record (`mutual.report.image_records`, without the fields of a
      labelled dataset: the image has no true class).
    ranking: [(class name, cosine)] the predicted class first, then the runners-up.
  """

  source: str
  image: np.ndarray
  refined: np.ndarray
  pixel_maps: Mapping[str, np.ndarray]
  record: Mapping[str, Any]
  ranking: Sequence[tuple[str, float]]

  @property
  def predicted(self) -> str:
    return self.ranking[0][0]


def image_files(sources: Sequence[str]) -> list[str]:
  """The image files that `--image` values name: a file as given, a folder's files with an
  image ending (sorted by name). A missing path or a folder without images is an InputError."""
  found: list[str] = []
  for source in sources:
    if paths.isdir(source):
      inside = sorted(
        paths.join(source, name)
        for name in paths.listdir(source)
        if name.lower().endswith(IMAGE_ENDINGS) and not name.startswith(".")
      )
      if not inside:
        raise InputError(
          f"The folder {source} holds no image file (endings {', '.join(IMAGE_ENDINGS)}), so "
          "there is nothing to explain. Name an image file, or a folder of images, with --image."
        )
      found += inside
    elif not paths.exists(source):
      raise InputError(
        f"The image {source} does not exist. Check the path given to --image (an image file "
        "or a folder of images)."
      )
    else:
      found.append(source)
  return found


def check_files(files: Sequence[str]) -> None:
  """Every file checked, before the model loads, without decoding it (its header and last
  bytes): one paragraph naming each file that is not a readable image."""
  image_io.check_images([(f, f) for f in files], what="images given with --image")


def read_images(files: Sequence[str], image_size: int) -> np.ndarray:
  """uint8 [N, S, S, 3], S = `image_size`: each file (checked by `check_files`) resized and
  centre-cropped as CLIP's preprocessing does."""
  return np.stack([image_io.model_input(f, image_size, where=f) for f in files])


def class_bank(
  config, descriptor_file: str | None = None, classes: Sequence[str] | None = None
) -> tuple[list[str], list[list[str]], list[str]]:
  """The classes that compete for the prediction and the descriptor bank: (class names, each
  class's descriptors, the bank D).

  With `descriptor_file` (Menon & Vondrick's JSON, {class: [descriptors]}): its classes, or
  the subset `classes` in that order, and their unique descriptors. Otherwise config.data's
  (the embedded world's 12 classes and its vocabulary by default); no image of it is read.
  """
  if descriptor_file:
    per_class = data.load_descriptors(descriptor_file)
    if classes:
      unknown = [c for c in classes if c not in per_class]
      if unknown:
        raise InputError(
          f"{len(unknown)} of the classes given with --classes are not in the descriptor file "
          f"{descriptor_file}: {', '.join(repr(c) for c in unknown[:10])}. Spell each class as "
          "the descriptor file does (its keys), or leave --classes out to use all of them."
        )
      per_class = {c: per_class[c] for c in classes}
    return (
      list(per_class),
      [list(v) for v in per_class.values()],
      descriptors.unique_descriptors(per_class),
    )
  dataset = data.prepare(config)
  names, lists = list(dataset.names), dataset.lists()
  if classes:
    unknown = [c for c in classes if c not in names]
    if unknown:
      raise InputError(
        f"{len(unknown)} of the classes given with --classes are not classes of the config "
        f"{config.get('name', '')}: {', '.join(repr(c) for c in unknown[:10])}. Its classes "
        f"are: {', '.join(names)}."
      )
    chosen = [names.index(c) for c in classes]
    names, lists = [names[i] for i in chosen], [lists[i] for i in chosen]
  return names, lists, pipeline.bank_descriptors(config, dataset.descriptors)


class _Unlabelled:
  """One image as `report.image_records` reads a class: no true label."""

  def __init__(self, name: str):
    self.label, self.name, self.ids = -1, "", (name,)


#: What a labelled dataset's record holds that an image given alone has not.
_LABEL_FIELDS = ("label", "class_name", "correct")


def explain(
  bundle,
  images: np.ndarray,
  sources: Sequence[str],
  bank: pipeline.TextBank,
  analysis,
  methods: Sequence[str],
) -> list[Explanation]:
  """Each image analysed on its own (B = 1: its own foreground split and concept fits).

  Args:
    bundle: a CLIPBundle; images: uint8 [N, S, S, 3] at its input size; sources: N names.
    bank: the encoded classes and descriptors; analysis: config.analysis; methods: concept
      methods (config.analysis.methods).
  """
  out = []
  for image, source in zip(images, sources):
    result = pipeline.analyze_class(bundle, image[None], bank, analysis, methods)
    record = report.image_records(
      _Unlabelled(os.path.basename(source)), result, bank.descriptors, bank.class_names, methods
    )[0]
    for field in _LABEL_FIELDS:
      record.pop(field)
    scores = np.asarray(result["class_scores"][0])
    order = np.argsort(-scores, kind="stable")[: 1 + RUNNERS_UP]
    out.append(
      Explanation(
        source=source,
        image=image,
        refined=np.asarray(result["refined"][0]),
        pixel_maps={m: np.asarray(result[m]["pixel_maps"][0]) for m in methods},
        record=record,
        ranking=[(bank.class_names[int(i)], float(scores[i])) for i in order],
      )
    )
  return out


def payload(explanation: Explanation, model: str) -> dict[str, Any]:
  """The JSON of one explanation: the image, the model, the ranking and the per-image record."""
  return dict(
    image=explanation.source,
    model=model,
    ranking=[dict(class_name=n, cosine=round(s, 6)) for n, s in explanation.ranking],
    **explanation.record,
  )


def summary(explanation: Explanation, methods: Sequence[str], top: int = 3) -> str:
  """A few lines: the prediction with its runners-up, then per method the MI and AUC, the
  concepts with their descriptors and the mutual descriptors (at most `top` of each)."""
  (name, score), *rest = explanation.ranking
  others = ", ".join(f"{n} {s:.3f}" for n, s in rest)
  lines = [
    f"{explanation.source}: predicted {name!r} (cosine {score:.3f}"
    + (f"; then {others})" if others else ")")
  ]
  for method in methods:
    m = explanation.record["methods"][method]
    lines.append(
      f"  {concept_methods.title(method)} concepts: MI {m['mi']:.3f}, "
      f"AUC {m['auc']:.3f}, {len(m['mutual_descriptors'])} mutual descriptors"
    )
    for concept in m["concepts"]:
      if concept["descriptors"]:
        lines.append(
          f"    concept {concept['concept']} ({concept['patches']} "
          f"patch{'' if concept['patches'] == 1 else 'es'}): "
          + ", ".join(concept["descriptors"][:top])
        )
    if m["mutual_descriptors"]:
      lines.append("    mutual: " + ", ".join(m["mutual_descriptors"][:top]))
  return "\n".join(lines)


def plot(path: str, explanation: Explanation, methods: Sequence[str], model: str = "") -> None:
  """One figure of one image: per concept method a row with the image and its concepts
  outlined (Fig. 4), each concept's descriptors, the vision-only / mutual / language-only
  descriptors (Fig. 6) and the MI curve while the visual descriptors are removed."""
  plt = pyplot()
  rows = len(methods)
  fig = plt.figure(figsize=(19, 3.6 * rows + 0.9))
  grid = fig.add_gridspec(
    rows, 6, width_ratios=[1.1, 1.3, 1.1, 1.1, 1.1, 1.4], wspace=0.12, hspace=0.35
  )
  for row, method in enumerate(methods):
    m = explanation.record["methods"][method]
    title = concept_methods.title(method)
    ax = fig.add_subplot(grid[row, 0])
    report.draw_concepts(ax, explanation.image, explanation.pixel_maps[method])
    ax.set_title(f"{title} concepts", fontsize=9)
    ax = fig.add_subplot(grid[row, 1])
    ax.set_axis_off()
    ax.set_title("their descriptors (optimal transport)", fontsize=9)
    caption = [
      (c["concept"], report.wrapped(", ".join(c["descriptors"]), 38))
      for c in m["concepts"]
      if c["descriptors"]
    ]
    report.draw_captions(ax, caption, step=0.065, indent=0.1, gap=0.02)
    mutual = set(m["mutual_descriptors"])
    columns = [
      ("vision only", [d for d in m["visual_descriptors"] if d not in mutual], "tab:blue"),
      ("mutual", [d for d in m["visual_descriptors"] if d in mutual], "tab:purple"),
      ("language only", [d for d in m["language_descriptors"] if d not in mutual], "tab:red"),
    ]
    for k, (heading, items, colour) in enumerate(columns):
      ax = fig.add_subplot(grid[row, 2 + k])
      ax.set_axis_off()
      ax.set_title(f"{heading} ({len(items)})", fontsize=9, color=colour)
      lines = report.column_lines(items, width=30, room=15)
      for j, text in enumerate(lines):
        ax.text(
          0.0, 0.97 - 0.062 * j, text, fontsize=7, color=colour, va="top", transform=ax.transAxes
        )
    ax = fig.add_subplot(grid[row, 5])
    curve = np.asarray(m["curve"])
    ax.plot(
      np.arange(len(curve)),
      curve,
      marker="o",
      ms=3,
      color="tab:purple",
      label=f"MI {m['mi']:.2f}, AUC {information.curve_auc(curve):.2f}",
    )
    ax.set_xlabel("visual descriptors removed (most important first)", fontsize=8)
    ax.set_ylabel("MI (nats)", fontsize=8)
    ax.set_title("mutual information", fontsize=9)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7)
  (name, score), *_ = explanation.ranking
  heading = f"{os.path.basename(explanation.source)}: predicted {name!r} (cosine {score:.3f})"
  fig.suptitle(f"{model}: {heading}" if model else heading, fontsize=10)
  fig.subplots_adjust(left=0.02, right=0.99, top=1 - 0.85 / fig.get_figheight(), bottom=0.1)
  save_figure(fig, path, dpi=110)
  plt.close(fig)
