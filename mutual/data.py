"""Data for the mutual-knowledge analysis: classes, their images, and the descriptor bank.

Sources (config.data.source):
  - "synthetic": the embedded attribute world (`stori_jax.data.synthetic_tasks`): its 12 few-shot
    classes, fresh images per class, and its descriptor bank with known attributes (offline).
  - "folder": an image folder `<root>/<class folder>/<images>` (ImageNet val arranged by wnid,
    Places365 val, Food101 ...); classes are the sorted folder names, named by the descriptor
    file's keys in their order (Menon & Vondrick's files list ImageNet's classes in label order)
    or by a CoOp `classnames.txt` (`<wnid> <name>` per line).
  - "tfds": a prepared TFDS dataset's evaluation split ("imagenet2012", "places365_small",
    "food101"); labels are named like the folder's classes.
Descriptors: Menon & Vondrick's JSON {class name: [descriptor, ...]}. They carry no licence and
are never shipped: `download_descriptors` fetches them where the network allows; a missing file
stops with a message naming the URL and where to put it.

Images are yielded class by class as uint8 [B, S, S, 3] at the model's input size (resize of the
shorter side and centre crop, bicubic, as CLIP's preprocessing).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Iterator, Mapping, Sequence

import numpy as np

from stori_jax.data import synthetic, synthetic_tasks
from stori_jax.data.download import fetch_json
from stori_jax.fewshot.datasets import (
  DatasetMissingError,
  _import_tfds,
  open_image,
  read_classnames_txt,
)
from stori_jax.preprocess import resize_center_crop

DESCRIPTORS_REPOSITORY = "https://github.com/sachit-menon/classify_by_description_release"
_DESCRIPTORS_RAW = (
  "https://raw.githubusercontent.com/sachit-menon/classify_by_description_release/HEAD/descriptors/"
)
#: dataset -> Menon & Vondrick's descriptor file name.
DESCRIPTOR_FILES = {
  "imagenet": "descriptors_imagenet.json",
  "places365": "descriptors_places365.json",
  "food101": "descriptors_food101.json",
}
#: Seed stream of the synthetic world's analysis images (disjoint from pretraining's (0, k) and
#: the evaluation's (2024, k) namespaces).
SYNTHETIC_STREAM = 2025

_IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")


@dataclasses.dataclass(frozen=True)
class ClassImages:
  """The images of one class.

  Attributes:
    label: the class index; name: its name.
    images: uint8 [B, S, S, 3].
    ids: B image identifiers (file names, or "synthetic/<class>/<i>").
    truth: for the synthetic world, the SyntheticBatch with masks and attributes; else None.
  """

  label: int
  name: str
  images: np.ndarray
  ids: tuple[str, ...]
  truth: synthetic.SyntheticBatch | None = None


# ---------------------------------------------------------------------------------------------
# Descriptors.


def descriptors_url(dataset: str) -> str:
  """The raw GitHub URL of Menon & Vondrick's descriptor file for `dataset`."""
  if dataset not in DESCRIPTOR_FILES:
    raise ValueError(f"no known descriptor file for {dataset!r}; known: {sorted(DESCRIPTOR_FILES)}")
  return _DESCRIPTORS_RAW + DESCRIPTOR_FILES[dataset]


def _missing_message(path: str, dataset: str | None) -> str:
  path = os.path.abspath(path)
  if dataset in DESCRIPTOR_FILES:
    where = f"Download {descriptors_url(dataset)}"
    helper = (
      f', or run `python -c "from mutual.data import download_descriptors; '
      f"download_descriptors('{dataset}', '{os.path.dirname(path)}')\"` where the network allows"
    )
  else:
    where = f"Download the dataset's descriptors_<dataset>.json from {DESCRIPTORS_REPOSITORY} (folder descriptors/)"
    helper = ""
  return (
    f"Descriptor file {path} does not exist. {where} and put it at {path}{helper}. "
    "The file has no licence, so it is not shipped with this project."
  )


def _validated(descriptors, where: str) -> dict[str, list[str]]:
  if (
    not isinstance(descriptors, dict)
    or not descriptors
    or not all(
      isinstance(k, str) and isinstance(v, list) and v and all(isinstance(s, str) for s in v)
      for k, v in descriptors.items()
    )
  ):
    raise ValueError(
      f"{where} is not a descriptor file: expected a non-empty JSON object "
      "{class name: [descriptor, ...]} with at least one descriptor per class."
    )
  return descriptors


