"""Few-shot datasets in one structure: CoOp image folders, prepared TFDS, the synthetic world.

Every loader returns a `FewShotSplit`: class names and (image source, label) items for the train,
test and (where the dataset has one) validation sets. An image source is one of
  - a file path (str), for image folders;
  - encoded image bytes (JPEG/PNG, `bytes`), for TFDS, so that a split costs its file size in
    memory rather than its decoded size (Food101's test set: ~1 GB instead of ~20 GB);
  - a uint8 [H, W, 3] array, for the in-memory synthetic world.
`open_image` turns any of them into a PIL image.

The protocol is CoOp's (docs/design.md, section "Few-shot protocol"): the fixed
`split_zhou_<Name>.json` splits, ImageNet's val set as its test set, and K training images per
class sampled with a seed (1, 2, 3 in the paper) by `sample_k_shot`.

A missing dataset, split file or TFDS preparation raises `DatasetMissingError` (a
FileNotFoundError) whose message names what to download, from where, and the full path where
it must go.
"""

from __future__ import annotations

import dataclasses
import importlib
import io
import os
import random
import re
from types import MappingProxyType
from typing import Any, Mapping, NamedTuple, Sequence, Union

import numpy as np
from PIL import Image

from stori_jax.config_files import ConfigError
from stori_jax.errors import InputError, UserError
from stori_jax.data import synthetic_tasks
from stori_jax.data.files import ClassMismatchError, check_no_problems, quoted, read_json
from stori_jax.preprocess import to_8bit, to_pil

COOP_DATASETS_DOC = "https://github.com/KaiyangZhou/CoOp/blob/main/DATASETS.md"

ImageSource = Union[str, bytes, np.ndarray]


class DatasetMissingError(UserError, FileNotFoundError):
  """A dataset, split file or prompt file is missing; the message says what to get, and where."""


class LabeledImage(NamedTuple):
  """One example: `source` (path, encoded bytes or uint8 [H, W, 3]) and its int class label."""

  source: Any
  label: int


@dataclasses.dataclass(frozen=True, eq=False)
class FewShotSplit:
  """A classification dataset in CoOp's protocol.

  Attributes:
    dataset: canonical dataset name ("dtd", "imagenet", "synthetic", ...), see `canonical_name`.
    class_names: one name per label, labels 0..C-1 (tuple: the split is immutable).
    train: the training pool (all of it, or the K-shot sample after `few_shot`).
    test: the evaluation set (ImageNet: its val set, as in CoOp).
    val: CoOp's validation set where the dataset has one, else empty.
  """

  dataset: str
  class_names: tuple[str, ...]
  train: tuple[LabeledImage, ...]
  test: tuple[LabeledImage, ...]
  val: tuple[LabeledImage, ...] = ()

  @property
  def num_classes(self) -> int:
    return len(self.class_names)

  @property
  def train_labels(self) -> np.ndarray:
    """int32 [len(train)]."""
    return np.asarray([item.label for item in self.train], np.int32)

  @property
  def test_labels(self) -> np.ndarray:
    """int32 [len(test)]."""
    return np.asarray([item.label for item in self.test], np.int32)

  def few_shot(self, shots: int, seed: int) -> "FewShotSplit":
    """This split with `train` replaced by `sample_k_shot(train, shots, seed)`."""
    return dataclasses.replace(
      self, train=sample_k_shot(self.train, shots, seed, class_names=self.class_names)
    )


def open_image(source: ImageSource | Image.Image) -> Image.Image:
  """A path, encoded bytes, a uint8 HWC array or a PIL image -> PIL image, 8-bit samples.

  16-bit and float images are scaled to 8 bits (or refused) by `preprocess.to_8bit`, the
  decoder every reader shares.
  """
  if isinstance(source, (bytes, bytearray, memoryview)):
    try:
      with Image.open(io.BytesIO(bytes(source))) as image:
        image.load()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
      raise InputError(
        f"Cannot decode an encoded image ({len(source)} bytes): {type(e).__name__}: {e}."
      ) from None
    return to_8bit(image, f"({len(source)} encoded bytes)")
  return to_pil(source)


