"""The baselines' training data: the patch features and image embeddings of the training images,
encoded once (`cache_features`), and App. D.2's descriptor targets of each class.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from mutual import features
from stori_jax.data.preprocess import normalize
from stori_jax.plumbing import paths


@dataclasses.dataclass(frozen=True)
class CachedFeatures:
  """Patch features of a set of images.

  Attributes:
    tokens: float [N, h, w, C] (float32 or float16: see `cache_features`).
    labels: int32 [N].
    embeddings: float32 [N, E], the tower's image embeddings, unnormalised (the Standard and
      LF-CBM rows' input); None: those two are not trained.
  """

  tokens: np.ndarray
  labels: np.ndarray
  embeddings: np.ndarray | None = None

  def __len__(self) -> int:
    return int(self.labels.shape[0])


def encode_features(
  bundle, images, kind: str = "tokens", batch_size: int = 64
) -> tuple[np.ndarray, np.ndarray]:
  """uint8 images [N, S, S, 3] -> (image embeddings float32 [N, E], unnormalised; patch features
  float32 [N, h, w, C]), from one tower pass, in fixed-size chunks (padded) so that the tower
  compiles once."""
  images = np.asarray(images)
  mean, std = bundle.preprocess_config.mean, bundle.preprocess_config.std
  embeddings, tokens = [], []
  for start in range(0, len(images), batch_size):
    part = images[start : start + batch_size]
    real = len(part)
    if real < batch_size and len(images) > batch_size:
      part = np.concatenate([part, np.zeros((batch_size - real, *part.shape[1:]), part.dtype)])
    e, t = features.embeddings_and_patches(
      bundle, normalize(part, mean, std), kind, normalize=False
    )
    embeddings.append(np.asarray(e, np.float32)[:real])
    tokens.append(np.asarray(t)[:real])
  return np.concatenate(embeddings), np.concatenate(tokens)


def encode_tokens(bundle, images, kind: str = "tokens", batch_size: int = 64) -> np.ndarray:
  """uint8 images [N, S, S, 3] -> float32 patch features [N, h, w, C] (`encode_features`')."""
  return encode_features(bundle, images, kind, batch_size)[1]


def cache_features(
  bundle,
  classes: Iterable,
  kind: str = "tokens",
  batch_size: int = 64,
  dtype=np.float32,
  progress: bool = True,
  directory: str | None = None,
) -> CachedFeatures:
  """Encodes the training images once (an iterable of mutual.data.ClassImages): their patch
  features and image embeddings (kept in float32: 2 KB per ViT-B/16 image).

  `dtype=np.float16` halves the patch features (ImageNet's ViT-B/16 tokens: 602 KB per image in
  float32). `directory` (a local folder): the patch features are written to
  <directory>/tokens.bin as they are encoded and read back memory-mapped (`tokens` is then an
  np.memmap; the training batches read their rows from it), for a training set larger than
  memory (every ImageNet training image: 385 GB in float16); None keeps them in memory.
  """
  tokens, labels, embeddings = [], [], []
  path = None if directory is None else os.path.join(directory, "tokens.bin")
  if path is not None:
    paths.makedirs(directory)
  shape = None
  # Streamed to a temporary file and moved over the file (`paths.AtomicWrite`): a memory map of
  # an earlier run's keeps its own, and a stopped run leaves no half file.
  with paths.AtomicWrite(path) if path is not None else contextlib.nullcontext() as sink:
    for cls in tqdm(classes, desc="cache features", disable=not progress, dynamic_ncols=True):
      e, t = encode_features(bundle, cls.images, kind, batch_size)
      t = np.ascontiguousarray(t, dtype)
      if sink is None:
        tokens.append(t)
      else:
        sink.write(t.tobytes())
        shape = t.shape[1:]
      embeddings.append(e)
      labels.append(np.full(len(cls.images), cls.label, np.int32))
    if not labels or (path is not None and shape is None):  # raised in the block: no file kept
      raise ValueError("no training images: the baselines need at least one class with images.")
  labels = np.concatenate(labels)
  if path is None:
    tokens = np.concatenate(tokens)
  else:
    tokens = np.memmap(path, np.dtype(dtype), "r", shape=(len(labels), *shape))
  return CachedFeatures(tokens, labels, np.concatenate(embeddings))


def descriptor_targets(
  class_names: Sequence[str], per_class: Mapping[str, Sequence[str]], bank: Sequence[str]
) -> np.ndarray:
  """float32 [C, D]: 1 where descriptor d is one of class c's descriptors (App. D.2's labels)."""
  index = {d: i for i, d in enumerate(bank)}
  targets = np.zeros((len(class_names), len(bank)), np.float32)
  for c, name in enumerate(class_names):
    for d in per_class.get(name, ()):
      if d in index:
        targets[c, index[d]] = 1.0
  return targets


def flat_tokens(tokens) -> jax.Array:
  """Patch features float [B, h, w, C] -> tokens [B, h * w, C]."""
  tokens = jnp.asarray(tokens)
  return tokens.reshape(tokens.shape[0], -1, tokens.shape[-1])


def embeddings_of(cached: CachedFeatures, who: str) -> np.ndarray:
  """float32 [N, E], the cached image embeddings that `who` trains on (refused when absent)."""
  if cached.embeddings is None:
    raise ValueError(f"{who} trains on the image embeddings: cache them (`cache_features` does).")
  return np.asarray(cached.embeddings, np.float32)
