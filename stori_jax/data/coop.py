"""CoOp's datasets (https://github.com/KaiyangZhou/CoOp/blob/main/DATASETS.md): their names,
where CoOp's instructions put them, their split files and class-name files.

`load_coop_split` reads a dataset laid out as CoOp describes: the fixed
`split_zhou_<Name>.json` splits, and for ImageNet `classnames.txt` with the train and val image
folders (val as the test set). `read_classnames_txt` reads CoOp's `classnames.txt`
("<wnid> <class name>" per line), also used to name any folder or label by class.
`tfds_class_names` spells a TFDS dataset's labels as CoOp does.

A missing dataset, split file or class-name file raises `DatasetMissingError` (a
FileNotFoundError) whose message names what to download, from where, and the full path where
it must go.
"""

from __future__ import annotations

import dataclasses
import os
import re
from types import MappingProxyType
from typing import Mapping, Sequence

import numpy as np

from stori_jax.plumbing import paths as storage
from stori_jax.plumbing.config_files import ConfigError
from stori_jax.data.files import (
  ClassMismatchError,
  DatasetMissingError,
  check_no_problems,
  quoted,
  read_json,
  read_text_lines,
)
from stori_jax.data.folders import image_files, subfolders
from stori_jax.data.splits import FewShotSplit, LabeledImage
from stori_jax.plumbing.errors import InputError

COOP_DATASETS_DOC = "https://github.com/KaiyangZhou/CoOp/blob/main/DATASETS.md"

_ALIASES = {
  "imagenet": "imagenet",
  "imagenet2012": "imagenet",
  "ilsvrc2012": "imagenet",
  "dtd": "dtd",
  "describabletextures": "dtd",
  "sun397": "sun397",
  "sun": "sun397",
  "flowers102": "flowers102",
  "oxfordflowers": "flowers102",
  "oxfordflowers102": "flowers102",
  "flowers": "flowers102",
  "caltech101": "caltech101",
  "caltech": "caltech101",
  "food101": "food101",
  "food": "food101",
  "synthetic": "synthetic",
}


def canonical_name(dataset: str) -> str:
  """'DescribableTextures', 'oxford_flowers102', 'food-101', ... -> 'dtd', 'flowers102', ...."""
  key = re.sub(r"[^a-z0-9]", "", dataset.lower())
  if key not in _ALIASES:
    raise ConfigError(
      f"Unknown dataset {dataset!r}; expected one of "
      f"{sorted(set(_ALIASES.values()))} (or a CoOp/TFDS spelling of one)."
    )
  return _ALIASES[key]


@dataclasses.dataclass(frozen=True)
class CoopLayout:
  """Where CoOp's instructions put one dataset under the data root, and where to get it."""

  folder: str  # under root
  image_dir: str  # under root/folder
  split_file: str  # under root/folder; "" for ImageNet (classnames.txt + train/val folders)
  split_url: str  # CoOp's Google Drive link for the split file (ImageNet: classnames.txt)
  images_hint: str  # what to download for the images, where to unpack it ({root}: data root)

  def images_instructions(self, root: str) -> str:
    return self.images_hint.format(root=root)


