"""cv2.fitEllipse's default fit (fitEllipseNoDirect), in float64.

A linear least-squares fit of -a x^2 - b y^2 - c xy + d x + e y = 10000 to the centred, scaled
points, the centre where that conic's gradient vanishes, then a refit of the quadratic terms
about the centre; output (centre, (width, height) full axes with width <= height, angle in
degrees). Each least-squares problem is solved as OpenCV solves it, by SVD with its cut-off, in
float64, after a QR of the design matrix whose rows (one per pixel) are weighted by the square
root of the pixel's multiplicity (`fit_ellipses`, on a contour's point multiset). Fits that
need the points in OpenCV's order (exactly 5 points; a degenerate design, whose points OpenCV
moves by cv::theRNG()) are left to `direct_fit.ordered_fits`; `listed_least_squares` is this
fit on such listed points.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from mutual.ellipse import floats, random_replay
from mutual.ellipse.floats import DBL_EPSILON, FLT_EPSILON
from mutual.ellipse.rules import ABSENT, DEGENERATE, DIRECT, FEW_POINTS, FITTED


def svd_solve(matrix, rhs, relative: float = 0.0):
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
  return svd_solve(r[:k, :k], r[:k, k])


def conic_box(r, g, scale, c):
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
  a contour of under 5 points (random_replay.reference_padding).

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
  r, _ = svd_solve(
    jnp.stack([jnp.stack([2 * gfp[0], gfp[2]]), jnp.stack([gfp[2], 2 * gfp[1]])]),
    gfp[3:5],
    relative=1e-9,
  )
  # Refit the quadratic terms about that centre: a' u'^2 + b' v'^2 + c' u'v' = 1.
  qu, qv = u - r[0], v - r[1]
  g, _ = _weighted_least_squares(jnp.stack([qu * qu, qv * qv, qu * qv], axis=1), weights, 1.0)
  centroid = jnp.stack([cx, cy])
  center, size, angle = conic_box(r, g, scale, centroid)
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


def least_squares_start(xy, n):
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


def least_squares_design(points, used, centroid, scale):
  """fitEllipseNoDirect's first design matrix float64 [K, 5] (rows past the points are zero) and
  the scaled coordinates u, v float64 [K]."""
  offset = (points - centroid).astype(jnp.float64) * scale
  u, v = offset[:, 0], offset[:, 1]
  design = jnp.stack([-u * u, -v * v, -u * v, u, v], axis=1)
  return jnp.where(used[:, None], design, 0.0), u, v


def listed_least_squares(xy, n, cursor, words, zero, moved=False):
  """fitEllipseNoDirect on the first n of the points int32 [K, 2], in OpenCV's order; where its
  design matrix is degenerate (w0 * FLT_EPSILON > w4) or `moved` (bool) the points first move
  by getOfs(s / (2 n) * 1e-3) from theRNG's words at cursor, cursor + 1, ... (2 a point).
  Least squares as `_fit_ellipse` solves them (LAPACK's SVD, not OpenCV's Jacobi SVD: the same
  to round-off). Returns (center float32 [2], size float32 [2], angle float32, degenerate
  bool)."""
  used, points, centroid, s, scale = least_squares_start(xy, n)
  design, _, _ = least_squares_design(points, used, centroid, scale)
  sigma = jnp.linalg.svd(design, compute_uv=False)
  degenerate = sigma[0] * FLT_EPSILON > sigma[4]
  moved = degenerate | moved
  eps = (s / (n.astype(jnp.float64) * 2) * 1e-3).astype(jnp.float32)
  offsets = random_replay.rng_offsets(words, cursor, xy.shape[0], eps, zero)
  points = jnp.where(moved, points + offsets, points)
  design, u, v = least_squares_design(points, used, centroid, scale)
  gfp, _ = svd_solve(design, jnp.where(used, 10000.0, 0.0))
  r, _ = svd_solve(
    jnp.stack([jnp.stack([2 * gfp[0], gfp[2]]), jnp.stack([gfp[2], 2 * gfp[1]])]), gfp[3:5]
  )
  qu, qv = u - r[0], v - r[1]
  refit = jnp.where(used[:, None], jnp.stack([qu * qu, qv * qv, qu * qv], axis=1), 0.0)
  g, _ = svd_solve(refit, jnp.where(used, 1.0, 0.0))
  center, size, angle = conic_box(r, g, scale, centroid)
  return center, size, angle, degenerate


@floats.with_x64
@jax.jit
def fit_ellipses(points: jax.Array, extra=None, n_extra=None):
  """cv2.fitEllipse's least squares of contours given as point multisets int32 [N, H, W]
  (contours.largest_contours' `points`), with the reference's padding points extra int32
  [N, 4, 2] and n_extra int32 [N] (random_replay.reference_padding; None: none), and which fit
  each contour gets. Returns (center float32 [N, 2] as (x, y), size float32 [N, 2] as (width,
  height) full axes with width <= height, angle float32 [N] degrees, rule int32 [N]: FITTED, or
  DIRECT and DEGENERATE (fits that need the points in order: `direct_fit.ordered_fits`), or
  FEW_POINTS, ABSENT; see `_fit_ellipse`)."""
  if extra is None:
    total = points.shape[0]
    extra, n_extra = jnp.zeros((total, 4, 2), jnp.int32), jnp.zeros(total, jnp.int32)
  return fit_chunks(jnp.asarray(points, jnp.int32), extra, n_extra)


def fit_chunks(points, extra, n_extra):
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
