"""Reading attribute tables: CelebA's and CUB-200-2011's per-image binary attributes.

Each reader returns (image file names [M], {attribute name: bool [M]}), in the files' order.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from stori_jax.data.files import read_text_lines
from stori_jax.plumbing import paths as storage
from stori_jax.plumbing.errors import InputError


def read_celeba_attributes(path: str | os.PathLike) -> tuple[list[str], dict[str, np.ndarray]]:
  """list_attr_celeba.txt -> (file names [M], {attribute: bool [M]}).

  Format: the image count, a line of the 40 attribute names, then per image its file name
  and 40 values in {1, -1}.

  Raises:
    InputError: the file is not UTF-8 or not in that format (the problem named).
  """
  path = os.fspath(path)
  lines = [line.split() for line in read_text_lines(path, "CelebA attribute file")]
  if len(lines) < 2 or not lines[0] or not lines[0][0].isdigit():
    raise InputError(f"{path} is not in list_attr_celeba.txt format (count, names, rows)")
  count, names, rows = int(lines[0][0]), lines[1], lines[2:]
  if len(rows) != count:
    raise InputError(
      f"{path} announces {count} images but lists {len(rows)}; the file is truncated or edited."
    )
  bad = [r[0] if r else "(empty line)" for r in rows if len(r) != len(names) + 1]
  if bad:
    raise InputError(f"{path}: rows {bad[:5]} do not have {len(names)} values")
  try:
    values = np.asarray([r[1:] for r in rows], np.int64)
  except ValueError:
    raise InputError(f"{path}: attribute values must be 1 or -1 (integers)") from None
  if not np.isin(values, (-1, 1)).all():
    raise InputError(f"{path}: attribute values must be 1 or -1")
  return [r[0] for r in rows], {n: values[:, j] == 1 for j, n in enumerate(names)}


def celeba_split_rows(root: str | os.PathLike, files: Sequence[str], split: str) -> np.ndarray:
  """bool [M]: the rows of `files` in CelebA's `split` ("all", or "train" / "valid" / "test"
  as `root`/list_eval_partition.txt assigns them)."""
  if split == "all":
    return np.ones(len(files), bool)
  codes = {"train": "0", "valid": "1", "test": "2"}
  if split not in codes:
    raise ValueError(f"split must be 'all', 'train', 'valid' or 'test', got {split!r}")
  path = os.path.join(os.fspath(root), "list_eval_partition.txt")
  if not storage.isfile(path):
    raise ValueError(f"split {split!r} needs {path}; use split='all' without it")
  with storage.open(path) as f:
    partition = dict(line.split()[:2] for line in f if line.strip())
  return np.asarray([partition.get(name) == codes[split] for name in files])


def _first_file(paths: Sequence[str]) -> str:
  for path in paths:
    if storage.isfile(path):
      return path
  raise InputError(f"none of {list(paths)} exists; is data.root the CUB_200_2011 folder?")


def read_cub_attributes(root: str | os.PathLike) -> tuple[list[str], dict[str, np.ndarray]]:
  """CUB_200_2011 -> (image paths relative to images/ [M], {attribute name: bool [M]}).

  Files: images.txt ("<image_id> <path>"), attributes.txt ("<attribute_id> <name>", at the
  root, in attributes/ or in the parent folder, as the archive unpacks) and
  attributes/image_attribute_labels.txt ("<image_id> <attribute_id> <is_present>
  <certainty_id> <time>"; a few official lines hold extra fields, ignored).
  """
  root = os.fspath(root)
  with storage.open(_first_file([os.path.join(root, "images.txt")])) as f:
    images = [line.split() for line in f if line.strip()]
  ids = {int(r[0]): k for k, r in enumerate(images)}
  names_path = _first_file(
    [
      os.path.join(root, "attributes.txt"),
      os.path.join(root, "attributes", "attributes.txt"),
      os.path.join(storage.parent(root), "attributes.txt"),
    ]
  )
  with storage.open(names_path) as f:
    names = dict(line.split()[:2] for line in f if line.strip())
  labels_path = _first_file([os.path.join(root, "attributes", "image_attribute_labels.txt")])
  with storage.open(labels_path) as f:
    rows = np.loadtxt(f, dtype=np.int64, usecols=(0, 1, 2), ndmin=2)
  present = np.zeros((len(images), max(int(k) for k in names) + 1), bool)
  unknown = set(rows[:, 0].tolist()) - set(ids)
  if unknown:
    raise InputError(f"{labels_path} names images {sorted(unknown)[:5]} absent from images.txt")
  present[[ids[i] for i in rows[:, 0]], rows[:, 1]] = rows[:, 2] == 1
  table = {name: present[:, int(k)] for k, name in names.items()}
  return [r[1] for r in images], table