COOP_LAYOUTS: Mapping[str, CoopLayout] = MappingProxyType(
  {
    "imagenet": CoopLayout(
      "imagenet",
      "images",
      "",
      "https://drive.google.com/file/d/1-61f_ol79pViBFDG_IDlUQSwoLcn2XXF/view?usp=sharing",
      "the ILSVRC2012 training and validation images from https://image-net.org/index.php, "
      "extracted so that {root}/imagenet/images/train/<wnid>/*.JPEG and "
      "{root}/imagenet/images/val/<wnid>/*.JPEG exist (the val images sorted into one folder per "
      "wnid)",
    ),
    "dtd": CoopLayout(
      "dtd",
      "images",
      "split_zhou_DescribableTextures.json",
      "https://drive.google.com/file/d/1u3_QfB467jqHgNXC00UIzbLZRQCg2S7x/view?usp=sharing",
      "https://www.robots.ox.ac.uk/~vgg/data/dtd/download/dtd-r1.0.1.tar.gz, extracted in {root} "
      "(it creates {root}/dtd/images/<class>/*.jpg)",
    ),
    "sun397": CoopLayout(
      "sun397",
      "SUN397",
      "split_zhou_SUN397.json",
      "https://drive.google.com/file/d/1y2RD81BYuiyvebdN-JymPfyWYcd8_MUq/view?usp=sharing",
      "http://vision.princeton.edu/projects/2010/SUN/SUN397.tar.gz, extracted in {root}/sun397 "
      "(it creates {root}/sun397/SUN397/<letter>/<class>/*.jpg)",
    ),
    "flowers102": CoopLayout(
      "oxford_flowers",
      "jpg",
      "split_zhou_OxfordFlowers.json",
      "https://drive.google.com/file/d/1Pp0sRXzZFZq15zVOzKjKBu4A9i01nozT/view?usp=sharing",
      "https://www.robots.ox.ac.uk/~vgg/data/flowers/102/102flowers.tgz, extracted in "
      "{root}/oxford_flowers (it creates {root}/oxford_flowers/jpg/image_*.jpg)",
    ),
    "caltech101": CoopLayout(
      "caltech-101",
      "101_ObjectCategories",
      "split_zhou_Caltech101.json",
      "https://drive.google.com/file/d/1hyarUivQE36mY6jSomru6Fjd-JzwcCzN/view?usp=sharing",
      "http://www.vision.caltech.edu/Image_Datasets/Caltech101/101_ObjectCategories.tar.gz, "
      "extracted in {root}/caltech-101 (it creates {root}/caltech-101/101_ObjectCategories/"
      "<class>/)",
    ),
    "food101": CoopLayout(
      "food-101",
      "images",
      "split_zhou_Food101.json",
      "https://drive.google.com/file/d/1QK0tGi096I0Ba6kggatX1ee6dJFIcEJl/view?usp=sharing",
      "food-101.tar.gz from https://data.vision.ee.ethz.ch/cvl/datasets_extra/food-101/, "
      "extracted in {root} (it creates {root}/food-101/images/<class>/*.jpg)",
    ),
  }
)


def load_coop_split(
  root: str | os.PathLike, dataset_name: str, *, check_files: bool = True
) -> FewShotSplit:
  """A dataset laid out as CoOp's DATASETS.md describes, under the data root `root`.

  `root/<folder>/split_zhou_<Name>.json` holds {"train"|"val"|"test": [[relpath, label,
  classname], ...]} with paths relative to `root/<folder>/<image_dir>`. ImageNet has no split
  file: `root/imagenet/classnames.txt` ("<wnid> <class name>" per line) names the classes, labels
  follow the sorted wnid folders of images/train, and images/val is the test set (CoOp's
  convention; `val` is left empty rather than repeating the test set).

  Args:
    root: CoOp's `$DATA` folder (the one holding dtd/, sun397/, ...).
    dataset_name: "imagenet", "dtd", "sun397", "flowers102", "caltech101", "food101" or a
      CoOp/TFDS spelling of one ("DescribableTextures", "OxfordFlowers", ...).
    check_files: also check that every listed image file exists (one stat per image).

  Raises:
    DatasetMissingError: the root, dataset folder, split file or an image is missing.
  """
  name = canonical_name(dataset_name)
  if name not in COOP_LAYOUTS:
    raise ConfigError(
      f"{dataset_name!r} has no CoOp layout; expected one of {sorted(COOP_LAYOUTS)}."
    )
  layout = COOP_LAYOUTS[name]
  root = storage.absolute(os.fspath(root))
  dataset_dir = os.path.join(root, layout.folder)
  image_dir = os.path.join(dataset_dir, layout.image_dir)
  if not storage.isdir(root):
    raise DatasetMissingError(
      f"The data root {root} does not exist. " + _coop_instructions(name, root)
    )
  if name == "imagenet":
    return _load_coop_imagenet(root, dataset_dir, image_dir)

  split_path = os.path.join(dataset_dir, layout.split_file)
  problems = []  # both pieces at once, so that one message says everything to fetch
  if not storage.isdir(image_dir):
    problems.append(
      f"the image folder {image_dir} does not exist: download {layout.images_instructions(root)}"
    )
  if not storage.isfile(split_path):
    problems.append(
      f"CoOp's split file {split_path} does not exist: download "
      f"{layout.split_file} from {layout.split_url} and put it at {split_path}"
    )
  if problems:
    raise DatasetMissingError(
      f"{name} (data root {root}): " + "; ".join(problems) + f". See {COOP_DATASETS_DOC}."
    )
  split = read_json(split_path, "CoOp split file")
  if not isinstance(split, dict):
    raise InputError(
      f"{split_path} holds a JSON {type(split).__name__}, not CoOp's split object "
      '{"train": [...], "val": [...], "test": [...]}.'
    )
  missing_keys = [k for k in ("train", "test") if k not in split]
  if missing_keys:
    raise InputError(f"{split_path} has no {missing_keys} entries; is it CoOp's split file?")

  entries = {k: split.get(k, []) for k in ("train", "val", "test")}
  class_names = _class_names_from_entries(entries, split_path)
  items = {
    k: tuple(
      LabeledImage(os.path.join(image_dir, relpath), int(label)) for relpath, label, _ in rows
    )
    for k, rows in entries.items()
  }
  _check_every_class_has_items(class_names, items, split_path)
  if check_files:
    _check_files_exist(
      [item.source for rows in items.values() for item in rows],
      name,
      image_dir,
      layout.images_instructions(root),
    )
  return FewShotSplit(name, class_names, items["train"], items["test"], items["val"])


