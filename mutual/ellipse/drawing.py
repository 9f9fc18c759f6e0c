"""cv2.ellipse with a RotatedRect and LINE_8, pixel for pixel.

cv2.ellipse(RotatedRect) rounds the angle to whole degrees and the geometry to 16-bit fixed
point, approximates the ellipse by a polygon (ellipse2Poly, one vertex every 5, 18, 30 or 90
degrees by size, from OpenCV's 7-digit sine table), and draws the polygon's edges with its
fixed-point 8-connected line (thickness 1) or fills it with its convex scanline filler
(thickness -1). Both are reproduced in int64, pixel for pixel, as OpenCV 4.x up to 4.12 draws
them (4.13 brought another line algorithm; the reference predates it).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from mutual.ellipse import floats


XY_SHIFT = 16
XY_ONE = 1 << XY_SHIFT
# OpenCV's drawing sine table: sin of whole degrees 0..450, to 7 decimals, as float32.
SIN_TABLE = np.round(np.sin(np.deg2rad(np.arange(451, dtype=np.float64))), 7).astype(np.float32)
# Most polygon vertices cv2.ellipse uses (one per 5 degrees, both ends included).
MAX_VERTICES = 73


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


@floats.with_x64
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
