"""CUB-200-2011 as one table: its images, classes, official train/test split and per-image
attribute labels, plus the text an attribute name reads as.

Files (the official archive, https://data.caltech.edu/records/65de6-vp158): `images.txt`,
`classes.txt`, `image_class_labels.txt`, `train_test_split.txt`,
`attributes/image_attribute_labels.txt` and `attributes.txt` (at the root, in `attributes/` or in
the parent folder, as the archive unpacks; read by `attributes.read_cub_attributes`), and the
JPEGs under `images/`. Used by the few-shot pairwise study (SToRI Fig. 3: prompts from a class's
attribute labels) and by the retrieval attributes chosen by zero-shot AUROC (App. A.2).
"""

from __future__ import annotations

import dataclasses
import os
import re

import numpy as np

from stori_jax.data.attributes import read_cub_attributes
from stori_jax.data.files import DatasetMissingError, read_text_lines
from stori_jax.plumbing import paths
from stori_jax.plumbing.errors import InputError

CUB_URL = "https://data.caltech.edu/records/65de6-vp158/files/CUB_200_2011.tgz"
#: The files `read_cub` needs under the CUB_200_2011 folder (attributes.txt may also sit in
#: attributes/ or in the parent folder).
CUB_FILES = (
  "images.txt",
  "classes.txt",
  "image_class_labels.txt",
  "train_test_split.txt",
  os.path.join("attributes", "image_attribute_labels.txt"),
)

#: The 112 attributes Koh et al. (2020, Concept Bottleneck Models) keep: those present, after
#: class-level majority voting over the training images, in at least 10 classes (their
#: `class_attr_data_10`). 1-based ids of attributes.txt. SToRI App. A.2 starts from them.
KOH_ATTRIBUTE_IDS = tuple(
  i + 1
  for i in (
    1, 4, 6, 7, 10, 14, 15, 20, 21, 23, 25, 29, 30, 35, 36, 38, 40, 44, 45, 50, 51, 53, 54, 56,
    57, 59, 63, 64, 69, 70, 72, 75, 80, 84, 90, 91, 93, 99, 101, 106, 110, 111, 116, 117, 119,
    125, 126, 131, 132, 134, 145, 149, 151, 152, 153, 157, 158, 163, 164, 168, 172, 178, 179,
    181, 183, 187, 188, 193, 194, 196, 198, 202, 203, 208, 209, 211, 212, 213, 218, 220, 221,
    225, 235, 236, 238, 239, 240, 242, 243, 244, 249, 253, 254, 259, 260, 262, 268, 274, 277,
    283, 289, 292, 293, 294, 298, 299, 304, 305, 308, 309, 310, 311,
  )
)  # fmt: skip


@dataclasses.dataclass(frozen=True, eq=False)
class CubTable:
  """CUB-200-2011's labels, one row per image of images.txt (M = 11,788 in the official files).

  Attributes:
    root: the CUB_200_2011 folder.
    files: M image paths relative to root/images.
    class_names: K class names as classes.txt spells them without the number
      ("Blue_headed_Vireo").
    labels: int64 [M], 0-based class index.
    is_training: bool [M], the official split (train_test_split.txt).
    attribute_names: A names in attributes.txt order (attribute id = index + 1).
    present: bool [M, A], image_attribute_labels.txt's is_present.
  """

  root: str
  files: tuple[str, ...]
  class_names: tuple[str, ...]
  labels: np.ndarray
  is_training: np.ndarray
  attribute_names: tuple[str, ...]
  present: np.ndarray

  def image_paths(self, rows) -> list[str]:
    return [os.path.join(self.root, "images", self.files[int(i)]) for i in np.asarray(rows)]

  def column(self, name: str) -> np.ndarray:
    """bool [M]: the images labelled with attribute `name`."""
    return self.present[:, self.attribute_names.index(name)]


def missing_message(root: str, missing: list[str]) -> str:
  return (
    f"CUB-200-2011 is not complete under {root} (missing: {', '.join(missing)}). Download "
    f"CUB_200_2011.tgz from {CUB_URL} (about 1.1 GB) and unpack it so that {root} is its "
    "CUB_200_2011 folder, holding images.txt, classes.txt, image_class_labels.txt, "
    "train_test_split.txt, attributes.txt (or ../attributes.txt), "
    "attributes/image_attribute_labels.txt and images/<class>/*.jpg; then pass that folder as "
    "config.data.root."
  )