# ---------------------------------------------------------------------------------------------
# Dataset names.

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


# ---------------------------------------------------------------------------------------------
# CoOp image folders (https://github.com/KaiyangZhou/CoOp/blob/main/DATASETS.md).


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
  root = os.path.abspath(os.fspath(root))
  dataset_dir = os.path.join(root, layout.folder)
  image_dir = os.path.join(dataset_dir, layout.image_dir)
  if not os.path.isdir(root):
    raise DatasetMissingError(
      f"The data root {root} does not exist. " + _coop_instructions(name, root)
    )
  if name == "imagenet":
    return _load_coop_imagenet(root, dataset_dir, image_dir)

  split_path = os.path.join(dataset_dir, layout.split_file)
  problems = []  # both pieces at once, so that one message says everything to fetch
  if not os.path.isdir(image_dir):
    problems.append(
      f"the image folder {image_dir} does not exist: download {layout.images_instructions(root)}"
    )
  if not os.path.isfile(split_path):
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
  missing = [p for p in paths if not os.path.isfile(p)]
  if missing:
    raise DatasetMissingError(
      f"{name}: {len(missing)} of {len(paths)} images listed in the split are missing under "
      f"{image_dir} (first: {missing[0]}). Download {hint} (see {COOP_DATASETS_DOC})."
    )


def _listdir_visible(path: str) -> list[str]:
  return sorted(n for n in os.listdir(path) if not n.startswith("."))


def read_classnames_txt(path: str | os.PathLike) -> dict[str, str]:
  """CoOp's ImageNet `classnames.txt` ("n01440764 tench" per line) -> {wnid: class name}.

  Raises:
    DatasetMissingError: the file does not exist.
    InputError: the file is not UTF-8 (line named) or names a key twice.
  """
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise DatasetMissingError(
      f"The class-name file {os.path.abspath(path)} does not exist: write one "
      "'<folder or label> <class name>' line per class there (ImageNet: CoOp's classnames.txt "
      f"from {COOP_LAYOUTS['imagenet'].split_url})."
    )
  names = {}
  with open(path, "rb") as f:
    for number, raw in enumerate(f, 1):
      try:
        line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
      except UnicodeDecodeError:
        raise InputError(
          f"The class-name file {path} is not UTF-8 (line {number}); re-save it as UTF-8."
        ) from None
      parts = line.strip().split(" ", 1)
      if parts[0]:
        if parts[0] in names:
          raise InputError(f"{path}, line {number}: {parts[0]!r} is named twice.")
        names[parts[0]] = parts[1].strip() if len(parts) > 1 else parts[0]
  return names


def _load_coop_imagenet(root: str, dataset_dir: str, image_dir: str) -> FewShotSplit:
  layout = COOP_LAYOUTS["imagenet"]
  classnames_path = os.path.join(dataset_dir, "classnames.txt")
  if not os.path.isfile(classnames_path):
    raise DatasetMissingError(
      f"imagenet: {classnames_path} does not exist. Download classnames.txt from "
      f"{layout.split_url} (linked in {COOP_DATASETS_DOC}) and put it at {classnames_path}."
    )
  split_dirs = {s: os.path.join(image_dir, s) for s in ("train", "val")}
  for split, path in split_dirs.items():
    if not os.path.isdir(path):
      raise DatasetMissingError(
        f"imagenet: {path} does not exist. Download {layout.images_instructions(root)} "
        f"(data root {root}; see {COOP_DATASETS_DOC})."
      )
  wnid_to_name = read_classnames_txt(classnames_path)
  wnids = [
    d
    for d in _listdir_visible(split_dirs["train"])
    if os.path.isdir(os.path.join(split_dirs["train"], d))
  ]
  unnamed = [w for w in wnids if w not in wnid_to_name]
  if unnamed:
    raise ClassMismatchError(
      f"imagenet: {len(unnamed)} class folders of {split_dirs['train']} are not in "
      f"{classnames_path}: {quoted(unnamed)}. Add a '<wnid> <class name>' line for each, or "
      "remove the folders."
    )
  val_wnids = [
    d
    for d in _listdir_visible(split_dirs["val"])
    if os.path.isdir(os.path.join(split_dirs["val"], d))
  ]
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
      for f in _listdir_visible(os.path.join(path, wnid))
    )
  class_names = tuple(wnid_to_name[w] for w in wnids)
  _check_every_class_has_items(
    class_names, {"train": items["train"], "test": items["val"]}, f"imagenet ({image_dir})"
  )
  return FewShotSplit("imagenet", class_names, items["train"], items["val"])


