"""Visual concepts: PCA or K-means over the foreground patch tokens of B images, fitted jointly.

Sammani & Deligiannis (2024), Sec. 3.1: the prominent patches are split into at most L concepts
(object parts); each patch belongs to one concept. Background patches get concept -1.
All shapes are static, so the fits run under jit whatever the mask holds: background rows are
zeroed or weighted out rather than removed.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from mutual import mt19937
from stori_jax.clip.encoding import l2_normalize_jax

_HIGHEST = jax.lax.Precision.HIGHEST  # accelerators would otherwise multiply in bf16 / tf32


def _flatten(features, mask, n_concepts: int):
  features, mask = jnp.asarray(features, jnp.float32), jnp.asarray(mask, bool)
  if features.ndim != 4 or mask.shape != features.shape[:3]:
    raise ValueError(
      f"features must be [B, h, w, D] and mask [B, h, w]; got {features.shape} and {mask.shape}."
    )
  if n_concepts < 1:
    raise ValueError(f"n_concepts must be >= 1, got {n_concepts}.")
  return features.reshape(-1, features.shape[-1]), mask.reshape(-1)


#: PCA sign conventions (`pca_components`): scikit-learn's before and from release 1.5.
PCA_SIGN_RULES = ("sklearn<1.5", "sklearn>=1.5")
#: K-means starts (`kmeans_concepts`): seeded k-means++ restarts, or kmeans_pytorch's one
#: random start under the seeding protocol.
KMEANS_INITS = ("k-means++", "random")


def _check_choice(name: str, value: str, allowed) -> None:
  if value not in allowed:
    raise ValueError(f"{name} must be one of {allowed}, got {value!r}.")


def pca_components(x: jax.Array, weights: jax.Array, n_components: int, sign_rule="sklearn>=1.5"):
  """Principal axes of the rows of x [N, D] with weight 1 (weights bool [N]; others ignored).

  Args:
    x: float32 [N, D]; weights: bool [N]; n_components: axes kept.
    sign_rule: which scikit-learn PCA sign convention fixes each axis's sign (svd_flip):
      "sklearn>=1.5": the component's (row of V^T) largest-magnitude entry is positive
        (u_based_decision=False, every solver since 1.5);
      "sklearn<1.5": the largest-magnitude entry of the matching column of U (the scores of the
        weighted rows over the singular value) is positive (u_based_decision=True, the full and
        randomized solvers before 1.5, the convention of the reference code's results).

  Returns (mean float32 [D], components float32 [n_components, D]).
  """
  _check_choice("sign_rule", sign_rule, PCA_SIGN_RULES)
  w = weights.astype(x.dtype)[:, None]
  mean = jnp.sum(x * w, axis=0) / jnp.maximum(jnp.sum(w), 1.0)
  # Zero rows leave the right singular vectors of the foreground rows unchanged, and their rows
  # of U are zero, so they never decide a sign either.
  u, _, vt = jnp.linalg.svd((x - mean) * w, full_matrices=False)
  vt = vt[:n_components]
  if sign_rule == "sklearn>=1.5":
    pivot = jnp.take_along_axis(vt, jnp.argmax(jnp.abs(vt), axis=1)[:, None], axis=1)[:, 0]
  else:
    u = u[:, :n_components]
    pivot = jnp.take_along_axis(u, jnp.argmax(jnp.abs(u), axis=0)[None], axis=0)[0]
  return mean, vt * jnp.where(pivot < 0, -1.0, 1.0)[:, None]


@functools.partial(jax.jit, static_argnames=("n_concepts", "sign_rule"))
def _pca_assign(x, fg, n_concepts, sign_rule):
  mean, components = pca_components(x, fg, n_concepts, sign_rule)
  scores = jnp.matmul(x - mean, components.T, precision=_HIGHEST)
  low = jnp.min(jnp.where(fg[:, None], scores, jnp.inf), axis=0)
  high = jnp.max(jnp.where(fg[:, None], scores, -jnp.inf), axis=0)
  scaled = (scores - low) / jnp.maximum(high - low, 1e-12)
  return jnp.where(fg, jnp.argmax(scaled, axis=1), -1).astype(jnp.int32)


def pca_concepts(features, mask, n_concepts: int = 5, sign_rule: str = "sklearn>=1.5") -> jax.Array:
  """Concept map from a joint PCA of raw foreground tokens.

  Each foreground token is projected on the first n_concepts principal axes (fitted on the
  foreground tokens of all B images), each axis is min-max scaled over those tokens, and the
  token takes the axis with the largest scaled score. An axis's sign decides which end scales
  to 1, so the labels depend on the sign rule.

  Args:
    features: float32 [B, h, w, D] patch features.
    mask: bool [B, h, w] foreground patches.
    n_concepts: number of principal axes (concepts).
    sign_rule: "sklearn>=1.5" or "sklearn<1.5" (see `pca_components`).

  Returns:
    int32 [B, h, w]: concept index in [0, n_concepts), -1 on background.
  """
  _check_choice("sign_rule", sign_rule, PCA_SIGN_RULES)
  x, fg = _flatten(features, mask, n_concepts)
  if n_concepts > min(x.shape):
    raise ValueError(
      f"n_concepts={n_concepts} exceeds the rank available from {x.shape[0]} tokens of "
      f"dimension {x.shape[1]}."
    )
  return _pca_assign(x, fg, n_concepts, sign_rule).reshape(jnp.shape(mask))


def _squared_distances(x, centers):
  # 2.0 * x first, as `2.0 * x @ centers.T` groups.
  cross = jnp.matmul(2.0 * x, centers.T, precision=_HIGHEST)
  return jnp.sum(x * x, axis=1)[:, None] - cross + jnp.sum(centers * centers, axis=1)


def kmeans_plus_plus(key, x, weights, k: int) -> jax.Array:
  """k-means++ seeding over the rows of x [N, D] with weights bool [N] -> centers [k, D]."""
  w = weights.astype(x.dtype)

  def sample(key, p):
    # All-zero probabilities (fewer distinct tokens than k) fall back to uniform over weights.
    p = jnp.where(jnp.sum(p) > 0, p, w)
    return jax.random.choice(key, x.shape[0], p=p / jnp.sum(p))

  keys = jax.random.split(key, k)
  centers = jnp.zeros((k, x.shape[1]), x.dtype).at[0].set(x[sample(keys[0], w)])
  closest = jnp.sum((x - centers[0]) ** 2, axis=1)

  def body(i, state):
    centers, closest = state
    new = x[sample(keys[i], closest * w)]
    closest = jnp.minimum(closest, jnp.sum((x - new) ** 2, axis=1))
    return centers.at[i].set(new), closest

  centers, _ = jax.lax.fori_loop(1, k, body, (centers, closest))
  return centers


def lloyd(x, weights, centers, max_iter: int = 300):
  """Lloyd iterations until the assignments stop changing (or max_iter).

  Returns (centers [k, D], assignments int32 [N], inertia scalar over weighted rows). An empty
  cluster keeps its previous center.
  """
  k = centers.shape[0]
  w = weights.astype(x.dtype)

  def assign(centers):
    return jnp.argmin(_squared_distances(x, centers), axis=1).astype(jnp.int32)

  def update(centers, labels):
    sums = jax.ops.segment_sum(x * w[:, None], labels, num_segments=k)
    counts = jax.ops.segment_sum(w, labels, num_segments=k)
    return jnp.where(counts[:, None] > 0, sums / jnp.maximum(counts, 1.0)[:, None], centers)

  def cond(state):
    _, labels, previous, step = state
    return (step < max_iter) & jnp.any((labels != previous) & weights)

  def body(state):
    centers, labels, _, step = state
    centers = update(centers, labels)
    return centers, assign(centers), labels, step + 1

  labels = assign(centers)
  centers, labels, _, _ = jax.lax.while_loop(cond, body, (centers, labels, labels - 1, 0))
  distances = jnp.take_along_axis(_squared_distances(x, centers), labels[:, None], axis=1)[:, 0]
  return centers, labels, jnp.sum(jnp.maximum(distances, 0.0) * w)


@functools.partial(jax.jit, static_argnames=("k", "n_init", "max_iter"))
def kmeans(key, x, weights, k: int, n_init: int = 10, max_iter: int = 300):
  """K-means of the weighted rows of x [N, D]: n_init k-means++ starts, the lowest inertia wins.

  Returns (centers float32 [k, D], assignments int32 [N]).
  """

  def run(key):
    return lloyd(x, weights, kmeans_plus_plus(key, x, weights, k), max_iter)

  centers, labels, inertia = jax.vmap(run)(jax.random.split(key, n_init))
  best = jnp.argmin(inertia)
  return centers[best], labels[best]


def reference_words(seed: int, size: int, k: int, max_iter: int = 500) -> np.ndarray:
  """uint32 words of the reference K-means' generators under the seeding protocol
  (np.random.seed(seed), torch.manual_seed(seed): one stream, `mt19937.legacy_words`), enough
  for the start's shuffle of up to `size` rows and for k redraws in each of max_iter iterations
  (the torch generator reads them from its own first word)."""
  return mt19937.legacy_words(seed, max(mt19937.permutation_words(size), k * max_iter))


def random_start(words, weights, k: int) -> jax.Array:
  """kmeans_pytorch's start: `np.random.choice(N, k, replace=False)` from numpy's legacy
  generator (`words`, its stream from the seed), N the number of weighted rows (weights bool
  [M]), the i-th weighted row standing for row i of the reference's foreground tokens. int32
  [k] indices into the M rows."""
  size = weights.shape[0]
  rows = jnp.nonzero(weights, size=size, fill_value=0)[0].astype(jnp.int32)
  n = jnp.sum(weights.astype(jnp.int32))
  return rows[mt19937.legacy_choice(words, n, k, size)]


def _direct_squared_distances(x, centers):
  # kmeans_pytorch's pairwise_distance: ((x - c) ** 2).sum(-1), not the expanded product.
  return jnp.sum((x[:, None, :] - centers[None, :, :]) ** 2, axis=-1)


@functools.partial(jax.jit, static_argnames=("max_iter",))
def kmeans_pytorch_loop(words, x, weights, centers, tol: float = 1e-4, max_iter: int = 500):
  """kmeans_pytorch's iterations from the given centres over the weighted rows of x [M, D].

  Each iteration assigns every row to its nearest centre (euclidean, as pairwise_distance
  computes it), then moves each centre, in index order, to the mean of its weighted rows; a
  centre left with none moves to a random weighted row, `X[torch.randint(N, (1,))]` as the
  kmeans_pytorch the authors call does (GitHub, after release 0.3, which would make it NaN),
  each redraw reading the next word of torch's CPU generator (`words`, its stream from the
  seed: uint32 [W], at least k * max_iter). The loop stops once the squared sum of the
  centres' moves (euclidean norms) is below tol, or after max_iter iterations (iter_limit).
  As kmeans_pytorch does, it returns the assignments of the last iteration, i.e. to the
  centres before their final move.

  Returns (centers float32 [k, D], assignments int32 [M]).
  """
  k, m = centers.shape[0], x.shape[0]
  if m >= mt19937.TORCH_32_BIT_LIMIT:  # torch.randint would read two words a draw
    raise ValueError(f"the reference K-means replays at most 2**28 - 1 rows, got {m}.")
  w = weights.astype(x.dtype)
  rows = jnp.nonzero(weights, size=m, fill_value=0)[0]
  n = jnp.maximum(jnp.sum(weights.astype(jnp.int32)), 1)

  def cond(state):
    _, _, shift, step, _ = state
    return (step == 0) | ((shift**2 >= tol) & (step < max_iter))

  def body(state):
    centers, _, _, step, cursor = state
    labels = jnp.argmin(_direct_squared_distances(x, centers), axis=1).astype(jnp.int32)
    sums = jax.ops.segment_sum(x * w[:, None], labels, num_segments=k)
    counts = jax.ops.segment_sum(w, labels, num_segments=k)
    empty = counts == 0
    # The empty clusters draw in index order, one word each.
    draws = cursor + jnp.cumsum(empty.astype(jnp.int32)) - 1
    spare = x[rows[mt19937.torch_randint(words, draws, n)]]
    new = jnp.where(empty[:, None], spare, sums / jnp.maximum(counts, 1.0)[:, None])
    shift = jnp.sum(jnp.sqrt(jnp.sum((new - centers) ** 2, axis=1)))
    return new, labels, shift, step + 1, cursor + jnp.sum(empty.astype(jnp.int32))

  init = (centers, jnp.zeros(m, jnp.int32), jnp.asarray(jnp.inf, x.dtype), 0, jnp.int32(0))
  centers, labels, _, _, _ = jax.lax.while_loop(cond, body, init)
  return centers, labels


@functools.partial(jax.jit, static_argnames=("k", "max_iter"))
def random_start_kmeans(words, x, weights, k: int, tol: float = 1e-4, max_iter: int = 500):
  """K-means of the weighted rows of x [M, D] as the authors' kmeans_pytorch call runs under
  the seeding protocol: `random_start` from numpy's generator, then `kmeans_pytorch_loop` with
  torch's; both read `words` (`reference_words(seed, M, k, max_iter)`: the two generators give
  the same stream, each from its first word). Returns (centers [k, D], assignments int32 [M])."""
  centers = x[random_start(words, weights, k)]
  return kmeans_pytorch_loop(words, x, weights, centers, tol, max_iter)


def kmeans_concepts(
  features,
  mask,
  n_concepts: int = 5,
  seed: int = 0,
  n_init: int = 10,
  max_iter: int | None = None,
  init: str = "k-means++",
) -> jax.Array:
  """Concept map from a joint K-means of L2-normalised foreground tokens.

  Args:
    features: float32 [B, h, w, D] patch features.
    mask: bool [B, h, w] foreground patches.
    n_concepts: number of clusters.
    seed: seed of the starts (same seed, same result); with "random" the seeding protocol's
      (an int in [0, 2**32), given to np.random.seed and torch.manual_seed).
    n_init: number of k-means++ starts; the one with the lowest inertia is kept ("k-means++").
    max_iter: iterations at most; default 300 ("k-means++") or 500 ("random", the reference's
      iter_limit).
    init: "k-means++": n_init seeded k-means++ starts (JAX's PRNG), Lloyd until the assignments
      settle; "random": the authors' kmeans_pytorch call (`random_start_kmeans`) under the
      seeding protocol: its clusters are those of utils.kmeans_clustering run after
      np.random.seed(seed) and torch.manual_seed(seed) (the start from numpy's legacy generator,
      an empty cluster's redraw from torch's), which the authors leave unseeded.

  Returns:
    int32 [B, h, w]: cluster index in [0, n_concepts), -1 on background.
  """
  _check_choice("init", init, KMEANS_INITS)
  x, fg = _flatten(features, mask, n_concepts)
  x = l2_normalize_jax(x, axis=1)
  if init == "random":
    max_iter = max_iter or 500
    words = jnp.asarray(reference_words(seed, x.shape[0], n_concepts, max_iter))
    _, labels = random_start_kmeans(words, x, fg, n_concepts, max_iter=max_iter)
  else:
    _, labels = kmeans(jax.random.PRNGKey(seed), x, fg, n_concepts, n_init, max_iter or 300)
  return jnp.where(fg, labels, -1).reshape(jnp.shape(mask))