def _pairs(path: str, what: str) -> dict[int, str]:
  """'<id> <value>' lines -> {id: value}."""
  out = {}
  for number, line in enumerate(read_text_lines(path, what), 1):
    fields = line.split()
    if not fields:
      continue
    if len(fields) < 2 or not fields[0].isdigit():
      raise InputError(f"{path} line {number}: expected '<id> <value>', got {line!r}")
    out[int(fields[0])] = fields[1]
  return out


def read_cub(root: str | os.PathLike) -> CubTable:
  """The CUB_200_2011 folder as a `CubTable`.

  Raises:
    DatasetMissingError: a file is missing (the message says what to download and where).
    InputError: a file is malformed, or the files disagree (an image without a class).
  """
  root = os.fspath(root)
  missing = [f for f in CUB_FILES if not paths.isfile(os.path.join(root, f))]
  if missing:
    raise DatasetMissingError(missing_message(root, missing))
  images = _pairs(os.path.join(root, "images.txt"), "CUB images.txt")
  files, table = read_cub_attributes(root)
  classes = _pairs(os.path.join(root, "classes.txt"), "CUB classes.txt")
  class_of = _pairs(os.path.join(root, "image_class_labels.txt"), "CUB image_class_labels.txt")
  split = _pairs(os.path.join(root, "train_test_split.txt"), "CUB train_test_split.txt")
  ids = list(images)
  lost = [i for i in ids if i not in class_of or i not in split]
  if lost:
    raise InputError(
      f"images {lost[:5]} of {root}/images.txt have no class or split in "
      "image_class_labels.txt / train_test_split.txt; the files are from different archives."
    )
  order = sorted(classes)
  index = {c: k for k, c in enumerate(order)}
  names = tuple(re.sub(r"^\d+\.", "", classes[c]) for c in order)
  return CubTable(
    root=root,
    files=tuple(files),
    class_names=names,
    labels=np.asarray([index[int(class_of[i])] for i in ids], np.int64),
    is_training=np.asarray([split[i] == "1" for i in ids], bool),
    attribute_names=tuple(table),
    present=np.stack(list(table.values()), axis=1),
  )


def class_attribute_shares(present: np.ndarray, labels: np.ndarray, num_classes: int) -> np.ndarray:
  """float64 [K, A]: per class, the share of its images labelled with each attribute.

  Args:
    present: bool [M, A] per-image labels; labels: int [M] class indices in [0, num_classes).
  """
  present = np.asarray(present, np.float64)
  counts = np.bincount(labels, minlength=num_classes).astype(np.float64)
  sums = np.zeros((num_classes, present.shape[1]))
  np.add.at(sums, np.asarray(labels), present)
  return sums / np.maximum(counts, 1)[:, None]


def attribute_text(name: str) -> str:
  """How an attribute reads in a prompt: the value, then the part it describes.

  The rule of SToRI's Table 10 ("has_crown_color::blue" -> "blue crown",
  "has_bill_shape::hooked_seabird" -> "hooked seabird bill", "has_shape::duck-like" ->
  "duck-like shape", "has_primary_color::yellow" -> "yellow color"), extended where the paper is
  silent: patterns "<value> <part> pattern" ("striped wing pattern"), lengths "<part> <value>"
  ("bill shorter than head"), a value naming its part stays alone ("forked tail"), and the
  parenthesised notes of the official names are dropped ("small_(5_-_9_in)" -> "small size").
  """
  part, _, value = name.partition("::")
  part = part.removeprefix("has_")
  value = " ".join(re.sub(r"\(.*?\)", " ", value).replace("_", " ").split())
  noun = part.rsplit("_", 1)[0].replace("_", " ") if "_" in part else ""
  if part in ("shape", "size"):
    return f"{value} {part}"
  if part == "primary_color":
    return f"{value} color"
  if part.endswith("_pattern"):
    return f"{value} {noun} pattern"
  if part.endswith("_length"):
    return f"{noun} {value}"
  if part.endswith(("_color", "_shape")):
    return value if re.search(rf"\b{noun}s?\b", value) else f"{value} {noun}"
  return f"{value} {part.replace('_', ' ')}".strip()
