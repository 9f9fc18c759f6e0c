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
`filter="lattice"` filters instead with the permutohedral lattice of SimpleCRF (Kraehenbuehl's
densecrf, which the reference calls), reproduced step for step in float32 (`lattice_refine`):
the reference's refined masks, label for label.
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

from mutual.ellipse import pixels as ellipse_pixels
from mutual.foreground import pixel_coordinates


#: How the kernels are filtered (`refine`): exactly, or with SimpleCRF's permutohedral lattice.
FILTERS = ("exact", "lattice")
HIGHEST = jax.lax.Precision.HIGHEST


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
    # fp32 products at full precision (no TF32 on a GPU: docs/design.md, numerics contract).
    d2 = jnp.sum(q * q, axis=1)[:, None] - 2.0 * jnp.matmul(q, keys.T, precision=HIGHEST)
    d2 = d2 + key_norms[None]
    return jnp.exp(-0.5 * jnp.maximum(d2, 0.0))

  def key_values(values):
    if factor == 1:
      return values.reshape(-1, values.shape[-1])
    return _pool(values, factor)  # sums: count * mean value

  n = queries.shape[0]
  if n * keys.shape[0] <= dense_entries:
    dense = kernel(queries)
    return lambda values: jnp.matmul(dense, key_values(values), precision=HIGHEST).reshape(
      height, width, -1
    )
  pad = -n % chunk
  blocks = jnp.pad(queries, ((0, pad), (0, 0))).reshape(-1, chunk, dim)

  def apply(values):
    kv = key_values(values)
    out = jax.lax.map(lambda q: jnp.matmul(kernel(q), kv, precision=HIGHEST), blocks)
    return out.reshape(-1, values.shape[-1])[:n].reshape(height, width, -1)

  return apply


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
  filter: str = "exact",  # pylint: disable=redefined-builtin
  round_trip=None,
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
    filter: "exact" (the kernels summed exactly, above) or "lattice" (SimpleCRF's permutohedral
      lattice, `lattice_refine`: the reference's CRF, label for label; max_keys unused).
    round_trip: (mean, std): refine the uint8 image the reference refines, the pixels after
      CLIP's normalisation and back with truncation (mutual.ellipse.pixels.reference_uint8); None:
      the pixels as given.

  Returns:
    bool [B, H, W], the refined foreground.
  """
  if filter not in FILTERS:
    raise ValueError(f"filter must be one of {FILTERS}, got {filter!r}.")
  # Shapes and types are checked without a transfer: the arrays may live on the device.
  images = images if isinstance(images, jax.Array) else np.asarray(images)
  mask = mask if isinstance(mask, jax.Array) else np.asarray(mask)
  if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != np.uint8:
    raise ValueError(f"images must be uint8 [B, H, W, 3], got {images.dtype} {images.shape}.")
  if mask.shape != images.shape[:3]:
    raise ValueError(
      f"mask {mask.shape} must be [B, H, W] like the images {images.shape[:3]}; upsample the "
      "patch mask first (mutual.foreground.upsample_mask)."
    )
  if round_trip is not None:
    images = ellipse_pixels.reference_uint8(jnp.asarray(images), *round_trip)
  if not 0.5 < confidence < 1.0:
    raise ValueError(f"confidence must lie in (0.5, 1), got {confidence}.")
  if min(spatial_sigma, rgb_sigma, gaussian_sigma) <= 0:
    raise ValueError("CRF sigmas must be positive.")
  # The lattice needs no pooled keys (factor 1).
  factor = 1 if filter == "lattice" else pooling_factor(images.shape[1], images.shape[2], max_keys)
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
  if filter == "lattice":
    return lattice_refine(images, mask, params)
  return _refine(jnp.asarray(images), jnp.asarray(mask, bool), params)


# ---------------------------------------------------------------------------------------------
# The permutohedral-lattice filter of SimpleCRF (Kraehenbuehl's densecrf), for the reference
# mode: the reference's CRF filters with this lattice, an approximation of the Gaussian kernels
# whose errors move the refined borders (one pixel of a concept region can move its ellipse).


class Lattice(NamedTuple):
  """A permutohedral lattice over N points, as densecrf's Permutohedral::init builds it.

  offsets int32 [N, d+1]: each point's simplex vertices (slot numbers; slot 0 is the always-zero
  slot for absent neighbours); weights float32 [N, d+1]: barycentric weights; neighbours int32
  [d+1, S, 2]: per blur direction, each slot's two neighbour slots (0: absent), S = N*(d+1)+1."""

  offsets: np.ndarray
  weights: np.ndarray
  neighbours: np.ndarray


