"""Prominent patches: spectral split of the patch affinity, then the main connected regions.

Sammani & Deligiannis (2024), Sec. 3.1 and App. A.3: the sign of the second eigenvector of the
affinity f f^T of L2-normalised patch features (all B images jointly) splits foreground from
background; per image the largest 8-connected region (plus the second largest when it has at
least `min_second` patches) is kept.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from stori_jax.encoding import l2_normalize_jax


def _check_features(features) -> jax.Array:
  features = jnp.asarray(features)
  if features.ndim != 4:
    raise ValueError(
      f"features must be [B, h, w, D] (patch_features output), got shape {features.shape}."
    )
  return features.astype(jnp.float32)


@functools.partial(jax.jit, static_argnames=("center",))
def fiedler_vector(features: jax.Array, center: bool = False) -> jax.Array:
  """Second left singular vector of the L2-normalised patch features, sign fixed.

  Args:
    features: float32 [B, h, w, D].
    center: subtract the mean patch feature (over all B*h*w patches) before normalising; not
      in the reference, but it keeps a shared offset direction (strong in small models) from
      taking the first singular vector's place.

  Returns:
    float32 [B, h, w]: the second eigenvector of the affinity f f^T over all B*h*w patches.
    The reference's sign rule is applied: the vector is negated when the fraction of positive
    entries lies strictly between 0.5 and 1, so positive (foreground) is the smaller side.
  """
  batch, height, width, dim = features.shape
  flat = features.reshape(-1, dim)
  if center:
    flat = flat - jnp.mean(flat, axis=0)
  flat = l2_normalize_jax(flat)
  u, _, _ = jnp.linalg.svd(flat, full_matrices=False)
  second = u[:, 1]
  positive = jnp.mean(second > 0)
  second = jnp.where((positive > 0.5) & (positive < 1.0), -second, second)
  return second.reshape(batch, height, width)


def _component_roots(mask: jax.Array) -> jax.Array:
  """bool [h, w] -> int32 [h, w]: each foreground patch's component id, the smallest flat index
  in its 8-connected component (so ids follow scipy.ndimage.label's raster order); background
  gets h*w."""
  height, width = mask.shape
  none = height * width
  init = jnp.where(mask, jnp.arange(none, dtype=jnp.int32).reshape(height, width), none)

  def spread(labels):
    # Minimum over the 3x3 neighbourhood, restricted to foreground patches.
    padded = jnp.pad(labels, 1, constant_values=none)
    shifted = [
      padded[1 + dy : 1 + dy + height, 1 + dx : 1 + dx + width]
      for dy in (-1, 0, 1)
      for dx in (-1, 0, 1)
    ]
    return jnp.where(mask, jnp.min(jnp.stack(shifted), axis=0), none)

  def cond(state):
    labels, previous = state
    return jnp.any(labels != previous)

  def body(state):
    labels, _ = state
    return spread(labels), labels

  labels, _ = jax.lax.while_loop(cond, body, (spread(init), init))
  return labels


@jax.jit
def connected_components(mask: jax.Array) -> jax.Array:
  """8-connected components of bool masks [B, h, w] -> int32 labels [B, h, w].

  Labels are 1..n per image in raster order of each component's first patch (as
  scipy.ndimage.label numbers them), 0 for background.
  """
  roots = jax.vmap(_component_roots)(mask)
  batch, height, width = mask.shape
  none = height * width
  flat = roots.reshape(batch, -1)
  is_root = flat == jnp.arange(none)
  numbers = jnp.cumsum(is_root, axis=1).astype(jnp.int32)
  labels = jnp.take_along_axis(numbers, jnp.minimum(flat, none - 1), axis=1)
  return jnp.where(flat < none, labels, 0).reshape(batch, height, width)


@functools.partial(jax.jit, static_argnames=("keep_second",))
def main_regions(mask: jax.Array, min_second: int = 5, keep_second: bool = True) -> jax.Array:
  """Per image, the largest 8-connected region of bool masks [B, h, w], plus the second largest
  when it has >= min_second patches (ties go to the region met first in raster order).
  Returns bool [B, h, w]."""

  def one(image_mask):
    roots = _component_roots(image_mask).reshape(-1)
    none = roots.shape[0]
    sizes = jnp.zeros(none + 1, jnp.int32).at[roots].add(1)[:none]
    order = jnp.argsort(-sizes, stable=True)
    first, second = order[0], order[1]
    keep = (roots == first) & (sizes[first] > 0)
    if keep_second:
      keep |= (roots == second) & (sizes[second] >= jnp.maximum(min_second, 1))
    return keep.reshape(image_mask.shape)

  return jax.vmap(one)(mask)


@functools.partial(jax.jit, static_argnames=("center", "joint"))
def _sign_split(features, center: bool, joint: bool) -> jax.Array:
  if joint:
    return fiedler_vector(features, center=center) > 0
  return jax.vmap(lambda f: fiedler_vector(f[None], center=center)[0])(features) > 0


def prominent_patches(
  features,
  min_second: int = 5,
  keep_second: bool = True,
  largest_only: bool = True,
  center: bool = False,
  joint: bool = True,
) -> jax.Array:
  """Foreground patches of a set of images.

  Args:
    features: float32 [B, h, w, D] patch features (tokens or keys) of B images, split jointly.
    min_second: the second-largest region is kept when it has at least this many patches.
    keep_second: False keeps only the largest region.
    largest_only: False returns the raw sign split (every patch with a positive entry).
    center: see fiedler_vector (False is the reference).
    joint: True splits all B images with one eigenvector (the reference); False splits each
      image on its own.

  Returns:
    bool [B, h, w], True on prominent (foreground) patches.
  """
  features = _check_features(features)
  if features.shape[0] * features.shape[1] * features.shape[2] < 2:
    raise ValueError("At least two patches are needed for a spectral split.")
  mask = _sign_split(features, center=center, joint=joint)
  if not largest_only:
    return mask
  return main_regions(mask, min_second=min_second, keep_second=keep_second)


def upsample_mask(mask, size: int | tuple[int, int]) -> jax.Array:
  """Nearest-neighbour upsampling of bool patch masks [B, h, w] to [B, H, W]."""
  mask = jnp.asarray(mask)
  if mask.ndim != 3:
    raise ValueError(f"mask must be [B, h, w], got shape {mask.shape}.")
  height, width = (size, size) if isinstance(size, int) else size
  out = jax.image.resize(mask.astype(jnp.float32), (mask.shape[0], height, width), method="nearest")
  return out > 0.5


def pixel_coordinates(height: int, width: int) -> jax.Array:
  """float32 [H, W, 2]: each pixel's (row, column)."""
  rows, cols = jnp.meshgrid(
    jnp.arange(height, dtype=jnp.float32), jnp.arange(width, dtype=jnp.float32), indexing="ij"
  )
  return jnp.stack([rows, cols], axis=-1)
