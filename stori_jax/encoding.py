"""Batched encoding of images and texts by a CLIP bundle, and L2 normalisation.

`encode_images` and `encode_texts` return unit rows (float32 [N, E]) for any number of inputs:
they run the bundle's encoders on fixed-size batches (the last one padded by repeating its last
row, then cut), so that one compiled function serves every call; texts are also cut to their
longest tokenized length rounded up to a bucket of tokens, which is exact because the text
mask is causal. They use only `bundle.tokenize(texts, with_weights=...)`,
`bundle.encode_text(ids, weights=None, start_block=..., method=...)`, `bundle.encode_image` and
`bundle.preprocess_config.mean / std`, so any object with those (a CLIPBundle, a test stub)
works.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np
from tqdm import tqdm

from stori_jax.preprocess import normalize

#: Images or texts per encode call.
BATCH_SIZE = 256
#: Token rows are cut to the longest text rounded up to a multiple of this, so that prompts of
#: similar lengths share one compiled function.
LENGTH_BUCKET = 16
#: Norms below this are treated as this when normalising (a zero row stays zero).
NORM_EPSILON = 1e-12


def l2_normalize(x, axis: int = -1, eps: float = NORM_EPSILON) -> np.ndarray:
  """float32 `x` divided by its L2 norm along `axis` (at least `eps`).

  Args:
    x: array-like [..., E].
    axis: the axis normalised.
    eps: the smallest norm divided by.

  Returns:
    float32, the shape of `x`.
  """
  x = np.asarray(x, np.float32)
  return x / np.maximum(np.linalg.norm(x, axis=axis, keepdims=True), np.float32(eps))


def batch_rows(n: int, batch_size: int) -> int:
  """Rows per encode call for `n` inputs: batch_size, or for fewer inputs the next power of two
  (>= 8), so that few distinct shapes (few compilations) serve every call at most 2x padding."""
  if n >= batch_size:
    return max(1, int(batch_size))
  return min(int(batch_size), max(8, 1 << (int(n) - 1).bit_length()))


def trim_tokens(
  ids, weights=None, bucket: int = LENGTH_BUCKET
) -> tuple[np.ndarray, np.ndarray | None]:
  """Cuts token rows after the longest text, rounded up to a multiple of `bucket` tokens.

  Exact for CLIP's text tower: the mask is causal, so the end-of-text output does not depend on
  the padding after it.

  Args:
    ids: int [N, T] token ids, padded with id 0 after the end-of-text token.
    weights: float32 [N, T] token weights, or None.
    bucket: the length is rounded up to a multiple of this (at most T).

  Returns:
    (ids int [N, T'], weights float32 [N, T'] or None), T' <= T.
  """
  ids = np.asarray(ids)
  nonzero = ids != 0  # padding id 0 follows the end-of-text token
  length = int(np.max(ids.shape[1] - np.argmax(nonzero[:, ::-1], axis=1)))
  length = min(ids.shape[1], -(-length // bucket) * bucket)
  return ids[:, :length], None if weights is None else weights[:, :length]


def _padded(rows: np.ndarray, size: int) -> np.ndarray:
  """`rows` [n, ...] with its last row repeated up to `size` rows."""
  if len(rows) >= size:
    return rows
  return np.concatenate([rows, np.repeat(rows[-1:], size - len(rows), axis=0)])


def _batches(n: int, size: int, desc: str | None) -> Iterator[slice]:
  """Slices of `size` rows over n rows, with a progress bar when there are several (desc None:
  no bar; a single batch finishes before a bar is useful)."""
  starts = range(0, n, size)
  bar = tqdm(
    starts,
    total=len(starts),
    desc=desc,
    leave=False,
    dynamic_ncols=True,
    disable=desc is None or len(starts) <= 1,
  )
  for start in bar:
    yield slice(start, start + size)


def encode_images(
  bundle, images: np.ndarray, batch_size: int = BATCH_SIZE, desc: str | None = "encode images"
) -> np.ndarray:
  """L2-normalised image embeddings of uint8 images.

  Args:
    bundle: a CLIPBundle (or anything with encode_image and preprocess_config).
    images: uint8 [N, S, S, 3] RGB at the model's input size.
    batch_size: images per encode call; the last batch is padded to the same shape, so one
      compiled function serves every call (fewer images: padded to a power of two).
    desc: progress-bar label (None: no bar).

  Returns:
    float32 [N, E], unit rows.
  """
  images = np.asarray(images)
  if images.dtype != np.uint8 or images.ndim != 4 or not len(images):
    raise ValueError(
      f"encode_images takes uint8 [N>0, S, S, 3] images, got {images.dtype} {images.shape}"
    )
  mean, std = bundle.preprocess_config.mean, bundle.preprocess_config.std
  chunk = batch_rows(len(images), batch_size)
  out = []
  for rows in _batches(len(images), chunk, desc):
    part = normalize(images[rows], mean, std)
    count = len(part)
    out.append(np.asarray(bundle.encode_image(_padded(part, chunk)), np.float32)[:count])
  return l2_normalize(np.concatenate(out))


def encode_texts(
  bundle,
  texts: Sequence,
  weighted: bool = False,
  method: str = "stori",
  start_block: int | None = None,
  batch_size: int = BATCH_SIZE,
  desc: str | None = "encode texts",
) -> np.ndarray:
  """L2-normalised text embeddings.

  Args:
    bundle: a CLIPBundle (or anything with tokenize and encode_text).
    texts: N strings (or, with weighted, prompts in the `(words:1.5)` syntax / segment lists).
    weighted: parse the weight syntax and pass the token weights to the encoder. Plain texts
      (captions may hold ':') are tokenized literally.
    method: "stori" or "prompt_weighting" (see CLIPBundle.encode_text); used only when some
      token weight differs from 1.
    start_block: first reweighted block (1-indexed); None: the bundle's default.
    batch_size: texts per encode call; rows are cut to the longest tokenized text rounded
      up to a multiple of 16 tokens (`trim_tokens`) and the last batch is padded, so one
      compiled function serves every call.
    desc: progress-bar label (None: no bar).

  Returns:
    float32 [N, E], unit rows.
  """
  texts = list(texts)
  if not texts:
    raise ValueError("encode_texts needs at least one text")
  if weighted:
    ids, weights = bundle.tokenize(texts, with_weights=True)
    weights = np.asarray(weights, np.float32)
    if np.all(weights == 1.0):
      weights = None
  else:
    ids, weights = bundle.tokenize(texts), None
  ids, weights = trim_tokens(ids, weights)
  chunk = batch_rows(len(texts), batch_size)
  out = []
  for rows in _batches(len(texts), chunk, desc):
    part_ids = _padded(ids[rows], chunk)
    count = min(len(texts), rows.stop) - rows.start
    if weights is None:
      features = bundle.encode_text(part_ids)
    else:
      part_weights = _padded(weights[rows], chunk)
      features = bundle.encode_text(part_ids, part_weights, start_block=start_block, method=method)
    out.append(np.asarray(features, np.float32)[:count])
  return l2_normalize(np.concatenate(out))
