"""The reference's ellipse visual prompt, as OpenCV computes it, in JAX.

Per concept region the reference (utils.draw_circle_on_components_with_augments) takes the
outer contours of the region (cv2.findContours, RETR_EXTERNAL, CHAIN_APPROX_NONE), keeps the one
with the largest polygon area (cv2.contourArea, holes ignored), fits cv2.fitEllipse to its
points, and draws the ellipse with cv2.ellipse: a 1-pixel red stroke on the image, and a filled
ellipse as the mask outside which the image is made grayscale (cv2.cvtColor) or blurred
(cv2.GaussianBlur, 11 x 11). This module reproduces each step for fixed shapes, batched over
images and concepts, with no loop over pixels:

* Contours. OpenCV follows borders with Suzuki-Abe's rule: from the current pixel, scan the
  8 neighbours counterclockwise (on screen) starting after the previous pixel; the first
  foreground one is the next pixel. The state (pixel, direction to the previous pixel) thus
  determines the next state, and on valid states this map is a permutation whose cycles are
  the borders; a border emits one point per state, so a pixel passed twice counts twice.
  The outer border of a component is the cycle through its raster-first pixel entered from
  its first foreground neighbour clockwise from the west, where OpenCV starts it. Instead of
  walking each border, all cycles are labelled at once with the smallest raster index of the
  start states on them (pointer doubling: log2 of the longest border steps, over the states
  of the boundary pixels only, which every border stays on), and per label the shoelace sum
  is a segment sum. Outer borders run with a negative shoelace sum, hole borders with a
  positive one, so the largest outer contour is the label with the largest negated sum; ties
  go to the larger start index, the contour OpenCV lists first (it lists them in reverse
  raster order of their start points). A component inside another's hole (which
  RETR_EXTERNAL drops) always has the smaller area, so it never wins.
* fitEllipse. OpenCV's default fit (fitEllipseNoDirect): a linear least-squares fit of
  -a x^2 - b y^2 - c xy + d x + e y = 10000 to the centred, scaled points, the centre where
  that conic's gradient vanishes, then a refit of the quadratic terms about the centre;
  output (centre, (width, height) full axes with width <= height, angle in degrees). Each
  least-squares problem is solved as OpenCV solves it, by SVD with its cut-off, in float64,
  after a QR of the design matrix whose rows (one per pixel) are weighted by the square root
  of the pixel's multiplicity. On exactly 5 points fitEllipse is fitEllipseDirect, whose
  decision and (on repeated points) result hang on round-off: it is reproduced operation for
  operation (`ordered_fits`, the contour's points listed in OpenCV's order).
* Rasterisation. cv2.ellipse(RotatedRect) rounds the angle to whole degrees and the geometry
  to 16-bit fixed point, approximates the ellipse by a polygon (ellipse2Poly, one vertex every
  5, 18, 30 or 90 degrees by size, from OpenCV's 7-digit sine table), and draws the polygon's
  edges with its fixed-point 8-connected line (thickness 1) or fills it with its convex
  scanline filler (thickness -1). Both are reproduced in int64, pixel for pixel, as OpenCV
  4.x up to 4.12 draws them (4.13 brought another line algorithm; the reference predates it).
* Pixels. RGB2GRAY is (9798 R + 19235 G + 3735 B + 2^14) >> 15; the 8-bit GaussianBlur is
  OpenCV's bit-exact fixed-point filter (8 fractional bits per tap, mirrored borders); both
  are exact. The reference's image reaches uint8 through CLIP's normalisation and back, with
  truncation (`reference_uint8`).

Short contours. A largest contour of under 5 points is padded as the reference pads it, with
random.randint(0, last_x - 1), random.randint(0, last_y - 1) per missing point from Python's
`random` seeded anew before each image's concepts of each method (padded_ellipses;
reference_padding replays the Mersenne Twister words), and 5 points get OpenCV's direct fit
(fitEllipseDirect), as natural 5-point contours do.

OpenCV's random paths (4.12). fitEllipseDirect reads cv::theRNG() on every call: its first
attempt moves the 5 points by getOfs(0) (10 words, values unused); where the attempt's reduced
scatter matrix has |det M| <= 1e-10 (it is singular in exact arithmetic for 5 points, so this
is round-off) it retries on points moved by getOfs(s / 10 * 1e-2) (10 more words), and where
that is singular too it falls back to fitEllipseNoDirect. fitEllipseNoDirect moves the points
by getOfs(s / (2 n) * 1e-3) (2 words a point) where its design matrix is degenerate
(w0 * FLT_EPSILON > w4: collinear points, or fewer than 6 distinct ones). cv::theRNG() is a
multiply-with-carry generator (state = (uint64)(unsigned)state * 4164903690 + (state >> 32))
whose state carries from fit to fit; under the protocol it is seeded (cv2.setRNGSeed) with the
same seed as Python's `random` before each image's concepts of each method, and the words each
region reads start where the concepts visited before it in its map stopped
(`opencv_rng_words`, `_context_cursors`). The moved points and the direct fit are reproduced
exactly; the degenerate least squares solves on LAPACK's SVD (OpenCV runs its Jacobi SVD), so
it can differ from OpenCV by round-off.

Where the reference raises, a deterministic rule gives a zero-size ellipse at the centroid of
the contour's points (which OpenCV would draw as the one pixel nearest to it, stroke and mask
alike): padding the reference cannot draw (a last point with a 0 coordinate: randint(0, -1)
raises; no word is read), and a box whose size is not a number (cv2.ellipse asserts on it).
concept_ellipses, which fits masks on their own, pads nothing (contours under 5 points get the
same rule) and seeds cv::theRNG() before each fit.

The contours run in 32-bit types. The fit needs float64 and the rasteriser int64 (OpenCV's
fixed-point products exceed 32 bits), so those steps are jitted functions that are traced and
compiled with 64-bit types switched on (`jax.enable_x64` around the call: a program lowered
with them off would truncate them); they take and return 32-bit arrays. Call them from Python,
not from inside another jit.
"""

from __future__ import annotations

import functools
import math
import random

import jax
import jax.numpy as jnp
import numpy as np

# Moore neighbourhood in OpenCV's chain-code order, counterclockwise on screen (y down):
# E, NE, N, NW, W, SW, S, SE.
_DX = (1, 1, 0, -1, -1, -1, 0, 1)
_DY = (0, -1, -1, -1, 0, 1, 1, 1)
# Clockwise from the west: the order OpenCV searches the first neighbour of a border's start.
_START_SEARCH = (3, 2, 1, 0, 7, 6, 5)

XY_SHIFT = 16
XY_ONE = 1 << XY_SHIFT
FLT_EPSILON = float(np.finfo(np.float32).eps)
DBL_EPSILON = float(np.finfo(np.float64).eps)
# OpenCV's drawing sine table: sin of whole degrees 0..450, to 7 decimals, as float32.
SIN_TABLE = np.round(np.sin(np.deg2rad(np.arange(451, dtype=np.float64))), 7).astype(np.float32)
# Most polygon vertices cv2.ellipse uses (one per 5 degrees, both ends included).
MAX_VERTICES = 73
RED = (255, 0, 0)
# cv2.cvtColor(RGB2GRAY) on uint8: 15-bit fixed-point BT.601 weights summing to 2^15.
GRAY_WEIGHTS = (9798, 19235, 3735)
# Which of OpenCV's fits made an ellipse (the `rule` of concept_ellipses and padded_ellipses):
# FITTED: fitEllipse's least squares; DIRECT: its direct fit of exactly 5 points (padded ones
# included), first attempt; DIRECT_RETRIED: the direct fit redone on points moved by
# cv::theRNG() (the first attempt's determinant was round-off); DIRECT_FALLBACK: both attempts
# singular, the 5 points' least squares; DEGENERATE: least squares on points moved by
# cv::theRNG() (a degenerate design). The rest get a zero-size ellipse at the centroid of the
# contour's points: FEW_POINTS (under 5 points unpadded, or padding the reference cannot draw:
# randint(0, -1) raises), UNDRAWABLE (OpenCV's box has a size that is not a number: cv2.ellipse
# raises in the reference), UNLISTED (a degenerate contour longer than the points listed in
# order, which no digital contour is) and ABSENT (no region).
(
  FITTED,
  FEW_POINTS,
  DIRECT_RETRIED,
  DEGENERATE,
  ABSENT,
  DIRECT,
  DIRECT_FALLBACK,
  UNDRAWABLE,
  UNLISTED,
) = range(9)
#: The rules where the reference has no ellipse (it raises there).
REFERENCE_FAILS = (FEW_POINTS, UNDRAWABLE)


# ------------------------------------------------------------------------------------------
# Contours
# ------------------------------------------------------------------------------------------


def _neighbours(mask: jax.Array):
  """(fg bool [H + 2, W + 2]: the mask with a background frame, as OpenCV pads it; nb bool
  [8, H + 2, W + 2]: the neighbour in each direction is foreground)."""
  fg = jnp.pad(mask.astype(bool), 1)
  hp, wp = fg.shape
  frame = jnp.pad(fg, 1)
  nb = jnp.stack([frame[1 + dy : 1 + dy + hp, 1 + dx : 1 + dx + wp] for dx, dy in zip(_DX, _DY)])
  return fg, nb


def boundary_count(mask: jax.Array) -> jax.Array:
  """int32: foreground pixels of bool [H, W] with a background 8-neighbour (borders visit no
  other pixel, and none more than 4 times)."""
  fg, nb = _neighbours(mask)
  return jnp.sum(fg & ~jnp.all(nb, axis=0), dtype=jnp.int32)


def _border_graph(fg, nb, pixels):
  """Suzuki-Abe's border-following step on the states of the listed pixels.

  A state is (pixel, direction 0..7 to the previous pixel); state c * 8 + d belongs to
  pixels[c] (padded raster index; entries equal to the padded size are unused slots). Borders
  only visit boundary pixels, so listing those keeps every border whole.

  Returns (next int32 [C * 8]: the state after one step, itself for invalid states and for
  steps to an unlisted pixel; valid bool [C * 8]: the previous pixel is foreground, or d = 4
  on an isolated pixel (a border of one point); seed int32 [C * 8]: the pixel's padded raster
  index on the state OpenCV starts a border from (a foreground pixel with background to the
  west, entered from its first foreground neighbour clockwise from the west), elsewhere the
  padded size).
  """
  hp, wp = fg.shape
  size = hp * wp
  n = pixels.shape[0]
  used = pixels < size
  flat = jnp.where(used, pixels, 0)
  here = used & fg.reshape(-1)[flat]
  near = jnp.where(used[:, None], nb.reshape(8, -1)[:, flat].T, False)  # [C, 8]
  isolated = here & ~jnp.any(near, axis=1)
  # Listed index of every padded pixel (n for unlisted ones).
  slot = (
    jnp.full(size + 1, n, jnp.int32)
    .at[jnp.where(used, pixels, size)]
    .set(jnp.arange(n, dtype=jnp.int32))
  )
  step = jnp.asarray(_DY, jnp.int32) * wp + jnp.asarray(_DX, jnp.int32)
  own = jnp.arange(n, dtype=jnp.int32)[:, None] * 8 + jnp.arange(8, dtype=jnp.int32)[None, :]
  # out[c, d]: first foreground neighbour counterclockwise after direction d (d itself last).
  out = jnp.broadcast_to(jnp.arange(8, dtype=jnp.int32), (n, 8))
  for k in range(7, 0, -1):
    turn = (jnp.arange(8) + k) % 8
    out = jnp.where(near[:, turn], turn.astype(jnp.int32), out)
  target = slot[jnp.clip(flat[:, None] + step[out], 0, size - 1)]
  valid = here[:, None] & (near | (isolated[:, None] & (jnp.arange(8) == 4)))
  moves = valid & ~isolated[:, None] & (target < n)
  nxt = jnp.where(moves, target * 8 + (out + 4) % 8, own)
  first = jnp.full(n, 4, jnp.int32)
  for d in reversed(_START_SEARCH):
    first = jnp.where(near[:, d], d, first)
  starts = here & ~near[:, 4]
  seed = jnp.where(
    starts[:, None] & (jnp.arange(8) == first[:, None]), pixels[:, None].astype(jnp.int32), size
  )
  return nxt.reshape(-1), valid.reshape(-1), seed.reshape(-1).astype(jnp.int32)


def _cycle_minimum(nxt: jax.Array, label: jax.Array, length_bound: jax.Array) -> jax.Array:
  """Per state, the minimum of `label` over its cycle of the permutation `nxt` (pointer
  doubling; exact once 2^steps >= the longest cycle, which `length_bound` bounds)."""

  def cond(carry):
    _, _, span = carry
    return span < length_bound

  def body(carry):
    nxt, label, span = carry
    return nxt[nxt], jnp.minimum(label, label[nxt]), span * 2

  _, label, _ = jax.lax.while_loop(cond, body, (nxt, label, jnp.int32(1)))
  return label