def _lattice_constants(d: int):
  """densecrf's per-dimension scale (float32 [d]) and canonical simplex table (int [d+1, d+1])."""
  inv_std_dev = np.float32(math.sqrt(2.0 / 3.0) * (d + 1))
  scale = np.array(
    [1.0 / math.sqrt((i + 2) * (i + 1)) * float(inv_std_dev) for i in range(d)], np.float32
  )
  # canonical[r][k] = r for k <= d - r, else r - (d + 1).
  r = np.arange(d + 1)[:, None]
  canonical = np.where(np.arange(d + 1)[None, :] <= d - r, r, r - (d + 1))
  return scale, canonical


def _fence(x: jax.Array, zero: jax.Array) -> jax.Array:
  """float32 x unchanged, through an XOR of its bits with `zero`, an int32 0 that is an
  argument of the program, so the compiler cannot fold it away or fuse the product that made x
  with the sum that uses it."""
  bits = jax.lax.bitcast_convert_type(x, jnp.int32) ^ zero
  return jax.lax.bitcast_convert_type(bits, jnp.float32)


def _simplex_keys(f, xp, zero=None):
  """The float32 part of densecrf's Permutohedral::init, for numpy or jax.numpy (`xp`): for
  features float32 [N, d], (keys int [N, d+1, d]: each point's simplex vertices, barycentric
  weights float32 [N, d+1]). Written once for both so the device build is the host build,
  operation for operation (the same float32 rounding in the same order). zero: int32 0 passed
  into the program (jax.numpy only; see `_fence`)."""
  n, d = f.shape
  scale, canonical = _lattice_constants(d)
  f32 = np.float32
  columns = [None] * (d + 1)
  total = xp.zeros((n,), f32)
  # Every float32 product is rounded before it is added, as densecrf's SSE code and numpy round
  # it. Compilers fuse a product and a sum into one multiply-add (XLA:CPU does, GPUs may), which
  # moves a weight by an ulp: on the device each product passes a fence (`_fence`) that hides
  # its origin from the compiler.
  if xp is jnp:
    product = lambda a, b: _fence(a * b, zero)  # noqa: E731
  else:
    product = lambda a, b: a * b  # noqa: E731
  for j in range(d, 0, -1):
    cf = product(f[:, j - 1], scale[j - 1])
    columns[j] = total - product(f32(j), cf)
    total = total + cf
  columns[0] = total
  elevated = xp.stack(columns, axis=1)
  inv_d1 = f32(1.0) / f32(d + 1)
  nearest = xp.rint(inv_d1 * elevated).astype(f32)  # round half to even, as SSE does
  rem0 = nearest * f32(d + 1)
  diff = elevated - rem0
  ranks = [xp.zeros((n,), np.int32) for _ in range(d + 1)]
  for i in range(d):
    for j in range(i + 1, d + 1):
      c = (diff[:, i] < diff[:, j]).astype(np.int32)
      ranks[i] = ranks[i] + c
      ranks[j] = ranks[j] + (1 - c)
  rank = xp.stack(ranks, axis=1) + nearest.sum(axis=1).astype(np.int32)[:, None]
  low, high = rank < 0, rank >= d + 1
  rank = rank + (d + 1) * low.astype(np.int32) - (d + 1) * high.astype(np.int32)
  rem0 = rem0 + f32(d + 1) * low.astype(f32) - f32(d + 1) * high.astype(f32)
  v = product(elevated - rem0, inv_d1)
  # Barycentric weights, accumulated column by column in densecrf's order.
  slot = np.arange(d + 2)[None, :]
  bary = xp.zeros((n, d + 2), f32)
  for i in range(d + 1):
    p = (d - rank[:, i])[:, None]
    bary = bary + xp.where(slot == p, v[:, i : i + 1], f32(0))
    bary = bary - xp.where(slot == p + 1, v[:, i : i + 1], f32(0))
  first = bary[:, :1] + (f32(1) + bary[:, d + 1 :])
  weights = xp.concatenate([first, bary[:, 1 : d + 1]], axis=1)
  base = rem0[:, :d].astype(np.int64)
  keys = xp.stack([base + xp.asarray(canonical[rem])[rank[:, :d]] for rem in range(d + 1)], axis=1)
  return keys, weights


