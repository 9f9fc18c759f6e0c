"""CUB-200-2011 as one table (`stori_jax.data.cub`), read from small files in the official
layout written here; the text an attribute name reads as (SToRI's Table 10 rule)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from PIL import Image

from stori_jax.data import cub
from stori_jax.data.files import DatasetMissingError
from stori_jax.retrieval.paper_config import CUB_ATTRIBUTES

CLASSES = ("Blue_headed_Vireo", "Warbling_Vireo", "White_eyed_Vireo", "Black_footed_Albatross")
ATTRIBUTES = (
  "has_wing_pattern::striped",
  "has_wing_color::grey",
  "has_crown_color::blue",
  "has_eye_color::red",
  "has_bill_length::shorter_than_head",
)


def write_cub(
  parent, present_of, per_class=(4, 3), class_ids=(152, 155, 156, 1), attributes=ATTRIBUTES
):
  """A CUB_200_2011 folder under `parent` (attributes.txt next to it, as the archive unpacks):
  per class `per_class` = (training, test) images of 12x12 px; image i of class c is labelled
  with the attributes present_of(c, i, training) (a bool per `attributes` entry). Returns the
  root.
  """
  root = os.path.join(parent, "CUB_200_2011")
  os.makedirs(os.path.join(root, "attributes"))
  order = sorted(range(len(CLASSES)), key=lambda c: class_ids[c])
  with open(os.path.join(parent, "attributes.txt"), "w") as f:
    f.writelines(f"{k + 1} {name}\n" for k, name in enumerate(attributes))
  with open(os.path.join(root, "classes.txt"), "w") as f:
    f.writelines(f"{class_ids[c]} {class_ids[c]:03d}.{CLASSES[c]}\n" for c in order)
  images, labels, split, attrs = [], [], [], []
  image_id = 0
  for c in order:
    folder = f"{class_ids[c]:03d}.{CLASSES[c]}"
    os.makedirs(os.path.join(root, "images", folder))
    for i in range(sum(per_class)):
      image_id += 1
      training = i < per_class[0]
      rel = f"{folder}/{CLASSES[c]}_{i}.jpg"
      Image.new("RGB", (12, 12), (20 * c, 10 * i, 90)).save(os.path.join(root, "images", rel))
      images.append(f"{image_id} {rel}\n")
      labels.append(f"{image_id} {class_ids[c]}\n")
      split.append(f"{image_id} {int(training)}\n")
      for k, on in enumerate(present_of(c, i, training)):
        attrs.append(f"{image_id} {k + 1} {int(on)} 3 4.5\n")
  for name, lines in (
    ("images.txt", images),
    ("image_class_labels.txt", labels),
    ("train_test_split.txt", split),
    (os.path.join("attributes", "image_attribute_labels.txt"), attrs),
  ):
    with open(os.path.join(root, name), "w") as f:
      f.writelines(lines)
  return root


def test_attribute_text_is_table_10s_rule():
  for name, text in CUB_ATTRIBUTES:  # every row of the paper's Table 10
    assert cub.attribute_text(name) == text
  assert cub.attribute_text("has_wing_pattern::striped") == "striped wing pattern"
  assert cub.attribute_text("has_wing_color::grey") == "grey wing"
  assert cub.attribute_text("has_upper_tail_color::grey") == "grey upper tail"
  assert cub.attribute_text("has_bill_length::shorter_than_head") == "bill shorter than head"
  assert cub.attribute_text("has_tail_shape::forked_tail") == "forked tail"
  assert cub.attribute_text("has_size::small_(5_-_9_in)") == "small size"
  assert cub.attribute_text("has_bill_shape::curved_(up_or_down)") == "curved bill"


def test_koh_attributes_are_112_distinct_ids_of_the_312():
  ids = cub.KOH_ATTRIBUTE_IDS
  assert len(ids) == len(set(ids)) == 112 and 1 <= min(ids) and max(ids) <= 312
  # Table 10's first three (ids of the official attributes.txt) are among them.
  assert {5, 221, 294} <= set(ids)


def test_read_cub_and_class_shares(tmp_path):
  def present(c, i, training):
    return [c == 0, i % 2 == 0, c == 1 and training, False, i == 0]

  root = write_cub(str(tmp_path), present)
  table = cub.read_cub(root)
  assert table.class_names == ("Black_footed_Albatross",) + CLASSES[:3]  # classes.txt order
  assert len(table.files) == 4 * 7 and table.present.shape == (28, 5)
  assert table.attribute_names == ATTRIBUTES
  vireo = table.class_names.index("Blue_headed_Vireo")
  rows = np.flatnonzero(table.labels == vireo)
  assert table.is_training[rows].tolist() == [True] * 4 + [False] * 3
  assert table.files[rows[0]] == "152.Blue_headed_Vireo/Blue_headed_Vireo_0.jpg"
  assert table.column("has_wing_pattern::striped")[rows].all()
  assert os.path.isfile(table.image_paths(rows[:1])[0])
  shares = cub.class_attribute_shares(table.present, table.labels, len(table.class_names))
  warbling = table.class_names.index("Warbling_Vireo")
  np.testing.assert_allclose(shares[vireo], [1, 4 / 7, 0, 0, 1 / 7])
  np.testing.assert_allclose(shares[warbling], [0, 4 / 7, 4 / 7, 0, 1 / 7])


def test_a_missing_cub_says_what_to_download(tmp_path):
  with pytest.raises(DatasetMissingError, match="CUB_200_2011.tgz") as caught:
    cub.read_cub(str(tmp_path / "nowhere"))
  message = str(caught.value)
  assert cub.CUB_URL in message and "image_attribute_labels.txt" in message
  root = write_cub(str(tmp_path), lambda c, i, t: [False] * 5)
  os.remove(os.path.join(root, "train_test_split.txt"))
  with pytest.raises(DatasetMissingError, match="missing: train_test_split.txt"):
    cub.read_cub(root)
