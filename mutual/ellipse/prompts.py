"""The reference's ellipse of each concept region and its three prompted images: the steps of
the package's other modules put together, under the reference's seeding protocol.

`concept_ellipses` fits masks on their own; `padded_ellipses` follows the protocol (a region's
padding and theRNG words depend on the concepts visited before it in its map);
`reference_prompts` draws the prompted images of concept maps.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from mutual.ellipse import contours, direct_fit, drawing, floats, least_squares, pixels
from mutual.ellipse import random_replay
from mutual.ellipse.rules import DEGENERATE, DIRECT


#: reference_prompts fits its regions padded to a multiple of this many, the regions of a tower
#: call of the pipeline (visual_prompts.PROMPT_CHUNK): other batch sizes and concept counts
#: reuse the compiled fits.
REGION_BUCKET = 32
#: padded_ellipses draws theRNG's words for a multiple of this many concepts (the fits read
#: fewer), so that maps of other concept counts reuse the compiled fits.
CONCEPT_BUCKET = 8


def rng_word_count(height: int, width: int, n_concepts: int = 1) -> int:
  """theRNG words the fits of n_concepts regions of an H x W image may read in all: per region
  at most 2 per listed point (a degenerate least-squares fit) or direct_fit.DIRECT_DRAWS (a
  5-point fit)."""
  return n_concepts * (2 * contours.listed_count(height, width) + direct_fit.DIRECT_DRAWS)


@jax.jit
def _ordered_needed(rule):
  """bool [N]: the fit needs the contour's points in order (5 points, or degenerate)."""
  return (rule == DIRECT) | (rule == DEGENERATE)


@floats.with_x64
@jax.jit
def _cursor_needed(rule, listed, n_points, extra, n_extra, words, zero):
  """bool [N]: the fit reads theRNG's words' values, not only their count (a 5-point fit whose
  first attempt is singular, or a degenerate least-squares fit)."""

  def one(r, points, n, e, ne):
    _, _, _, first, _, _, _, _ = direct_fit.direct_attempts(
      direct_fit.five_points(points, n, e, ne), jnp.int32(0), words, zero
    )
    return (r == DEGENERATE) | ((r == DIRECT) & ~first)

  return jax.vmap(one)(rule, listed, n_points, extra, n_extra)


@floats.with_x64
@functools.partial(jax.jit, static_argnames=("n_concepts",))
def _context_cursors(context, pairs, need, words, zero, n_concepts):
  """The theRNG cursor of each region of `pairs` (int32 [P]): the words its map's concepts read
  before it, visited in the reference's order from a freshly seeded theRNG (from _map_contours'
  `context`, traced for the regions that need it; zeros where none does)."""
  order = jnp.asarray(random_replay.reference_order(n_concepts))
  regions = pairs.shape[0]

  def run(_):
    count, extra, n_extra = context["count"], context["extra"], context["n_extra"]
    rule = least_squares.fit_chunks(
      context["points"], extra.reshape(-1, 4, 2), n_extra.reshape(-1)
    )[3]
    rule = rule.reshape(regions, n_concepts)
    five = jax.vmap(jax.vmap(direct_fit.five_points))(context["listed"], count, extra, n_extra)
    draws = jax.vmap(direct_fit.fit_draws, in_axes=(0, 0, 0, 0, None, None))

    def visit(cursor, c):
      return cursor + draws(rule[:, c], five[:, c], count[:, c], cursor, words, zero), cursor

    _, starts = jax.lax.scan(visit, jnp.zeros(regions, jnp.int32), order)  # [L, P]
    by_concept = jnp.zeros_like(starts).at[order].set(starts)
    return by_concept[pairs[:, 2], context["slot"]]

  return jax.lax.cond(jnp.any(need), run, lambda _: jnp.zeros(regions, jnp.int32), None)


def _opencv_ellipses(masks, contour, extra, n_extra, cursors, words, chunk):
  """The fits (least_squares.fit_ellipses, then direct_fit.ordered_fits with theRNG's cursors
  from `cursors(rule, listed)`) and cv2.ellipse's pixels of the contours `contour` of bool
  masks [N, H, W]."""
  height, width = masks.shape[1:]
  zero = np.uint64(0)
  center, size, angle, rule = least_squares.fit_ellipses(contour["points"], extra, n_extra)
  listed = contours.largest_contours(
    masks, chunk=chunk, listed=contours.listed_count(height, width), need=_ordered_needed(rule)
  )["listed"]
  cursor = cursors(rule, listed)
  center, size, angle, rule = direct_fit.ordered_fits(
    center, size, angle, rule, listed, contour["n_points"], extra, n_extra, cursor, words, zero
  )
  stroke, filled = drawing.ellipse_masks(center, size, angle, height, width)
  return dict(
    contour, center=center, size=size, angle=angle, rule=rule, stroke=stroke, filled=filled
  )


