"""Fully connected CRF refinement of a binary mask (Kraehenbuehl & Koltun 2011), in JAX.

Two labels, Potts compatibility, mean-field inference as pydensecrf runs it:
  Q <- softmax(-U + sum_k w_k * n_k * K_k (n_k * Q)),
with n_k = 1 / sqrt(K_k 1) (pydensecrf's NORMALIZE_SYMMETRIC) and two kernels:
  appearance  exp(-|p_i - p_j|^2 / 2 spatial_sigma^2 - |I_i - I_j|^2 / 2 rgb_sigma^2),
  smoothness  exp(-|p_i - p_j|^2 / 2 gaussian_sigma^2),
p in pixels and I in 0-255 RGB. pydensecrf evaluates both with a permutohedral lattice; here the
smoothness kernel is an exact separable convolution (truncated at 4 sigma) and the appearance
kernel is an exact dense sum when the image has at most `max_keys` pixels. Larger images sum
over keys pooled on a coarse grid (f x f cells, f the smallest factor leaving <= max_keys
cells; each cell carries its pixel count, mean position, mean colour and mean Q), every pixel
still a query: O(N * max_keys) per iteration.
The unary is -log of a fixed confidence in the mask (pydensecrf's unary_from_labels with
gt_prob = confidence). The reference passes a one-hot mask to SimpleCRF, which clips it to
[0.01, 0.99]: confidence 0.99; config.analysis.mode picks 0.99 or 0.9 (paper_config.MODE_STAGES).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from mutual.foreground import pixel_coordinates


def _gaussian_taps(sigma: float) -> jax.Array:
  radius = max(1, math.ceil(4 * sigma))
  x = np.arange(-radius, radius + 1, dtype=np.float64)
  return jnp.asarray(np.exp(-(x**2) / (2 * sigma**2)), jnp.float32)


def smoothness_filter(values: jax.Array, sigma: float) -> jax.Array:
  """sum_j exp(-|p_i - p_j|^2 / 2 sigma^2) values_j for values float [H, W, C] (self
  included, zero outside the image), as two 1-D convolutions."""
  taps = _gaussian_taps(sigma)
  radius = (taps.shape[0] - 1) // 2
  height, width = values.shape[:2]
  padded = jnp.pad(values, ((radius, radius), (0, 0), (0, 0)))
  rows = sum(taps[i] * padded[i : i + height] for i in range(taps.shape[0]))
  padded = jnp.pad(rows, ((0, 0), (radius, radius), (0, 0)))
  return sum(taps[i] * padded[:, i : i + width] for i in range(taps.shape[0]))


def _pool(values: jax.Array, factor: int):
  """Sums of float [H, W, C] over factor x factor cells (zero-padded) -> [cells, C]."""
  height, width, channels = values.shape
  ph, pw = -height % factor, -width % factor
  values = jnp.pad(values, ((0, ph), (0, pw), (0, 0)))
  h, w = values.shape[0] // factor, values.shape[1] // factor
  return values.reshape(h, factor, w, factor, channels).sum(axis=(1, 3)).reshape(h * w, channels)


def pooling_factor(height: int, width: int, max_keys: int) -> int:
  """Smallest f with ceil(H / f) * ceil(W / f) <= max_keys (1: exact)."""
  factor = 1
  while math.ceil(height / factor) * math.ceil(width / factor) > max_keys:
    factor += 1
  return factor


def appearance_operator(features, factor: int, chunk: int = 1024, dense_entries: int = 2**25):
  """The appearance filter of one image as a function of the values.

  Args:
    features: float [H, W, F] scaled features (position / sigma, colour / sigma).
    factor: key pooling factor (1: every pixel is a key).
    chunk: query rows per block when the kernel is recomputed at each call.
    dense_entries: kernels with at most this many entries are built once and kept.

  Returns:
    filter(values float [H, W, C]) -> sum_j exp(-|f_i - f_j|^2 / 2) values_j, [H, W, C]; with
    factor > 1 the keys j are factor x factor cells (count-weighted means).
  """
  height, width, dim = features.shape
  queries = features.reshape(-1, dim)
  if factor == 1:
    keys = queries
  else:
    counts = _pool(jnp.ones((height, width, 1), features.dtype), factor)
    keys = _pool(features, factor) / jnp.maximum(counts, 1.0)
  key_norms = jnp.sum(keys * keys, axis=1)

  def kernel(q):
    d2 = jnp.sum(q * q, axis=1)[:, None] - 2.0 * q @ keys.T + key_norms[None]
    return jnp.exp(-0.5 * jnp.maximum(d2, 0.0))

  def key_values(values):
    if factor == 1:
      return values.reshape(-1, values.shape[-1])
    return _pool(values, factor)  # sums: count * mean value

  n = queries.shape[0]
  if n * keys.shape[0] <= dense_entries:
    dense = kernel(queries)
    return lambda values: (dense @ key_values(values)).reshape(height, width, -1)
  pad = -n % chunk
  blocks = jnp.pad(queries, ((0, pad), (0, 0))).reshape(-1, chunk, dim)

  def apply(values):
    kv = key_values(values)
    out = jax.lax.map(lambda q: kernel(q) @ kv, blocks)
    return out.reshape(-1, values.shape[-1])[:n].reshape(height, width, -1)

  return apply


def appearance_filter(features, values, factor: int, chunk: int = 1024, dense_entries=2**25):
  """appearance_operator(features, factor, chunk, dense_entries)(values)."""
  return appearance_operator(features, factor, chunk, dense_entries)(values)


class CRFParams(NamedTuple):
  """Mean-field settings (hashable: a static argument of the jitted inference)."""

  iterations: int
  bilateral_weight: float
  spatial_sigma: float
  rgb_sigma: float
  gaussian_weight: float
  gaussian_sigma: float
  confidence: float
  factor: int


def _refine_one(image, mask, p: CRFParams):
  height, width = mask.shape
  features = jnp.concatenate(
    [
      pixel_coordinates(height, width) / p.spatial_sigma,
      image.astype(jnp.float32) / p.rgb_sigma,
    ],
    axis=-1,
  )
  confidence = jnp.asarray([1 - p.confidence, p.confidence])
  unary = -jnp.log(jnp.where(mask[..., None], confidence, confidence[::-1]))
  ones = jnp.ones((height, width, 1), jnp.float32)
  appearance = appearance_operator(features, p.factor)
  norm_app = jax.lax.rsqrt(appearance(ones) + 1e-20)
  norm_smooth = jax.lax.rsqrt(smoothness_filter(ones, p.gaussian_sigma) + 1e-20)

  def step(_, q):
    message = p.bilateral_weight * norm_app * appearance(norm_app * q)
    message += (
      p.gaussian_weight * norm_smooth * smoothness_filter(norm_smooth * q, p.gaussian_sigma)
    )
    return jax.nn.softmax(-unary + message, axis=-1)

  q = jax.lax.fori_loop(0, p.iterations, step, jax.nn.softmax(-unary, axis=-1))
  return q[..., 1] > q[..., 0]


@functools.partial(jax.jit, static_argnames=("params",))
def _refine(images, masks, params: CRFParams):
  # One image at a time bounds memory to one image's kernel blocks.
  return jax.lax.map(lambda args: _refine_one(*args, params), (images, masks))


def refine(
  images,
  mask,
  iterations: int = 5,
  bilateral_weight: float = 10.0,
  spatial_sigma: float = 40.0,
  rgb_sigma: float = 13.0,
  gaussian_weight: float = 3.0,
  gaussian_sigma: float = 3.0,
  confidence: float = 0.9,
  max_keys: int = 4096,
) -> jax.Array:
  """Dense-CRF refinement of binary masks.

  Args:
    images: uint8 [B, H, W, 3] RGB.
    mask: bool [B, H, W], e.g. the nearest-upsampled prominent-patch mask.
    iterations: mean-field steps.
    bilateral_weight, spatial_sigma, rgb_sigma: appearance kernel (sigmas in pixels, 0-255).
    gaussian_weight, gaussian_sigma: smoothness kernel.
    confidence: probability the unary gives the mask's label (in (0.5, 1)).
    max_keys: images with more pixels use pooled appearance keys (see the module docstring).

  Returns:
    bool [B, H, W], the refined foreground.
  """
  images, mask = np.asarray(images), np.asarray(mask)
  if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != np.uint8:
    raise ValueError(f"images must be uint8 [B, H, W, 3], got {images.dtype} {images.shape}.")
  if mask.shape != images.shape[:3]:
    raise ValueError(
      f"mask {mask.shape} must be [B, H, W] like the images {images.shape[:3]}; upsample the "
      "patch mask first (mutual.foreground.upsample_mask)."
    )
  if not 0.5 < confidence < 1.0:
    raise ValueError(f"confidence must lie in (0.5, 1), got {confidence}.")
  if min(spatial_sigma, rgb_sigma, gaussian_sigma) <= 0:
    raise ValueError("CRF sigmas must be positive.")
  factor = pooling_factor(images.shape[1], images.shape[2], max_keys)
  params = CRFParams(
    int(iterations),
    float(bilateral_weight),
    float(spatial_sigma),
    float(rgb_sigma),
    float(gaussian_weight),
    float(gaussian_sigma),
    float(confidence),
    factor,
  )
  return _refine(jnp.asarray(images), jnp.asarray(mask, bool), params)