def build_lattice(features: np.ndarray) -> Lattice:
  """densecrf's Permutohedral::init for float32 features [N, d], in float32 as it computes them
  (elevation, rounding to the nearest remainder-0 point, ranks, barycentric weights, keys);
  lattice points are numbered by sorted key rather than by hash-table insertion (the numbering
  changes no value). The host build: the reference the device build (`lattice_slots`) is
  tested against."""
  f = np.asarray(features, np.float32)
  n, d = f.shape
  keys, bary = _simplex_keys(f, np)
  flat = keys.reshape(-1, d)
  lowest = flat.min(axis=0) - d - 1
  base = int((flat.max(axis=0) - lowest).max()) + d + 2

  def code(k):
    out = np.zeros(k.shape[0], np.int64)
    for c in range(d):
      out = out * base + (k[:, c] - lowest[c])
    return out

  codes = code(flat)
  unique, inverse = np.unique(codes, return_inverse=True)
  points = np.empty((len(unique), d), np.int64)
  points[inverse] = flat
  slots = n * (d + 1) + 1
  neighbours = np.zeros((d + 1, slots, 2), np.int32)
  for j in range(d + 1):
    n1, n2 = points - 1, points + 1
    if j < d:
      n1[:, j] = points[:, j] + d
      n2[:, j] = points[:, j] - d
    for side, key in enumerate((n1, n2)):
      c = code(key)
      at = np.clip(np.searchsorted(unique, c), 0, len(unique) - 1)
      found = unique[at] == c
      neighbours[j, 1 : len(unique) + 1, side] = np.where(found, at + 1, 0)
  offsets = (inverse.reshape(n, d + 1) + 1).astype(np.int32)
  return Lattice(offsets, np.ascontiguousarray(bary), neighbours)


def lattice_filter(lattice, values: jax.Array) -> jax.Array:
  """densecrf's Permutohedral::compute (seqCompute) of float32 values [N, C]: splat onto the
  lattice, blur along each of the d+1 directions, slice back with densecrf's alpha."""
  offsets, weights, neighbours = lattice
  n, d1 = offsets.shape
  slots = neighbours.shape[1]
  splat = (weights[:, :, None] * values[:, None, :]).reshape(n * d1, -1)
  grid = jnp.zeros((slots, values.shape[1]), values.dtype).at[offsets.reshape(-1)].add(splat)
  for j in range(d1):
    grid = grid + 0.5 * (grid[neighbours[j, :, 0]] + grid[neighbours[j, :, 1]])
    grid = grid.at[0].set(0.0)
  alpha = np.float32(1.0) / (np.float32(1.0) + np.float32(2.0) ** np.float32(-(d1 - 1)))
  out = jnp.zeros_like(values)
  for j in range(d1):
    out = out + weights[:, j, None] * grid[offsets[:, j]] * alpha
  return out


