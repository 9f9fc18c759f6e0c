"""An image folder as the explorer's index: its readable images, without labels.

Unreadable files (truncated, corrupt, not images, not regular files such as a FIFO) are
skipped, each named in a warning. The check decodes every image once; with a cache_dir its
result is remembered beside the index (`folder-<fingerprint>.images.json`), so later starts
only stat the files.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Callable, Sequence

import numpy as np
from absl import logging

from stori_jax.plumbing import paths as storage
from stori_jax.plumbing import jsonio
from stori_jax.plumbing.errors import InputError, UserError
from stori_jax.data.preprocess import resize_center_crop, to_pil
from stori_jax.retrieval import datasets


def image_folder(root: str, cache_dir: str | None = None):
  """The readable images under `root` as RetrievalData (keys: sorted relative paths).

  The data's spec, part of the index cache key, holds a fingerprint of every file's size,
  modification and change times, so an image replaced under the same name builds a new
  index.

  Raises:
    InputError: `root` is not a folder of images, or none of its images can be read.
  """
  try:
    listing = datasets.folder_data(root)
  except ValueError as e:
    raise InputError(f"--images {root}: {e}") from None
  stamps = []
  for key in listing.keys:
    try:
      if storage.is_remote(root):  # an object's size and generation
        stamps.append("\t".join([key, *map(str, storage.version(storage.join(root, key)))]))
        continue
      st = os.stat(os.path.join(root, key))
      stamps.append(f"{key}\t{st.st_size}\t{st.st_mtime_ns}\t{st.st_ctime_ns}")
    except OSError:
      stamps.append(f"{key}\tmissing")
  fingerprint = hashlib.sha256("\n".join(stamps).encode()).hexdigest()
  unreadable = _unreadable_images(root, listing.keys, fingerprint, cache_dir)
  kept = tuple(k for k in listing.keys if k not in unreadable)
  if not kept:
    raise InputError(
      f"none of the {len(listing.keys)} images under {root} can be read: "
      + "; ".join(f"{k} ({unreadable[k]})" for k in list(unreadable)[:5])
      + ("; ..." if len(unreadable) > 5 else "")
      + ". Replace them with readable images."
    )
  if unreadable:
    logging.warning(
      "Skipping %d of the %d images under %s, which cannot be read:\n%s",
      len(unreadable),
      len(listing.keys),
      root,
      "\n".join(f"  {os.path.join(root, k)}: {reason}" for k, reason in unreadable.items()),
    )
  spec = {**listing.spec, "files": fingerprint}
  return datasets.RetrievalData(
    "folder", spec, kept, _file_loader([os.path.join(root, k) for k in kept]), ()
  )


def _file_loader(paths: Sequence[str]) -> Callable[[np.ndarray, int], np.ndarray]:
  """(indices, size) -> uint8 [n, size, size, 3]: files read, resized and center-cropped."""

  def load(indices, size):
    return np.stack(
      [
        np.asarray(resize_center_crop(to_pil(paths[int(i)]).convert("RGB"), size))
        for i in np.asarray(indices).reshape(-1)
      ]
    ).astype(np.uint8)

  return load


def _image_problem(path: str) -> str | None:
  """Why the image file cannot be used (short), or None when it decodes to pixels.

  Read through the project's one image reader (`preprocess.to_pil`, as the mutual and
  retrieval readers): it refuses what is not a regular file, such as a FIFO named x.png,
  before opening it, where opening one would wait forever for a writer (issue 26 row 14).
  """
  try:
    image = to_pil(path)
    if image.width == 0 or image.height == 0:
      return f"it has no pixels ({image.width}x{image.height})"
    image.convert("RGB")
  except UserError as e:  # a clear message already; the warning names the full path
    return str(e).replace(path, os.path.basename(path))
  except Exception as e:  # pylint: disable=broad-except  # any decoder failure: skip, named
    return f"{type(e).__name__}: {e}"
  return None


def _unreadable_images(
  root: str, keys: Sequence[str], fingerprint: str, cache_dir: str | None
) -> dict[str, str]:
  """{key: reason} of the images under root that cannot be read; remembered per fingerprint."""
  record = os.path.join(cache_dir, f"folder-{fingerprint[:32]}.images.json") if cache_dir else None
  if record and storage.isfile(record):
    try:
      with storage.open(record) as f:
        saved = json.load(f)
      unreadable = saved["unreadable"]
      if saved["images"] == len(keys) and set(unreadable) <= set(keys):
        return {str(k): str(v) for k, v in unreadable.items()}
      problem = "it lists other images"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
      problem = f"{type(e).__name__}: {e}"
    logging.warning(
      "The image check record %s is unusable (%s); checking the images again.", record, problem
    )
  unreadable = {}
  for key in keys:
    problem = _image_problem(os.path.join(root, key))
    if problem is not None:
      unreadable[key] = problem
  if record:
    try:
      storage.makedirs(cache_dir, exist_ok=True)
      jsonio.write_json(
        record,
        {"root": storage.absolute(root), "images": len(keys), "unreadable": unreadable},
        indent=1,
      )
    except OSError as e:  # only an optimisation: say so and go on
      logging.warning(
        "Cannot write %s (%s); the images will be checked again next time.", record, e
      )
  return unreadable
