"""The reference's contour of a region: the outer contour cv2.findContours(RETR_EXTERNAL,
CHAIN_APPROX_NONE) lists with the largest cv2.contourArea, for fixed shapes, batched over masks,
in 32-bit types.

OpenCV follows borders with Suzuki-Abe's rule: from the current pixel, scan the 8 neighbours
counterclockwise (on screen) starting after the previous pixel; the first foreground one is the
next pixel. The state (pixel, direction to the previous pixel) thus determines the next state,
and on valid states this map is a permutation whose cycles are the borders; a border emits one
point per state, so a pixel passed twice counts twice. The outer border of a component is the
cycle through its raster-first pixel entered from its first foreground neighbour clockwise from
the west, where OpenCV starts it. Instead of walking each border, all cycles are labelled at
once with the smallest raster index of the start states on them (pointer doubling: log2 of the
longest border steps, over the states of the boundary pixels only, which every border stays
on), and per label the shoelace sum is a segment sum. Outer borders run with a negative
shoelace sum, hole borders with a positive one, so the largest outer contour is the label with
the largest negated sum; ties go to the larger start index, the contour OpenCV lists first (it
lists them in reverse raster order of their start points). A component inside another's hole
(which RETR_EXTERNAL drops) always has the smaller area, so it never wins.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


# Moore neighbourhood in OpenCV's chain-code order, counterclockwise on screen (y down):
# E, NE, N, NW, W, SW, S, SE.
_DX = (1, 1, 0, -1, -1, -1, 0, 1)
_DY = (0, -1, -1, -1, 0, 1, 1, 1)
# Clockwise from the west: the order OpenCV searches the first neighbour of a border's start.
_START_SEARCH = (3, 2, 1, 0, 7, 6, 5)


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


def listed_count(height: int, width: int) -> int:
  """Contour points listed in order per region: 2 max(H, W), the most a degenerate contour (a
  straight line of pixels, each inner one visited twice) has."""
  return 2 * max(height, width)
