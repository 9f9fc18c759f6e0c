"""A cached image-embedding index: unit rows float32 [N, E], one per image key.

The cache file `<cache_dir>/<key>.npz` is named by a SHA-256 over the model (architecture
config and a digest of every parameter), the data (its spec and image keys) and the
preprocessing (input size, mean, std), so a change in any of them builds a new index.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import zipfile

import jax
import numpy as np
from absl import logging
from tqdm import tqdm

from stori_jax.plumbing import jsonio, paths
from stori_jax.clip.encoding import encode_images
from stori_jax.retrieval.datasets import RetrievalData

#: Images loaded (decoded, resized) per step while building an index.
LOAD_CHUNK = 1024


@dataclasses.dataclass(frozen=True, eq=False)
class ImageIndex:
  """embeddings float32 [N, E] (unit rows) of the images `keys` [N]."""

  embeddings: np.ndarray
  keys: tuple[str, ...]
  path: str | None = None
  from_cache: bool = False


def params_digest(params) -> str:
  """SHA-256 over every parameter's path, dtype, shape and bytes."""
  h = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    array = np.ascontiguousarray(np.asarray(leaf))
    h.update(f"{jax.tree_util.keystr(path)}|{array.dtype}|{array.shape}".encode())
    h.update(array.tobytes())
  return h.hexdigest()


def cache_key(bundle, data: RetrievalData) -> str:
  """Hex key of (model config + params digest, data spec + keys, preprocessing)."""
  pre = bundle.preprocess_config
  description = {
    "model": {"config": bundle.config.to_dict(), "params": params_digest(bundle.params)},
    "data": {"spec": dict(data.spec), "keys": data.keys_digest()},
    "preprocessing": {
      "image_size": int(bundle.config.vision.image_size),
      "mean": list(pre.mean),
      "std": list(pre.std),
    },
  }
  blob = json.dumps(description, sort_keys=True, default=str).encode()
  return hashlib.sha256(blob).hexdigest()[:32]


def encode_data(bundle, data: RetrievalData, batch_size: int = 256) -> np.ndarray:
  """float32 [N, E] unit image embeddings of every image of `data`."""
  size = int(bundle.config.vision.image_size)
  n = len(data.keys)
  out = []
  for start in tqdm(range(0, n, LOAD_CHUNK), desc="index images", disable=n <= LOAD_CHUNK):
    images = data.load(np.arange(start, min(n, start + LOAD_CHUNK)), size)
    out.append(encode_images(bundle, images, batch_size, desc=None))
  return np.concatenate(out)


def build_index(
  bundle, data: RetrievalData, cache_dir: str | None = None, batch_size: int = 256
) -> ImageIndex:
  """Loads the index from cache_dir when its key matches, else encodes and stores it."""
  if not data.keys:
    raise ValueError(f"data {data.name!r} has no images to index")
  path = None
  if cache_dir:
    path = os.path.join(cache_dir, f"{data.name}-{cache_key(bundle, data)}.npz")
    cached = _read_cache(path) if paths.isfile(path) else None
    if cached is not None and cached[1] == tuple(data.keys):
      return ImageIndex(cached[0], cached[1], path, from_cache=True)
  embeddings = encode_data(bundle, data, batch_size)
  if path:
    # Whole under its name or absent (a unique temporary file renamed; on gs:// one upload): no
    # reader or concurrent writer ever sees a half-written cache.
    paths.makedirs(cache_dir)
    jsonio.write_arrays_atomic(path, {"embeddings": embeddings, "keys": np.asarray(data.keys)})
  return ImageIndex(embeddings, tuple(data.keys), path, from_cache=False)


def _read_cache(path: str) -> tuple[np.ndarray, tuple[str, ...]] | None:
  """(embeddings, keys) of a cache file, or None with a warning when it is unusable
  (truncated, corrupt, not finite): the index is then rebuilt and the file replaced."""
  try:
    with paths.open(path, "rb") as source, np.load(source) as f:
      embeddings, keys = f["embeddings"], tuple(str(k) for k in f["keys"])
  except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
    problem = f"{type(e).__name__}: {e}"
  else:
    if embeddings.ndim == 2 and len(embeddings) == len(keys) and np.isfinite(embeddings).all():
      return embeddings, keys
    problem = f"embeddings of shape {embeddings.shape} for {len(keys)} keys, or not finite"
  logging.warning("The index cache %s is unusable (%s); rebuilding it.", path, problem)
  return None