def _coop_instructions(name: str, root: str) -> str:
  layout = COOP_LAYOUTS[name]
  dataset_dir = os.path.join(root, layout.folder)
  if name == "imagenet":
    return (
      f"For ImageNet, download {layout.images_instructions(root)}, "
      f"and classnames.txt from {layout.split_url} to "
      f"{os.path.join(dataset_dir, 'classnames.txt')} (see {COOP_DATASETS_DOC})."
    )
  return (
    f"For {name}, download {layout.images_instructions(root)}, and {layout.split_file} "
    f"from {layout.split_url} to {os.path.join(dataset_dir, layout.split_file)} "
    f"(see {COOP_DATASETS_DOC})."
  )


def _class_names_from_entries(entries: Mapping[str, Sequence], where: str) -> tuple[str, ...]:
  """Class names by label from [relpath, label, classname] rows (labels 0..C-1, one name each)."""
  names: dict[int, str] = {}
  for part, rows in entries.items():
    if not isinstance(rows, list):
      raise InputError(f"{where}: {part!r} must be a list of [relpath, label, classname] rows.")
    for row in rows:
      if not isinstance(row, (list, tuple)) or len(row) != 3:
        raise InputError(f"{where}: expected [relpath, label, classname] rows, got {row!r:.120}.")
      relpath, label, classname = row
      if not isinstance(relpath, str) or not relpath:
        raise InputError(
          f"{where}: the image path of {row!r:.120} is not a non-empty string; each row is "
          '[relpath, label, classname], e.g. ["images/cat_1.jpg", 0, "cat"].'
        )
      if not isinstance(classname, str):
        raise InputError(f"{where}: the class name of {row!r:.120} is not a string.")
      try:
        label = int(label)
      except (TypeError, ValueError, OverflowError):
        raise InputError(f"{where}: the label of {row!r:.120} is not an integer.") from None
      if names.setdefault(label, classname) != classname:
        raise InputError(
          f"{where}: label {label} is named both {names[label]!r} and {classname!r}."
        )
  labels = sorted(names)
  if labels != list(range(len(labels))):
    raise InputError(
      f"{where}: labels are not 0..{len(labels) - 1} ({_label_gaps(labels)}); number the "
      "classes 0, 1, 2, ... with no gaps."
    )
  return tuple(names[i] for i in range(len(names)))


def _label_gaps(labels: Sequence[int], shown: int = 5) -> str:
  """The negative labels and missing ranges of sorted `labels`, e.g. 'missing: 3..999999999'.

  Ranges, never the full list: one stray label 10**9 once built a billion-element set (14.5 GB)
  just for this message (issue 26 row 4).
  """
  parts = []
  negative = [label for label in labels if label < 0]
  if negative:
    parts.append(f"negative: {negative[:shown]}" + (" ..." if len(negative) > shown else ""))
  gaps, previous = [], -1
  for label in labels:
    if label > previous + 1:
      gaps.append(str(previous + 1) if label == previous + 2 else f"{previous + 1}..{label - 1}")
    previous = max(previous, label)
  if gaps:
    parts.append("missing: " + ", ".join(gaps[:shown]) + (", ..." if len(gaps) > shown else ""))
  return "; ".join(parts)


