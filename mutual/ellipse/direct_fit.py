"""cv2.fitEllipse where it needs the contour's points in OpenCV's order (`ordered_fits`).

On exactly 5 points fitEllipse is fitEllipseDirect, whose reduced scatter matrix M is singular
in exact arithmetic: its decision and (on repeated points) its result hang on round-off, so it
is reproduced operation for operation (`floats`, `eigen`). It reads cv::theRNG() on every call:
its first attempt moves the 5 points by getOfs(0) (10 words, values unused); where the
attempt's |det M| <= 1e-10 it retries on points moved by getOfs(s / 10 * 1e-2) (10 more
words), and where that is singular too it falls back to fitEllipseNoDirect. A degenerate
least-squares design (collinear points, or fewer than 6 distinct ones) first moves every point
by getOfs(s / (2 n) * 1e-3) (2 words each: `least_squares.listed_least_squares`).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from mutual.ellipse import eigen, floats, least_squares, random_replay
from mutual.ellipse.floats import FLT_EPSILON
from mutual.ellipse.rules import (
  DEGENERATE,
  DIRECT,
  DIRECT_FALLBACK,
  DIRECT_RETRIED,
  UNDRAWABLE,
  UNLISTED,
)


#: offsets (2 words a point each), for 5 points.
DIRECT_DRAWS = 30


def _reduced_scatter(p, zero):
  """fitEllipseDirect's reduced system for 5 centred, scaled points float64 [5, 2]: (TM float64
  [3, 3], Ts, M float64 [3, 3], |det M|), each in OpenCV's operation order."""

  def mul(a, b):
    return floats.mul(a, b, zero)

  def div(a, b):
    return floats.div(a, b, zero)

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


def direct_attempts(xy, cursor, words, zero):
  """fitEllipseDirect's attempts on 5 points int32 [5, 2] in OpenCV's order: the points as they
  are (theRNG's offsets of size 0: 10 words read, values unused), then, where |det M| is at most
  1e-10 (or not a number), moved by getOfs(s / 10 * 1e-2) from the next 10 words.

  Returns (tm, ts, m: the system of the attempt that stands, first bool: the first stands,
  second bool: the second does (neither: OpenCV falls back to fitEllipseNoDirect), cx, cy, scale
  float64)."""

  def mul(a, b):
    return floats.mul(a, b, zero)

  def div(a, b):
    return floats.div(a, b, zero)

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
  moved = jnp.stack([points, points + random_replay.rng_offsets(words, cursor + 10, 5, eps, zero)])
  tm, ts, m, det = jax.vmap(attempt)(moved)
  first = det[0] > 1e-10
  second = ~first & (det[1] > 1e-10)
  tm, ts, m = (jnp.where(first, x[0], x[1]) for x in (tm, ts, m))
  return tm, ts, m, first, second, cx, cy, scale


def _direct_fit(xy, cursor, words, zero):
  """cv2.fitEllipse of exactly 5 points int32 [5, 2] in OpenCV's order (fitEllipseDirect),
  theRNG's words from `cursor` on; traced with 64-bit types on.

  Returns (center float32 [2], size float32 [2], angle float32, attempt int32: 0 where the first
  attempt stands, 1 where the second (moved points) does, 2 where both are singular and OpenCV
  falls back to fitEllipseNoDirect on the 5 points, from theRNG's words at cursor + 20: the
  box returned is then not OpenCV's)."""

  def mul(a, b):
    return floats.mul(a, b, zero)

  def div(a, b):
    return floats.div(a, b, zero)

  tm, ts, m, first, second, cx, cy, scale = direct_attempts(xy, cursor, words, zero)
  _, vectors, _ = eigen.eigen_nonsymmetric3(m, zero)
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
  # (the caller runs it: least_squares.listed_least_squares from theRNG's word cursor + 20).
  return center, size, angle, jnp.where(first, 0, jnp.where(second, 1, 2)).astype(jnp.int32)


def five_points(listed, n_points, extra, n_extra):
  """The 5 points cv2.fitEllipse gets: the contour's own in OpenCV's order (listed int32 [>= 5,
  2]), then the reference's padding (extra int32 [4, 2], n_extra of them)."""
  del n_extra
  i = jnp.arange(5)
  own = listed[i]
  padding = extra[jnp.clip(i - n_points, 0, 3)]
  return jnp.where((i < n_points)[:, None], own, padding)


def fit_draws(rule, five, n_points, cursor, words, zero):
  """theRNG words cv2.fitEllipse reads for one contour: a 5-point fit 10 (its first attempt's
  offsets of size 0), 20 with the second attempt, 30 where both are singular and the 5 points'
  least squares is degenerate; a degenerate least-squares fit 2 per point; other fits none."""
  _, _, _, first, second, _, _, _ = direct_attempts(five, cursor, words, zero)
  used, points, centroid, _, scale = least_squares.least_squares_start(five, jnp.int32(5))
  design, _, _ = least_squares.least_squares_design(points, used, centroid, scale)
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
  five = five_points(listed, n_points, extra, n_extra)
  d_center, d_size, d_angle, attempt = _direct_fit(five, cursor, words, zero)
  capacity = listed.shape[0]
  fits_list = n_points <= capacity
  direct = rule == DIRECT
  # One least squares on listed points: a degenerate contour's (moved by theRNG), or the 5
  # points' where both direct attempts are singular (moved where their design is degenerate).
  fallback = direct & (attempt == 2)
  l_center, l_size, l_angle, _ = least_squares.listed_least_squares(
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


@floats.with_x64
@functools.partial(jax.jit, static_argnames=("chunk",))
def ordered_fits(
  center, size, angle, rule, listed, n_points, extra, n_extra, cursor, words, zero, chunk=16
):
  """cv2.fitEllipse where it needs the contour's points in order: 5 points (fitEllipseDirect,
  exactly as OpenCV rounds it) and degenerate least squares (points moved by cv::theRNG()), for
  N contours; `fit_ellipses`' output passes through elsewhere. Chunks of `chunk` contours
  without such a fit skip the work.

  Args:
    center, size, angle, rule: least_squares.fit_ellipses' output over N.
    listed: int32 [N, K, 2], each contour's first K points in order (the `listed` of
      contours.largest_contours; K >= 5; degenerate contours longer than K get rule UNLISTED).
    n_points: int32 [N]; extra int32 [N, 4, 2], n_extra int32 [N]: the reference's padding.
    cursor: int32 [N], the index in `words` of the first theRNG word each fit reads.
    words: uint32 [W], random_replay.opencv_rng_words(seed, W).
    zero: uint64 0 (np.uint64(0)), passed in so that the compiler cannot fold the rounding
      fences (`floats.fence`).

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
