"""CoOp's class-name files and TFDS labels in CoOp's spelling (stori_jax.data.coop); the split
files and folders are tested through the few-shot loaders (tests/test_fewshot_data.py)."""

import pytest

from stori_jax.data import coop
from stori_jax.data.files import ClassMismatchError, DatasetMissingError
from stori_jax.plumbing.errors import InputError


def test_classnames_txt(tmp_path):
  path = tmp_path / "classnames.txt"
  path.write_bytes("\ufeffn01 tench\n\nn02  great white shark \nn03\n".encode())
  assert coop.read_classnames_txt(path) == {
    "n01": "tench",
    "n02": "great white shark",
    "n03": "n03",  # a key alone names itself
  }
  path.write_bytes(b"n01 tench\nn01 goldfish\n")
  with pytest.raises(InputError, match="line 2: 'n01' is named twice"):
    coop.read_classnames_txt(path)
  path.write_bytes(b"n01 tench\nn02 caf\xe9\n")
  with pytest.raises(InputError, match=r"not UTF-8 \(line 2\)"):
    coop.read_classnames_txt(path)
  with pytest.raises(DatasetMissingError, match="classnames.txt"):
    coop.read_classnames_txt(tmp_path / "missing.txt")


def test_tfds_labels_in_coop_spelling(tmp_path):
  assert coop.tfds_canonical_name("oxford_flowers102:2.1.1") == "flowers102"
  assert coop.tfds_canonical_name("mnist") is None
  names, relabel = coop.tfds_class_names("caltech101", ["Faces", "BACKGROUND_Google", "ant"])
  assert names == ("face", "ant") and relabel.tolist() == [0, -1, 1]
  names, _ = coop.tfds_class_names("sun397", ["/b/bakery/shop"])
  assert names == ("shop bakery",)
  with pytest.raises(DatasetMissingError, match="labels are wnids"):
    coop.tfds_class_names("imagenet2012", ["n01"])
  with pytest.raises(ClassMismatchError, match="no entry for 1"):
    coop.tfds_class_names("imagenet2012", ["n01", "n02"], {"n01": "tench"})
  assert coop.tfds_class_names("dtd", ["a", "b"], ["x", "y"])[0] == ("x", "y")
