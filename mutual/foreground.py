"""Prominent patches: spectral split of the patch affinity, then the main connected regions.

Sammani & Deligiannis (2024), Sec. 3.1 and App. A.3: the sign of the second eigenvector of the
affinity f f^T of L2-normalised patch features (all B images jointly) splits foreground from
background; per image the largest 8-connected region (plus the second largest when it has at
least `min_second` patches) is kept.

The second eigenvector comes from the smaller Gram matrix ([N, N] or [D, D] for N = B*h*w
patches of dim D) rather than the reference's SVD of the [N, D] features: the same vector, a
[min(N, D)]^2 eigendecomposition instead, with an error bound; the rare ill-determined vector,
and a split whose sign the reference's rule leaves to the solver, go back to the SVD
(`fiedler_vector`), so the masks are the SVD's.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from stori_jax.clip.encoding import l2_normalize_jax


def _check_features(features) -> jax.Array:
  features = jnp.asarray(features)
  if features.ndim != 4:
    raise ValueError(
      f"features must be [B, h, w, D] (patch_features output), got shape {features.shape}."
    )
  return features.astype(jnp.float32)


#: How the second singular vector is found: "gram" (the default), an eigendecomposition of the
#: smaller Gram matrix, checked; "svd", the full SVD of the [B*h*w, D] features (the reference's
#: way, several times slower).
SOLVERS = ("gram", "svd")
#: The Gram solver's result is used where its a-posteriori bound on sin(angle to the exact
#: vector) is at most this (a cosine distance of 5e-7); elsewhere the SVD's.
GRAM_TOLERANCE = 1e-3

_HIGHEST = jax.lax.Precision.HIGHEST  # accelerators would otherwise multiply in bf16 / tf32


def _unit_rows(features: jax.Array, center: bool) -> jax.Array:
  """float32 [B, h, w, D] -> the L2-normalised (optionally centred) patch rows [B*h*w, D]."""
  flat = features.reshape(-1, features.shape[-1])
  if center:
    flat = flat - jnp.mean(flat, axis=0)
  return l2_normalize_jax(flat)


def _gram_second_vector(flat: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Second left singular vector of flat [N, D] from the smaller Gram matrix, and a bound on
  its error.

  N <= D: the second eigenvector of the affinity A = flat flat^T [N, N] itself. N > D: v, the
  second eigenvector of flat^T flat [D, D], then u = flat v / ||flat v||. Either way costs one
  [min(N, D)]^2 eigendecomposition and a few matrix products instead of an [N, D] SVD.

  The bound: with sigma = ||flat^T u|| and r = flat (flat^T u) / sigma - sigma u, u is a unit
  vector with A u - sigma^2 u = sigma r, so (Davis-Kahan) sin(angle to A's second eigenvector)
  <= sigma ||r|| / min(l1 - sigma^2, sigma^2 - l3), l1 and l3 A's first and third eigenvalues
  (as computed). It is large where the second vector is ill-determined (l2 close to l1 or l3)
  or the Gram matrix lost it to rounding (l2 below ~1e-7 l1).

  Returns:
    (u float32 [N], bound float32 scalar; +inf where the gap is zero or negative).
  """
  n, d = flat.shape
  if n <= d:
    values, vectors = jnp.linalg.eigh(jnp.matmul(flat, flat.T, precision=_HIGHEST))
    u = vectors[:, -2]
  else:
    values, vectors = jnp.linalg.eigh(jnp.matmul(flat.T, flat, precision=_HIGHEST))
    u = jnp.matmul(flat, vectors[:, -2], precision=_HIGHEST)
    u = u / jnp.maximum(jnp.linalg.norm(u), jnp.finfo(jnp.float32).tiny)
  w = jnp.matmul(u, flat, precision=_HIGHEST)  # flat^T u, [D]
  sigma = jnp.linalg.norm(w)
  residual = jnp.matmul(flat, w, precision=_HIGHEST) / jnp.maximum(sigma, 1e-30) - sigma * u
  third = values[-3] if values.shape[0] >= 3 else jnp.float32(0.0)
  gap = jnp.minimum(values[-1] - sigma**2, sigma**2 - jnp.maximum(third, 0.0))
  bound = jnp.where(gap > 0, sigma * jnp.linalg.norm(residual) / gap, jnp.inf)
  return u, bound