def _check_every_class_has_items(
  class_names: Sequence[str], items: Mapping[str, Sequence[LabeledImage]], where: str
) -> None:
  """Raises ClassMismatchError naming every class without training or test images: such a
  class would silently drop out of training or of the accuracy."""
  problems = []
  for part in ("train", "test"):
    present = {int(item.label) for item in items[part]}
    empty = [name for label, name in enumerate(class_names) if label not in present]
    if empty:
      problems.append(f"no {part} images for {len(empty)} class(es): {quoted(empty)}")
  check_no_problems(
    problems,
    where,
    "Every class needs training and test images; add them to the split, or use the "
    "dataset's original split file.",
  )


def _check_files_exist(paths: Sequence[str], name: str, image_dir: str, hint: str) -> None:
  missing = [p for p in paths if not storage.isfile(p)]
  if missing:
    raise DatasetMissingError(
      f"{name}: {len(missing)} of {len(paths)} images listed in the split are missing under "
      f"{image_dir} (first: {missing[0]}). Download {hint} (see {COOP_DATASETS_DOC})."
    )


def read_classnames_txt(path: str | os.PathLike) -> dict[str, str]:
  """CoOp's ImageNet `classnames.txt` ("n01440764 tench" per line) -> {wnid: class name}.

  Raises:
    DatasetMissingError: the file does not exist.
    InputError: the file is not UTF-8 (line named) or names a key twice.
  """
  path = os.fspath(path)
  if not storage.isfile(path):
    raise DatasetMissingError(
      f"The class-name file {storage.absolute(path)} does not exist: write one "
      "'<folder or label> <class name>' line per class there (ImageNet: CoOp's classnames.txt "
      f"from {COOP_LAYOUTS['imagenet'].split_url})."
    )
  names = {}
  for number, line in enumerate(read_text_lines(path, "class-name file"), 1):
    parts = line.strip().split(" ", 1)
    if parts[0]:
      if parts[0] in names:
        raise InputError(f"{path}, line {number}: {parts[0]!r} is named twice.")
      names[parts[0]] = parts[1].strip() if len(parts) > 1 else parts[0]
  return names


def _load_coop_imagenet(root: str, dataset_dir: str, image_dir: str) -> FewShotSplit:
  layout = COOP_LAYOUTS["imagenet"]
  classnames_path = os.path.join(dataset_dir, "classnames.txt")
  if not storage.isfile(classnames_path):
    raise DatasetMissingError(
      f"imagenet: {classnames_path} does not exist. Download classnames.txt from "
      f"{layout.split_url} (linked in {COOP_DATASETS_DOC}) and put it at {classnames_path}."
    )
  split_dirs = {s: os.path.join(image_dir, s) for s in ("train", "val")}
  for split, path in split_dirs.items():
    if not storage.isdir(path):
      raise DatasetMissingError(
        f"imagenet: {path} does not exist. Download {layout.images_instructions(root)} "
        f"(data root {root}; see {COOP_DATASETS_DOC})."
      )
  wnid_to_name = read_classnames_txt(classnames_path)
  wnids = subfolders(split_dirs["train"])
  unnamed = [w for w in wnids if w not in wnid_to_name]
  if unnamed:
    raise ClassMismatchError(
      f"imagenet: {len(unnamed)} class folders of {split_dirs['train']} are not in "
      f"{classnames_path}: {quoted(unnamed)}. Add a '<wnid> <class name>' line for each, or "
      "remove the folders."
    )
  val_wnids = subfolders(split_dirs["val"])
  if val_wnids != wnids:
    only_train = [w for w in wnids if w not in set(val_wnids)]
    only_val = [w for w in val_wnids if w not in set(wnids)]
    raise DatasetMissingError(
      f"imagenet: the class folders of {split_dirs['val']} ({len(val_wnids)}) differ from those "
      f"of {split_dirs['train']} ({len(wnids)}; only in train: {quoted(only_train) or 'none'}; "
      f"only in val: {quoted(only_val) or 'none'}); CoOp expects the val images sorted into one "
      f"folder per wnid, as in images/train."
    )
  items = {}
  for split, path in split_dirs.items():
    items[split] = tuple(
      LabeledImage(os.path.join(path, wnid, f), label)
      for label, wnid in enumerate(wnids)
      for f in image_files(os.path.join(path, wnid), extensions=None)
    )
  class_names = tuple(wnid_to_name[w] for w in wnids)
  _check_every_class_has_items(
    class_names, {"train": items["train"], "test": items["val"]}, f"imagenet ({image_dir})"
  )
  return FewShotSplit("imagenet", class_names, items["train"], items["val"])