def largest_contour(
  mask: jax.Array, capacity: int | None = None, listed: int = 0
) -> dict[str, jax.Array]:
  """The outer contour cv2.findContours(RETR_EXTERNAL, CHAIN_APPROX_NONE) lists with the largest
  cv2.contourArea, for one bool mask [H, W] (jit- and vmap-able).

  capacity: boundary pixels traced (static); None traces up to every pixel. With fewer
    boundary pixels than that the result is exact; with more, some borders are cut
    (largest_contours checks and falls back to the full size).
  listed: also list the contour's first `listed` points in OpenCV's order (static; 0: none).

  Returns a dict:
    points: int32 [H, W], how many times the contour visits each pixel (its point multiset);
    n_points: int32, the contour's length (sum of points);
    area: float32, its contourArea (shoelace area through pixel centres, holes ignored);
    start: int32 [2], its first point (x, y), the component's raster-first pixel;
    last: int32 [2], its last point (x, y) in OpenCV's order (the reference pads short
      contours with random points bounded by it);
    present: bool, the mask has a foreground pixel;
    with listed > 0, listed: int32 [listed, 2], the contour's first points (x, y) in OpenCV's
      order (from `start`), -1 past its end.
  """
  fg, nb = _neighbours(mask)
  hp, wp = fg.shape
  size = hp * wp
  boundary = fg & ~jnp.all(nb, axis=0)
  capacity = size if capacity is None else min(capacity, size)
  # Raster order, so the listed index order is the padded raster order.
  pixels = jnp.nonzero(boundary.reshape(-1), size=capacity, fill_value=size)[0].astype(jnp.int32)
  nxt, valid, seed = _border_graph(fg, nb, pixels)
  label = _cycle_minimum(nxt, seed, 4 * jnp.sum(boundary, dtype=jnp.int32) + 1)
  on = valid & (label < size)
  label = jnp.where(on, label, size)

  here = jnp.repeat(jnp.where(pixels < size, pixels, 0), 8)
  there = here[nxt]
  cross = jnp.where(on, (here % wp) * (there // wp) - (here // wp) * (there % wp), 0)
  area2 = jnp.zeros(size + 1, jnp.int32).at[label].add(cross)[:size]
  count = jnp.zeros(size + 1, jnp.int32).at[label].add(on.astype(jnp.int32))[:size]
  exists = count > 0
  # Outer borders run clockwise in (x, y) with y down: a negative shoelace sum.
  score = jnp.where(exists, -area2, jnp.iinfo(jnp.int32).min)
  best = jnp.max(score)
  chosen = jnp.max(jnp.where(exists & (score == best), jnp.arange(size, dtype=jnp.int32), -1))
  present = jnp.any(exists)
  visits = jnp.sum(((label == chosen) & present).reshape(-1, 8), axis=1, dtype=jnp.int32)
  points = jnp.zeros(size + 1, jnp.int32).at[jnp.where(pixels < size, pixels, size)].add(visits)
  points = points[:size].reshape(hp, wp)[1:-1, 1:-1]
  # The contour's last point: the state before its start state on the cycle (OpenCV stops on
  # returning to the start state); the start state itself on a one-point border.
  states = jnp.arange(nxt.shape[0], dtype=jnp.int32)
  first_state = jnp.argmax(on & (seed == chosen)).astype(jnp.int32)
  before = on & (label == chosen) & (nxt == first_state) & (states != first_state)
  last_state = jnp.where(jnp.any(before), jnp.argmax(before), first_state)
  last = jnp.where(present, here[last_state], wp + 1)
  out = dict(
    points=points,
    n_points=jnp.sum(points),
    area=jnp.where(present, best, 0).astype(jnp.float32) / 2,
    start=jnp.stack(
      [jnp.where(present, chosen, wp + 1) % wp - 1, jnp.where(present, chosen, wp + 1) // wp - 1]
    ).astype(jnp.int32),
    last=jnp.stack([last % wp - 1, last // wp - 1]).astype(jnp.int32),
    present=present,
  )
  if listed:
    # Each state's place on the contour: its distance to the last state, by pointer doubling
    # on the cycle cut after the last state (list ranking), counted back from the length.
    on_contour = on & (label == chosen) & present
    moves = on_contour & (states != last_state)
    succ = jnp.where(moves, nxt, states)
    dist = moves.astype(jnp.int32)

    def rank_cond(carry):
      return carry[2] < 4 * jnp.sum(boundary, dtype=jnp.int32) + 1

    def rank_body(carry):
      succ, dist, span = carry
      return succ[succ], dist + dist[succ], span * 2

    _, dist, _ = jax.lax.while_loop(rank_cond, rank_body, (succ, dist, jnp.int32(1)))
    place = out["n_points"] - 1 - dist
    slot = jnp.where(on_contour & (place < listed), place, listed)
    xy = jnp.stack([here % wp - 1, here // wp - 1], axis=1).astype(jnp.int32)
    out["listed"] = jnp.full((listed + 1, 2), -1, jnp.int32).at[slot].set(xy)[:listed]
  return out


@functools.partial(jax.jit, static_argnames=("chunk", "capacity", "listed"))
def largest_contours(
  masks: jax.Array, chunk: int = 16, capacity: int | None = None, listed: int = 0, need=None
):
  """`largest_contour` of bool masks [N, H, W], `chunk` masks at a time.

  capacity: boundary pixels traced per mask; None: a twelfth of the pixels (concept regions at
  224 px have a few thousand at most). A chunk with a mask over it is traced at full size
  instead, so the result is always exact.
  listed: also list each contour's first `listed` points in order (largest_contour).
  need: None, or bool [N]: only chunks holding a mask with need True are traced (the others
    give zeros: absent, no points).

  Returns largest_contour's dict, each field stacked over N.
  """
  masks = masks.astype(bool)
  total, height, width = masks.shape
  full = (height + 2) * (width + 2)
  capacity = max(256, full // 12) if capacity is None else capacity
  chunks = -(-total // chunk)
  padded = jnp.pad(masks, ((0, chunks * chunk - total), (0, 0), (0, 0)))
  need = jnp.ones(total, bool) if need is None else jnp.asarray(need, bool)
  need = jnp.pad(need, (0, chunks * chunk - total))
  trace_small = jax.vmap(functools.partial(largest_contour, capacity=capacity, listed=listed))
  trace_full = jax.vmap(functools.partial(largest_contour, listed=listed))

  def one_chunk(args):
    group, wanted = args
    fits = jnp.max(jax.vmap(boundary_count)(group)) <= capacity
    traced = lambda g: jax.lax.cond(fits, trace_small, trace_full, g)  # noqa: E731
    shapes = jax.eval_shape(trace_small, group)
    skipped = lambda g: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)  # noqa: E731
    return jax.lax.cond(jnp.any(wanted), traced, skipped, group)

  out = jax.lax.map(
    one_chunk, (padded.reshape(chunks, chunk, height, width), need.reshape(chunks, chunk))
  )
  return {k: v.reshape(chunks * chunk, *v.shape[2:])[:total] for k, v in out.items()}


# ------------------------------------------------------------------------------------------
# fitEllipse
# ------------------------------------------------------------------------------------------


def _svd_solve(matrix, rhs, relative: float = 0.0):
  """Least squares as cv2.solve(DECOMP_SVD) / SVBackSubst: singular values at most
  2 DBL_EPSILON times their sum (or `relative` times the largest) count as zero. Returns
  (solution, singular values, descending)."""
  u, sigma, vt = jnp.linalg.svd(matrix, full_matrices=False)
  keep = (sigma > 2 * DBL_EPSILON * jnp.sum(sigma)) & (sigma > relative * sigma[0])
  coef = jnp.where(keep, (u.T @ rhs) / jnp.where(keep, sigma, 1.0), 0.0)
  return vt.T @ coef, sigma


def _weighted_least_squares(columns, weights, rhs):
  """OpenCV's SVD least squares over the contour's points, with each pixel's row weighted by the
  square root of its multiplicity (the same normal equations and singular values as repeating
  the row). columns: float64 [P, K]; weights: float64 [P]; rhs: the right-hand side shared by
  all rows. A Householder QR of [A | b] reduces it to K x K (R and Q^T b) first."""
  k = columns.shape[1]
  stacked = (
    jnp.concatenate([columns, jnp.full_like(columns[:, :1], rhs)], axis=1) * weights[:, None]
  )
  r = jnp.linalg.qr(stacked, mode="r")
  return _svd_solve(r[:k, :k], r[:k, k])


def _conic_box(r, g, scale, c):
  """fitEllipseNoDirect's last step: the box from the centre r float64 [2] (scaled), the refit's
  quadratic terms g float64 [3], the scale and the float32 centroid c [2]. Returns (center
  float32 [2], size float32 [2], angle float32)."""
  theta = -0.5 * jnp.arctan2(g[2], g[1] - g[0])
  min_eps = 1e-8
  t = jnp.where(jnp.abs(g[2]) > min_eps, g[2] / jnp.sin(-2.0 * theta), g[1] - g[0])
  r2 = jnp.abs(g[0] + g[1] - t)
  r2 = jnp.where(r2 > min_eps, jnp.sqrt(2.0 / jnp.where(r2 > min_eps, r2, 1.0)), r2)
  r3 = jnp.abs(g[0] + g[1] + t)
  r3 = jnp.where(r3 > min_eps, jnp.sqrt(2.0 / jnp.where(r3 > min_eps, r3, 1.0)), r3)
  center = jnp.stack(
    [(r[0] / scale).astype(jnp.float32) + c[0], (r[1] / scale).astype(jnp.float32) + c[1]]
  )
  w = (r2 * 2 / scale).astype(jnp.float32)
  h = (r3 * 2 / scale).astype(jnp.float32)
  swap = w > h
  angle = jnp.where(swap, (90 + theta * 180 / math.pi).astype(jnp.float32), jnp.float32(0))
  size = jnp.where(swap, jnp.stack([h, w]), jnp.stack([w, h]))
  angle = jnp.where(angle < -180, angle + 360, angle)
  angle = jnp.where(angle > 360, angle - 360, angle)
  return center, size, angle


def _fit_ellipse(points: jax.Array, extra=None, n_extra=None, rows: int | None = None):
  """cv2.fitEllipse's least squares (fitEllipseNoDirect) of a contour given as its point multiset
  int32 [H, W] (largest_contour's `points`), and which of OpenCV's fits the contour gets;
  traced with 64-bit types on. rows: the design matrices get a row for each of the first `rows`
  pixels on the contour (static; None: one per pixel), exact when the contour has no more
  distinct pixels. extra int32 [4, 2] and n_extra int32: points (x, y) the reference appends to
  a contour of under 5 points (reference_padding).

  Returns (center float32 [2] as (x, y), size float32 [2] as (width, height) full axes with
  width <= height, angle float32 degrees, rule int32): FITTED: the least-squares box;
  DIRECT (5 points, padding included: OpenCV's direct fit) and DEGENERATE (OpenCV moves the
  points by cv::theRNG()): fits that need the points in order, left to `ordered_fits`, and
  FEW_POINTS or ABSENT: a zero-size box at the centroid of the contour's points.
  """
  height, width = points.shape
  n = jnp.sum(points)
  xs = jnp.arange(width, dtype=jnp.float32)
  ys = jnp.arange(height, dtype=jnp.float32)
  # OpenCV accumulates the centroid in float32 (exact for integer sums below 2^24).
  nf = jnp.maximum(n, 1).astype(jnp.float32)
  cx = jnp.sum(points * jnp.arange(width)[None, :]).astype(jnp.float32) / nf
  cy = jnp.sum(points * jnp.arange(height)[:, None]).astype(jnp.float32) / nf
  f64 = jnp.float64
  m = points.astype(f64)
  du = (xs - cx).astype(f64)  # the float32 subtraction OpenCV does, then widened
  dv = (ys - cy).astype(f64)
  spread = jnp.sum(m * (jnp.abs(du)[None, :] + jnp.abs(dv)[:, None]))
  scale = 100.0 / jnp.where(spread > FLT_EPSILON, spread, FLT_EPSILON)
  flat = points.reshape(-1)
  if rows is None:
    index = jnp.arange(height * width)
  else:
    index = jnp.nonzero(flat > 0, size=min(rows, height * width), fill_value=0)[0]
    flat = jnp.where(jnp.arange(index.shape[0]) < jnp.sum(flat > 0), flat[index], 0)
  u = (du * scale)[index % width]
  v = (dv * scale)[index // width]
  weights = jnp.sqrt(flat.astype(f64))
  # First fit: -a u^2 - b v^2 - c uv + d u + e v = 10000.
  design = jnp.stack([-u * u, -v * v, -u * v, u, v], axis=1)
  gfp, sigma = _weighted_least_squares(design, weights, 10000.0)
  # OpenCV's degeneracy test on the design matrix: w0 * FLT_EPSILON > w4.
  degenerate = sigma[0] * FLT_EPSILON > sigma[4]
  # The centre, where the conic's gradient vanishes. A coefficient the first fit gives as
  # round-off (a strip two pixels wide, whose exact fit has b = e = 0) is zero in OpenCV's fit
  # and noise in ours: the centre's system drops singular values below 1e-9 of the largest,
  # so such a degenerate conic is centred on the points' mean, as OpenCV centres it.
  r, _ = _svd_solve(
    jnp.stack([jnp.stack([2 * gfp[0], gfp[2]]), jnp.stack([gfp[2], 2 * gfp[1]])]),
    gfp[3:5],
    relative=1e-9,
  )
  # Refit the quadratic terms about that centre: a' u'^2 + b' v'^2 + c' u'v' = 1.
  qu, qv = u - r[0], v - r[1]
  g, _ = _weighted_least_squares(jnp.stack([qu * qu, qv * qv, qu * qv], axis=1), weights, 1.0)
  centroid = jnp.stack([cx, cy])
  center, size, angle = _conic_box(r, g, scale, centroid)
  if extra is None:
    n_extra = jnp.int32(0)
  n_extra = jnp.where((n > 0) & (n < 5), n_extra, 0)
  total = n + n_extra
  rule = jnp.where(
    n == 0,
    ABSENT,
    jnp.where(
      total < 5,
      FEW_POINTS,
      jnp.where(total == 5, DIRECT, jnp.where(degenerate, DEGENERATE, FITTED)),
    ),
  ).astype(jnp.int32)
  fitted = rule == FITTED
  return (
    jnp.where(fitted, center, centroid),
    jnp.where(fitted, size, 0.0).astype(jnp.float32),
    jnp.where(fitted, angle, 0.0).astype(jnp.float32),
    rule,
  )


# ------------------------------------------------------------------------------------------
# OpenCV's operation order: the 5-point direct fit and cv::theRNG()'s offsets
# ------------------------------------------------------------------------------------------
#
# fitEllipse on exactly 5 points is fitEllipseDirect, whose reduced scatter matrix M is singular
# in exact arithmetic for 5 points: |det M| is round-off, and the fit goes on where it exceeds
# 1e-10. So the decision, and on ill-conditioned point sets (repeated points) the eigenvector,
# depend on every rounding; here each operation is OpenCV's, in its order, in float64 (the
# 6 x 6 scatter as mulTransposed sums it, M and det M from OpenCV's formulas, and the
# eigenvectors from JAMA's orthes and hqr2 as cv::eigenNonSymmetric runs them). Two compiler
# rewrites would move the result: fusing a product into the sum that uses it (a multiply-add
# rounds once; XLA:CPU fuses, GPUs may), and dividing by a broadcast scalar or a quotient as a
# multiplication by a reciprocal (XLA's algebraic simplifier). Every product and quotient
# passes through `_fence` (an XOR of its bits with `zero`, a uint64 0 that is an argument of
# the program), and every divisor is tied to its dividend the same way.


def _with_x64(jitted):
  """Call `jitted` with 64-bit types on, so it is traced and compiled with them."""

  @functools.wraps(jitted)
  def call(*args, **kwargs):
    with jax.enable_x64(True):
      return jitted(*args, **kwargs)

  return call


def _fence(x: jax.Array, zero: jax.Array) -> jax.Array:
  """float32 or float64 x unchanged, through an XOR of its bits with `zero` (uint64 0, an
  argument of the program), so the compiler can neither fold it away nor fuse the product that
  made x into the sum that uses it."""
  if x.dtype == jnp.float64:
    bits = jax.lax.bitcast_convert_type(x, jnp.uint64) ^ zero
    return jax.lax.bitcast_convert_type(bits, jnp.float64)
  bits = jax.lax.bitcast_convert_type(x, jnp.uint32) ^ zero.astype(jnp.uint32)
  return jax.lax.bitcast_convert_type(bits, x.dtype)


def _mul(a, b, zero):
  """a * b rounded to the type, then fenced (see _fence)."""
  return _fence(jnp.asarray(a) * jnp.asarray(b), zero)


def _div(a, b, zero):
  """a / b in float64 as C computes it: the divisor is tied bit for bit to the dividend (XLA
  turns a division by a broadcast scalar into a multiplication by its reciprocal) and the
  quotient is fenced ((a / b) / c would become a / (b * c))."""
  a, b = jnp.broadcast_arrays(jnp.asarray(a, jnp.float64), jnp.asarray(b, jnp.float64))
  tie = jax.lax.bitcast_convert_type(a, jnp.uint64) & zero
  b = jax.lax.bitcast_convert_type(jax.lax.bitcast_convert_type(b, jnp.uint64) ^ tie, jnp.float64)
  return _fence(a / b, zero)


#: theRNG's state after cv2.setRNGSeed(0), and at the start of every thread (cv::RNG's default).
OPENCV_DEFAULT_STATE = 0xFFFFFFFF
#: cv::RNG's multiply-with-carry multiplier (CV_RNG_COEFF).
OPENCV_RNG_COEFF = 4164903690
#: theRNG words one fit may read: fitEllipseDirect's two attempts and fitEllipseNoDirect's
#: offsets (2 words a point each), for 5 points.
DIRECT_DRAWS = 30


@functools.lru_cache(maxsize=8)
def opencv_rng_words(seed: int, count: int) -> np.ndarray:
  """uint32 [count]: the words cv::theRNG() gives after cv2.setRNGSeed(seed) (RNG::next: state =
  (uint64)(unsigned)state * 4164903690 + (state >> 32), the low 32 bits; seed 0 starts from
  0xFFFFFFFF, OpenCV's state at the start of every thread)."""
  state = int(seed) % (1 << 64) or OPENCV_DEFAULT_STATE
  out = np.empty(count, np.uint32)
  for i in range(count):
    state = (state & 0xFFFFFFFF) * OPENCV_RNG_COEFF + (state >> 32)
    out[i] = state & 0xFFFFFFFF
  return out


def _rng_offsets(words, start, points: int, eps, zero):
  """OpenCV's getOfs(eps) for `points` points from theRNG's words at start, start + 1, ...:
  float32 [points, 2] (dx, dy), each rng.uniform(-eps, eps) = word * 2^-32 * (2 eps) - eps in
  float32. The compiler OpenCV ships with evaluates Point2f(uniform(), uniform())'s arguments
  right to left: a point's y takes the first of its two words."""
  index = jnp.clip(start + jnp.arange(2 * points), 0, words.shape[0] - 1)
  unit = words[index].astype(jnp.float32) * jnp.float32(2.0**-32)
  eps = jnp.asarray(eps, jnp.float32)
  offsets = _fence(unit * (eps - (-eps)), zero) + (-eps)
  return offsets.reshape(points, 2)[:, ::-1]


def _reduced_scatter(p, zero):
  """fitEllipseDirect's reduced system for 5 centred, scaled points float64 [5, 2]: (TM float64
  [3, 3], Ts, M float64 [3, 3], |det M|), each in OpenCV's operation order."""

  def mul(a, b):
    return _mul(a, b, zero)

  def div(a, b):
    return _div(a, b, zero)

  px, py = p[:, 0], p[:, 1]
  cols = jnp.stack([mul(px, px), mul(px, py), mul(py, py), px, py, jnp.ones_like(px)])  # [6, 5]
  # mulTransposed: each entry a sum over the points in order; then DM *= 1.0 / n. Entries are
  # computed as arrays, each with OpenCV's operations.
  acc = jnp.zeros((6, 6), jnp.float64)
  for k in range(5):
    acc = acc + mul(cols[:, k, None], cols[None, :, k])
  dm = mul(acc, 1.0 / 5)

  def t3(a, b, c):
    """dm[a] * dm[b] * dm[c], left to right; a may index a column of rows 0..2."""
    return mul(mul(dm[a], dm[b]), dm[c])

  r = slice(0, 3)  # TM's columns, one per row r of DM
  tm = jnp.stack(
    [
      t3((r, 5), (3, 5), (4, 4))
      - t3((r, 5), (3, 4), (4, 5))
      - t3((r, 4), (3, 5), (5, 4))
      + t3((r, 3), (4, 5), (5, 4))
      + t3((r, 4), (3, 4), (5, 5))
      - t3((r, 3), (4, 4), (5, 5)),
      t3((r, 5), (3, 3), (4, 5))
      - t3((r, 5), (3, 5), (4, 3))
      + t3((r, 4), (3, 5), (5, 3))
      - t3((r, 3), (4, 5), (5, 3))
      - t3((r, 4), (3, 3), (5, 5))
      + t3((r, 3), (4, 3), (5, 5)),
      t3((r, 5), (3, 4), (4, 3))
      - t3((r, 5), (3, 3), (4, 4))
      - t3((r, 4), (3, 4), (5, 3))
      + t3((r, 3), (4, 4), (5, 3))
      + t3((r, 4), (3, 3), (5, 4))
      - t3((r, 3), (4, 3), (5, 4)),
    ]
  )
  ts = (
    -t3((3, 5), (4, 4), (5, 3))
    + t3((3, 4), (4, 5), (5, 3))
    + t3((3, 5), (4, 3), (5, 4))
    - t3((3, 3), (4, 5), (5, 4))
    - t3((3, 4), (4, 3), (5, 5))
    + t3((3, 3), (4, 4), (5, 5))
  )

  def row_sum(row):
    return (mul(dm[row, 3], tm[0]) + mul(dm[row, 4], tm[1])) + mul(dm[row, 5], tm[2])

  m = jnp.stack(
    [
      div(dm[2, :3] + div(row_sum(2), ts), 2.0),
      -dm[1, :3] - div(row_sum(1), ts),
      div(dm[0, :3] + div(row_sum(0), ts), 2.0),
    ]
  )
  det = (
    mul(m[0, 0], mul(m[1, 1], m[2, 2]) - mul(m[2, 1], m[1, 2]))
    - mul(m[0, 1], mul(m[1, 0], m[2, 2]) - mul(m[2, 0], m[1, 2]))
    + mul(m[0, 2], mul(m[1, 0], m[2, 1]) - mul(m[2, 0], m[1, 1]))
  )
  return tm, ts, m, jnp.abs(det)


def _direct_attempts(xy, cursor, words, zero):
  """fitEllipseDirect's attempts on 5 points int32 [5, 2] in OpenCV's order: the points as they
  are (theRNG's offsets of size 0: 10 words read, values unused), then, where |det M| is at most
  1e-10 (or not a number), moved by getOfs(s / 10 * 1e-2) from the next 10 words.

  Returns (tm, ts, m: the system of the attempt that stands, first bool: the first stands,
  second bool: the second does (neither: OpenCV falls back to fitEllipseNoDirect), cx, cy, scale
  float64)."""

  def mul(a, b):
    return _mul(a, b, zero)

  def div(a, b):
    return _div(a, b, zero)

  points = xy.astype(jnp.float32)
  wide = points.astype(jnp.float64)
  cx, cy = jnp.zeros((), jnp.float64), jnp.zeros((), jnp.float64)
  for i in range(5):
    cx, cy = cx + wide[i, 0], cy + wide[i, 1]
  cx, cy = div(cx, 5.0), div(cy, 5.0)
  s = jnp.zeros((), jnp.float64)
  for i in range(5):
    s = s + (jnp.abs(wide[i, 0] - cx) + jnp.abs(wide[i, 1] - cy))
  scale = div(100.0, jnp.where(s > FLT_EPSILON, s, FLT_EPSILON))

  def attempt(moved):
    moved = moved.astype(jnp.float64)  # p.x + delta.x in float32, then widened
    centred = jnp.stack([mul(moved[:, 0] - cx, scale), mul(moved[:, 1] - cy, scale)], axis=1)
    return _reduced_scatter(centred, zero)

  eps = mul(div(s, 10.0), 1e-2).astype(jnp.float32)
  moved = jnp.stack([points, points + _rng_offsets(words, cursor + 10, 5, eps, zero)])
  tm, ts, m, det = jax.vmap(attempt)(moved)
  first = det[0] > 1e-10
  second = ~first & (det[1] > 1e-10)
  tm, ts, m = (jnp.where(first, x[0], x[1]) for x in (tm, ts, m))
  return tm, ts, m, first, second, cx, cy, scale


def _cdiv(xr, xi, yr, yi, zero):
  """JAMA's complex division (xr + i xi) / (yr + i yi): (real, imaginary)."""

  def mul(a, b):
    return _mul(a, b, zero)

  def div(a, b):
    return _div(a, b, zero)

  wide = jnp.abs(yr) > jnp.abs(yi)
  r = div(yi, jnp.where(yr != 0, yr, 1.0))
  d = yr + mul(r, yi)
  wide_out = div(xr + mul(r, xi), d), div(xi - mul(r, xr), d)
  r = div(yr, jnp.where(yi != 0, yi, 1.0))
  d = yi + mul(r, yr)
  tall_out = div(mul(r, xr) + xi, d), div(mul(r, xi) - xr, d)
  return tuple(jnp.where(wide, a, b) for a, b in zip(wide_out, tall_out))


def _eigen_nonsymmetric3(matrix, zero):
  """cv::eigenNonSymmetric of a float64 [3, 3] matrix as OpenCV computes it: JAMA's orthes
  (Householder reduction to Hessenberg form) and hqr2 (shifted QR to real Schur form, then
  back substitution), operation for operation. Returns (eigenvalues float64 [3], real parts,
  sorted as cv::sortIdx sorts them: ascending, stable, then reversed; eigenvectors float64
  [3, 3], one per row in that order, unnormalised as hqr2 leaves them (a complex pair's rows
  are its real and imaginary parts); converged bool (hqr2 sets no limit; here 300 steps))."""

  def mul(a, b):
    return _mul(a, b, zero)

  def div(a, b):
    return _div(a, b, zero)

  def where(c, a, b):
    return [[jnp.where(c, a[i][j], b[i][j]) for j in range(3)] for i in range(3)]

  eps = 2.0**-52
  h = [[matrix[i, j] for j in range(3)] for i in range(3)]
  zero64 = jnp.zeros((), jnp.float64)
  one64 = jnp.ones((), jnp.float64)

  # orthes: one Householder step (m = 1) for 3 x 3.
  scale = (zero64 + jnp.abs(h[1][0])) + jnp.abs(h[2][0])
  active = scale != 0.0
  safe = jnp.where(active, scale, 1.0)
  o2 = div(h[2][0], safe)
  o1 = div(h[1][0], safe)
  norm2 = (zero64 + mul(o2, o2)) + mul(o1, o1)
  g = jnp.sqrt(norm2)
  g = jnp.where(o1 > 0, -g, g)
  norm2 = jnp.where(active, norm2 - mul(o1, g), 1.0)
  o1 = o1 - g
  reduced = [row[:] for row in h]
  for j in (1, 2):
    f = div((zero64 + mul(o2, reduced[2][j])) + mul(o1, reduced[1][j]), norm2)
    reduced[1][j] = reduced[1][j] - mul(f, o1)
    reduced[2][j] = reduced[2][j] - mul(f, o2)
  for i in range(3):
    f = div((zero64 + mul(o2, reduced[i][2])) + mul(o1, reduced[i][1]), norm2)
    reduced[i][1] = reduced[i][1] - mul(f, o1)
    reduced[i][2] = reduced[i][2] - mul(f, o2)
  o1 = jnp.where(active, mul(scale, o1), 0.0)
  reduced[1][0] = mul(scale, g)
  h = where(active, reduced, h)
  # ortran: accumulate the transformation.
  v = [[one64 if i == j else zero64 for j in range(3)] for i in range(3)]
  accumulate = h[1][0] != 0.0
  o2 = h[2][0]
  updated = [row[:] for row in v]
  for j in (1, 2):
    gj = (zero64 + mul(o1, v[1][j])) + mul(o2, v[2][j])
    gj = div(div(gj, jnp.where(accumulate, o1, 1.0)), jnp.where(accumulate, h[1][0], 1.0))
    updated[1][j] = v[1][j] + mul(gj, o1)
    updated[2][j] = v[2][j] + mul(gj, o2)
  v = where(accumulate, updated, v)

  norm = zero64
  for i in range(3):
    for j in range(max(i - 1, 0), 3):
      norm = norm + jnp.abs(h[i][j])

  def small(ha, l):
    s = jnp.abs(ha[l - 1, l - 1]) + jnp.abs(ha[l, l])
    return jnp.abs(ha[l, l - 1]) < eps * jnp.where(s == 0.0, norm, s)

  def one_root(ha, da, ea, n1, exshift):
    k = jnp.clip(n1, 0, 2)
    value = ha[k, k] + exshift
    return ha.at[k, k].set(value), da.at[k].set(value), ea.at[k].set(0.0)

  def two_roots(ha, va, da, ea, n1, exshift):
    """Rows and columns n1 - 1, n1 (n1 = 1 or 2, traced) on float64 [3, 3] arrays."""
    a = n1 - 1
    index = jnp.arange(3)
    w = mul(ha[n1, a], ha[a, n1])
    p = div(ha[a, a] - ha[n1, n1], 2.0)
    q = mul(p, p) + w
    z = jnp.sqrt(jnp.abs(q))
    ha = ha.at[n1, n1].set(ha[n1, n1] + exshift)
    ha = ha.at[a, a].set(ha[a, a] + exshift)
    x = ha[n1, n1]
    real = q >= 0
    zr = jnp.where(p >= 0, p + z, p - z)
    upper = x + zr
    lower = jnp.where(zr != 0.0, x - div(w, jnp.where(zr != 0.0, zr, 1.0)), upper)
    xr = ha[n1, a]
    s = jnp.abs(xr) + jnp.abs(zr)
    pr, qr = div(xr, jnp.where(s != 0, s, 1.0)), div(zr, jnp.where(s != 0, s, 1.0))
    r = jnp.sqrt(mul(pr, pr) + mul(qr, qr))
    pr, qr = div(pr, jnp.where(r != 0, r, 1.0)), div(qr, jnp.where(r != 0, r, 1.0))

    def rotate(first, second, keep):
      new_first = mul(qr, first) + mul(pr, second)
      new_second = mul(qr, second) - mul(pr, first)
      return jnp.where(keep, new_first, first), jnp.where(keep, new_second, second)

    top, bottom = rotate(ha[a], ha[n1], index >= a)  # row modification
    hr = ha.at[a].set(top).at[n1].set(bottom)
    left, right = rotate(hr[:, a], hr[:, n1], index <= n1)  # column modification
    hr = hr.at[:, a].set(left).at[:, n1].set(right)
    left, right = rotate(va[:, a], va[:, n1], index >= 0)  # accumulate
    vr = va.at[:, a].set(left).at[:, n1].set(right)
    da = da.at[a].set(jnp.where(real, upper, x + p)).at[n1].set(jnp.where(real, lower, x + p))
    ea = ea.at[a].set(jnp.where(real, 0.0, z)).at[n1].set(jnp.where(real, 0.0, -z))
    return jnp.where(real, hr, ha), jnp.where(real, vr, va), da, ea

  def qr_step(ha, va, it, exshift):
    """A double QR step on float64 [3, 3] arrays; on 3 x 3 only with n1 = 2, l = 0, m = 0.
    Rows and columns are updated as vectors: each element gets OpenCV's operations."""
    diagonal = jnp.eye(3, dtype=bool)
    index = jnp.arange(3)
    x, y, w = ha[2, 2], ha[1, 1], mul(ha[2, 1], ha[1, 2])
    wilkinson = it == 10  # Wilkinson's original ad hoc shift
    exshift = jnp.where(wilkinson, exshift + x, exshift)
    ha = jnp.where(wilkinson & diagonal, ha - x, ha)
    s = jnp.abs(ha[2, 1]) + jnp.abs(ha[1, 0])
    x = jnp.where(wilkinson, mul(0.75, s), x)
    y = jnp.where(wilkinson, mul(0.75, s), y)
    w = jnp.where(wilkinson, mul(mul(-0.4375, s), s), w)
    s = div(y - x, 2.0)  # MATLAB's ad hoc shift
    s = mul(s, s) + w
    matlab = (it == 30) & (s > 0)
    s = jnp.sqrt(jnp.where(matlab, s, 1.0))
    s = jnp.where(y < x, -s, s)
    s = x - div(w, div(y - x, 2.0) + s)
    ha = jnp.where(matlab & diagonal, ha - s, ha)
    exshift = jnp.where(matlab, exshift + s, exshift)
    x, y, w = (jnp.where(matlab, 0.964, t) for t in (x, y, w))
    # Two consecutive small sub-diagonal elements: m = l = 0.
    z = ha[0, 0]
    r, s = x - z, y - z
    p = div(mul(r, s) - w, ha[1, 0]) + ha[0, 1]
    q = ha[1, 1] - z - r - s
    r = ha[2, 1]
    s = jnp.abs(p) + jnp.abs(q) + jnp.abs(r)
    p, q, r = div(p, s), div(q, s), div(r, s)
    ha = ha.at[2, 0].set(0.0)
    # k = 0 (not last): its x is the shift's; x == 0 ends the step.
    go = x != 0.0
    s = jnp.sqrt(mul(p, p) + mul(q, q) + mul(r, r))
    s = jnp.where(p < 0, -s, s)
    go = go & (s != 0)
    safe = jnp.where(s != 0, s, 1.0)
    p = p + s
    xk, yk, zk = div(p, safe), div(q, safe), div(r, safe)
    qk, rk = div(q, jnp.where(p != 0, p, 1.0)), div(r, jnp.where(p != 0, p, 1.0))
    pj = ha[0] + mul(qk, ha[1])  # row modification, all columns
    pj = pj + mul(rk, ha[2])
    hk = jnp.stack([ha[0] - mul(pj, xk), ha[1] - mul(pj, yk), ha[2] - mul(pj, zk)])

    def columns0(a):  # column modification (and accumulation), all rows
      pi = mul(xk, a[:, 0]) + mul(yk, a[:, 1])
      pi = pi + mul(zk, a[:, 2])
      return jnp.stack([a[:, 0] - pi, a[:, 1] - mul(pi, qk), a[:, 2] - mul(pi, rk)], axis=1)

    ha, va = jnp.where(go, columns0(hk), ha), jnp.where(go, columns0(va), va)
    stopped = x == 0.0
    # k = 1 (last).
    p, q = ha[1, 0], ha[2, 0]
    x1 = jnp.abs(p) + jnp.abs(q)
    scaled = x1 != 0.0
    safe = jnp.where(scaled, x1, 1.0)
    p, q = jnp.where(scaled, div(p, safe), p), jnp.where(scaled, div(q, safe), q)
    s = jnp.sqrt(mul(p, p) + mul(q, q) + mul(zero64, zero64))
    s = jnp.where(p < 0, -s, s)
    go = ~stopped & scaled & (s != 0)
    safe = jnp.where(s != 0, s, 1.0)
    below = mul(-s, x1)
    p = p + s
    xk, yk = div(p, safe), div(q, safe)
    qk = div(q, jnp.where(p != 0, p, 1.0))
    hk = ha.at[1, 0].set(below)
    pj = hk[1] + mul(qk, hk[2])  # row modification, columns 1 and 2
    right = index >= 1
    hk = hk.at[1].set(jnp.where(right, hk[1] - mul(pj, xk), hk[1]))
    hk = hk.at[2].set(jnp.where(right, hk[2] - mul(pj, yk), hk[2]))

    def columns1(a):
      pi = mul(xk, a[:, 1]) + mul(yk, a[:, 2])
      return jnp.stack([a[:, 0], a[:, 1] - pi, a[:, 2] - mul(pi, qk)], axis=1)

    return jnp.where(go, columns1(hk), ha), jnp.where(go, columns1(va), va), exshift

  def pack(h, v, d, e):
    return (
      jnp.stack([jnp.stack(r) for r in h]),
      jnp.stack([jnp.stack(r) for r in v]),
      jnp.stack(d),
      jnp.stack(e),
    )

  def unpack(ha, va, da, ea):
    rows = lambda a: [[a[i, j] for j in range(3)] for i in range(3)]  # noqa: E731
    return rows(ha), rows(va), [da[i] for i in range(3)], [ea[i] for i in range(3)]

  def cond(state):
    return (state[4] >= 0) & (state[7] < 300)

  def body(state):
    ha, va, da, ea, n1, it, exshift, steps = state
    s2, s1 = small(ha, 2), small(ha, 1)
    l = jnp.where(n1 == 2, jnp.where(s2, 2, jnp.where(s1, 1, 0)), jnp.where((n1 == 1) & s1, 1, 0))
    h1, d1, e1 = one_root(ha, da, ea, n1, exshift)
    one = (h1, va, d1, e1)
    two = two_roots(ha, va, da, ea, jnp.clip(n1, 1, 2), exshift)
    hq, vq, exshift_q = qr_step(ha, va, it, exshift)
    step = (hq, vq, da, ea)
    is_one, is_two = l == n1, l == n1 - 1
    new = tuple(jnp.where(is_one, a, jnp.where(is_two, b, c)) for a, b, c in zip(one, two, step))
    deflated = is_one | is_two
    return (
      *new,
      jnp.where(is_one, n1 - 1, jnp.where(is_two, n1 - 2, n1)),
      jnp.where(deflated, 0, it + 1),
      jnp.where(deflated, exshift, exshift_q),
      steps + 1,
    )

  start = (*pack(h, v, [zero64] * 3, [zero64] * 3), jnp.int32(2), jnp.int32(0), zero64, 0)
  ha, va, da, ea, n1, _, _, _ = jax.lax.while_loop(cond, body, start)
  h, v, d, e = unpack(ha, va, da, ea)
  converged = n1 < 0

  # Back substitution to the vectors of the upper triangular form.
  for n1 in (2, 1, 0):  # noqa: PLR1704 (hqr2's name)
    p, q = d[n1], e[n1]
    # A real eigenvalue.
    hr = [row[:] for row in h]
    l = jnp.int32(n1)
    hr[n1][n1] = one64
    z = s = zero64
    for i in range(n1 - 1, -1, -1):
      w = hr[i][i] - p
      r = zero64
      for j in range(i + 1, n1 + 1):
        r = jnp.where(j >= l, r + mul(hr[i][j], hr[j][n1]), r)
      paired = e[i] < 0.0
      alone = div(-r, jnp.where(w != 0.0, w, mul(eps, norm)))
      # e[i] > 0: the real equations of a complex pair (i, i + 1).
      xq, yq = hr[i][i + 1], hr[i + 1][i]
      qq = mul(d[i] - p, d[i] - p) + mul(e[i], e[i])
      t = div(mul(xq, s) - mul(z, r), qq)
      below = jnp.where(jnp.abs(xq) > jnp.abs(z), div(-r - mul(w, t), xq), div(-s - mul(yq, t), z))
      settle = ~paired
      pair = e[i] != 0.0
      hr[i][n1] = jnp.where(settle, jnp.where(pair, t, alone), hr[i][n1])
      hr[i + 1][n1] = jnp.where(settle & pair, below, hr[i + 1][n1])
      t = jnp.abs(hr[i][n1])
      big = settle & (mul(mul(eps, t), t) > 1)
      for j in range(i, n1 + 1):
        hr[j][n1] = jnp.where(big, div(hr[j][n1], jnp.where(big, t, 1.0)), hr[j][n1])
      l = jnp.where(settle, i, l)
      z, s = jnp.where(paired, w, z), jnp.where(paired, r, s)
    # The second of a complex pair (n1 - 1, n1); a 3 x 3 matrix has at most one pair.
    hc = [row[:] for row in h]
    if n1 >= 1:
      a, b = hc[n1][n1 - 1], hc[n1 - 1][n1]
      tall = jnp.abs(a) > jnp.abs(b)
      safe = jnp.where(a != 0, a, 1.0)
      cr, ci = _cdiv(zero64, -b, hc[n1 - 1][n1 - 1] - p, q, zero)
      hc[n1 - 1][n1 - 1] = jnp.where(tall, div(q, safe), cr)
      hc[n1 - 1][n1] = jnp.where(tall, div(-(hc[n1][n1] - p), safe), ci)
      hc[n1][n1 - 1] = zero64
      hc[n1][n1] = one64
      for i in range(n1 - 2, -1, -1):
        ra = sa = zero64
        for j in range(n1 - 1, n1 + 1):
          ra = ra + mul(hc[i][j], hc[j][n1 - 1])
          sa = sa + mul(hc[i][j], hc[j][n1])
        hc[i][n1 - 1], hc[i][n1] = _cdiv(-ra, -sa, hc[i][i] - p, q, zero)
        t = jnp.maximum(jnp.abs(hc[i][n1 - 1]), jnp.abs(hc[i][n1]))
        big = mul(mul(eps, t), t) > 1
        for j in range(i, n1 + 1):
          for c in (n1 - 1, n1):
            hc[j][c] = jnp.where(big, div(hc[j][c], jnp.where(big, t, 1.0)), hc[j][c])
    h = where(q == 0, hr, where(q < 0, hc, h))
  # Back transformation.
  vb = [row[:] for row in v]
  for j in (2, 1, 0):
    for i in range(3):
      total = zero64
      for k in range(j + 1):
        total = total + mul(vb[i][k], h[k][j])
      vb[i][j] = total
  v = where(norm != 0.0, vb, v)
  values = jnp.stack(d)
  order = jnp.argsort(values, stable=True)[::-1]
  vectors = jnp.stack([jnp.stack(r) for r in v]).T
  return values[order], vectors[order], converged


def _direct_fit(xy, cursor, words, zero):
  """cv2.fitEllipse of exactly 5 points int32 [5, 2] in OpenCV's order (fitEllipseDirect),
  theRNG's words from `cursor` on; traced with 64-bit types on.

  Returns (center float32 [2], size float32 [2], angle float32, attempt int32: 0 where the first
  attempt stands, 1 where the second (moved points) does, 2 where both are singular and OpenCV
  falls back to fitEllipseNoDirect on the 5 points, from theRNG's words at cursor + 20: the
  box returned is then not OpenCV's)."""

  def mul(a, b):
    return _mul(a, b, zero)

  def div(a, b):
    return _div(a, b, zero)

  tm, ts, m, first, second, cx, cy, scale = _direct_attempts(xy, cursor, words, zero)
  _, vectors, _ = _eigen_nonsymmetric3(m, zero)
  # The eigenvector {a, b, c} with the largest 4ac - b^2, sign-normalised as OpenCV does.
  cond = [
    mul(mul(4.0, vectors[k, 0]), vectors[k, 2]) - mul(vectors[k, 1], vectors[k, 1])
    for k in range(3)
  ]
  pick = jnp.where(
    cond[0] < cond[1], jnp.where(cond[1] < cond[2], 2, 1), jnp.where(cond[0] < cond[2], 2, 0)
  )
  vec = vectors[pick]
  norm = jnp.sqrt((mul(vec[0], vec[0]) + mul(vec[1], vec[1])) + mul(vec[2], vec[2]))
  sign = jnp.prod(jnp.where(vec < 0.0, -1, 1))
  norm = jnp.where(sign <= 0, mul(-1.0, norm), norm)
  p0, p1, p2 = (div(vec[k], norm) for k in range(3))
  q0, q1, q2 = (
    div((mul(tm[r, 0], p0) + mul(tm[r, 1], p1)) + mul(tm[r, 2], p2), ts) for r in range(3)
  )
  u1 = ((mul(mul(p2, q0), q0) - mul(mul(p1, q0), q1)) + mul(mul(p0, q1), q1)) + mul(mul(p1, p1), q2)
  u2 = mul(mul(p0, p2), q2)
  l1 = jnp.sqrt(mul(p1, p1) + mul(p0 - p2, p0 - p2))
  l2 = p0 + p2
  l3 = mul(p1, p1) - mul(mul(4.0, p0), p2)
  x0 = div(div(mul(mul(2.0, p2), q0) - mul(p1, q1), l3), scale) + cx
  y0 = div(div(mul(mul(2.0, p0), q1) - mul(p1, q0), l3), scale) + cy
  root2 = math.sqrt(2.0)
  semi_a = div(mul(root2, jnp.sqrt(div(u1 - mul(4.0, u2), mul(l1 - l2, l3)))), scale)
  semi_b = div(mul(root2, jnp.sqrt(mul(-1.0, div(u1 - mul(4.0, u2), mul(l1 + l2, l3))))), scale)
  theta = jnp.where(
    p1 == 0,
    jnp.where(p0 < p2, 0.0, math.pi / 2),
    math.pi / 2 + mul(0.5, jnp.arctan2(p1, p0 - p2)),
  )
  width = mul(2.0, semi_a).astype(jnp.float32)
  height = mul(2.0, semi_b).astype(jnp.float32)
  swap = width > height
  degrees = div(mul(theta, 180.0), math.pi)
  angle = jnp.fmod(jnp.where(swap, 90 + degrees, degrees), 180.0).astype(jnp.float32)
  size = jnp.where(swap, jnp.stack([height, width]), jnp.stack([width, height]))
  center = jnp.stack([x0, y0]).astype(jnp.float32)
  # Where both attempts are singular, OpenCV's fitEllipseNoDirect on the 5 points takes over
  # (the caller runs it: _listed_least_squares from theRNG's word cursor + 20).
  return center, size, angle, jnp.where(first, 0, jnp.where(second, 1, 2)).astype(jnp.int32)


def _least_squares_start(xy, n):
  """fitEllipseNoDirect's centre and scale for the first n of the points int32 [K, 2]: (used
  bool [K], points float32 [K, 2], centroid float32 [2] (a float32 sum over the points, then
  divided by n), s float64 (the sum of |x - cx| + |y - cy|), scale float64 (100 / s))."""
  used = jnp.arange(xy.shape[0]) < n
  points = xy.astype(jnp.float32)
  total = jnp.sum(jnp.where(used[:, None], xy, 0), axis=0).astype(jnp.float32)  # exact below 2^24
  count = jnp.maximum(n, 1).astype(jnp.float32)
  # Coordinate by coordinate: XLA would divide a vector by a broadcast count as a product with
  # its reciprocal, which rounds otherwise.
  centroid = jnp.stack([total[0] / count, total[1] / count])
  offset = points - centroid
  s = jnp.sum(
    jnp.where(used, jnp.abs(offset[:, 0]).astype(jnp.float64) + jnp.abs(offset[:, 1]), 0.0)
  )
  scale = 100.0 / jnp.where(s > FLT_EPSILON, s, FLT_EPSILON)
  return used, points, centroid, s, scale


def _least_squares_design(points, used, centroid, scale):
  """fitEllipseNoDirect's first design matrix float64 [K, 5] (rows past the points are zero) and
  the scaled coordinates u, v float64 [K]."""
  offset = (points - centroid).astype(jnp.float64) * scale
  u, v = offset[:, 0], offset[:, 1]
  design = jnp.stack([-u * u, -v * v, -u * v, u, v], axis=1)
  return jnp.where(used[:, None], design, 0.0), u, v


def _listed_least_squares(xy, n, cursor, words, zero, moved=False):
  """fitEllipseNoDirect on the first n of the points int32 [K, 2], in OpenCV's order; where its
  design matrix is degenerate (w0 * FLT_EPSILON > w4) or `moved` (bool) the points first move
  by getOfs(s / (2 n) * 1e-3) from theRNG's words at cursor, cursor + 1, ... (2 a point).
  Least squares as `_fit_ellipse` solves them (LAPACK's SVD, not OpenCV's Jacobi SVD: the same
  to round-off). Returns (center float32 [2], size float32 [2], angle float32, degenerate
  bool)."""
  used, points, centroid, s, scale = _least_squares_start(xy, n)
  design, _, _ = _least_squares_design(points, used, centroid, scale)
  sigma = jnp.linalg.svd(design, compute_uv=False)
  degenerate = sigma[0] * FLT_EPSILON > sigma[4]
  moved = degenerate | moved
  eps = (s / (n.astype(jnp.float64) * 2) * 1e-3).astype(jnp.float32)
  offsets = _rng_offsets(words, cursor, xy.shape[0], eps, zero)
  points = jnp.where(moved, points + offsets, points)
  design, u, v = _least_squares_design(points, used, centroid, scale)
  gfp, _ = _svd_solve(design, jnp.where(used, 10000.0, 0.0))
  r, _ = _svd_solve(
    jnp.stack([jnp.stack([2 * gfp[0], gfp[2]]), jnp.stack([gfp[2], 2 * gfp[1]])]), gfp[3:5]
  )
  qu, qv = u - r[0], v - r[1]
  refit = jnp.where(used[:, None], jnp.stack([qu * qu, qv * qv, qu * qv], axis=1), 0.0)
  g, _ = _svd_solve(refit, jnp.where(used, 1.0, 0.0))
  center, size, angle = _conic_box(r, g, scale, centroid)
  return center, size, angle, degenerate


def _five_points(listed, n_points, extra, n_extra):
  """The 5 points cv2.fitEllipse gets: the contour's own in OpenCV's order (listed int32 [>= 5,
  2]), then the reference's padding (extra int32 [4, 2], n_extra of them)."""
  del n_extra
  i = jnp.arange(5)
  own = listed[i]
  padding = extra[jnp.clip(i - n_points, 0, 3)]
  return jnp.where((i < n_points)[:, None], own, padding)


def _fit_draws(rule, five, n_points, cursor, words, zero):
  """theRNG words cv2.fitEllipse reads for one contour: a 5-point fit 10 (its first attempt's
  offsets of size 0), 20 with the second attempt, 30 where both are singular and the 5 points'
  least squares is degenerate; a degenerate least-squares fit 2 per point; other fits none."""
  _, _, _, first, second, _, _, _ = _direct_attempts(five, cursor, words, zero)
  used, points, centroid, _, scale = _least_squares_start(five, jnp.int32(5))
  design, _, _ = _least_squares_design(points, used, centroid, scale)
  sigma = jnp.linalg.svd(design, compute_uv=False)
  degenerate = sigma[0] * FLT_EPSILON > sigma[4]
  direct = jnp.where(first, 10, jnp.where(second | ~degenerate, 20, 30))
  return jnp.where(rule == DIRECT, direct, jnp.where(rule == DEGENERATE, 2 * n_points, 0)).astype(
    jnp.int32
  )


def _ordered_fit(center, size, angle, rule, listed, n_points, extra, n_extra, cursor, words, zero):
  """One contour's fit where OpenCV needs its points in order (rule DIRECT or DEGENERATE from
  `_fit_ellipse`); the others pass through. Returns (center, size, angle, rule) with rule
  DIRECT, DIRECT_RETRIED or DIRECT_FALLBACK for the 5-point fit's three outcomes, DEGENERATE
  (fitted on moved points), UNLISTED (a degenerate contour longer than `listed`: the zero-size
  box stays) or UNDRAWABLE (OpenCV's box has a size that is not a number, which cv2.ellipse
  refuses: the zero-size box at the centroid)."""
  five = _five_points(listed, n_points, extra, n_extra)
  d_center, d_size, d_angle, attempt = _direct_fit(five, cursor, words, zero)
  capacity = listed.shape[0]
  fits_list = n_points <= capacity
  direct = rule == DIRECT
  # One least squares on listed points: a degenerate contour's (moved by theRNG), or the 5
  # points' where both direct attempts are singular (moved where their design is degenerate).
  fallback = direct & (attempt == 2)
  l_center, l_size, l_angle, _ = _listed_least_squares(
    jnp.where(fallback, jnp.zeros_like(listed).at[:5].set(five), listed),
    jnp.where(fallback, 5, jnp.minimum(n_points, capacity)),
    jnp.where(fallback, cursor + 20, cursor),
    words,
    zero,
    moved=~fallback,
  )
  d_center = jnp.where(fallback, l_center, d_center)
  d_size = jnp.where(fallback, l_size, d_size)
  d_angle = jnp.where(fallback, l_angle, d_angle)
  degenerate = (rule == DEGENERATE) & fits_list
  new_center = jnp.where(direct, d_center, jnp.where(degenerate, l_center, center))
  new_size = jnp.where(direct, d_size, jnp.where(degenerate, l_size, size))
  new_angle = jnp.where(direct, d_angle, jnp.where(degenerate, l_angle, angle))
  new_rule = jnp.where(
    direct,
    jnp.asarray((DIRECT, DIRECT_RETRIED, DIRECT_FALLBACK))[attempt],
    jnp.where(rule == DEGENERATE, jnp.where(fits_list, DEGENERATE, UNLISTED), rule),
  )
  undrawable = (direct | degenerate) & jnp.any(jnp.isnan(new_size))
  return (
    jnp.where(undrawable, center, new_center),
    jnp.where(undrawable, size, new_size),
    jnp.where(undrawable, angle, new_angle),
    jnp.where(undrawable, UNDRAWABLE, new_rule).astype(jnp.int32),
  )


@_with_x64
@functools.partial(jax.jit, static_argnames=("chunk",))
def ordered_fits(
  center, size, angle, rule, listed, n_points, extra, n_extra, cursor, words, zero, chunk=16
):
  """cv2.fitEllipse where it needs the contour's points in order: 5 points (fitEllipseDirect,
  exactly as OpenCV rounds it) and degenerate least squares (points moved by cv::theRNG()), for
  N contours; `fit_ellipses`' output passes through elsewhere. Chunks of `chunk` contours
  without such a fit skip the work.

  Args:
    center, size, angle, rule: fit_ellipses' output over N.
    listed: int32 [N, K, 2], each contour's first K points in order (largest_contours' listed;
      K >= 5; degenerate contours longer than K get rule UNLISTED).
    n_points: int32 [N]; extra int32 [N, 4, 2], n_extra int32 [N]: the reference's padding.
    cursor: int32 [N], the index in `words` of the first theRNG word each fit reads.
    words: uint32 [W], opencv_rng_words(seed, W).
    zero: uint64 0 (np.uint64(0)), passed in so that the compiler cannot fold the rounding
      fences (`_fence`).

  Returns (center float32 [N, 2], size float32 [N, 2], angle float32 [N], rule int32 [N]).
  """
  total = rule.shape[0]
  chunks = -(-total // chunk)
  grow = chunks * chunk - total

  def pad(x):
    return jnp.pad(x, [(0, grow)] + [(0, 0)] * (x.ndim - 1)).reshape(chunks, chunk, *x.shape[1:])

  args = [pad(jnp.asarray(x)) for x in (center, size, angle, rule, listed, n_points, extra)]
  args += [pad(jnp.asarray(x)) for x in (n_extra, cursor)]
  fit = jax.vmap(_ordered_fit, in_axes=(0,) * 9 + (None, None))

  def one_chunk(group):
    ordered = jnp.any((group[3] == DIRECT) | (group[3] == DEGENERATE))
    return jax.lax.cond(
      ordered, lambda g: fit(*g, words, zero), lambda g: tuple(g[:3]) + (g[3],), group
    )

  out = jax.lax.map(one_chunk, tuple(args))
  return tuple(v.reshape(chunks * chunk, *v.shape[2:])[:total] for v in out)


# ------------------------------------------------------------------------------------------
# The reference's padding of short contours (Python's `random`)
# ------------------------------------------------------------------------------------------

#: utils.get_label_colors: concept l is drawn in REFERENCE_COLORS[l]; the reference visits an
#: image's concepts in np.unique order of their colours (rows sorted lexicographically).
REFERENCE_COLORS = (
  (255, 0, 0),
  (0, 255, 0),
  (0, 0, 255),
  (255, 255, 0),
  (255, 165, 0),
  (255, 192, 203),
  (160, 32, 240),
  (0, 255, 255),
  (128, 0, 0),
  (128, 128, 0),
  (128, 0, 128),
  (255, 105, 180),
  (75, 0, 130),
  (0, 128, 0),
  (0, 128, 128),
  (70, 130, 180),
  (255, 69, 0),
  (139, 69, 19),
  (0, 0, 128),
  (255, 20, 147),
  (255, 140, 0),
)
#: 32-bit words of Python's Mersenne Twister a padding pass may read: at most 4 points of 2
#: draws per concept, a draw rejecting a word with probability below 1/2 (no draw is cut short
#: before 2^-40 of them are rejected in a row).
PAD_WORDS = 1024


def reference_order(n_concepts: int) -> np.ndarray:
  """int [n_concepts]: the concept ids in the reference's visiting order (np.unique of colours)."""
  if n_concepts > len(REFERENCE_COLORS):
    raise ValueError(
      f"utils.get_label_colors has {len(REFERENCE_COLORS)} colours, not {n_concepts}."
    )
  return np.asarray(sorted(range(n_concepts), key=lambda c: REFERENCE_COLORS[c]), np.int32)


@functools.lru_cache(maxsize=8)
def python_random_words(seed: int, count: int = PAD_WORDS) -> np.ndarray:
  """uint32 [count]: the first words random.seed(seed) makes Python's generator give (what
  getrandbits(32) returns); random.randint reads them in this order."""
  generator = random.Random(seed)
  return np.asarray([generator.getrandbits(32) for _ in range(count)], np.uint32)


def _randbelow(words, cursor, n):
  """random._randbelow(n) for int32 n >= 1 from uint32 words: getrandbits(n.bit_length()) is a
  word's top bits; values >= n are rejected. Returns (value int32, cursor after it)."""
  bits = 32 - jax.lax.clz(n.astype(jnp.uint32)).astype(jnp.uint32)
  shift = jnp.uint32(32) - bits

  def draw(carry):
    cursor, _ = carry
    word = words[jnp.minimum(cursor, words.shape[0] - 1)]
    return cursor + 1, (word >> shift).astype(jnp.int32)

  cursor, value = draw((cursor, jnp.int32(0)))
  cursor, value = jax.lax.while_loop(lambda c: c[1] >= n, draw, (cursor, value))
  return value, cursor


def reference_padding(n_points, last, words, order):
  """The points utils.draw_circle_on_components_with_augments adds to a largest contour of
  fewer than 5 points, for the concepts of one image and method, drawn from Python's `random`
  reseeded before them.

  Args:
    n_points: int32 [L] contour lengths (0: concept absent); last: int32 [L, 2], the contours'
      last points (x, y); words: uint32 [W], python_random_words(seed); order: int32 [L], the
      visiting order (reference_order).
  Returns:
    (extra int32 [L, 4, 2] points (x, y), n_extra int32 [L], failed bool [L]: the reference's
     randint(0, last - 1) raises there (a last coordinate of 0): no points, no words read.)
  For each missing point the reference draws randint(0, last_x - 1), then randint(0, last_y - 1).
  """

  def concept(cursor, c):
    need = (n_points[c] > 0) & (n_points[c] < 5)
    failed = need & jnp.any(last[c] < 1)
    missing = jnp.where(need & ~failed, 5 - n_points[c], 0)

    def point(cursor, k):
      take = k < missing
      x, after_x = _randbelow(words, cursor, jnp.maximum(last[c, 0], 1))
      y, after_y = _randbelow(words, after_x, jnp.maximum(last[c, 1], 1))
      return jnp.where(take, after_y, cursor), jnp.stack([x, y])

    cursor, points = jax.lax.scan(point, cursor, jnp.arange(4))
    return cursor, (points, missing, failed)

  _, (points, missing, failed) = jax.lax.scan(concept, jnp.int32(0), order)
  inverse = jnp.argsort(order)
  return points[inverse], missing[inverse], failed[inverse]


# ------------------------------------------------------------------------------------------
# Rasterisation (cv2.ellipse with a RotatedRect, LINE_8)
# ------------------------------------------------------------------------------------------


def _round_even(x):
  """cvRound: to nearest, ties to even."""
  return jnp.round(x).astype(jnp.int64)


def _cv_round(x):
  """cvRound of a float32 to OpenCV's int, as int64: to nearest, ties to even; a value outside
  int's range or not a number gives INT_MIN (x86's conversion), which draws nothing."""
  x = x.astype(jnp.float64)
  inside = (x >= -2147483648.5) & (x < 2147483647.5)
  return jnp.where(inside, jnp.round(jnp.where(inside, x, 0.0)).astype(jnp.int64), -(2**31))


def _ellipse_polygon(center, size, angle):
  """The fixed-point polygon cv2.ellipse draws: int64 [MAX_VERTICES, 2] vertices (x, y) in
  1/65536 pixels (the last vertex repeated past the polygon's end) and the fixed-point centre
  int64 [2]. Traced with 64-bit types on."""
  center = jnp.asarray(center, jnp.float32)
  size = jnp.asarray(size, jnp.float32)
  angle = jnp.asarray(angle, jnp.float32)
  # Whole pixels, then the fraction in float32 arithmetic, as OpenCV's float RotatedRect.
  whole = _cv_round(center)
  fixed_center = whole * XY_ONE + _cv_round((center - whole.astype(jnp.float32)) * XY_ONE)
  whole_axes = _cv_round(size)
  axes = jnp.abs(
    whole_axes * (XY_ONE >> 1)
    + _cv_round((size - whole_axes.astype(jnp.float32)) * np.float32(XY_ONE >> 1))
  )
  degrees = _cv_round(angle)
  degrees = jnp.where(degrees < 0, jnp.mod(degrees, 360), degrees)
  degrees = jnp.where(degrees > 360, jnp.mod(degrees - 1, 360) + 1, degrees)
  radius = (jnp.max(axes) + (XY_ONE >> 1)) >> XY_SHIFT
  delta = jnp.where(radius < 3, 90, jnp.where(radius < 10, 30, jnp.where(radius < 15, 18, 5)))
  table = jnp.asarray(SIN_TABLE)
  cos_a = table[450 - degrees].astype(jnp.float64)
  sin_a = table[degrees].astype(jnp.float64)
  step = jnp.minimum(jnp.arange(MAX_VERTICES) * delta, 360)
  x = axes[0].astype(jnp.float64) * table[450 - step].astype(jnp.float64)
  y = axes[1].astype(jnp.float64) * table[step].astype(jnp.float64)
  cx, cy = fixed_center.astype(jnp.float64)
  px = cx + x * cos_a - y * sin_a
  py = cy + x * sin_a + y * cos_a
  return jnp.stack([_round_even(px), _round_even(py)], axis=-1), fixed_center


def _clip_line(p1, p2, width: int, height: int):
  """OpenCV's clipLine on fixed-point segments (int64 [..., 2] each) against
  [0, width * 65536) x [0, height * 65536). Returns (p1, p2, inside)."""
  right = (width << XY_SHIFT) - 1
  bottom = (height << XY_SHIFT) - 1
  x1, y1 = p1[..., 0], p1[..., 1]
  x2, y2 = p2[..., 0], p2[..., 1]

  def code(x, y):
    return (x < 0) * 1 + (x > right) * 2 + (y < 0) * 4 + (y > bottom) * 8

  def shift(d, along, across):
    # (int64)((double)d * along / across), as clipLine computes it (in double: the product can
    # pass 2^63 for the polygon of an ellipse millions of pixels long); across == 0 only on
    # unused paths.
    wide = d.astype(jnp.float64) * along.astype(jnp.float64)
    return (wide / jnp.where(across == 0, 1, across).astype(jnp.float64)).astype(jnp.int64)

  c1, c2 = code(x1, y1), code(x2, y2)
  clip = ((c1 & c2) == 0) & ((c1 | c2) != 0)
  # Rows first: move each end outside in y onto the top or bottom edge.
  move = clip & ((c1 & 12) != 0)
  a = jnp.where(c1 < 8, 0, bottom)
  x1n = x1 + shift(a - y1, x2 - x1, y2 - y1)
  x1, y1 = jnp.where(move, x1n, x1), jnp.where(move, a, y1)
  c1 = jnp.where(move, (x1 < 0) * 1 + (x1 > right) * 2, c1)
  move = clip & ((c2 & 12) != 0)
  a = jnp.where(c2 < 8, 0, bottom)
  x2n = x2 + shift(a - y2, x2 - x1, y2 - y1)
  x2, y2 = jnp.where(move, x2n, x2), jnp.where(move, a, y2)
  c2 = jnp.where(move, (x2 < 0) * 1 + (x2 > right) * 2, c2)
  # Then columns.
  clip = clip & ((c1 & c2) == 0) & ((c1 | c2) != 0)
  move = clip & (c1 != 0)
  a = jnp.where(c1 == 1, 0, right)
  y1n = y1 + shift(a - x1, y2 - y1, x2 - x1)
  y1, x1 = jnp.where(move, y1n, y1), jnp.where(move, a, x1)
  c1 = jnp.where(move, 0, c1)
  move = clip & (c2 != 0)
  a = jnp.where(c2 == 1, 0, right)
  y2n = y2 + shift(a - x2, y2 - y1, x2 - x1)
  y2, x2 = jnp.where(move, y2n, y2), jnp.where(move, a, x2)
  c2 = jnp.where(move, 0, c2)
  return jnp.stack([x1, y1], -1), jnp.stack([x2, y2], -1), (c1 | c2) == 0


def _line_pixels(p1, p2, width: int, height: int):
  """Pixels of OpenCV's fixed-point 8-connected line (Line2) for segments int64 [N, 2] each:
  (x int32 [N, K], y int32 [N, K], drawn bool [N, K]) with K = max(height, width) + 1."""
  p1, p2, inside = _clip_line(p1, p2, width, height)
  d = p2 - p1
  ax, ay = jnp.abs(d[:, 0]), jnp.abs(d[:, 1])
  xmajor = ax > ay
  swap = jnp.where(xmajor, d[:, 0] < 0, d[:, 1] < 0)
  p1, p2 = jnp.where(swap[:, None], p2, p1), jnp.where(swap[:, None], p1, p2)
  d = p2 - p1
  y_step = jnp.where(xmajor, jax.lax.div(d[:, 1] * XY_ONE, ax | 1), XY_ONE)
  x_step = jnp.where(xmajor, XY_ONE, jax.lax.div(d[:, 0] * XY_ONE, ay | 1))
  count = jnp.where(xmajor, d[:, 0], d[:, 1]) >> XY_SHIFT
  half = XY_ONE >> 1
  x0, y0 = p1[:, 0] + half, p1[:, 1] + half
  k = jnp.arange(max(height, width), dtype=jnp.int64)[None, :]
  xs = jnp.where(
    xmajor[:, None], (x0 >> XY_SHIFT)[:, None] + k, (x0[:, None] + k * x_step[:, None]) >> XY_SHIFT
  )
  ys = jnp.where(
    xmajor[:, None], (y0[:, None] + k * y_step[:, None]) >> XY_SHIFT, (y0 >> XY_SHIFT)[:, None] + k
  )
  drawn = inside[:, None] & (k <= count[:, None])
  # The end point is put first, then the run from the start.
  xs = jnp.concatenate([((p2[:, 0] + half) >> XY_SHIFT)[:, None], xs], axis=1)
  ys = jnp.concatenate([((p2[:, 1] + half) >> XY_SHIFT)[:, None], ys], axis=1)
  drawn = jnp.concatenate([inside[:, None], drawn], axis=1)
  drawn &= (xs >= 0) & (xs < width) & (ys >= 0) & (ys < height)
  return xs.astype(jnp.int32), ys.astype(jnp.int32), drawn


def _paint(xs, ys, drawn, width: int, height: int) -> jax.Array:
  flat = jnp.where(drawn, ys * width + xs, height * width).reshape(-1)
  canvas = jnp.zeros(height * width + 1, bool).at[flat].set(True)
  return canvas[:-1].reshape(height, width)


def _convex_fill_rows(vertices, count, width: int, height: int):
  """Row spans of OpenCV's FillConvexPoly (LINE_8, 16-bit shift) for fixed-point vertices int64
  [V, 2] of which the first `count` are the polygon. Returns bool [H, W] (spans only; the
  filler also draws the edges, which are the stroke's pixels here)."""
  n_max = vertices.shape[0]
  half = XY_ONE >> 1
  index = jnp.arange(n_max)
  real = index < count
  vx, vy = vertices[:, 0], vertices[:, 1]
  big = jnp.iinfo(jnp.int64).max
  imin = jnp.argmin(jnp.where(real, vy, big)).astype(jnp.int64)
  rows = (vy + half) >> XY_SHIFT
  ymin = (jnp.min(jnp.where(real, vy, big)) + half) >> XY_SHIFT
  ymax = (jnp.max(jnp.where(real, vy, -big)) + half) >> XY_SHIFT
  xmin = (jnp.min(jnp.where(real, vx, big)) + half) >> XY_SHIFT
  xmax = (jnp.max(jnp.where(real, vx, -big)) + half) >> XY_SHIFT
  fills = (count >= 3) & (xmax >= 0) & (ymax >= 0) & (xmin < width) & (ymin < height)

  y = jnp.arange(height, dtype=jnp.int64)[:, None]
  k = jnp.arange(1, n_max)[None, :]
  usable = k < count

  def edge_x(direction):
    # Walking from the top vertex, the active edge on row y ends at the first vertex whose row
    # is below y; it was picked up on its start vertex's row with x at that vertex.
    chain = jnp.mod(imin + direction * jnp.arange(n_max), jnp.maximum(count, 1))
    below = usable & (rows[chain][None, 1:] > y)
    pos = 1 + jnp.argmax(below, axis=1)
    end, start = chain[pos], chain[pos - 1]
    dy = rows[end] - rows[start]
    dx = jax.lax.div((vx[end] - vx[start]) * 2 + dy, jnp.maximum(2 * dy, 1))
    return vx[start] + (y[:, 0] - rows[start]) * dx

  left, right = edge_x(1), edge_x(-1)
  x1 = (jnp.minimum(left, right) + half) >> XY_SHIFT
  x2 = (jnp.maximum(left, right) + half) >> XY_SHIFT
  # The filler stops on the bottom vertex's row (no vertex left below it).
  drawn = fills & (y[:, 0] >= ymin) & (y[:, 0] < ymax) & (x2 >= 0) & (x1 < width)
  x1 = jnp.maximum(x1, 0)
  x2 = jnp.minimum(x2, width - 1)
  cols = jnp.arange(width)[None, :]
  return drawn[:, None] & (cols >= x1[:, None]) & (cols <= x2[:, None])


def _ellipse_masks(center, size, angle, height: int, width: int):
  """The pixels cv2.ellipse(img, (center, size, angle), color, thickness) sets, with LINE_8:
  (stroke bool [H, W] for thickness 1, filled bool [H, W] for thickness -1); traced with
  64-bit types on.

  center: float32 [2] (x, y); size: float32 [2] full axes (width, height); angle: float32
  degrees (cv2.fitEllipse's output convention).
  """
  vertices, fixed_center = _ellipse_polygon(center, size, angle)
  stroke = _paint(*_line_pixels(vertices[:-1], vertices[1:], width, height), width, height)
  # FillConvexPoly gets the polygon without consecutive repeats (two centres if one point).
  keep = jnp.concatenate([jnp.ones(1, bool), jnp.any(vertices[1:] != vertices[:-1], axis=-1)])
  count = jnp.sum(keep)
  slot = jnp.where(keep, jnp.cumsum(keep) - 1, MAX_VERTICES)
  compact = jnp.zeros((MAX_VERTICES + 1, 2), jnp.int64).at[slot].set(vertices)[:-1]
  single = count <= 1
  compact = jnp.where(single, fixed_center[None, :], compact)
  count = jnp.where(single, 2, count)
  spans = _convex_fill_rows(compact, count, width, height)
  return stroke, stroke | spans


# ------------------------------------------------------------------------------------------
# Pixels
# ------------------------------------------------------------------------------------------


def gray_u8(image: jax.Array) -> jax.Array:
  """cv2.cvtColor(image, RGB2GRAY) of uint8 [..., 3] -> uint8 [...]."""
  rgb = image.astype(jnp.int32)
  r, g, b = GRAY_WEIGHTS
  return ((rgb[..., 0] * r + rgb[..., 1] * g + rgb[..., 2] * b + (1 << 14)) >> 15).astype(jnp.uint8)


def blur_taps(size: int = 11) -> np.ndarray:
  """OpenCV's 8-bit Gaussian taps for `size` with sigma 0: int [size] summing to 256 (the
  float kernel with sigma 0.15 size + 0.35, rounded to 8 fractional bits with error diffusion;
  sizes up to 9 use OpenCV's fixed binomial tables)."""
  if size < 1 or size % 2 == 0:
    raise ValueError(f"The blur kernel size must be odd and positive, got {size}.")
  fixed = {
    1: [256],
    3: [64, 128, 64],
    5: [16, 64, 96, 64, 16],
    7: [8, 28, 56, 72, 56, 28, 8],
    9: [4, 13, 30, 51, 60, 51, 30, 13, 4],
  }
  if size in fixed:
    return np.asarray(fixed[size], np.int64)
  sigma = 0.15 * size + 0.35
  half = size // 2
  values = [math.exp((x * x) * (-0.125 / (sigma * sigma))) for x in range(1 - size, 0, 2)]
  total = 2 * sum(values) + 1
  taps, carry = [], 0.0
  for value in values:
    scaled = value / total * 256 + carry
    tap = int(np.rint(scaled))
    carry = scaled - tap
    taps.append(tap)
  center = 256 - 2 * sum(taps)
  assert len(taps) == half
  return np.asarray(taps + [center] + taps[::-1], np.int64)


def gaussian_blur_u8(image: jax.Array, size: int = 11) -> jax.Array:
  """cv2.GaussianBlur(image, (size, size), 0) of uint8 [H, W, C] -> uint8 [H, W, C]: the exact
  fixed-point result (taps with 8 fractional bits, mirrored borders, rounded once)."""
  taps = blur_taps(size)
  half = size // 2
  height, width = image.shape[:2]
  padded = jnp.pad(image.astype(jnp.int32), ((half, half), (half, half), (0, 0)), mode="reflect")
  rows = sum(int(taps[i]) * padded[:, i : i + width] for i in range(size))
  total = sum(int(taps[i]) * rows[i : i + height] for i in range(size))
  return ((total + (1 << 15)) >> 16).astype(jnp.uint8)


def reference_uint8_table(mean, std) -> np.ndarray:
  """uint8 [3, 256]: what each 8-bit value of each channel becomes in the reference's round
  trip: ToTensor and Normalize in float32 (CLIP's preprocessing), then show_image in float64
  (x * std + mean, clipped to [0, 1]) and (x * 255).astype(uint8), which truncates."""
  mean64 = np.asarray(mean, np.float64)
  std64 = np.asarray(std, np.float64)
  values = np.arange(256, dtype=np.float32)[:, None] / np.float32(255)
  normalised = (values - mean64.astype(np.float32)) / std64.astype(np.float32)
  back = np.clip(std64 * normalised.astype(np.float64) + mean64, 0, 1) * 255
  return back.astype(np.uint8).T.copy()


def reference_uint8(images: jax.Array, mean, std) -> jax.Array:
  """The reference's uint8 image from uint8 [..., 3] (see reference_uint8_table)."""
  table = jnp.asarray(reference_uint8_table(mean, std))
  return table[jnp.arange(3), images.astype(jnp.int32)]


# ------------------------------------------------------------------------------------------
# Prompts
# ------------------------------------------------------------------------------------------


@_with_x64
@jax.jit
def fit_ellipses(points: jax.Array, extra=None, n_extra=None):
  """cv2.fitEllipse's least squares of contours given as point multisets int32 [N, H, W]
  (largest_contours' `points`), with the reference's padding points extra int32 [N, 4, 2] and
  n_extra int32 [N] (reference_padding; None: none), and which fit each contour gets. Returns
  (center float32 [N, 2] as (x, y), size float32 [N, 2] as (width, height) full axes with
  width <= height, angle float32 [N] degrees, rule int32 [N]: FITTED, or DIRECT and DEGENERATE
  (fits that need the points in order: `ordered_fits`), or FEW_POINTS, ABSENT; see
  `_fit_ellipse`)."""
  if extra is None:
    total = points.shape[0]
    extra, n_extra = jnp.zeros((total, 4, 2), jnp.int32), jnp.zeros(total, jnp.int32)
  return _fit_chunks(jnp.asarray(points, jnp.int32), extra, n_extra)


def _fit_chunks(points, extra, n_extra):
  """fit_ellipses' body (traced with 64-bit types on), 16 contours at a time."""
  total, height, width = points.shape
  # Design matrices need a row per contour pixel only: a row budget of a twelfth of the
  # pixels serves concept regions; a chunk of 16 with a longer contour gets a row per pixel.
  rows = max(256, height * width // 12)
  chunk = 16
  chunks = -(-total // chunk)
  grow = chunks * chunk - total
  padded = jnp.pad(points, ((0, grow), (0, 0), (0, 0)))
  extra = jnp.pad(jnp.asarray(extra, jnp.int32), ((0, grow), (0, 0), (0, 0)))
  n_extra = jnp.pad(jnp.asarray(n_extra, jnp.int32), (0, grow))

  def one_chunk(group):
    fits = jnp.max(jnp.sum(group[0] > 0, axis=(1, 2))) <= rows
    fitted = lambda *g: jax.lax.cond(  # noqa: E731
      fits, jax.vmap(functools.partial(_fit_ellipse, rows=rows)), jax.vmap(_fit_ellipse), *g
    )

    def absent(*g):
      return (
        jnp.zeros((chunk, 2), jnp.float32),
        jnp.zeros((chunk, 2), jnp.float32),
        jnp.zeros(chunk, jnp.float32),
        jnp.full(chunk, ABSENT, jnp.int32),
      )

    # A chunk of empty masks (absent concepts, unused slots) has nothing to fit.
    return jax.lax.cond(jnp.any(group[0] > 0), fitted, absent, *group)

  out = jax.lax.map(
    one_chunk,
    (
      padded.reshape(chunks, chunk, height, width),
      extra.reshape(chunks, chunk, 4, 2),
      n_extra.reshape(chunks, chunk),
    ),
  )
  return tuple(v.reshape(chunks * chunk, *v.shape[2:])[:total] for v in out)


@_with_x64
@functools.partial(jax.jit, static_argnames=("height", "width"))
def ellipse_masks(center, size, angle, height: int, width: int):
  """The pixels cv2.ellipse(img, ((x, y), (width, height), angle), color, thickness, LINE_8) sets
  on an image [height, width], for N ellipses: center float32 [N, 2], size float32 [N, 2] (full
  axes), angle float32 [N] degrees. Returns (stroke bool [N, H, W] for thickness 1, filled bool
  [N, H, W] for thickness -1)."""
  return jax.vmap(lambda c, s, a: _ellipse_masks(c, s, a, height, width))(
    jnp.asarray(center, jnp.float32),
    jnp.asarray(size, jnp.float32),
    jnp.asarray(angle, jnp.float32),
  )


def listed_count(height: int, width: int) -> int:
  """Contour points listed in order per region: 2 max(H, W), the most a degenerate contour (a
  straight line of pixels, each inner one visited twice) has."""
  return 2 * max(height, width)


def rng_word_count(height: int, width: int, n_concepts: int = 1) -> int:
  """theRNG words the fits of n_concepts regions of an H x W image may read in all: per region
  at most 2 per listed point (a degenerate least-squares fit) or DIRECT_DRAWS (a 5-point fit)."""
  return n_concepts * (2 * listed_count(height, width) + DIRECT_DRAWS)


@jax.jit
def _ordered_needed(rule):
  """bool [N]: the fit needs the contour's points in order (5 points, or degenerate)."""
  return (rule == DIRECT) | (rule == DEGENERATE)


@_with_x64
@jax.jit
def _cursor_needed(rule, listed, n_points, extra, n_extra, words, zero):
  """bool [N]: the fit reads theRNG's words' values, not only their count (a 5-point fit whose
  first attempt is singular, or a degenerate least-squares fit)."""

  def one(r, points, n, e, ne):
    _, _, _, first, _, _, _, _ = _direct_attempts(
      _five_points(points, n, e, ne), jnp.int32(0), words, zero
    )
    return (r == DEGENERATE) | ((r == DIRECT) & ~first)

  return jax.vmap(one)(rule, listed, n_points, extra, n_extra)


@_with_x64
@functools.partial(jax.jit, static_argnames=("n_concepts",))
def _context_cursors(context, pairs, need, words, zero, n_concepts):
  """The theRNG cursor of each region of `pairs` (int32 [P]): the words its map's concepts read
  before it, visited in the reference's order from a freshly seeded theRNG (from _map_contours'
  `context`, traced for the regions that need it; zeros where none does)."""
  order = jnp.asarray(reference_order(n_concepts))
  regions = pairs.shape[0]

  def run(_):
    count, extra, n_extra = context["count"], context["extra"], context["n_extra"]
    rule = _fit_chunks(context["points"], extra.reshape(-1, 4, 2), n_extra.reshape(-1))[3]
    rule = rule.reshape(regions, n_concepts)
    five = jax.vmap(jax.vmap(_five_points))(context["listed"], count, extra, n_extra)
    draws = jax.vmap(_fit_draws, in_axes=(0, 0, 0, 0, None, None))

    def visit(cursor, c):
      return cursor + draws(rule[:, c], five[:, c], count[:, c], cursor, words, zero), cursor

    _, starts = jax.lax.scan(visit, jnp.zeros(regions, jnp.int32), order)  # [L, P]
    by_concept = jnp.zeros_like(starts).at[order].set(starts)
    return by_concept[pairs[:, 2], context["slot"]]

  return jax.lax.cond(jnp.any(need), run, lambda _: jnp.zeros(regions, jnp.int32), None)


def _opencv_ellipses(masks, contour, extra, n_extra, cursors, words, chunk):
  """The fits (fit_ellipses, then ordered_fits with theRNG's cursors from `cursors(rule,
  listed)`) and cv2.ellipse's pixels of the contours `contour` of bool masks [N, H, W]."""
  height, width = masks.shape[1:]
  zero = np.uint64(0)
  center, size, angle, rule = fit_ellipses(contour["points"], extra, n_extra)
  listed = largest_contours(
    masks, chunk=chunk, listed=listed_count(height, width), need=_ordered_needed(rule)
  )["listed"]
  cursor = cursors(rule, listed)
  center, size, angle, rule = ordered_fits(
    center, size, angle, rule, listed, contour["n_points"], extra, n_extra, cursor, words, zero
  )
  stroke, filled = ellipse_masks(center, size, angle, height, width)
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
  contour = largest_contours(masks, chunk=chunk)
  extra = jax.device_put(np.zeros((total, 4, 2), np.int32))
  n_extra = jax.device_put(np.zeros(total, np.int32))
  words = jax.device_put(opencv_rng_words(int(seed), rng_word_count(height, width)))
  cursor = jax.device_put(np.zeros(total, np.int32))
  return _opencv_ellipses(masks, contour, extra, n_extra, lambda rule, listed: cursor, words, chunk)


@functools.partial(jax.jit, static_argnames=("n_concepts", "chunk"))
def _map_contours(maps, pairs, wanted, words, n_concepts: int, chunk: int):
  """The contours of all n_concepts concepts of the maps of the regions `pairs` (int32 [P, 3]:
  map, image, concept of maps int32 [M, B, H, W]) where wanted (bool [P]): a region's padding
  and theRNG words depend on the concepts visited before it in its map. Each distinct map is
  traced once; the unused slots, and everything where no region is wanted, are skipped.

  Returns a dict: slot int32 [P] (each wanted region's map among the P slots), points int32
  [P * L, H, W] (contour multisets), count int32 [P, L], listed int32 [P, L, 5, 2] (each
  contour's first 5 points in order), and the reference's padding extra int32 [P, L, 4, 2],
  n_extra int32 [P, L] (Python's `random` from `words`, reseeded per map).
  """
  order = jnp.asarray(reference_order(n_concepts))
  regions = pairs.shape[0]
  images, height, width = maps.shape[1:]
  key = pairs[:, 0] * images + pairs[:, 1]
  unused = maps.shape[0] * images
  # Distinct maps first (sorted), unused slots after them.
  maps_in = jnp.unique(jnp.where(wanted, key, unused), size=regions, fill_value=unused)
  slot = jnp.searchsorted(maps_in, key).astype(jnp.int32)
  real = maps_in < unused
  taken = jnp.where(real, maps_in, 0)
  group = maps[taken // images, taken % images]  # [P, H, W]
  ids = jnp.arange(n_concepts, dtype=jnp.int32)
  masks = (group[:, None] == ids[None, :, None, None]) & real[:, None, None, None]
  traced = largest_contours(
    masks.reshape(-1, height, width), chunk=chunk, listed=5, need=jnp.repeat(real, n_concepts)
  )
  count = traced["n_points"].reshape(regions, n_concepts)
  last = traced["last"].reshape(regions, n_concepts, 2)
  extra, n_extra, _ = jax.vmap(lambda n, l: reference_padding(n, l, words, order))(count, last)
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
  """bool [P, H, W]: the pixels of region pairs[p] = (map, image, concept) of maps [M, B, H, W]."""
  return maps[pairs[:, 0], pairs[:, 1]] == pairs[:, 2, None, None]


def padded_ellipses(maps, pairs, n_concepts: int, seed: int = 0, chunk: int = 16):
  """concept_ellipses of the regions `pairs` (int32 [P, 3]: map, image, concept) of concept
  maps int32 [M, B, H, W] (-1 background) under the reference's protocol: before each map's
  (image's and method's) concepts, visited in the reference's colour order (reference_order),
  Python's `random` is seeded with `seed` (the padding of contours under 5 points) and so is
  cv::theRNG() (cv2.setRNGSeed(seed): the offsets of OpenCV's retried and degenerate fits).
  Returns concept_ellipses' dict over P."""
  maps = jnp.asarray(maps, jnp.int32)
  pairs = jnp.asarray(pairs, jnp.int32)
  height, width = maps.shape[2:]
  # device_put and one jitted gather: eagerly these compiled some 13 small programs.
  words = jax.device_put(python_random_words(int(seed)))
  rng_words = jax.device_put(opencv_rng_words(int(seed), rng_word_count(height, width, n_concepts)))
  masks = _region_masks(maps, pairs)
  contour = largest_contours(masks, chunk=chunk)
  short = _short_contours(contour["n_points"])
  extra, n_extra = _pairs_padding(
    _map_contours(maps, pairs, short, words, n_concepts, chunk), pairs, contour["n_points"]
  )
  zero = np.uint64(0)

  def cursors(rule, listed):
    need = _cursor_needed(rule, listed, contour["n_points"], extra, n_extra, rng_words, zero)
    context = _map_contours(maps, pairs, need, words, n_concepts, chunk)
    return _context_cursors(context, pairs, need, rng_words, zero, n_concepts)

  return _opencv_ellipses(masks, contour, extra, n_extra, cursors, rng_words, chunk)


@functools.partial(jax.jit, static_argnames=("blur_size",))
def compose_prompts(images, stroke, filled, valid, blur_size: int = 11):
  """The three prompted images from uint8 [B, H, W, 3] images and per-concept ellipse pixels
  (stroke, filled bool [B, L, H, W]; valid bool [B, L]): uint8 [B, L, 3, H, W, 3] in
  visual_prompts.VARIANTS order (red ellipse; grayscale outside; blur outside, each with the
  red stroke on top), the plain image where a concept is absent."""
  images = images.astype(jnp.uint8)
  gray = jnp.repeat(gray_u8(images)[..., None], 3, axis=-1)
  blurred = jax.vmap(lambda im: gaussian_blur_u8(im, blur_size))(images)
  red = jnp.asarray(RED, jnp.uint8)
  plain = images[:, None]
  stroke, filled = stroke[..., None], filled[..., None]
  variants = jnp.stack(
    [
      jnp.where(stroke, red, plain),
      jnp.where(stroke, red, jnp.where(filled, plain, gray[:, None])),
      jnp.where(stroke, red, jnp.where(filled, plain, blurred[:, None])),
    ],
    axis=2,
  )
  return jnp.where(valid[:, :, None, None, None, None], variants, plain[:, :, None])


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
  found = padded_ellipses(concept_maps[None], pairs, n_concepts, seed=seed, chunk=chunk)
  shape = (batch, n_concepts, height, width)
  valid = found["present"].reshape(batch, n_concepts)
  prompted = compose_prompts(
    jnp.asarray(images),
    found["stroke"].reshape(shape),
    found["filled"].reshape(shape),
    valid,
    blur_size,
  )
  return prompted, valid
