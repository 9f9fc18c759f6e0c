"""Listing image folders: class folders under a root, the images in a folder or under a tree.

Every listing is sorted, so that labels and image order are the same on every machine; the
listings of one folder skip hidden entries (names starting with '.', such as .DS_Store).
"""

from __future__ import annotations

import os
from typing import Sequence

from stori_jax.plumbing import paths

#: File name endings read as images (compared in lower case).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")


def visible_entries(folder: str | os.PathLike) -> list[str]:
  """The sorted names in `folder` that do not start with '.'."""
  return sorted(name for name in paths.listdir(folder) if not name.startswith("."))


def subfolders(root: str | os.PathLike) -> list[str]:
  """The sorted names of the visible folders in `root` (class folders)."""
  return [name for name in visible_entries(root) if paths.isdir(os.path.join(root, name))]


def image_files(
  folder: str | os.PathLike, extensions: Sequence[str] | None = IMAGE_EXTENSIONS
) -> list[str]:
  """The sorted names of the visible files in `folder` ending with one of `extensions` (any
  case; None: every visible entry, as CoOp's ImageNet folders are read)."""
  names = visible_entries(folder)
  if extensions is None:
    return names
  return [name for name in names if name.lower().endswith(tuple(extensions))]


def images_under(
  root: str | os.PathLike, extensions: Sequence[str] = IMAGE_EXTENSIONS
) -> list[str]:
  """The sorted paths, relative to `root`, of every file under it (any depth) ending with one of
  `extensions` (any case)."""
  root = os.fspath(root)
  return sorted(
    os.path.relpath(os.path.join(folder, name), root)
    for folder, _, names in paths.walk(root)
    for name in names
    if name.lower().endswith(tuple(extensions))
  )
