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
  of the pixel's multiplicity.
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

Deterministic rules where OpenCV is not (all give a zero-size ellipse at the centroid of the
contour's points, which OpenCV draws as the one pixel nearest to it, stroke and mask alike):
  * fewer than 5 contour points and no padding (concept_ellipses without `padding`), or padding
    the reference cannot draw (a last point with a 0 coordinate: randint(0, -1) raises);
  * 5 points whose direct fit OpenCV redoes at random: the reduced scatter matrix is singular
    for 5 points, and where its round-off determinant is at most 1e-10 OpenCV moves the points
    by cv::theRNG(), whose state depends on every earlier fit of the process;
  * degenerate point sets (the design matrix's smallest singular value below FLT_EPSILON
    times its largest: collinear points, or fewer than 6 distinct ones): OpenCV up to 4.11
    returns an ellipse of about 1e-3 pixels, 4.12 on perturbs the points with cv::theRNG().

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
# Rules behind an ellipse (fit_ellipses' `rule`): FITTED and DIRECT are OpenCV's own fits
# (fitEllipse's least squares; its direct fit on exactly 5 points, padded ones included); the
# others are this module's deterministic zero-size ellipse where OpenCV or the reference is random
# or fails (FEW_POINTS: under 5 points and no padding; DIRECT_FIT: a 5-point direct fit that
# OpenCV redoes with cv::theRNG(); DEGENERATE: a degenerate least-squares fit) or absent.
FITTED, FEW_POINTS, DIRECT_FIT, DEGENERATE, ABSENT, DIRECT = range(6)


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


def largest_contour(mask: jax.Array, capacity: int | None = None) -> dict[str, jax.Array]:
  """The outer contour cv2.findContours(RETR_EXTERNAL, CHAIN_APPROX_NONE) lists with the largest
  cv2.contourArea, for one bool mask [H, W] (jit- and vmap-able).

  capacity: boundary pixels traced (static); None traces up to every pixel. With fewer
    boundary pixels than that the result is exact; with more, some borders are cut
    (largest_contours checks and falls back to the full size).

  Returns a dict:
    points: int32 [H, W], how many times the contour visits each pixel (its point multiset);
    n_points: int32, the contour's length (sum of points);
    area: float32, its contourArea (shoelace area through pixel centres, holes ignored);
    start: int32 [2], its first point (x, y), the component's raster-first pixel;
    last: int32 [2], its last point (x, y) in OpenCV's order (the reference pads short
      contours with random points bounded by it);
    present: bool, the mask has a foreground pixel.
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
  chosen = jnp.where(present, chosen, wp + 1)
  return dict(
    points=points,
    n_points=jnp.sum(points),
    area=jnp.where(present, best, 0).astype(jnp.float32) / 2,
    start=jnp.stack([chosen % wp - 1, chosen // wp - 1]).astype(jnp.int32),
    last=jnp.stack([last % wp - 1, last // wp - 1]).astype(jnp.int32),
    present=present,
  )


@functools.partial(jax.jit, static_argnames=("chunk", "capacity"))
def largest_contours(masks: jax.Array, chunk: int = 16, capacity: int | None = None):
  """`largest_contour` of bool masks [N, H, W], `chunk` masks at a time.

  capacity: boundary pixels traced per mask; None: a twelfth of the pixels (concept regions at
  224 px have a few thousand at most). A chunk with a mask over it is traced at full size
  instead, so the result is always exact.

  Returns largest_contour's dict, each field stacked over N.
  """
  masks = masks.astype(bool)
  total, height, width = masks.shape
  full = (height + 2) * (width + 2)
  capacity = max(256, full // 12) if capacity is None else capacity
  chunks = -(-total // chunk)
  padded = jnp.pad(masks, ((0, chunks * chunk - total), (0, 0), (0, 0)))

  def one_chunk(group):
    fits = jnp.max(jax.vmap(boundary_count)(group)) <= capacity
    return jax.lax.cond(
      fits,
      jax.vmap(functools.partial(largest_contour, capacity=capacity)),
      jax.vmap(largest_contour),
      group,
    )

  out = jax.lax.map(one_chunk, padded.reshape(chunks, chunk, height, width))
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


def _fit_ellipse(points: jax.Array, extra=None, n_extra=None, rows: int | None = None):
  """cv2.fitEllipse of a contour given as its point multiset int32 [H, W] (largest_contour's
  `points`); traced with 64-bit types on. rows: the design matrices get a row for each of the
  first `rows` pixels on the contour (static; None: one per pixel), exact when the contour has
  no more distinct pixels. extra int32 [4, 2] and n_extra int32: points (x, y) the reference
  appends to a contour of under 5 points (reference_padding); a contour of 5 points with them
  gets OpenCV's direct fit.

  Returns (center float32 [2] as (x, y), size float32 [2] as (width, height) full axes with
  width <= height, angle float32 degrees, rule int32: FITTED, or the deterministic rule used
  (FEW_POINTS, DIRECT_FIT, DEGENERATE: a zero-size ellipse at the centroid), or ABSENT).
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
  theta = -0.5 * jnp.arctan2(g[2], g[1] - g[0])
  min_eps = 1e-8
  t = jnp.where(jnp.abs(g[2]) > min_eps, g[2] / jnp.sin(-2.0 * theta), g[1] - g[0])
  r2 = jnp.abs(g[0] + g[1] - t)
  r2 = jnp.where(r2 > min_eps, jnp.sqrt(2.0 / jnp.where(r2 > min_eps, r2, 1.0)), r2)
  r3 = jnp.abs(g[0] + g[1] + t)
  r3 = jnp.where(r3 > min_eps, jnp.sqrt(2.0 / jnp.where(r3 > min_eps, r3, 1.0)), r3)
  center = jnp.stack(
    [(r[0] / scale).astype(jnp.float32) + cx, (r[1] / scale).astype(jnp.float32) + cy]
  )
  w = (r2 * 2 / scale).astype(jnp.float32)
  h = (r3 * 2 / scale).astype(jnp.float32)
  swap = w > h
  angle = jnp.where(swap, (90 + theta * 180 / math.pi).astype(jnp.float32), jnp.float32(0))
  size = jnp.where(swap, jnp.stack([h, w]), jnp.stack([w, h]))
  angle = jnp.where(angle < -180, angle + 360, angle)
  angle = jnp.where(angle > 360, angle - 360, angle)
  # Five points (the contour's, repeats included, then the padding): OpenCV's direct fit.
  if extra is None:
    extra, n_extra = jnp.zeros((4, 2), jnp.int32), jnp.int32(0)
  n_extra = jnp.where((n > 0) & (n < 5), n_extra, 0)
  total = n + n_extra
  own = jnp.nonzero(points.reshape(-1) > 0, size=5, fill_value=0)[0]
  reps = jnp.where(jnp.arange(5) < jnp.sum(points > 0), points.reshape(-1)[own], 0)
  slot = jnp.minimum(jnp.searchsorted(jnp.cumsum(reps), jnp.arange(5), side="right"), 4)
  listed = jnp.stack([own[slot] % width, own[slot] // width], axis=1)
  five = jnp.concatenate([listed, extra.astype(jnp.int32)]).astype(f64)
  used = jnp.concatenate([jnp.arange(5) < jnp.minimum(n, 5), jnp.arange(4) < n_extra])
  d_center, d_size, d_angle, d_ok = _fit_ellipse_direct(five, used)
  rule = jnp.where(
    n == 0,
    ABSENT,
    jnp.where(
      total < 5,
      FEW_POINTS,
      jnp.where(
        total == 5,
        jnp.where(d_ok, DIRECT, DIRECT_FIT),
        jnp.where(degenerate, DEGENERATE, FITTED),
      ),
    ),
  ).astype(jnp.int32)
  fitted = rule == FITTED
  direct = rule == DIRECT
  centroid = jnp.stack([cx, cy])
  return (
    jnp.where(fitted, center, jnp.where(direct, d_center, centroid)),
    jnp.where(fitted, size, jnp.where(direct, d_size, 0.0)).astype(jnp.float32),
    jnp.where(fitted, angle, jnp.where(direct, d_angle, 0.0)).astype(jnp.float32),
    rule,
  )


def _fit_ellipse_direct(xy, rows_used):
  """cv2.fitEllipseDirect's first attempt (OpenCV 4.x, the fit cv2.fitEllipse uses on exactly 5
  points) on float64 [5, 2] points; traced with 64-bit types on. rows_used: bool [5], the rows
  that are points (the rest are ignored).

  With 5 points the reduced scatter matrix M is singular in exact arithmetic, so |det M| is
  round-off: where it is at most 1e-10 (or not finite), OpenCV retries with points moved by
  cv::theRNG(), a generator whose state depends on every earlier fit of the process, and its
  result cannot be reproduced. Returns (center float32 [2], size float32 [2], angle float32,
  ok bool: OpenCV's first attempt stands and gives a finite ellipse).
  """
  f64 = jnp.float64
  w = rows_used.astype(f64)
  n = jnp.maximum(jnp.sum(w), 1.0)
  # OpenCV converts the int points to float32, sums them in double.
  c = jnp.sum(xy * w[:, None], axis=0) / n
  s = jnp.sum(w * (jnp.abs(xy[:, 0] - c[0]) + jnp.abs(xy[:, 1] - c[1])))
  scale = 100.0 / jnp.where(s > FLT_EPSILON, s, FLT_EPSILON)
  px = (xy[:, 0] - c[0]) * scale
  py = (xy[:, 1] - c[1]) * scale
  a = jnp.stack([px * px, px * py, py * py, px, py, jnp.ones_like(px)], axis=1) * w[:, None]
  dm = a.T @ a / n
  s1, s2, s3 = dm[:3, :3], dm[:3, 3:], dm[3:, 3:]
  # TM = -adj(S3) S2^T and Ts = det(S3): S3^-1 without a division, as OpenCV writes it.
  adj = jnp.stack(
    [
      jnp.stack(
        [
          s3[1, 1] * s3[2, 2] - s3[1, 2] * s3[2, 1],
          s3[0, 2] * s3[2, 1] - s3[0, 1] * s3[2, 2],
          s3[0, 1] * s3[1, 2] - s3[0, 2] * s3[1, 1],
        ]
      ),
      jnp.stack(
        [
          s3[1, 2] * s3[2, 0] - s3[1, 0] * s3[2, 2],
          s3[0, 0] * s3[2, 2] - s3[0, 2] * s3[2, 0],
          s3[0, 2] * s3[1, 0] - s3[0, 0] * s3[1, 2],
        ]
      ),
      jnp.stack(
        [
          s3[1, 0] * s3[2, 1] - s3[1, 1] * s3[2, 0],
          s3[0, 1] * s3[2, 0] - s3[0, 0] * s3[2, 1],
          s3[0, 0] * s3[1, 1] - s3[0, 1] * s3[1, 0],
        ]
      ),
    ]
  )
  ts = s3[0, 0] * adj[0, 0] + s3[0, 1] * adj[1, 0] + s3[0, 2] * adj[2, 0]
  tm = -adj @ s2.T
  reduced = s1 + s2 @ tm / ts
  m = jnp.stack([reduced[2] / 2, -reduced[1], reduced[0] / 2])
  det = jnp.linalg.det(m)
  # Eigenvalues of the 3 x 3 M from its characteristic cubic (complex roots: OpenCV's
  # eigenNonSymmetric takes real eigenvalues only), eigenvectors as the longest cross product
  # of two rows of M - lambda I, unit length.
  tr = jnp.trace(m)
  c2 = (
    m[0, 0] * m[1, 1]
    - m[0, 1] * m[1, 0]
    + m[0, 0] * m[2, 2]
    - m[0, 2] * m[2, 0]
    + m[1, 1] * m[2, 2]
    - m[1, 2] * m[2, 1]
  )
  shift = tr / 3
  p = c2 - tr * tr / 3
  q = -(2 * tr**3 / 27 - tr * c2 / 3 + det)  # lambda = t + shift solves t^3 + p t + q = 0
  real_roots = p < 0
  radius = 2 * jnp.sqrt(jnp.where(real_roots, -p / 3, 1.0))
  cosine = jnp.clip(3 * q / (p * radius) * jnp.where(real_roots, 1.0, 0.0), -1.0, 1.0)
  phi = jnp.arccos(cosine) / 3
  lambdas = shift + radius * jnp.cos(phi - 2 * math.pi * jnp.arange(3) / 3)
  real_roots &= 4 * p**3 + 27 * q**2 <= 0

  def vector(lam):
    r = m - lam * jnp.eye(3, dtype=f64)
    crosses = jnp.stack([jnp.cross(r[0], r[1]), jnp.cross(r[0], r[2]), jnp.cross(r[1], r[2])])
    best = crosses[jnp.argmax(jnp.sum(crosses * crosses, axis=1))]
    return best / jnp.linalg.norm(best)

  vectors = jax.vmap(vector)(lambdas)
  cond = 4 * vectors[:, 0] * vectors[:, 2] - vectors[:, 1] ** 2
  i = jnp.where(
    cond[0] < cond[1], jnp.where(cond[1] < cond[2], 2, 1), jnp.where(cond[0] < cond[2], 2, 0)
  )
  v = vectors[i]
  norm = jnp.linalg.norm(v)
  norm = jnp.where(jnp.prod(jnp.where(v < 0, -1.0, 1.0)) <= 0, -norm, norm)
  pv = v / norm
  qv = tm @ pv / ts
  u1 = pv[2] * qv[0] ** 2 - pv[1] * qv[0] * qv[1] + pv[0] * qv[1] ** 2 + pv[1] ** 2 * qv[2]
  u2 = pv[0] * pv[2] * qv[2]
  l1 = jnp.sqrt(pv[1] ** 2 + (pv[0] - pv[2]) ** 2)
  l2 = pv[0] + pv[2]
  l3 = pv[1] ** 2 - 4 * pv[0] * pv[2]
  p1 = 2 * pv[2] * qv[0] - pv[1] * qv[1]
  p2 = 2 * pv[0] * qv[1] - pv[1] * qv[0]
  x0 = p1 / l3 / scale + c[0]
  y0 = p2 / l3 / scale + c[1]
  semi_a = math.sqrt(2.0) * jnp.sqrt((u1 - 4 * u2) / ((l1 - l2) * l3)) / scale
  semi_b = math.sqrt(2.0) * jnp.sqrt(-1.0 * ((u1 - 4 * u2) / ((l1 + l2) * l3))) / scale
  theta = jnp.where(
    pv[1] == 0,
    jnp.where(pv[0] < pv[2], 0.0, math.pi / 2),
    math.pi / 2 + 0.5 * jnp.arctan2(pv[1], pv[0] - pv[2]),
  )
  width = (2 * semi_a).astype(jnp.float32)
  height = (2 * semi_b).astype(jnp.float32)
  swap = width > height
  angle = jnp.where(
    swap, jnp.fmod(90 + theta * 180 / math.pi, 180.0), jnp.fmod(theta * 180 / math.pi, 180.0)
  )
  center = jnp.stack([x0, y0]).astype(jnp.float32)
  size = jnp.where(swap, jnp.stack([height, width]), jnp.stack([width, height]))
  ok = (
    jnp.all(jnp.isfinite(m))
    & (jnp.abs(det) > 1e-10)
    & real_roots
    & jnp.all(jnp.isfinite(center))
    & jnp.all(jnp.isfinite(size))
  )
  return center, size, angle.astype(jnp.float32), ok


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


def _ellipse_polygon(center, size, angle):
  """The fixed-point polygon cv2.ellipse draws: int64 [MAX_VERTICES, 2] vertices (x, y) in
  1/65536 pixels (the last vertex repeated past the polygon's end) and the fixed-point centre
  int64 [2]. Traced with 64-bit types on."""
  center = jnp.asarray(center, jnp.float32)
  size = jnp.asarray(size, jnp.float32)
  angle = jnp.asarray(angle, jnp.float32)
  whole = jnp.round(center)  # float32 arithmetic, as OpenCV's float RotatedRect
  fixed_center = whole.astype(jnp.int64) * XY_ONE + _round_even(
    (center - whole) * np.float32(XY_ONE)
  )
  whole_axes = jnp.round(size)
  axes = whole_axes.astype(jnp.int64) * (XY_ONE >> 1) + _round_even(
    (size - whole_axes) * np.float32(XY_ONE >> 1)
  )
  degrees = _round_even(angle)
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

  def div(a, b):
    return jax.lax.div(a, jnp.where(b == 0, 1, b))  # C division; b == 0 only on unused paths

  c1, c2 = code(x1, y1), code(x2, y2)
  clip = ((c1 & c2) == 0) & ((c1 | c2) != 0)
  # Rows first: move each end outside in y onto the top or bottom edge.
  move = clip & ((c1 & 12) != 0)
  a = jnp.where(c1 < 8, 0, bottom)
  x1n = x1 + div((a - y1) * (x2 - x1), y2 - y1)
  x1, y1 = jnp.where(move, x1n, x1), jnp.where(move, a, y1)
  c1 = jnp.where(move, (x1 < 0) * 1 + (x1 > right) * 2, c1)
  move = clip & ((c2 & 12) != 0)
  a = jnp.where(c2 < 8, 0, bottom)
  x2n = x2 + div((a - y2) * (x2 - x1), y2 - y1)
  x2, y2 = jnp.where(move, x2n, x2), jnp.where(move, a, y2)
  c2 = jnp.where(move, (x2 < 0) * 1 + (x2 > right) * 2, c2)
  # Then columns.
  clip = clip & ((c1 & c2) == 0) & ((c1 | c2) != 0)
  move = clip & (c1 != 0)
  a = jnp.where(c1 == 1, 0, right)
  y1n = y1 + div((a - x1) * (y2 - y1), x2 - x1)
  y1, x1 = jnp.where(move, y1n, y1), jnp.where(move, a, x1)
  c1 = jnp.where(move, 0, c1)
  move = clip & (c2 != 0)
  a = jnp.where(c2 == 1, 0, right)
  y2n = y2 + div((a - x2) * (y2 - y1), x2 - x1)
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


def _with_x64(jitted):
  """Call `jitted` with 64-bit types on, so it is traced and compiled with them."""

  @functools.wraps(jitted)
  def call(*args, **kwargs):
    with jax.enable_x64(True):
      return jitted(*args, **kwargs)

  return call


@_with_x64
@jax.jit
def fit_ellipses(points: jax.Array, extra=None, n_extra=None):
  """cv2.fitEllipse of contours given as point multisets int32 [N, H, W] (largest_contours'
  `points`), with the reference's padding points extra int32 [N, 4, 2] and n_extra int32 [N]
  (reference_padding; None: none). Returns (center float32 [N, 2] as (x, y), size float32 [N, 2]
  as (width, height) full axes with width <= height, angle float32 [N] degrees, rule int32 [N]:
  FITTED or DIRECT (OpenCV's fits), or the deterministic rule used (FEW_POINTS, DIRECT_FIT,
  DEGENERATE: a zero-size ellipse at the centroid), or ABSENT)."""
  points = jnp.asarray(points, jnp.int32)
  total, height, width = points.shape
  # Design matrices need a row per contour pixel only: a row budget of a twelfth of the
  # pixels serves concept regions; a chunk of 16 with a longer contour gets a row per pixel.
  rows = max(256, height * width // 12)
  chunk = 16
  chunks = -(-total // chunk)
  if extra is None:
    extra, n_extra = jnp.zeros((total, 4, 2), jnp.int32), jnp.zeros(total, jnp.int32)
  grow = chunks * chunk - total
  padded = jnp.pad(points, ((0, grow), (0, 0), (0, 0)))
  extra = jnp.pad(jnp.asarray(extra, jnp.int32), ((0, grow), (0, 0), (0, 0)))
  n_extra = jnp.pad(jnp.asarray(n_extra, jnp.int32), (0, grow))

  def one_chunk(group):
    fits = jnp.max(jnp.sum(group[0] > 0, axis=(1, 2))) <= rows
    return jax.lax.cond(
      fits,
      jax.vmap(functools.partial(_fit_ellipse, rows=rows)),
      jax.vmap(_fit_ellipse),
      *group,
    )

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


def concept_ellipses(masks: jax.Array, chunk: int = 16, padding=None) -> dict[str, jax.Array]:
  """Contour, fitEllipse and rasterised ellipse of bool masks [N, H, W]; padding: None, or a
  function of largest_contours' dict returning (extra int32 [N, 4, 2], n_extra int32 [N]), the
  reference's points added to contours of under 5 points (see padded_ellipses).

  Returns a dict with largest_contour's fields (stacked), center float32 [N, 2], size float32
  [N, 2], angle float32 [N], rule int32 [N], stroke bool [N, H, W], filled bool [N, H, W].
  """
  height, width = masks.shape[1:]
  contour = largest_contours(masks, chunk=chunk)
  extra = n_extra = None
  if padding is not None:
    extra, n_extra = padding(contour)
  center, size, angle, rule = fit_ellipses(contour["points"], extra, n_extra)
  stroke, filled = ellipse_masks(center, size, angle, height, width)
  return dict(
    contour, center=center, size=size, angle=angle, rule=rule, stroke=stroke, filled=filled
  )


@functools.partial(jax.jit, static_argnames=("n_concepts", "chunk"))
def _pairs_padding(maps, pairs, n_points, words, n_concepts: int, chunk: int):
  """reference_padding for the regions `pairs` (int32 [P, 3]: map, image, concept of maps int32
  [M, B, H, W]) whose own contours have n_points int32 [P]. A region's draws depend on the
  concepts visited before it in its map, so only when some region has 1 to 4 points are the
  contours of all n_concepts concepts of its map traced (a branch, taken on few chunks)."""
  order = jnp.asarray(reference_order(n_concepts))
  short = jnp.any((n_points > 0) & (n_points < 5))

  def pad(_):
    group = maps[pairs[:, 0], pairs[:, 1]]  # [P, H, W]
    ids = jnp.arange(n_concepts, dtype=jnp.int32)
    masks = (group[:, None] == ids[None, :, None, None]).reshape(-1, *group.shape[1:])
    traced = largest_contours(masks, chunk=chunk)
    count = traced["n_points"].reshape(-1, n_concepts)
    last = traced["last"].reshape(-1, n_concepts, 2)
    extra, n_extra, _ = jax.vmap(lambda n, l: reference_padding(n, l, words, order))(count, last)
    rows = jnp.arange(pairs.shape[0])
    return extra[rows, pairs[:, 2]], n_extra[rows, pairs[:, 2]]

  def none(_):
    return jnp.zeros((pairs.shape[0], 4, 2), jnp.int32), jnp.zeros(pairs.shape[0], jnp.int32)

  return jax.lax.cond(short, pad, none, None)


def padded_ellipses(maps, pairs, n_concepts: int, seed: int = 0, chunk: int = 16):
  """concept_ellipses of the regions `pairs` (int32 [P, 3]: map, image, concept) of concept
  maps int32 [M, B, H, W] (-1 background), with the reference's padding of contours under 5
  points: Python's `random` seeded with `seed` anew before each map's (image's and method's)
  concepts, visited in the reference's colour order (reference_order). Returns
  concept_ellipses' dict over P."""
  maps = jnp.asarray(maps, jnp.int32)
  pairs = jnp.asarray(pairs, jnp.int32)
  words = jnp.asarray(python_random_words(int(seed)))
  masks = maps[pairs[:, 0], pairs[:, 1]] == pairs[:, 2, None, None]

  def padding(contour):
    return _pairs_padding(maps, pairs, contour["n_points"], words, n_concepts, chunk)

  return concept_ellipses(masks, chunk=chunk, padding=padding)


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


def reference_prompts(images, concept_maps, n_concepts: int, blur_size: int = 11, chunk: int = 16):
  """The reference's three prompted images per concept, in uint8.

  Args:
    images: uint8 [B, H, W, 3] RGB (already the reference's uint8 image, see reference_uint8).
    concept_maps: int [B, H, W] concept ids (-1 or any id outside 0..L-1 is background).
    n_concepts: L.
    blur_size: GaussianBlur kernel side.
    chunk: masks traced at once (memory: 8 int32 border states per pixel and mask).

  Returns:
    (uint8 [B, L, 3, H, W, 3] in visual_prompts.VARIANTS order: red ellipse, grayscale
     outside, blur outside; the plain image where a concept is absent; valid bool [B, L].)
  """
  concept_maps = jnp.asarray(concept_maps, jnp.int32)
  batch, height, width = concept_maps.shape
  masks = concept_maps[:, None] == jnp.arange(n_concepts, dtype=jnp.int32)[None, :, None, None]
  found = concept_ellipses(masks.reshape(-1, height, width), chunk=chunk)
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
