"""The two random streams the reference reads, replayed on the device from words computed
once on the host.

* cv::theRNG() (`opencv_rng_words`, `rng_offsets`): a multiply-with-carry generator (state =
  (uint64)(unsigned)state * 4164903690 + (state >> 32)) whose state carries from fit to fit;
  fitEllipse reads its words as point offsets (getOfs).
* Python's `random`, a Mersenne Twister (`python_random_words`, `reference_padding`): the
  reference pads a largest contour of under 5 points with random.randint(0, last_x - 1),
  random.randint(0, last_y - 1) per missing point.

Under the seeding protocol both are seeded with the same seed before each image's concepts of
each method, which are visited in the reference's order (`reference_order`).
"""

from __future__ import annotations

import functools
import random

import jax
import jax.numpy as jnp
import numpy as np

from mutual.ellipse import floats


#: theRNG's state after cv2.setRNGSeed(0), and at the start of every thread (cv::RNG's default).
OPENCV_DEFAULT_STATE = 0xFFFFFFFF
#: cv::RNG's multiply-with-carry multiplier (CV_RNG_COEFF).
OPENCV_RNG_COEFF = 4164903690
#: theRNG words one fit may read: fitEllipseDirect's two attempts and fitEllipseNoDirect's


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


def rng_offsets(words, start, points: int, eps, zero):
  """OpenCV's getOfs(eps) for `points` points from theRNG's words at start, start + 1, ...:
  float32 [points, 2] (dx, dy), each rng.uniform(-eps, eps) = word * 2^-32 * (2 eps) - eps in
  float32. The compiler OpenCV ships with evaluates Point2f(uniform(), uniform())'s arguments
  right to left: a point's y takes the first of its two words."""
  index = jnp.clip(start + jnp.arange(2 * points), 0, words.shape[0] - 1)
  unit = words[index].astype(jnp.float32) * jnp.float32(2.0**-32)
  eps = jnp.asarray(eps, jnp.float32)
  offsets = floats.fence(unit * (eps - (-eps)), zero) + (-eps)
  return offsets.reshape(points, 2)[:, ::-1]


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