def _lattice_refine_one(mask, bilateral, gaussian, p: CRFParams):
  """SimpleCRF's densecrf on one image: the unary -log(clip(one-hot, 0.01, 0.99)) (confidence
  p.confidence), the bilateral then the Gaussian Potts term through lattice filters with
  symmetric normalisation, p.iterations mean-field steps, label 1 where it wins (ties: 0)."""
  height, width = mask.shape
  flat = mask.reshape(-1)
  confidence = jnp.asarray([1 - p.confidence, p.confidence], jnp.float32)
  unary = -jnp.log(jnp.where(flat[:, None], confidence, confidence[::-1]))
  ones = jnp.ones((flat.shape[0], 1), jnp.float32)
  norms = [1.0 / jnp.sqrt(lattice_filter(lat, ones) + 1e-20) for lat in (bilateral, gaussian)]
  kernels = ((bilateral, norms[0], p.bilateral_weight), (gaussian, norms[1], p.gaussian_weight))

  def step(_, q):
    total = -unary
    for lat, norm, weight in kernels:
      total = total + weight * (norm * lattice_filter(lat, norm * q))
    return jax.nn.softmax(total, axis=-1)

  q = jax.lax.fori_loop(0, p.iterations, step, jax.nn.softmax(-unary, axis=-1))
  return (q[:, 1] > q[:, 0]).reshape(height, width)


@functools.partial(jax.jit, static_argnames=("params",))
def _lattice_refine(masks, bilateral, gaussian, params: CRFParams):
  return jax.lax.map(
    lambda args: _lattice_refine_one(args[0], args[1], gaussian, params), (masks, bilateral)
  )


def device_lattice(features: jax.Array, zero: jax.Array) -> Lattice:
  """`build_lattice` in jax.numpy, with static sizes, for the device: the same float32 steps
  (`_simplex_keys`), then the lattice points numbered by sorted key (a sort and a cumulative
  sum in place of np.unique) and each point's neighbours found by binary search
  (jnp.searchsorted) in the sorted keys. Equal to build_lattice array for array (the lattice
  slots beyond the points present stay 0, as there). Keys are int64: trace it with 64-bit
  types on (`jax.enable_x64`). features: float32 [N, d]; zero: int32 0, an argument of the
  jitted caller (`_fence`)."""
  n, d = features.shape
  keys, weights = _simplex_keys(features, jnp, zero)
  flat = keys.reshape(-1, d)
  total = flat.shape[0]
  lowest = flat.min(axis=0) - d - 1
  base = (flat.max(axis=0) - lowest).max() + d + 2

  def code(k):
    out = jnp.zeros(k.shape[0], jnp.int64)
    for c in range(d):
      out = out * base + (k[:, c] - lowest[c])
    return out

  codes = code(flat)
  order = jnp.argsort(codes)
  ordered = codes[order]
  first = jnp.concatenate([jnp.ones(1, bool), ordered[1:] != ordered[:-1]])
  number = jnp.cumsum(first.astype(jnp.int64)) - 1  # the point number of each sorted key
  inverse = jnp.zeros(total, jnp.int64).at[order].set(number)
  present = jnp.arange(total) <= number[-1]
  # Absent points sort last and match no key.
  unique = jnp.full(total, jnp.iinfo(jnp.int64).max, jnp.int64).at[number].set(ordered)
  points = jnp.zeros((total, d), jnp.int64).at[inverse].set(flat)
  directions = []
  for j in range(d + 1):
    n1, n2 = points - 1, points + 1
    if j < d:
      n1 = n1.at[:, j].set(points[:, j] + d)
      n2 = n2.at[:, j].set(points[:, j] - d)
    sides = []
    for key in (n1, n2):
      c = code(key)
      at = jnp.clip(jnp.searchsorted(unique, c), 0, total - 1)
      found = (unique[at] == c) & present
      sides.append(jnp.where(found, at + 1, 0).astype(jnp.int32))
    directions.append(jnp.stack(sides, axis=1))
  neighbours = jnp.pad(jnp.stack(directions), ((0, 0), (1, 0), (0, 0)))
  offsets = (inverse.reshape(n, d + 1) + 1).astype(jnp.int32)
  return Lattice(offsets, weights, neighbours)