def _fix_sign(second: jax.Array) -> jax.Array:
  """The reference's sign rule on a second eigenvector [N]: negated when the share of positive
  entries lies strictly between 0.5 and 1, so positive (foreground) is the smaller side."""
  positive = jnp.mean(second > 0)
  return jnp.where((positive > 0.5) & (positive < 1.0), -second, second)


def _sign_decided(second: jax.Array) -> jax.Array:
  """bool scalar: `_fix_sign` gives the same vector for `second` and `-second`. It does not
  when neither the positive nor the negative entries are a share in (0.5, 1) (e.g. exactly
  half positive, common on 2 x 2 grids): the reference then keeps the sign its LAPACK SVD
  returned, so the Gram solver leaves those splits to the SVD."""
  larger = jnp.maximum(jnp.mean(second > 0), jnp.mean(second < 0))
  return (larger > 0.5) & (larger < 1.0)


@functools.partial(jax.jit, static_argnames=("center", "solver"))
def fiedler_pair(
  features: jax.Array, center: bool = False, solver: str = "gram"
) -> tuple[jax.Array, jax.Array]:
  """`fiedler_vector` without the fallback, for use under jit / vmap.

  Returns:
    (float32 [B, h, w] the sign-fixed second eigenvector, float32 scalar the bound on
     sin(angle) to the exact one, +inf where the sign rule cannot decide: 0 for "svd"; use the
     SVD where it exceeds GRAM_TOLERANCE.)
  """
  if solver not in SOLVERS:
    raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}.")
  batch, height, width, _ = features.shape
  flat = _unit_rows(features, center)
  if solver == "svd":
    u, _, _ = jnp.linalg.svd(flat, full_matrices=False)
    second, bound = u[:, 1], jnp.float32(0.0)
  else:
    second, bound = _gram_second_vector(flat)
    bound = jnp.where(_sign_decided(second), bound, jnp.inf)
  return _fix_sign(second).reshape(batch, height, width), bound


def fiedler_vector(features: jax.Array, center: bool = False, solver: str = "gram") -> jax.Array:
  """Second left singular vector of the L2-normalised patch features, sign fixed.

  Args:
    features: float32 [B, h, w, D].
    center: subtract the mean patch feature (over all B*h*w patches) before normalising; not
      in the reference, but it keeps a shared offset direction (strong in small models) from
      taking the first singular vector's place.
    solver: "gram" (default): from the eigendecomposition of the smaller Gram matrix
      (`_gram_second_vector`), replaced by the SVD's vector where its error bound exceeds
      GRAM_TOLERANCE (the second vector is then ill-determined: near-equal eigenvalues, or lost
      to rounding) or where the sign rule leaves the sign to the solver (`_sign_decided`);
      "svd": the full SVD, as the reference. Not for use under jit (the fallback is decided on
      the host): use `fiedler_pair` there.

  Returns:
    float32 [B, h, w]: the second eigenvector of the affinity f f^T over all B*h*w patches.
    The reference's sign rule is applied: the vector is negated when the fraction of positive
    entries lies strictly between 0.5 and 1, so positive (foreground) is the smaller side.
  """
  features = _check_features(features)
  second, bound = fiedler_pair(features, center=center, solver=solver)
  if solver == "gram" and not float(bound) <= GRAM_TOLERANCE:
    second, _ = fiedler_pair(features, center=center, solver="svd")
  return second


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


@functools.partial(jax.jit, static_argnames=("center", "joint", "solver"))
def sign_split(features, center: bool, joint: bool, solver: str = "gram"):
  """The raw spectral split of float32 [B, h, w, D] features, without the fallback.

  Returns:
    (bool [B, h, w] positive entries of the second eigenvector (joint: one over all B images;
     else one per image), bool [B] the Gram solver's split of the image is good: its bound is
     within GRAM_TOLERANCE and its sign decided (see fiedler_vector); always True with "svd".)
  """
  if joint:
    second, bound = fiedler_pair(features, center=center, solver=solver)
    bound = jnp.broadcast_to(bound, features.shape[:1])
  else:
    second, bound = jax.vmap(lambda f: fiedler_pair(f[None], center=center, solver=solver))(
      features
    )
    second = second[:, 0]
  return second > 0, bound <= GRAM_TOLERANCE