#: CoOp's Caltech101 protocol drops these two folders (background clutter and the cropped copy
#: of the face class) and renames four plural folders; applied to TFDS's lower-case label names.
_CALTECH_DROPPED = frozenset({"background_google", "faces_easy"})
_CALTECH_RENAMED = MappingProxyType(
  {"airplanes": "airplane", "faces": "face", "leopards": "leopard", "motorbikes": "motorbike"}
)


def tfds_canonical_name(name: str) -> str | None:
  """A TFDS name ("dtd", "oxford_flowers102:2.1.1", ...) -> its `canonical_name`, or None for
  a dataset outside CoOp's list."""
  try:
    return canonical_name(name.split(":")[0].split("/")[0])
  except ValueError:
    return None


def tfds_class_names(
  name: str,
  raw_names: Sequence[str],
  class_names: Sequence[str] | Mapping[str, str] | str | os.PathLike | None = None,
) -> tuple[tuple[str, ...], np.ndarray]:
  """CoOp's class names for the labels of TFDS dataset `name`.

  SUN397's labels ('/a/apartment_building/outdoor') become 'outdoor apartment_building';
  Caltech101 drops CoOp's two dropped classes and takes its renames; imagenet2012's labels are
  wnids, so it needs `class_names`.

  Args:
    raw_names: the TFDS label names, by label.
    class_names: overrides the names: a path to CoOp's classnames.txt or a {label name: class
      name} mapping, or one name per label.

  Returns:
    (class names, int [len(raw_names)]: each raw label's new label, -1 for a dropped class).

  Raises:
    ClassMismatchError: `class_names` does not name every label.
    DatasetMissingError: imagenet2012 without `class_names`.
  """
  canonical = tfds_canonical_name(name)
  relabel = np.arange(len(raw_names))
  if class_names is not None:
    if isinstance(class_names, (str, os.PathLike)):
      class_names = read_classnames_txt(class_names)
    if isinstance(class_names, Mapping):
      unnamed = [n for n in raw_names if n not in class_names]
      if unnamed:
        raise ClassMismatchError(
          f"class_names has no entry for {len(unnamed)} of TFDS {name!r}'s labels: "
          f"{quoted(unnamed)}; add them (CoOp's classnames.txt names every label)."
        )
      return tuple(class_names[n] for n in raw_names), relabel
    if len(class_names) != len(raw_names):
      raise ClassMismatchError(
        f"class_names has {len(class_names)} names; TFDS {name!r} has {len(raw_names)} labels "
        "(a list names the labels in order: give one name per label, or a {label: name} "
        "mapping)."
      )
    return tuple(class_names), relabel
  if canonical == "imagenet":
    raise DatasetMissingError(
      f"TFDS {name!r} labels are wnids; pass class_names=<path to CoOp's classnames.txt>. "
      f"Download classnames.txt from {COOP_LAYOUTS['imagenet'].split_url} (see "
      f"{COOP_DATASETS_DOC})."
    )
  if canonical == "sun397":
    # '/a/apartment_building/outdoor' -> 'outdoor apartment_building', as CoOp names it.
    return tuple(" ".join(n.strip("/").split("/")[1:][::-1]) for n in raw_names), relabel
  if canonical == "caltech101":
    kept = [i for i, n in enumerate(raw_names) if n.lower() not in _CALTECH_DROPPED]
    relabel = np.full(len(raw_names), -1)
    relabel[kept] = np.arange(len(kept))
    return tuple(_CALTECH_RENAMED.get(raw_names[i].lower(), raw_names[i]) for i in kept), relabel
  return tuple(raw_names), relabel
