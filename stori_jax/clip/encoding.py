"""Batched encoding of images and texts by a CLIP bundle, and L2 normalisation.

`encode_images`, `encode_texts` and `encode_tokens` return unit rows (float32 [N, E]) for any
number of inputs: they run the bundle's encoders on fixed-size batches (the last one padded by
repeating its last row, then cut), so that one compiled function serves every call; token rows
are also cut to their longest text rounded up to a bucket of tokens, which is exact because the
text mask is causal. `encode_pixels` does the same for preprocessed images arriving in chunks of any
size (an image set larger than memory streams through), and `encode_images_on_device` for float
images already on the device, returning a jax.Array for callers that go on computing there.
`l2_normalize` (numpy) and `l2_normalize_jax` (traceable) are the one normalisation of the
project's embeddings.

They use only `bundle.tokenize(texts, with_weights=...)`,
`bundle.encode_text(ids, weights=None, start_block=..., stop_block=..., method=...)`,
`bundle.encode_image` and `bundle.preprocess_config.mean / std`, so any object with those (a
CLIPBundle, a test stub) works.
"""

from __future__ import annotations

from typing import Iterable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from stori_jax.data.preprocess import normalize

#: Images or texts per encode call.
BATCH_SIZE = 256
#: Token rows are cut to the longest text rounded up to a multiple of this, so that prompts of
#: similar lengths share one compiled function.
LENGTH_BUCKET = 16
#: Norms below this are treated as this when normalising (a zero row stays zero).
NORM_EPSILON = 1e-12


def l2_normalize(x, axis: int = -1, eps: float = NORM_EPSILON, dtype=np.float32) -> np.ndarray:
  """`x` as `dtype` divided by its L2 norm along `axis` (at least `eps`).

  Args:
    x: array-like [..., E].
    axis: the axis normalised.
    eps: the smallest norm divided by.
    dtype: the floating dtype computed in and returned (float64 for statistics that need it).

  Returns:
    `dtype`, the shape of `x`.
  """
  x = np.asarray(x, dtype)
  return x / np.maximum(np.linalg.norm(x, axis=axis, keepdims=True), np.asarray(eps, x.dtype))


def l2_normalize_jax(x: jax.Array, axis: int = -1, eps: float | None = NORM_EPSILON) -> jax.Array:
  """`x` divided by its L2 norm along `axis` (at least `eps`), traceable and differentiable.

  Wherever the norm exceeds `eps` the values and the gradients are those of x / ||x||; the
  floor keeps a zero row's value zero instead of NaN (its gradient stays undefined).

  Args:
    x: float [..., E], any float dtype.
    axis: the axis normalised.
    eps: the smallest norm divided by (a Python float, so that it takes x's dtype). None: no
      floor, for compiled code whose rounding must not move: XLA rewrites x / sqrt(s) as
      x * rsqrt(s) only when nothing stands between them, so under jit the floor changes
      results by an ulp.

  Returns:
    x's dtype and shape.
  """
  norm = jnp.linalg.norm(x, axis=axis, keepdims=True)
  return x / (norm if eps is None else jnp.maximum(norm, eps))


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


def _packed(chunks: Iterable[np.ndarray], size: int) -> Iterator[tuple[np.ndarray, int]]:
  """(batch [size, ...], real rows) over the rows of `chunks`, in order; the last batch is
  padded by `_padded`. Holds at most one batch of rows beyond the current chunk."""
  pending, count = [], 0
  for chunk in chunks:
    start = 0
    while start < len(chunk):
      take = chunk[start : start + size - count]
      start += len(take)
      pending.append(take)
      count += len(take)
      if count == size:
        yield (pending[0] if len(pending) == 1 else np.concatenate(pending)), size
        pending, count = [], 0
  if count:
    yield _padded(np.concatenate(pending), size), count


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


def encode_pixels(bundle, chunks: Iterable[np.ndarray], batch_size: int = BATCH_SIZE) -> np.ndarray:
  """L2-normalised image embeddings of preprocessed images that arrive in chunks.

  Args:
    bundle: a CLIPBundle (or anything with encode_image).
    chunks: float32 [n_i, S, S, 3] normalised images, chunks of any size (also 0), read lazily.
    batch_size: the rows of every encode call (exactly: the rows are packed across chunks and
      the last batch is padded), so one compiled function serves every call. A row's embedding
      does not depend on the other rows of its batch.

  Returns:
    float32 [sum n_i, E], unit rows in input order.

  Raises:
    ValueError: the chunks held no image.
  """
  out = [
    np.asarray(bundle.encode_image(batch), np.float32)[:count]
    for batch, count in _packed(chunks, batch_size)
  ]
  if not out:
    raise ValueError("encode_pixels got no images")
  return l2_normalize(np.concatenate(out))


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
  # Normalised one batch at a time: float32 pixels take 4x the memory of the uint8 images.
  pixels = (normalize(images[rows], mean, std) for rows in _batches(len(images), chunk, desc))
  return encode_pixels(bundle, pixels, chunk)