def load_descriptors(path: str | os.PathLike, dataset: str | None = None) -> dict[str, list[str]]:
  """Menon & Vondrick's descriptors {class name: [descriptor, ...]}, in the file's order.

  Raises:
    DatasetMissingError: the file is missing (the message names the URL and where to put it).
    ValueError: the file does not have that layout.
  """
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise DatasetMissingError(_missing_message(path, dataset))
  with open(path, encoding="utf-8") as f:
    return _validated(json.load(f), path)


def download_descriptors(
  dataset: str, directory: str | os.PathLike, *, url: str | None = None, timeout: float = 30.0
) -> str:
  """Fetches `dataset`'s descriptor file into `directory` (kept if present); returns its path.

  Raises:
    DatasetMissingError: the download failed; the message says what to fetch by hand.
  """
  path = os.path.join(
    os.fspath(directory), DESCRIPTOR_FILES.get(dataset, f"descriptors_{dataset}.json")
  )
  url = url or descriptors_url(dataset)
  return fetch_json(
    url,
    path,
    validate=_validated,
    on_error=lambda error: DatasetMissingError(
      f"Could not download {url} ({error}). " + _missing_message(path, dataset)
    ),
    timeout=timeout,
  )


# ---------------------------------------------------------------------------------------------
# The synthetic world.


def synthetic_descriptors() -> dict[str, list[str]]:
  """The synthetic world's descriptor bank, {class name: descriptors} like a Menon file."""
  return synthetic_tasks.descriptor_bank(synthetic_tasks.FEWSHOT_CLASSES)


def synthetic_classes(
  images_per_class: int, seed: int = 0, image_size: int = 64, classes: Sequence[int] | None = None
) -> Iterator[ClassImages]:
  """The synthetic few-shot classes' images, class by class, with ground truth."""
  specs = synthetic_tasks.FEWSHOT_CLASSES
  for label in classes if classes is not None else range(len(specs)):
    spec = specs[label]
    batch = synthetic.generate_with(
      images_per_class,
      (SYNTHETIC_STREAM, seed, label),
      image_size=image_size,
      **spec.attributes(),
    )
    ids = tuple(f"synthetic/{spec.name}/{i}" for i in range(images_per_class))
    yield ClassImages(label, spec.name, batch.images, ids, batch)


def descriptor_hits(truth: synthetic.SyntheticBatch, descriptors: Sequence[str], ids, valid):
  """How often chosen descriptors name an attribute of the image's object, against chance.

  Args:
    truth: the class's SyntheticBatch (single-object images).
    descriptors: the bank (index -> phrase).
    ids: int [B, N] chosen descriptor indices; valid: bool [B, N].

  Returns:
    (hit rate of the chosen descriptors, chance rate: the bank's fraction of descriptors naming
    one of the object's attributes, averaged over the same picks).
  """
  names = [synthetic_tasks.descriptor_attribute(d) for d in descriptors]
  hits, chance = [], []
  for i in range(len(truth)):
    obj = truth.objects(i)[0]
    own = {(f, getattr(obj, f)) for f in ("colour", "pattern", "shape", "size")}
    named = np.array([n in own for n in names])
    for j in np.flatnonzero(np.asarray(valid[i])):
      hits.append(named[int(ids[i][j])])
      chance.append(named.mean())
  if not hits:
    return 0.0, 0.0
  return float(np.mean(hits)), float(np.mean(chance))


def object_overlap(truth: synthetic.SyntheticBatch, pixel_maps) -> tuple[float, float]:
  """(fraction of concept pixels on an object, the objects' fraction of the image: chance)."""
  on_object = np.asarray(truth.masks) >= 0
  concept = np.asarray(pixel_maps) >= 0
  return float(on_object[concept].mean()) if concept.any() else 0.0, float(on_object.mean())


# ---------------------------------------------------------------------------------------------
# Real datasets.


def class_names_for(descriptors: Mapping[str, Sequence[str]], classnames: str | None, keys):
  """Names of the sorted class keys (wnids or folder names): a CoOp classnames.txt when given,
  else the descriptor file's keys in order (one per class)."""
  keys = list(keys)
  if classnames:
    table = read_classnames_txt(classnames)
    missing = [k for k in keys if k not in table]
    if missing:
      raise ValueError(f"{classnames} names no class {missing[0]!r} (and {len(missing) - 1} more).")
    return [table[k] for k in keys]
  names = list(descriptors)
  if len(names) != len(keys):
    raise ValueError(
      f"{len(keys)} classes in the data but {len(names)} in the descriptor file; pass "
      "config.data.classnames (CoOp's classnames.txt) to name the classes."
    )
  return names


def _as_model_input(source, image_size: int) -> np.ndarray:
  image = resize_center_crop(open_image(source).convert("RGB"), image_size)
  return np.asarray(image, np.uint8)


