"""Listing image folders (stori_jax.data.folders): sorted, hidden entries skipped, extensions
compared in any case, and the tree walked for `images_under`."""

import os

from stori_jax.data import folders


def _touch(path):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "wb"):
    pass


def test_class_folders_and_their_images(tmp_path):
  for name in ("b/2.PNG", "b/1.jpg", "b/.hidden.jpg", "b/notes.txt", "a/x.webp", ".git/x.png"):
    _touch(tmp_path / name)
  _touch(tmp_path / "loose.jpg")  # a file at the root is not a class folder
  assert folders.subfolders(tmp_path) == ["a", "b"]
  assert folders.image_files(tmp_path / "b") == ["1.jpg", "2.PNG"]
  assert folders.image_files(tmp_path / "b", extensions=None) == ["1.jpg", "2.PNG", "notes.txt"]
  assert folders.image_files(tmp_path / "b", extensions=(".txt",)) == ["notes.txt"]


def test_images_under_walks_the_tree(tmp_path):
  for name in ("z.JPEG", "sub/deeper/a.png", "sub/b.bmp", "sub/readme.md"):
    _touch(tmp_path / name)
  assert folders.images_under(tmp_path) == [
    os.path.join("sub", "b.bmp"),
    os.path.join("sub", "deeper", "a.png"),
    "z.JPEG",
  ]