def concept_ellipses(masks: jax.Array, chunk: int = 16, seed: int = 0) -> dict[str, jax.Array]:
  """Contour, cv2.fitEllipse and rasterised ellipse of bool masks [N, H, W], each on its own:
  contours of under 5 points are not padded (rule FEW_POINTS), and cv::theRNG() is seeded with
  `seed` (cv2.setRNGSeed) before each fit. padded_ellipses follows the reference's protocol.

  Returns a dict with largest_contour's fields (stacked), center float32 [N, 2], size float32
  [N, 2], angle float32 [N], rule int32 [N], stroke bool [N, H, W], filled bool [N, H, W].
  """
  total, height, width = masks.shape
  contour = contours.largest_contours(masks, chunk=chunk)
  extra = jax.device_put(np.zeros((total, 4, 2), np.int32))
  n_extra = jax.device_put(np.zeros(total, np.int32))
  words = jax.device_put(random_replay.opencv_rng_words(int(seed), rng_word_count(height, width)))
  cursor = jax.device_put(np.zeros(total, np.int32))
  return _opencv_ellipses(masks, contour, extra, n_extra, lambda rule, listed: cursor, words, chunk)


@functools.partial(jax.jit, static_argnames=("n_concepts", "chunk"))
def _map_contours(region_maps, key, pairs, wanted, words, n_concepts: int, chunk: int):
  """The contours of all n_concepts concepts of the maps of the regions `pairs` (int32 [P, 3]:
  map, image, concept) where wanted (bool [P]): a region's padding and theRNG words depend on
  the concepts visited before it in its map. `region_maps` int32 [P, H, W] is each region's
  map and `key` int32 [P] numbers the maps in (map, image) order (_region_masks): the program's
  shapes are the regions', whatever the number of maps and images, so calls on other batches
  reuse it. Each distinct map is traced once; the unused slots, and everything where no region
  is wanted, are skipped.

  Returns a dict: slot int32 [P] (each wanted region's map among the P slots), points int32
  [P * L, H, W] (contour multisets), count int32 [P, L], listed int32 [P, L, 5, 2] (each
  contour's first 5 points in order), and the reference's padding extra int32 [P, L, 4, 2],
  n_extra int32 [P, L] (Python's `random` from `words`, reseeded per map).
  """
  order = jnp.asarray(random_replay.reference_order(n_concepts))
  regions = pairs.shape[0]
  height, width = region_maps.shape[1:]
  unused = jnp.iinfo(jnp.int32).max
  # Distinct maps first (sorted), unused slots after them.
  maps_in = jnp.unique(jnp.where(wanted, key, unused), size=regions, fill_value=unused)
  slot = jnp.searchsorted(maps_in, key).astype(jnp.int32)
  real = maps_in < unused
  # Each slot's map: that of a region with its key (all such regions share the map).
  group = region_maps[jnp.argmax(key[None, :] == maps_in[:, None], axis=1)]  # [P, H, W]
  ids = jnp.arange(n_concepts, dtype=jnp.int32)
  masks = (group[:, None] == ids[None, :, None, None]) & real[:, None, None, None]
  traced = contours.largest_contours(
    masks.reshape(-1, height, width), chunk=chunk, listed=5, need=jnp.repeat(real, n_concepts)
  )
  count = traced["n_points"].reshape(regions, n_concepts)
  last = traced["last"].reshape(regions, n_concepts, 2)
  extra, n_extra, _ = jax.vmap(lambda n, l: random_replay.reference_padding(n, l, words, order))(
    count, last
  )
  return dict(
    slot=slot,
    points=traced["points"],
    count=count,
    listed=traced["listed"].reshape(regions, n_concepts, 5, 2),
    extra=extra,
    n_extra=n_extra,
  )


@jax.jit
def _pairs_padding(context, pairs, n_points):
  """The reference's padding of each region of `pairs` from _map_contours' `context` (traced for
  the regions of 1 to 4 points): (extra int32 [P, 4, 2], n_extra int32 [P], zero elsewhere)."""
  short = (n_points > 0) & (n_points < 5)
  extra = context["extra"][context["slot"], pairs[:, 2]]
  n_extra = context["n_extra"][context["slot"], pairs[:, 2]]
  return jnp.where(short[:, None, None], extra, 0), jnp.where(short, n_extra, 0)


@jax.jit
def _short_contours(n_points):
  """bool [P]: contours of 1 to 4 points (the reference pads them)."""
  return (n_points > 0) & (n_points < 5)