# ---------------------------------------------------------------------------------------------
# K-shot sampling.


def sample_k_shot(
  train_items: Sequence[LabeledImage],
  shots: int,
  seed: int,
  *,
  class_names: Sequence[str] | None = None,
) -> tuple[LabeledImage, ...]:
  """K items per class, deterministic given `seed`; grouped by class.

  Follows Dassl's `generate_fewshot_dataset`, which CoOp, TaskRes and the paper use: classes are
  visited in order of first appearance in `train_items`, and each contributes
  `random.Random(seed).sample(its items, shots)` from one RNG shared across classes. (Dassl uses
  the global `random` seeded with the run seed; a private RNG gives the same draws without
  touching global state.) `train_items` may be any (source, label) items, e.g. (index, label).

  Raises:
    ValueError: shots < 1, or a class has fewer than `shots` items (ClassMismatchError, an
      InputError: names every such class and its count, including the classes of
      `class_names` with none; CoOp would silently keep fewer there).
  """
  if shots < 1:
    raise InputError(f"shots must be >= 1, got {shots}.")
  by_label: dict[int, list[LabeledImage]] = {}
  for item in train_items:
    item = LabeledImage(*item)
    by_label.setdefault(int(item.label), []).append(item)
  short = {label: len(items) for label, items in by_label.items() if len(items) < shots}
  if class_names is not None:  # a class without any item would silently drop out
    short.update({label: 0 for label in range(len(class_names)) if label not in by_label})
  if short:

    def describe(label):
      name = f"{class_names[label]!r} " if class_names is not None else ""
      return f"class {name}(label {label}) has {short[label]}"

    raise ClassMismatchError(
      f"{shots}-shot sampling needs {shots} training images per class, but "
      + "; ".join(describe(label) for label in sorted(short))
      + "."
    )
  rng = random.Random(seed)
  return tuple(item for items in by_label.values() for item in rng.sample(items, shots))


# ---------------------------------------------------------------------------------------------
# TFDS.

#: CoOp's Caltech101 protocol drops these two folders (background clutter and the cropped copy
#: of the face class) and renames four plural folders; applied to TFDS's lower-case label names.
_CALTECH_DROPPED = frozenset({"background_google", "faces_easy"})
_CALTECH_RENAMED = MappingProxyType(
  {"airplanes": "airplane", "faces": "face", "leopards": "leopard", "motorbikes": "motorbike"}
)


def _import_tfds():
  try:
    return importlib.import_module("tensorflow_datasets")
  except ImportError as error:
    raise ImportError(
      "Loading a TFDS dataset needs TensorFlow Datasets: `pip install tensorflow-datasets "
      "tensorflow`. Then prepare the dataset once, e.g. `tfds build dtd --data_dir DIR` "
      "(or CoOp's image folders with load_coop_split, which need neither)."
    ) from error