def encode_images_on_device(bundle, images, batch_size: int = BATCH_SIZE) -> jax.Array:
  """L2-normalised image embeddings of float images, computed and kept on the device.

  For callers that go on computing with the embeddings in JAX (the mutual-knowledge analysis
  scores perturbed and visually prompted images this way).

  Args:
    bundle: a CLIPBundle (or anything with encode_image and preprocess_config).
    images: float [N>0, S, S, 3] RGB in [0, 1] (jax or numpy); normalised here with the
      bundle's mean and std.
    batch_size: at most this many images per encode call: min(batch_size, N) rows, the last
      call padded by repeating its last image, so one compiled function serves a call.

  Returns:
    float32 jax.Array [N, E], unit rows.
  """
  images = jnp.asarray(images, jnp.float32)
  n = images.shape[0]
  if not n:
    raise ValueError("encode_images_on_device got no images")
  mean = jnp.asarray(bundle.preprocess_config.mean, jnp.float32)
  std = jnp.asarray(bundle.preprocess_config.std, jnp.float32)
  chunk = min(int(batch_size), n)
  out = []
  for start in range(0, n, chunk):
    part = images[start : start + chunk]
    real = part.shape[0]
    if real < chunk:
      part = jnp.concatenate([part, jnp.repeat(part[-1:], chunk - real, axis=0)])
    out.append(l2_normalize_jax(bundle.encode_image((part - mean) / std)[:real]))
  return out[0] if len(out) == 1 else jnp.concatenate(out)


def encode_tokens(
  bundle,
  ids,
  weights=None,
  method: str = "stori",
  start_block: int | None = None,
  stop_block: int | None = None,
  batch_size: int = BATCH_SIZE,
  desc: str | None = None,
  normalize: bool = True,
) -> np.ndarray:
  """L2-normalised (or, with normalize=False, raw) text embeddings of tokenized texts.

  Args:
    bundle: a CLIPBundle (or anything with encode_text).
    ids: int [N>0, T] token ids, padded with id 0 after the end-of-text token.
    weights: float32 [N, T] token weights, passed to the encoder as they are (all ones too:
      the weighted encoders may round differently from the plain one), or None: plain CLIP.
    method: "stori" or "prompt_weighting" (see CLIPBundle.encode_text).
    start_block, stop_block: the reweighted blocks (1-indexed, inclusive; stop_block only for
      "stori"); None: the bundle's defaults.
    batch_size: texts per encode call; rows are cut to the longest text rounded up to a
      multiple of 16 tokens (`trim_tokens`) and the last batch is padded, so one compiled
      function serves every call.
    desc: progress-bar label (None: no bar).
    normalize: False returns the text tower's output as it is (TaskRes averages raw features).

  Returns:
    float32 [N, E], unit rows when normalize.
  """
  ids, weights = trim_tokens(ids, None if weights is None else np.asarray(weights, np.float32))
  if not len(ids):
    raise ValueError("encode_tokens needs at least one text")
  blocks = {"start_block": start_block, "method": method}
  if stop_block is not None:  # prompt weighting takes none (and test stubs may not either)
    blocks["stop_block"] = stop_block
  chunk = batch_rows(len(ids), batch_size)
  out = []
  for rows in _batches(len(ids), chunk, desc):
    part_ids = _padded(ids[rows], chunk)
    count = min(len(ids), rows.stop) - rows.start
    if weights is None:
      features = bundle.encode_text(part_ids)
    else:
      features = bundle.encode_text(part_ids, _padded(weights[rows], chunk), **blocks)
    out.append(np.asarray(features, np.float32)[:count])
  features = np.concatenate(out)
  return l2_normalize(features) if normalize else features


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
      token weight differs from 1 (all ones: the plain encoder, one compilation less).
    start_block: first reweighted block (1-indexed); None: the bundle's default.
    batch_size: texts per encode call (see `encode_tokens`).
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
  return encode_tokens(
    bundle,
    ids,
    weights,
    method=method,
    start_block=start_block,
    batch_size=batch_size,
    desc=desc,
  )