def _pixel_grid(height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
  """float32 [H * W] x and y of every pixel in raster order."""
  ys, xs = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
  return xs.reshape(-1).astype(np.float32), ys.reshape(-1).astype(np.float32)


@functools.lru_cache(maxsize=8)
def _gaussian_lattice(height: int, width: int, sigma: float) -> Lattice:
  """The smoothness kernel's lattice (positions only: the same for every image of a size),
  built once on the host and kept on the device."""
  xs, ys = _pixel_grid(height, width)
  lattice = build_lattice(np.stack([xs / np.float32(sigma), ys / np.float32(sigma)], axis=1))
  return Lattice(*(jnp.asarray(a) for a in lattice))


def _bilateral_features(image, p: CRFParams, xp):
  """float32 [H * W, 5]: (x, y) / spatial_sigma and RGB / rgb_sigma of uint8 [H, W, 3]."""
  height, width = image.shape[:2]
  xs, ys = _pixel_grid(height, width)
  colours = image.reshape(-1, 3).astype(np.float32) / np.float32(p.rgb_sigma)
  spatial = np.stack([xs / np.float32(p.spatial_sigma), ys / np.float32(p.spatial_sigma)], 1)
  return xp.concatenate([xp.asarray(spatial), colours], axis=1)


@functools.partial(jax.jit, static_argnames=("params", "images_per_pass"))
def _device_lattice_refine(images, masks, gaussian, zero, params: CRFParams, images_per_pass):
  def one(args):
    image, mask = args
    bilateral = device_lattice(_bilateral_features(image, params, jnp), zero)
    return _lattice_refine_one(mask, bilateral, gaussian, params)

  return jax.lax.map(one, (images, masks), batch_size=images_per_pass)


def lattice_images_per_pass(batch: int) -> int:
  """Images whose lattices are built and filtered at once: one on a CPU (its cache holds one
  image's lattice), the whole batch on an accelerator (a few hundred MB for 50 images at
  224 px), so the device sorts and searches them in parallel."""
  return 1 if jax.default_backend() == "cpu" else max(1, int(batch))


def lattice_refine(images, mask, p: CRFParams, on_device: bool = True) -> jax.Array:
  """`refine(filter="lattice")` on checked inputs (uint8 [B, H, W, 3], bool [B, H, W]), as
  SimpleCRF's densecrf computes it (the reference's CRF): the kernels filtered with densecrf's
  permutohedral lattice, in float32. The bilateral lattices are built on the device inside the
  jitted program (`device_lattice`; nothing per image on the host), the Gaussian one once per
  image size; on_device=False builds them on the host with numpy (`build_lattice`, the
  reference the device build is tested against). Returns bool [B, H, W]."""
  batch, height, width = mask.shape
  gaussian = _gaussian_lattice(height, width, float(p.gaussian_sigma))
  if on_device:
    with jax.enable_x64(True):  # int64 lattice keys
      return _device_lattice_refine(
        jnp.asarray(images, jnp.uint8),
        jnp.asarray(mask, bool),
        gaussian,
        jnp.zeros((), jnp.int32),
        p,
        lattice_images_per_pass(batch),
      )
  lattices = [build_lattice(_bilateral_features(np.asarray(im), p, np)) for im in images]
  bilateral = Lattice(*(np.stack(parts) for parts in zip(*lattices)))
  as_jax = lambda lat: Lattice(*(jnp.asarray(a) for a in lat))  # noqa: E731
  return _lattice_refine(jnp.asarray(mask, bool), as_jax(bilateral), gaussian, p)