def load_tfds(
  name: str,
  data_dir: str | os.PathLike | None = None,
  *,
  shots: int | None = None,
  seed: int = 1,
  class_names: Sequence[str] | Mapping[str, str] | str | os.PathLike | None = None,
) -> FewShotSplit:
  """A prepared TFDS image-classification dataset ('dtd', 'oxford_flowers102', 'food101',
  'caltech101', 'sun397', 'imagenet2012', ...) as a FewShotSplit of encoded-image items.

  Nothing is downloaded: the dataset must already be prepared in `data_dir` (TFDS's default,
  $TFDS_DATA_DIR or ~/tensorflow_datasets, when None). Splits: train -> "train"; test -> "test",
  or "validation" where there is no "test" (food101, imagenet2012: their official evaluation
  sets); val -> "validation" where "test" exists. These are TFDS's splits, not CoOp's
  split_zhou files, so accuracies are comparable across methods run here but not digit for
  digit with CoOp-protocol tables.

  Class names come from the label feature, converted to CoOp's spelling for SUN397
  ('/a/apartment_building/outdoor' -> 'outdoor apartment_building') and Caltech101 (CoOp's
  renames; its two dropped classes are dropped and labels renumbered). imagenet2012's labels are
  wnids: pass `class_names` (a path to CoOp's classnames.txt, a {wnid: name} mapping, or one
  name per label).

  Args:
    shots, seed: when given, only a K-shot sample of the train split is read (`sample_k_shot`
      over the labels, read in a first pass without decoding), so that ImageNet's 1.28M
      training images are never held in memory.

  Raises:
    ImportError: tensorflow_datasets is not installed (the message says what to install).
    DatasetMissingError: the dataset is unknown to TFDS or not prepared in `data_dir`.
  """
  tfds = _import_tfds()
  data_dir = None if data_dir is None else os.fspath(data_dir)
  not_found = getattr(getattr(tfds, "core", None), "DatasetNotFoundError", LookupError)
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except not_found as error:
    raise DatasetMissingError(f"TFDS has no dataset {name!r}: {error}") from error
  if not _tfds_is_prepared(builder):
    raise DatasetMissingError(
      f"The TFDS dataset {name!r} is not prepared in {builder.data_dir}. Prepare it once with "
      f"`tfds build {name} --data_dir {data_dir or '~/tensorflow_datasets'}` (imagenet2012 "
      "needs ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar from https://image-net.org "
      "in <data_dir>/downloads/manual first), or use load_coop_split with CoOp's image "
      f"folders ({COOP_DATASETS_DOC})."
    )

  splits = builder.info.splits
  test_split = "test" if "test" in splits else "validation"
  val_split = "validation" if test_split == "test" and "validation" in splits else None
  if "train" not in splits or test_split not in splits:
    raise InputError(
      f"TFDS {name!r} has splits {sorted(splits)}; expected train and test or validation."
    )
  raw_names = list(builder.info.features["label"].names)
  canonical = _canonical_or_none(name)
  names, relabel = _tfds_class_names(name, canonical, raw_names, class_names)

  def read(split):
    return _iter_tfds(tfds, builder, split, relabel)

  if shots is None:
    train = tuple(LabeledImage(bytes(image), label) for _, image, label in read("train"))
  else:
    # Pass 1: labels only (records are read but not decoded); pass 2: the chosen images.
    chosen = sample_k_shot(
      [LabeledImage(index, label) for index, _, label in read("train")],
      shots,
      seed,
      class_names=names,
    )
    wanted = {index for index, _ in chosen}
    by_index = {
      index: LabeledImage(bytes(image), label)
      for index, image, label in read("train")
      if index in wanted
    }
    train = tuple(by_index[index] for index, _ in chosen)  # sample_k_shot's order
  test = tuple(LabeledImage(bytes(image), label) for _, image, label in read(test_split))
  val = (
    tuple(LabeledImage(bytes(image), label) for _, image, label in read(val_split))
    if val_split
    else ()
  )
  return FewShotSplit(canonical or name, names, train, test, val)