@jax.jit
def _region_masks(maps, pairs):
  """Of the regions pairs[p] = (map, image, concept) of maps int32 [M, B, H, W]: (bool [P, H, W]
  their pixels; int32 [P, H, W] their maps; int32 [P] their maps' numbers, m * B + b)."""
  region_maps = maps[pairs[:, 0], pairs[:, 1]]
  key = pairs[:, 0] * maps.shape[1] + pairs[:, 1]
  return region_maps == pairs[:, 2, None, None], region_maps, key


def padded_ellipses(maps, pairs, n_concepts: int, seed: int = 0, chunk: int = 16):
  """concept_ellipses of the regions `pairs` (int32 [P, 3]: map, image, concept) of concept
  maps int32 [M, B, H, W] (-1 background) under the reference's protocol: before each map's
  (image's and method's) concepts, visited in the reference's colour order
  (random_replay.reference_order), Python's `random` is seeded with `seed` (the padding of
  contours under 5 points) and so is cv::theRNG() (cv2.setRNGSeed(seed): the offsets of
  OpenCV's retried and degenerate fits).
  Returns concept_ellipses' dict over P."""
  maps = jnp.asarray(maps, jnp.int32)
  pairs = jnp.asarray(pairs, jnp.int32)
  height, width = maps.shape[2:]
  # device_put and one jitted gather: eagerly these compiled some 13 small programs.
  words = jax.device_put(random_replay.python_random_words(int(seed)))
  rng_words = jax.device_put(
    random_replay.opencv_rng_words(
      int(seed), rng_word_count(height, width, -(-n_concepts // CONCEPT_BUCKET) * CONCEPT_BUCKET)
    )
  )
  masks, region_maps, key = _region_masks(maps, pairs)
  contour = contours.largest_contours(masks, chunk=chunk)
  short = _short_contours(contour["n_points"])
  extra, n_extra = _pairs_padding(
    _map_contours(region_maps, key, pairs, short, words, n_concepts, chunk),
    pairs,
    contour["n_points"],
  )
  zero = np.uint64(0)

  def cursors(rule, listed):
    need = _cursor_needed(rule, listed, contour["n_points"], extra, n_extra, rng_words, zero)
    context = _map_contours(region_maps, key, pairs, need, words, n_concepts, chunk)
    return _context_cursors(context, pairs, need, rng_words, zero, n_concepts)

  return _opencv_ellipses(masks, contour, extra, n_extra, cursors, rng_words, chunk)


def reference_prompts(
  images, concept_maps, n_concepts: int, blur_size: int = 11, chunk: int = 16, seed: int = 0
):
  """The reference's three prompted images per concept, in uint8, under the reference's
  seeding protocol (padded_ellipses: Python's `random` and cv::theRNG() seeded with `seed`
  before each image's concepts).

  Args:
    images: uint8 [B, H, W, 3] RGB (already the reference's uint8 image, see reference_uint8).
    concept_maps: int [B, H, W] concept ids (-1 or any id outside 0..L-1 is background).
    n_concepts: L.
    blur_size: GaussianBlur kernel side.
    chunk: masks traced at once (memory: 8 int32 border states per pixel and mask).
    seed: the protocol's seed (config.analysis.ellipse_seed).

  Returns:
    (uint8 [B, L, 3, H, W, 3] in visual_prompts.VARIANTS order: red ellipse, grayscale
     outside, blur outside; the plain image where a concept is absent; valid bool [B, L].)
  """
  concept_maps = jnp.asarray(concept_maps, jnp.int32)
  batch, height, width = concept_maps.shape
  pairs = np.stack(
    [
      np.zeros(batch * n_concepts, np.int32),
      np.repeat(np.arange(batch, dtype=np.int32), n_concepts),
      np.tile(np.arange(n_concepts, dtype=np.int32), batch),
    ],
    axis=1,
  )
  # Padding repeats the last region (each region's fit depends on its map alone).
  total = len(pairs)
  pairs = pairs[np.minimum(np.arange(-(-total // REGION_BUCKET) * REGION_BUCKET), total - 1)]
  found = padded_ellipses(concept_maps[None], pairs, n_concepts, seed=seed, chunk=chunk)
  return _compose_regions(
    jnp.asarray(images), found["stroke"], found["filled"], found["present"], n_concepts, blur_size
  )


@functools.partial(jax.jit, static_argnames=("n_concepts", "blur_size"))
def _compose_regions(images, stroke, filled, present, n_concepts: int, blur_size: int):
  """reference_prompts' prompted images and valid from the ellipse pixels of its padded
  regions (the first B * L of them are image b's concept l)."""
  batch, height, width = images.shape[:3]
  shape = (batch, n_concepts, height, width)
  total = batch * n_concepts
  valid = present[:total].reshape(batch, n_concepts)
  prompted = pixels.compose_prompts(
    images, stroke[:total].reshape(shape), filled[:total].reshape(shape), valid, blur_size
  )
  return prompted, valid
