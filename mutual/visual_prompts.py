"""Visual prompts for concept regions (Shtedritski et al. 2023, as used by Sammani & Deligiannis).

Each concept region gets an ellipse and three prompted images: the image with a red ellipse; the
same with everything outside the ellipse in grayscale; the same with everything outside blurred
by an 11x11 Gaussian. The vision tower encodes the three, and their L2-normalised embeddings are
averaged (not re-normalised) into the concept's embedding.

The ellipse comes from the region's moments (pixel mean and covariance): a uniformly filled
ellipse with semi-axes a, b has covariance eigenvalues a^2/4 and b^2/4, so the ellipse
{p : (p - mean)^T (4 cov)^-1 (p - mean) <= 1} is the one a filled elliptical region would give.
The reference fits cv2.fitEllipse to the region's contour instead; both agree on elliptical
regions and the moments need no contour tracing.

`ellipse="reference"` renders what the reference renders instead (mutual.ellipse: OpenCV's
largest outer contour, fitEllipse, its fixed-point ellipse rasteriser, grayscale and 11x11
blur, all in uint8 arithmetic), on the uint8 image the reference draws on: CLIP's
normalisation undone in float64 and truncated to uint8 (`round_trip`). "moments" stays the
default.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jax.sharding import Mesh, NamedSharding, PartitionSpec

from mutual.ellipse import pixels as ellipse_pixels
from mutual.ellipse import prompts as ellipse_prompts
from mutual.foreground import main_regions, pixel_coordinates, upsample_mask
from stori_jax.clip.encoding import l2_normalize_jax

RED = (1.0, 0.0, 0.0)
# ITU-R BT.601 luma weights, as cv2's RGB2GRAY uses.
LUMA = (0.299, 0.587, 0.114)
VARIANTS = ("ellipse", "grayscale_outside", "blur_outside")
# How the ellipse of a concept region is found and drawn (render_prompts' `ellipse`).
ELLIPSES = ("moments", "reference")
#: The mesh axis the concept regions of a tower call are sharded over.
DATA_AXIS = "regions"
# fp32 products at full precision (no TF32 on a GPU: docs/design.md, numerics contract).
HIGHEST = jax.lax.Precision.HIGHEST


def gaussian_kernel(size: int = 11, sigma: float | None = None) -> jax.Array:
  """1-D Gaussian taps float32 [size] summing to 1; sigma=None uses OpenCV's rule for a kernel
  size, 0.3 * ((size - 1) / 2 - 1) + 0.8 (2.0 for 11)."""
  if size < 1 or size % 2 == 0:
    raise ValueError(f"The blur kernel size must be odd and positive, got {size}.")
  if sigma is None:
    sigma = 0.3 * ((size - 1) * 0.5 - 1) + 0.8
  x = np.arange(size, dtype=np.float64) - (size - 1) / 2
  taps = np.exp(-(x**2) / (2 * sigma**2))
  return jnp.asarray(taps / taps.sum(), jnp.float32)


def gaussian_blur(image: jax.Array, size: int = 11, sigma: float | None = None) -> jax.Array:
  """Separable Gaussian blur of float [H, W, C] with mirrored borders (OpenCV's default
  BORDER_REFLECT_101, numpy's "reflect")."""
  taps = gaussian_kernel(size, sigma)
  half = size // 2
  padded = jnp.pad(image, ((half, half), (half, half), (0, 0)), mode="reflect")
  height, width = image.shape[:2]
  rows = sum(taps[i] * padded[i : i + height] for i in range(size))
  return sum(taps[i] * rows[:, i : i + width] for i in range(size))


def grayscale(image: jax.Array) -> jax.Array:
  """float [H, W, 3] RGB -> its luma repeated on 3 channels."""
  luma = jnp.matmul(image, jnp.asarray(LUMA, image.dtype), precision=HIGHEST)
  return jnp.repeat(luma[..., None], 3, axis=-1)


def fit_ellipse(region: jax.Array):
  """Moment ellipse of a bool region [H, W].

  Returns (center float32 [2] as (row, col), shape matrix float32 [2, 2] = 4 cov, with the
  pixel quantisation variance 1/12 added on the diagonal so one-pixel-thin regions still give
  an ellipse, valid bool scalar: the region is not empty).
  """
  coords = pixel_coordinates(*region.shape).reshape(-1, 2)
  weight = region.reshape(-1).astype(jnp.float32)
  count = jnp.sum(weight)
  center = jnp.matmul(weight, coords, precision=HIGHEST) / jnp.maximum(count, 1.0)
  centered = (coords - center) * weight[:, None]
  cov = jnp.matmul(centered.T, coords - center, precision=HIGHEST) / jnp.maximum(count, 1.0)
  cov = cov + jnp.eye(2) / 12.0
  return center, 4.0 * cov, count > 0


def ellipse_geometry(center, shape_matrix, height: int, width: int):
  """(inside bool [H, W], distance float32 [H, W]): pixels inside the ellipse and their
  approximate distance in pixels to its boundary (first-order, from sqrt of the quadratic form,
  which is exact on circles)."""
  d = pixel_coordinates(height, width) - center
  inverse = jnp.linalg.inv(shape_matrix)
  md = jnp.matmul(d, inverse, precision=HIGHEST)
  radius = jnp.sqrt(jnp.maximum(jnp.sum(md * d, axis=-1), 1e-12))
  gradient = jnp.linalg.norm(md, axis=-1) / radius
  distance = jnp.abs(radius - 1.0) / jnp.maximum(gradient, 1e-12)
  return radius <= 1.0, distance


def _render_one(image, region, thickness: float, blur_size: int):
  height, width = region.shape
  center, shape_matrix, valid = fit_ellipse(region)
  inside, distance = ellipse_geometry(center, shape_matrix, height, width)
  # Anti-aliased stroke: alpha is the share of a unit pixel at distance d that a stroke of
  # width `thickness` centred on the boundary covers.
  alpha = jnp.clip(thickness / 2 + 0.5 - distance, 0.0, 1.0)[..., None]
  red = jnp.asarray(RED, image.dtype)

  def stroke(x):
    return (1 - alpha) * x + alpha * red

  inside = inside[..., None]
  variants = jnp.stack(
    [
      stroke(image),
      stroke(jnp.where(inside, image, grayscale(image))),
      stroke(jnp.where(inside, image, gaussian_blur(image, blur_size))),
    ]
  )
  # Empty concepts render the plain image; `valid` marks them.
  return jnp.where(valid, variants, image[None]), valid


@functools.partial(
  jax.jit, static_argnames=("n_concepts", "thickness", "blur_size", "largest_region")
)
def _render(images, concept_maps, n_concepts, thickness, blur_size, largest_region):
  batch, height, width = images.shape[:3]
  regions = concept_maps[:, None] == jnp.arange(n_concepts)[None, :, None, None]
  grid = regions.shape[2:]
  regions = regions.reshape(-1, *grid)
  if largest_region:
    regions = main_regions(regions, keep_second=False)
  regions = upsample_mask(regions, (height, width)).reshape(batch, n_concepts, height, width)

  def per_image(image, image_regions):
    return jax.vmap(lambda r: _render_one(image, r, thickness, blur_size))(image_regions)

  return jax.vmap(per_image)(images, regions)


def render_prompts(
  images,
  concept_maps,
  n_concepts: int = 5,
  thickness: float = 1.0,
  blur_size: int = 11,
  largest_region: bool = True,
  ellipse: str = "moments",
  round_trip=None,
):
  """Three visual prompts per concept.

  Args:
    images: float32 [B, H, W, 3] RGB in [0, 1].
    concept_maps: int32 [B, h, w] concept ids (-1 background), upsampled nearest to H x W.
    n_concepts: L, the number of concept ids.
    thickness: ellipse stroke width in pixels at 224 x 224, scaled with the image height
      (at least 1 pixel).
    blur_size: side of the Gaussian blur kernel.
    largest_region: fit the ellipse to the concept's largest 8-connected region (the paper's
      remedy for scattered concepts, App. "Limitations"; the reference's contour is one
      region too); False fits all of the concept's patches.
    ellipse: "moments" (the moment ellipse, anti-aliased stroke, float blur) or "reference"
      (mutual.ellipse: OpenCV's contour, fitEllipse and drawing, in uint8; it always uses the
      largest outer contour, whatever largest_region, and a 1-pixel stroke at any size, as
      cv2.ellipse(..., thickness=1) draws, so thickness must be 1; the reference's seeding
      protocol with seed 0: mutual.ellipse.prompts.reference_prompts).
    round_trip: with "reference", (mean, std) of the normalisation the reference's image went
      through before it was turned back to uint8 by truncation
      (mutual.ellipse.pixels.reference_uint8); None takes the pixels as they are (rounded to
      uint8).

  Returns:
    (prompted float32 [B, L, 3, H, W, 3] in [0, 1], variants in VARIANTS order (with
     "reference", uint8 values / 255); valid bool [B, L], False where concept l is absent
     from the image.)
  """
  images = jnp.asarray(images, jnp.float32)
  concept_maps = jnp.asarray(concept_maps)
  if images.ndim != 4 or images.shape[-1] != 3:
    raise ValueError(f"images must be float [B, H, W, 3] in [0, 1], got shape {images.shape}.")
  if concept_maps.ndim != 3 or concept_maps.shape[0] != images.shape[0]:
    raise ValueError(
      f"concept_maps must be int [B, h, w] with B = {images.shape[0]}, got {concept_maps.shape}."
    )
  if ellipse not in ELLIPSES:
    raise ValueError(f"ellipse must be one of {ELLIPSES}, got {ellipse!r}.")
  if ellipse == "reference":
    if thickness != 1:
      raise ValueError(
        f"ellipse='reference' draws OpenCV's 1-pixel stroke; thickness must be 1, got {thickness}."
      )
    pixels = jnp.round(jnp.clip(images, 0.0, 1.0) * 255).astype(jnp.uint8)
    if round_trip is not None:
      pixels = ellipse_pixels.reference_uint8(pixels, *round_trip)
    height, width = images.shape[1:3]
    maps = concept_maps.astype(jnp.int32)
    if maps.shape[1:] != (height, width):
      # Nearest upsampling, indexed as cv2.resize(INTER_NEAREST) and pipeline.pixel_concepts do.
      rows = (jnp.arange(height) * maps.shape[1]) // height
      cols = (jnp.arange(width) * maps.shape[2]) // width
      maps = maps[:, rows][:, :, cols]
    prompted, valid = ellipse_prompts.reference_prompts(pixels, maps, n_concepts, blur_size)
    return prompted.astype(jnp.float32) / 255.0, valid
  stroke = max(1.0, thickness * images.shape[1] / 224)
  return _render(
    images, concept_maps.astype(jnp.int32), n_concepts, stroke, blur_size, largest_region
  )


# Small jitted pieces: eager jnp ops outside jit compile one program each (per op and shape).


@jax.jit
def _unit_from_uint8(images):
  """uint8 [...] -> float32 in [0, 1] (x / 255)."""
  return images.astype(jnp.float32) / 255.0


@functools.partial(jax.jit, static_argnums=(1, 2))
def _reference_pixels(pixels, mean: tuple, std: tuple):
  """float32 [0, 1] pixels -> the reference's uint8 image (8-bit values, then
  mutual.ellipse.pixels.reference_uint8's round trip)."""
  pixels = jnp.round(jnp.clip(pixels, 0.0, 1.0) * 255).astype(jnp.uint8)
  return ellipse_pixels.reference_uint8(pixels, mean, std)


@functools.partial(jax.jit, static_argnums=2)
def _rows_per_map(table, index, maps: int):
  """_take_rows of index int32 [M, ...], split into M arrays (one program)."""
  out = _take_rows(table, index)
  return tuple(out[m] for m in range(maps))


def _unit_pixels(bundle, images, normalized: bool) -> jax.Array:
  """Images (uint8, [0, 1] floats, or bundle-normalised floats with normalized=True) ->
  float32 [B, S, S, 3] in [0, 1]."""
  images = np.asarray(images)
  if images.ndim == 3:
    images = images[None]
  if images.dtype == np.uint8:
    return _unit_from_uint8(images)
  images = images.astype(np.float32)
  if normalized:
    mean = np.asarray(bundle.preprocess_config.mean, np.float32)
    std = np.asarray(bundle.preprocess_config.std, np.float32)
    images = images * std + mean
  elif images.size and (images.min() < -1e-3 or images.max() > 1 + 1e-3):
    raise ValueError(
      f"Float images must hold RGB in [0, 1] (got values in [{images.min():.2f}, "
      f"{images.max():.2f}]); pass normalized=True for bundle.preprocess output."
    )
  return jnp.asarray(np.clip(images, 0.0, 1.0))


#: Concept regions whose prompts go through the tower in one call (3 images each). Every call
#: has this shape (the last one padded), so the program compiles once per run; inside it, the
#: regions go through the tower a few at a time where the device wants it (a CPU), and the
#: passes holding only padding are skipped.
PROMPT_CHUNK = 32
#: The chunk is a multiple of this (and of the devices it is sharded over).
PROMPT_GRANULE = 4


def _chunk_starts(count: int, chunk: int) -> list[int]:
  """The first region of each call covering `count` regions, `chunk` regions a call."""
  return list(range(0, count, chunk))


def _region_prompts(pixels, maps, pairs, ellipses, stroke, blur_size, largest_region):
  """The three prompts of the concept regions `pairs` (int32 [P, 3]: map, image, concept) ->
  float32 [P, 3, H, W, 3] in [0, 1], rendered as render_prompts renders them. `ellipses`:
  None (moment ellipses), or the reference's ellipse pixels (stroke, filled bool [P, H, W]),
  which are computed outside (mutual.ellipse runs them with 64-bit types)."""
  images = pixels[pairs[:, 1]]  # [P, H, W, 3]: uint8 (reference ellipses) or float in [0, 1]
  if ellipses is not None:
    outline, filled = ellipses
    valid = jnp.ones((len(pairs), 1), bool)
    prompted = ellipse_pixels.compose_prompts(
      images, outline[:, None], filled[:, None], valid, blur_size
    )
    return prompted[:, 0].astype(jnp.float32) / 255.0
  regions = maps[pairs[:, 0], pairs[:, 1]] == pairs[:, 2, None, None]
  if largest_region:
    regions = main_regions(regions, keep_second=False)
  regions = upsample_mask(regions, images.shape[1:3])
  prompted, _ = jax.vmap(lambda im, r: _render_one(im, r, stroke, blur_size))(images, regions)
  return prompted


@functools.partial(
  jax.jit,
  static_argnames=("image_fn", "stroke", "blur_size", "largest_region", "regions_per_pass"),
)
def _region_embeddings(
  params,
  mean,
  std,
  pixels,
  maps,
  pairs,
  ellipses,
  real,
  *,
  image_fn,
  stroke,
  blur_size,
  largest_region,
  regions_per_pass=None,
):
  """Rendering and tower in one program: float32 [P, E], the mean of the L2-normalised
  embeddings of each region's three prompts. `regions_per_pass` (a divisor of P, or None for
  all P) regions are rendered and go through the tower at a time, in a loop inside the
  program; passes past the first `real` regions (int32 scalar: the call's regions that are
  not padding) are skipped and give zeros."""

  def embed(part):
    part_pairs, part_ellipses = part
    prompted = _region_prompts(
      pixels, maps, part_pairs, part_ellipses, stroke, blur_size, largest_region
    )
    count, size = prompted.shape[0], prompted.shape[2:]
    x = (prompted.reshape(-1, *size) - mean) / std
    embedded = l2_normalize_jax(image_fn(params, x, False))
    return embedded.reshape(count, len(VARIANTS), -1).mean(axis=1)

  count = pairs.shape[0]
  if regions_per_pass is None or regions_per_pass >= count:
    return embed((pairs, ellipses))
  steps = count // regions_per_pass
  parts = jax.tree.map(
    lambda a: a.reshape(steps, regions_per_pass, *a.shape[1:]), (pairs, ellipses)
  )
  skipped = jax.eval_shape(embed, jax.tree.map(lambda a: a[0], parts))

  def one_pass(args):
    step, part = args
    return jax.lax.cond(
      step * regions_per_pass < real,
      embed,
      lambda _: jnp.zeros(skipped.shape, skipped.dtype),
      part,
    )

  return jax.lax.map(one_pass, (jnp.arange(steps), parts)).reshape(count, -1)


@functools.partial(jax.jit, donate_argnums=0)
def _put_rows(table, rows, start):
  """table float32 [capacity, E] with rows [P, E] written from row `start` (int32 scalar)."""
  return jax.lax.dynamic_update_slice(table, rows.astype(table.dtype), (start, 0))


@jax.jit
def _take_rows(table, index):
  """float32 [..., E]: table's row index[...] (int32), zeros where index is -1."""
  return jnp.where(index[..., None] >= 0, table[jnp.maximum(index, 0)], 0.0)


def _regions_per_pass(size: int, per_pass: int | None) -> int | None:
  """The largest divisor of a call's `size` regions whose 3 prompts each fit in `per_pass`
  images (at least 1 region); None (per_pass None): the whole call."""
  if per_pass is None:
    return None
  target = max(1, int(per_pass) // len(VARIANTS))
  return max(d for d in range(1, min(size, target) + 1) if size % d == 0)


def region_presence(maps, n_concepts: int) -> np.ndarray:
  """bool [M, B, L]: concept l has a pixel in map [m, b] (int [M, B, h, w]); the regions that
  get prompts."""
  maps = np.asarray(maps)
  return (maps[:, :, None] == np.arange(n_concepts)[None, None, :, None, None]).any(axis=(3, 4))


def distinct_regions(
  maps: np.ndarray, pairs: np.ndarray, across_maps: bool = True
) -> tuple[np.ndarray, np.ndarray]:
  """The regions of `pairs` (int [P, 3]: map, image, concept of maps int [M, B, h, w]) with a
  pixel set of their own: (the first pair of each distinct (image, pixel set), int [U, 3];
  int [P], the row of that list each pair takes). Equal regions get equal prompts, so PCA's and
  K-means' equal regions (9% of the embedded world's) go through the tower once.
  across_maps=False shares regions within a map only: the reference's ellipse of a contour
  under 5 points depends on the method's random draws, not only on the pixels."""
  first: dict[tuple[int, int, bytes], int] = {}
  copies = np.empty(len(pairs), np.int64)
  for row, (m, b, c) in enumerate(pairs):
    key = (0 if across_maps else int(m), int(b), np.packbits(maps[m, b] == c).tobytes())
    copies[row] = first.setdefault(key, len(first))
  unique_rows = np.full(len(first), -1, np.int64)
  for row in range(len(pairs) - 1, -1, -1):
    unique_rows[copies[row]] = row
  return pairs[unique_rows], copies


def _distinct_prompts(maps, pairs, copies, n_concepts: int, chunk: int, seed: int, shard):
  """The reference's ellipses of the regions `pairs` (int [U, 3]), fitted `chunk` at a time as
  the tower calls take them, and the regions whose prompts are distinct among them.

  Returns (the first pair of each distinct prompt, int [V, 3]; `copies` (int [P], rows of
  `pairs`) mapped to rows of that list; a function of int [chunk] rows of the new list ->
  (stroke, filled) bool [chunk, H, W] on the device(s)). Two regions have equal prompts when
  they are of the same image with the same stroke and filled pixels: the three prompts are
  functions of those alone (ellipse_pixels.compose_prompts).
  """
  strokes, filled = [], []
  for start in _chunk_starts(len(pairs), chunk):
    real = min(chunk, len(pairs) - start)
    index = pairs[np.minimum(np.arange(start, start + chunk), start + real - 1)]
    index = jax.device_put(index, shard) if shard is not None else jax.device_put(index)
    # The reference's protocol: Python's `random` and cv::theRNG() seeded anew per map.
    found = ellipse_prompts.padded_ellipses(maps, index, n_concepts, seed=seed)
    strokes.append(found["stroke"])
    filled.append(found["filled"])
  if not strokes:
    return pairs, copies, None
  # One read back of every fit (bool [U, H, W] twice: a few MB).
  strokes = np.concatenate([np.asarray(s) for s in strokes])[: len(pairs)]
  filled = np.concatenate([np.asarray(f) for f in filled])[: len(pairs)]
  first: dict[tuple[int, bytes, bytes], int] = {}
  prompt_of = np.empty(len(pairs), np.int64)
  for row, (_, image, _) in enumerate(pairs):
    key = (int(image), np.packbits(strokes[row]).tobytes(), np.packbits(filled[row]).tobytes())
    prompt_of[row] = first.setdefault(key, len(first))
  kept = np.full(len(first), -1, np.int64)
  for row in range(len(pairs) - 1, -1, -1):
    kept[prompt_of[row]] = row

  def ellipses_of(rows):
    taken = kept[rows]
    arrays = (strokes[taken], filled[taken])
    return jax.device_put(arrays, shard) if shard is not None else jax.device_put(arrays)

  return pairs[kept], prompt_of[copies], ellipses_of


def concept_embeddings_of_maps(
  bundle,
  images,
  maps_per_method,
  n_concepts: int = 5,
  normalized: bool = False,
  thickness: float = 1.0,
  blur_size: int = 11,
  largest_region: bool = True,
  ellipse: str = "moments",
  chunk: int = PROMPT_CHUNK,
  devices: Sequence[jax.Device] | None = None,
  per_pass: int | None = None,
  ellipse_seed: int = 0,
):
  """`concept_embeddings` for several concept maps of the same images at once (PCA's and
  K-means', say): only the regions present are prompted, and the regions of all maps and
  images share the tower calls, `chunk` regions (3 * chunk images) per call, rendering fused
  into the same program; a region equal to one before it (the same image and pixel set, e.g.
  in both methods' maps: `distinct_regions`; with ellipse="reference", the same image, stroke
  and filled pixels once the ellipses are fitted) is prompted once. Same numbers as one
  `concept_embeddings` call per map.

  Args:
    maps_per_method: M int32 maps [B, h, w] of the same images.
    chunk: regions per tower call (rounded up to a multiple of the devices).
    devices: the devices the regions of a call are sharded over (the weights, images and maps
      are replicated on them); default this process's devices. The result does not depend on
      them beyond float32 summation order.
    ellipse_seed: with ellipse="reference", the seed of the reference's random padding of
      contours under 5 points and of OpenCV's cv::theRNG() (config.analysis.ellipse_seed;
      mutual.ellipse.prompts.padded_ellipses: both seeded anew per image and method).
      The reference's ellipses may differ by method there, so equal regions of two maps share
      their prompts in that mode only where their fitted ellipses are equal too.
    per_pass: on one device, images per tower pass inside a call (mutual.features.
      images_per_pass: a few on a CPU, whose tower slows once a pass's activations leave the
      cache); None, or several devices (each holding its share of the call): the whole call.
    The rest: as concept_embeddings.

  Returns:
    M pairs (embeddings float32 [B, L, E], zeros for absent concepts; valid bool [B, L]).
  """
  if ellipse not in ELLIPSES:
    raise ValueError(f"ellipse must be one of {ELLIPSES}, got {ellipse!r}.")
  if ellipse == "reference" and thickness != 1:
    raise ValueError(
      f"ellipse='reference' draws OpenCV's 1-pixel stroke; thickness must be 1, got {thickness}."
    )
  if chunk < 1:
    raise ValueError(f"chunk must be at least 1 region, got {chunk}.")
  pixels = _unit_pixels(bundle, images, normalized)
  batch, height, width = pixels.shape[:3]
  maps = jnp.stack([jnp.asarray(m, jnp.int32) for m in maps_per_method])
  if maps.ndim != 4 or maps.shape[1] != batch:
    raise ValueError(
      f"concept maps must be int [B, h, w] with B = {batch}, got {[m.shape for m in maps]}."
    )
  if ellipse == "reference":
    mean, std = bundle.preprocess_config.mean, bundle.preprocess_config.std
    pixels = _reference_pixels(pixels, tuple(map(float, mean)), tuple(map(float, std)))
    if maps.shape[2:] != (height, width):
      # Nearest upsampling, indexed as cv2.resize(INTER_NEAREST) and pipeline.pixel_concepts do.
      rows = (jnp.arange(height) * maps.shape[2]) // height
      cols = (jnp.arange(width) * maps.shape[3]) // width
      maps = maps[:, :, rows][:, :, :, cols]
  devices = list(devices) if devices is not None else jax.local_devices()
  granule = -(-PROMPT_GRANULE // len(devices)) * len(devices)
  chunk = -(-int(chunk) // granule) * granule
  params = bundle.params
  shard = None
  if len(devices) > 1:
    mesh = Mesh(np.asarray(devices), (DATA_AXIS,))
    replicated = NamedSharding(mesh, PartitionSpec())
    shard = NamedSharding(mesh, PartitionSpec(DATA_AXIS))
    params, pixels, maps = jax.device_put((params, pixels, maps), replicated)
  host_maps = np.asarray(maps)
  present = region_presence(host_maps, n_concepts)
  every_pair = np.argwhere(present).astype(np.int32)  # [P, 3]: map, image, concept
  pairs, copies = distinct_regions(host_maps, every_pair, across_maps=ellipse != "reference")
  options = dict(
    image_fn=bundle.image_function,
    stroke=max(1.0, thickness * height / 224) if ellipse == "moments" else 1.0,
    blur_size=blur_size,
    largest_region=largest_region,
  )
  # Host arrays placed with device_put (jnp.asarray and jnp.zeros would compile a program each).
  mean = jax.device_put(np.asarray(bundle.preprocess_config.mean, np.float32))
  std = jax.device_put(np.asarray(bundle.preprocess_config.std, np.float32))
  # Every call has `chunk` regions: one compiled program whatever the images hold.
  per_call = _regions_per_pass(chunk, per_pass if shard is None else None)
  # The distinct regions' embeddings, written call by call into a table of fixed size (so the
  # writes and the final gather compile once too); a call's padding rows are overwritten by
  # the next call's or never read.
  table = jax.device_put(np.zeros((present.size + chunk, bundle.config.embed_dim), np.float32))
  ellipse_pixels_of = None
  if ellipse == "reference":
    # The reference's ellipses of the distinct regions first; regions whose prompts are equal
    # (the same image, stroke and filled pixels: PCA's and K-means' equal regions, wherever
    # their maps' random draws gave them the same ellipse) then go through the tower once.
    pairs, copies, ellipse_pixels_of = _distinct_prompts(
      maps, pairs, copies, n_concepts, chunk, ellipse_seed, shard
    )
  for start in _chunk_starts(len(pairs), chunk):
    real = min(chunk, len(pairs) - start)
    # Padding repeats the last region.
    rows_of_call = np.minimum(np.arange(start, start + chunk), start + real - 1)
    index = pairs[rows_of_call]
    index = jax.device_put(index, shard) if shard is not None else jax.device_put(index)
    ellipses = None
    if ellipse_pixels_of is not None:
      ellipses = ellipse_pixels_of(rows_of_call)
    embedded = _region_embeddings(
      params,
      mean,
      std,
      pixels,
      # The reference's ellipses are drawn from their pixels alone: without the maps, calls
      # on other numbers of maps share the program.
      maps if ellipses is None else None,
      index,
      ellipses,
      np.int32(real),
      regions_per_pass=per_call,
      **options,
    )
    table = _put_rows(table, embedded, np.int32(start))
  rows = np.full(present.shape, -1, np.int32)
  rows[tuple(every_pair.T)] = copies
  out = _rows_per_map(table, jax.device_put(rows), len(maps_per_method))
  return [(out[m], jax.device_put(present[m])) for m in range(len(maps_per_method))]


def concept_embeddings(
  bundle,
  images,
  concept_maps,
  n_concepts: int = 5,
  normalized: bool = False,
  thickness: float = 1.0,
  blur_size: int = 11,
  largest_region: bool = True,
  ellipse: str = "moments",
):
  """Embeddings of every concept region through its three visual prompts.

  Args:
    bundle: a stori_jax CLIPBundle.
    images: [B, S, S, 3] at the model's input size: uint8, or float RGB in [0, 1], or the
      bundle-normalised floats of bundle.preprocess with normalized=True.
    concept_maps: int32 [B, h, w] (pca_concepts / kmeans_concepts output).
    n_concepts: L.
    normalized: images are bundle.preprocess output (mean/std normalised).
    thickness, blur_size, largest_region: see render_prompts.
    ellipse: "moments" or "reference" (render_prompts); "reference" draws on the uint8 image
      the reference draws on: the pixels normalised with the bundle's mean and std in float32,
      denormalised in float64 and truncated to uint8.

  Returns:
    (embeddings float32 [B, L, E]: the mean of the three prompts' L2-normalised embeddings,
     zeros for absent concepts; valid bool [B, L].)
  """
  (result,) = concept_embeddings_of_maps(
    bundle,
    images,
    [concept_maps],
    n_concepts,
    normalized,
    thickness,
    blur_size,
    largest_region,
    ellipse,
  )
  return result