def _tfds_is_prepared(builder) -> bool:
  is_prepared = getattr(builder, "is_prepared", None)
  if is_prepared is not None:
    return bool(is_prepared())
  return os.path.isdir(os.fspath(builder.data_dir))  # TFDS before is_prepared() existed


def _canonical_or_none(name: str) -> str | None:
  try:
    return canonical_name(name.split(":")[0].split("/")[0])
  except ValueError:
    return None


def _tfds_class_names(name, canonical, raw_names, class_names):
  """(class names, raw label -> new label or -1 to drop) for a TFDS label feature."""
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


def _iter_tfds(tfds, builder, split: str, relabel: np.ndarray):
  """(record index, encoded bytes, label) of a split in file order; dropped classes skipped."""
  dataset = builder.as_dataset(
    split=split, shuffle_files=False, decoders={"image": tfds.decode.SkipDecoding()}
  )
  for index, example in enumerate(tfds.as_numpy(dataset)):
    label = int(relabel[int(example["label"])])
    if label >= 0:
      yield index, example["image"], label


# ---------------------------------------------------------------------------------------------
# The synthetic world (the offline stand-in for the datasets above).


def _memory_bytes() -> int | None:
  """The machine's physical memory, or None where the OS does not say."""
  try:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (AttributeError, ValueError, OSError):
    return None


def _check_synthetic_memory(classes: int, shots: int, n_test_per_class: int, size: int) -> None:
  """Refuses a synthetic world whose uint8 images would not fit in half the machine's memory,
  before drawing any (100,000,000 test images per class once grew to 19 GB, then hung).

  Raises:
    ConfigError: with the estimate, the machine's memory and the values to lower.
  """
  images = classes * (int(shots) + int(n_test_per_class))
  estimate = images * int(size) * int(size) * 3
  memory = _memory_bytes()
  limit = memory // 2 if memory else 64 << 30
  if estimate > limit:
    raise ConfigError(
      f"the synthetic world would hold {images:,} images of {size}x{size} px ({classes} "
      f"classes x ({shots} shots + {n_test_per_class} test images)), about "
      f"{estimate / 2**30:,.1f} GiB in memory, more than "
      + (f"half this machine's {memory / 2**30:,.1f} GiB" if memory else "64 GiB")
      + "; lower config.data.n_test_per_class, config.shots or config.data.image_size"
    )


def load_synthetic(
  shots: int,
  seed: int,
  n_test_per_class: int = 50,
  *,
  class_names: Sequence[str] | None = None,
  test_seed: int = 0,
  image_size: int = 64,
) -> FewShotSplit:
  """`synthetic_tasks.fewshot_dataset` as a FewShotSplit, uint8 [H, W, 3] sources.

  class_names: the task's classes, e.g. ("red striped star", "red dotted star"), any
  colour/pattern/shape combination (`synthetic_tasks.class_from_name`); None: the world's 12
  `FEWSHOT_CLASSES`. The train set is already K-shot (the world draws `shots` fresh images per
  class from `seed`), so it needs no `sample_k_shot`; the test set depends on `test_seed` only.
  The classes' CuPL-like prompts are `prompts.synthetic_prompts(class_names)`.
  """
  try:
    classes = synthetic_tasks.resolve_classes(class_names)
  except ValueError as e:
    raise ConfigError(f"config.data.class_names: {e}") from None
  _check_synthetic_memory(len(classes), shots, n_test_per_class, image_size)
  data = synthetic_tasks.fewshot_dataset(
    shots, seed, n_test_per_class, classes=classes, test_seed=test_seed, image_size=image_size
  )

  def items(images, labels):
    return tuple(LabeledImage(image, int(label)) for image, label in zip(images, labels))

  return FewShotSplit(
    "synthetic",
    tuple(data.class_names),
    items(data.train_images, data.train_labels),
    items(data.test_images, data.test_labels),
  )
