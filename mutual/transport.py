"""Optimal transport from visual concepts to candidate descriptors, and the top descriptors.

Sammani & Deligiannis (2024), Eq. 2 and App. A.2. The concepts x candidates scores C (dot products
of concept and descriptor embeddings) become a transport plan; each concept keeps the descriptors
with the most mass in its row. Two solvers, both batched over images with masks for padding:

- "ott": ott-jax's Sinkhorn on the kernel exp(scale * C / epsilon) with uniform marginals over the
  valid concepts (rows) and candidates (columns), run to its convergence threshold.
- "reference": the reference code's plain loop: P = exp(scale * C), then `iterations` (1,000)
  rounds of row then column normalisation.

Both return diag(u) K diag(v) for the same kernel K; at convergence the two plans differ only by
a constant factor (the reference's rows sum to n_cols / n_rows, its columns to 1; ott's rows to
1 / n_rows, its columns to 1 / n_cols), so each row's top descriptors coincide. They can differ
when the reference's fixed number of rounds stops short of convergence, or when two entries of a
row are within the solvers' tolerance of each other.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from ott.geometry import geometry
from ott.problems.linear import linear_problem
from ott.solvers.linear import sinkhorn

SOLVERS = ("ott", "reference")


def _safe_divide(x: jax.Array, total: jax.Array) -> jax.Array:
  return x / jnp.where(total > 0, total, 1.0)


def reference_plan(
  scores: jax.Array,
  row_mask: jax.Array,
  col_mask: jax.Array,
  scale: float = 2.5,
  epsilon: float = 1.0,
  iterations: int = 1000,
) -> jax.Array:
  """The reference's Sinkhorn-Knopp loop on one image.

  Args:
    scores: float32 [L, D], concept x descriptor scores.
    row_mask: bool [L] (valid concepts); col_mask: bool [D] (candidate descriptors).
    scale, epsilon: P starts as exp(scale * scores / epsilon) on the valid entries.
    iterations: rounds of row then column normalisation.

  Returns:
    float32 [L, D], zero outside the valid rows and columns.
  """
  mask = row_mask[:, None] & col_mask[None, :]
  logits = scale * scores / epsilon
  # Row and column scalings absorb any constant, so shifting by the max changes nothing.
  logits = logits - jnp.max(jnp.where(mask, logits, -jnp.inf), initial=0.0)
  plan = jnp.where(mask, jnp.exp(logits), 0.0)

  def round_(_, p):
    p = _safe_divide(p, jnp.sum(p, axis=1, keepdims=True))
    return _safe_divide(p, jnp.sum(p, axis=0, keepdims=True))

  return jax.lax.fori_loop(0, iterations, round_, plan)


def ott_plan(
  scores: jax.Array,
  row_mask: jax.Array,
  col_mask: jax.Array,
  scale: float = 2.5,
  epsilon: float = 1.0,
  threshold: float = 1e-6,
  max_iterations: int = 2000,
) -> jax.Array:
  """Entropic OT of one image with ott-jax: cost -scale * scores, uniform masked marginals.

  Args and returns as `reference_plan`; threshold and max_iterations go to ott's Sinkhorn.
  """
  rows = row_mask.astype(jnp.float32)
  cols = col_mask.astype(jnp.float32)
  a = _safe_divide(rows, jnp.sum(rows))
  b = _safe_divide(cols, jnp.sum(cols))
  # Padded rows / columns carry no mass (zero marginal); a finite cost keeps them NaN-free.
  cost = jnp.where(row_mask[:, None] & col_mask[None, :], -scale * scores, 0.0)
  geom = geometry.Geometry(cost_matrix=cost, epsilon=epsilon)
  problem = linear_problem.LinearProblem(geom, a=a, b=b)
  solver = sinkhorn.Sinkhorn(threshold=threshold, max_iterations=max_iterations)
  plan = solver(problem).matrix
  ok = jnp.any(row_mask) & jnp.any(col_mask)
  return jnp.where(ok & row_mask[:, None] & col_mask[None, :], plan, 0.0)


def top_descriptors(
  plan_or_scores: jax.Array,
  row_mask: jax.Array,
  col_mask: jax.Array,
  top: int = 3,
  tie_scores: jax.Array | None = None,
  tie_tolerance: float = 1e-4,
) -> tuple[jax.Array, jax.Array]:
  """Each valid concept's `top` descriptors by plan mass (or raw score), best first.

  Args:
    plan_or_scores: float32 [L, D].
    row_mask: bool [L]; col_mask: bool [D], the descriptors that may be chosen.
    top: descriptors per concept (fewer when fewer columns are allowed).
    tie_scores: float32 [L, D] (the raw scores), used to order entries whose values are equal
      to within tie_tolerance of the row's maximum. Without it, near-ties fall to rounding; they
      are common: with a single valid concept the plan's row is uniform over the candidates.
    tie_tolerance: relative width of a tie.

  Returns:
    (int32 [L, top] descriptor indices, bool [L, top] validity).
  """
  values = jnp.where(col_mask[None, :], plan_or_scores, -jnp.inf)
  if tie_scores is None:
    _, idx = jax.lax.top_k(values, top)
  else:
    row_max = jnp.max(jnp.where(col_mask[None, :], jnp.abs(plan_or_scores), 0.0), axis=1)
    level = jnp.round(plan_or_scores / jnp.maximum(row_max, 1e-30)[:, None] / tie_tolerance)
    level = jnp.where(col_mask[None, :], level, -jnp.inf)
    order = jax.vmap(lambda lv, sc: jnp.lexsort((-sc, -lv)))(level, tie_scores)
    idx = order[:, :top]
  allowed = jnp.arange(top)[None, :] < jnp.sum(col_mask)
  return idx.astype(jnp.int32), allowed & row_mask[:, None]


@functools.partial(
  jax.jit, static_argnames=("solver", "top", "iterations", "max_iterations", "use_ot")
)
def concept_descriptors(
  concept_scores: jax.Array,
  concept_valid: jax.Array,
  candidates: jax.Array,
  solver: str = "ott",
  top: int = 3,
  scale: float = 2.5,
  epsilon: float = 1.0,
  iterations: int = 1000,
  threshold: float = 1e-6,
  max_iterations: int = 2000,
  use_ot: bool = True,
) -> tuple[jax.Array, jax.Array]:
  """Top descriptors per concept for a batch of images.

  Args:
    concept_scores: float32 [B, L, D]; concept_valid: bool [B, L]; candidates: bool [B, D].
    solver: "ott" or "reference" (see the module docstring).
    use_ot: False is the reference's "w/o OT" path: each concept's top descriptors by raw score
      over the whole bank (candidates ignored).

  Returns:
    (int32 [B, L, top], bool [B, L, top]).
  """
  if solver not in SOLVERS:
    raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}.")

  def one(scores, valid, cand):
    if not use_ot:
      return top_descriptors(scores, valid, jnp.ones_like(cand), top)
    if solver == "ott":
      plan = ott_plan(scores, valid, cand, scale, epsilon, threshold, max_iterations)
    else:
      plan = reference_plan(scores, valid, cand, scale, epsilon, iterations)
    return top_descriptors(plan, valid, cand, top, tie_scores=scores)

  return jax.vmap(one)(concept_scores, concept_valid, candidates)


def choice_entropy(ids: jax.Array, valid: jax.Array) -> jax.Array:
  """App. A.2's diversity of the descriptors chosen for one image's concepts.

  The Shannon entropy (nats) of how often each descriptor is chosen over all concepts' picks:
  log(n) when the n picks are all different, lower when concepts share descriptors.

  Args:
    ids: int [L, k] chosen descriptor indices; valid: bool [L, k].

  Returns:
    float32 scalar (0 with no valid pick).
  """
  ids, valid = ids.reshape(-1), valid.reshape(-1)
  total = jnp.sum(valid)
  counts = jnp.sum(valid[None, :] & (ids[None, :] == ids[:, None]), axis=1)
  p = _safe_divide(counts.astype(jnp.float32), total)
  # Each pick contributes p/count * log p; a descriptor chosen c times contributes p log p.
  terms = jnp.where(valid, jnp.log(jnp.where(valid, p, 1.0)), 0.0)
  return -_safe_divide(jnp.sum(terms), total)