def folder_classes(
  root: str,
  descriptors: Mapping[str, Sequence[str]],
  image_size: int,
  *,
  classnames: str | None = None,
  images_per_class: int | None = None,
  classes: Sequence[int] | None = None,
) -> tuple[list[str], Iterator[ClassImages]]:
  """An image folder `<root>/<class>/<image>`: (class names, iterator of ClassImages)."""
  if not os.path.isdir(root):
    raise DatasetMissingError(
      f"Image folder {os.path.abspath(root)} does not exist: put the evaluation images there as "
      "<root>/<class folder>/<image files> (ImageNet: the ILSVRC2012 val images from "
      "https://image-net.org sorted into one folder per wnid)."
    )
  keys = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
  names = class_names_for(descriptors, classnames, keys)

  def iterate():
    for label in classes if classes is not None else range(len(keys)):
      folder = os.path.join(root, keys[label])
      files = sorted(f for f in os.listdir(folder) if f.lower().endswith(_IMAGE_EXTENSIONS))
      files = files[:images_per_class] if images_per_class else files
      if not files:
        continue
      images = np.stack([_as_model_input(os.path.join(folder, f), image_size) for f in files])
      yield ClassImages(label, names[label], images, tuple(f"{keys[label]}/{f}" for f in files))

  return names, iterate()


def tfds_classes(
  name: str,
  descriptors: Mapping[str, Sequence[str]],
  image_size: int,
  *,
  data_dir: str | None = None,
  split: str = "validation",
  classnames: str | None = None,
  images_per_class: int | None = None,
  classes: Sequence[int] | None = None,
) -> tuple[list[str], Iterator[ClassImages]]:
  """A prepared TFDS split: (class names, iterator of ClassImages). Nothing is downloaded.

  The split is read once and the chosen classes' encoded images kept in memory (ImageNet val:
  about 6.4 GB for all 1,000 classes; choose `classes` to bound it).
  """
  tfds = _import_tfds()
  builder = tfds.builder(name, data_dir=data_dir)
  if not builder.is_prepared():
    raise DatasetMissingError(
      f"The TFDS dataset {name!r} is not prepared in {builder.data_dir}: run `tfds build {name} "
      f"--data_dir {data_dir or '~/tensorflow_datasets'}` once (imagenet2012 needs the ILSVRC2012 "
      "tars from https://image-net.org in <data_dir>/downloads/manual), or use an image folder."
    )
  raw = list(builder.info.features["label"].names)
  names = class_names_for(descriptors, classnames, raw)
  wanted = set(classes if classes is not None else range(len(raw)))
  kept: dict[int, list] = {c: [] for c in sorted(wanted)}
  dataset = builder.as_dataset(
    split=split, shuffle_files=False, decoders={"image": tfds.decode.SkipDecoding()}
  )
  for index, example in enumerate(tfds.as_numpy(dataset)):
    label = int(example["label"])
    if label in wanted and (not images_per_class or len(kept[label]) < images_per_class):
      kept[label].append((f"{name}/{split}/{index}", bytes(example["image"])))

  def iterate():
    for label, items in kept.items():
      if items:
        images = np.stack([_as_model_input(b, image_size) for _, b in items])
        yield ClassImages(label, names[label], images, tuple(i for i, _ in items))

  return names, iterate()


def load(config, image_size: int):
  """(class names, descriptors {class: [..]}, iterator of ClassImages) for config.data."""
  data = config.data
  if data.source == "synthetic":
    descriptors = synthetic_descriptors()
    names = [c.name for c in synthetic_tasks.FEWSHOT_CLASSES]
    classes = list(data.classes) if data.get("classes") else None
    return (
      names,
      descriptors,
      synthetic_classes(data.images_per_class, data.seed, image_size, classes),
    )
  descriptors = load_descriptors(data.descriptors, data.get("dataset"))
  classes = list(data.classes) if data.get("classes") else None
  per_class = data.get("images_per_class") or None
  if data.source == "folder":
    names, it = folder_classes(
      data.root,
      descriptors,
      image_size,
      classnames=data.get("classnames"),
      images_per_class=per_class,
      classes=classes,
    )
  elif data.source == "tfds":
    names, it = tfds_classes(
      data.tfds_name,
      descriptors,
      image_size,
      data_dir=data.get("root") or None,
      split=data.get("split", "validation"),
      classnames=data.get("classnames"),
      images_per_class=per_class,
      classes=classes,
    )
  else:
    raise ValueError(f"config.data.source must be synthetic, folder or tfds, got {data.source!r}.")
  return names, descriptors, it