@functools.partial(jax.jit, static_argnames=("center", "joint", "solver"))
def checked_split(features, center: bool, joint: bool, solver: str = "gram") -> jax.Array:
  """sign_split's mask bool [B, h, w], with the SVD's split for the images whose Gram split is
  ill-determined (an undecided sign, a loose bound). One program: the fallback is a branch
  taken on the device (lax.cond), so neither a host sync nor a new compilation waits on it."""
  mask, ok = sign_split(features, center=center, joint=joint, solver=solver)
  if solver == "svd":
    return mask

  def with_fallback(mask):
    fallback, _ = sign_split(features, center=center, joint=joint, solver="svd")
    return jnp.where(ok[:, None, None], mask, fallback)

  return jax.lax.cond(jnp.all(ok), lambda m: m, with_fallback, mask)


@functools.partial(jax.jit, static_argnames=("center", "joint", "solver"))
def checked_split_across(features, center: bool, joint: bool, solver: str = "gram") -> jax.Array:
  """`checked_split` of M feature sets of one shape at once: float32 [M, B, h, w, D] -> bool
  [M, B, h, w], each set's mask as `checked_split` gives it.

  One program: the Gram matrices' eigendecompositions run as one batched eigh (vmapped over
  the leading axis); where any set's split is ill-determined, the SVD's split is computed for
  the batch and taken for those images only (the SVD is the same whatever the batch), so every
  mask is the one `checked_split` gives that set alone, up to the batched products' summation
  order (the second eigenvector within 1e-5, tested).
  """
  mask, ok = jax.vmap(lambda f: sign_split(f, center=center, joint=joint, solver=solver))(features)
  if solver == "svd":
    return mask

  def with_fallback(mask):
    fallback, _ = jax.vmap(lambda f: sign_split(f, center=center, joint=joint, solver="svd"))(
      features
    )
    return jnp.where(ok[:, :, None, None], mask, fallback)

  return jax.lax.cond(jnp.all(ok), lambda m: m, with_fallback, mask)


def _checked_options(features, solver: str) -> None:
  """The checks `prominent_patches` makes of float32 [..., B, h, w, D] features and a solver."""
  if features.shape[-4] * features.shape[-3] * features.shape[-2] < 2:
    raise ValueError("At least two patches are needed for a spectral split.")
  if solver not in SOLVERS:
    raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}.")


def prominent_patches(
  features,
  min_second: int = 5,
  keep_second: bool = True,
  largest_only: bool = True,
  center: bool = False,
  joint: bool = True,
  solver: str = "gram",
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
    solver: "gram" or "svd", see fiedler_vector.

  Returns:
    bool [B, h, w], True on prominent (foreground) patches.
  """
  features = _check_features(features)
  _checked_options(features, solver)
  mask = checked_split(features, center=center, joint=joint, solver=solver)
  if not largest_only:
    return mask
  return main_regions(mask, min_second=min_second, keep_second=keep_second)


def prominent_patches_across(
  features,
  min_second: int = 5,
  keep_second: bool = True,
  largest_only: bool = True,
  center: bool = False,
  joint: bool = True,
  solver: str = "gram",
) -> jax.Array:
  """`prominent_patches` of M feature sets of one shape (several models' patch features of a
  class), their spectral splits as one batched eigendecomposition (`checked_split_across`).

  Args:
    features: float32 [M, B, h, w, D]: M sets, each split on its own (jointly over its B
      images when `joint`).
    the others: as prominent_patches.

  Returns:
    bool [M, B, h, w]: each set's `prominent_patches`.
  """
  features = jnp.asarray(features, jnp.float32)
  if features.ndim != 5:
    raise ValueError(f"features must be [M, B, h, w, D], got shape {features.shape}.")
  _checked_options(features, solver)
  mask = checked_split_across(features, center=center, joint=joint, solver=solver)
  if not largest_only:
    return mask
  sets, batch, height, width = mask.shape
  flat = mask.reshape(sets * batch, height, width)  # main_regions treats each image alone
  return main_regions(flat, min_second=min_second, keep_second=keep_second).reshape(mask.shape)


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
