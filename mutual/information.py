"""Mutual information between vision- and language-side descriptors, and its dynamics.

Sammani & Deligiannis (2024), Eq. 1, Sec. 3.3 and App. B. Both sides are sets of descriptor ids:
X, the N descriptors chosen for an image's visual concepts (unique, ordered by importance), and
Y, the top u descriptors of the predicted class in the language space. The contingency table is
T_ij = 1 if X_i == Y_j; p = T / sum(T), and k = sum(T) is the number of shared descriptors.

Formulas (`FORMULAS`):
  - "reference": log N + log M + H(p), as the reference code computes it; the paper's tables come
    from it. H(p) = log k, so this is log(N M k): it grows with the number of matches.
  - "eq1": Eq. 1 read literally as a Shannon identity, H(X) + H(Y) - H(X, Y) with App. B's
    uniform H(X) = log N, H(Y) = log M and H(X, Y) = H(p): log(N M / k). It falls as matches grow
    (App. B's final line flips the sign of H(X, Y), which gives "reference").
  - "table": the plug-in mutual information of p itself, H(rows of p) + H(columns of p) - H(p);
    with unique ids on both sides this is log k.
All three are 0 when nothing matches (the reference returns 0 for its NaN).

MI dynamics: the visual descriptors are replaced by a dummy id one by one, most important first,
and the MI is recomputed after each step: N + 1 points. The AUC is their mean; curves of different
lengths are zero-padded before averaging (reference).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

FORMULAS = ("reference", "eq1", "table")


def _entropy(p: jax.Array) -> jax.Array:
  """-sum p log p over the entries of p (0 log 0 = 0)."""
  return -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0))


def match_table(
  visual_ids: jax.Array, visual_valid: jax.Array, language_ids: jax.Array, language_valid=None
) -> jax.Array:
  """The 0/1 contingency table float32 [N, M]: 1 where both are valid and the ids are equal."""
  if language_valid is None:
    language_valid = jnp.ones(language_ids.shape, bool)
  same = visual_ids[:, None] == language_ids[None, :]
  return (same & visual_valid[:, None] & language_valid[None, :]).astype(jnp.float32)


def mutual_information(
  table: jax.Array, n_visual: jax.Array, n_language: jax.Array, formula: str = "reference"
) -> jax.Array:
  """MI of one 0/1 match table (see the module docstring for the formulas).

  Args:
    table: float32 [N, M] 0/1 matches (padding rows / columns all zero).
    n_visual, n_language: the set sizes N and M (padding excluded).
    formula: one of FORMULAS.

  Returns:
    float32 scalar, 0 when the table has no match.
  """
  if formula not in FORMULAS:
    raise ValueError(f"formula must be one of {FORMULAS}, got {formula!r}.")
  matches = jnp.sum(table)
  p = table / jnp.maximum(matches, 1.0)
  joint = _entropy(p)
  log_nm = jnp.log(jnp.maximum(n_visual, 1).astype(jnp.float32)) + jnp.log(
    jnp.maximum(n_language, 1).astype(jnp.float32)
  )
  if formula == "reference":
    value = log_nm + joint
  elif formula == "eq1":
    value = log_nm - joint
  else:
    value = _entropy(jnp.sum(p, axis=1)) + _entropy(jnp.sum(p, axis=0)) - joint
  return jnp.where(matches > 0, value, 0.0)


def mi_curve(
  visual_ids: jax.Array,
  visual_valid: jax.Array,
  language_ids: jax.Array,
  language_valid=None,
  formula: str = "reference",
) -> jax.Array:
  """MI dynamics of one image.

  Args:
    visual_ids: int [N_max], ordered by importance (most important first); visual_valid: bool
      [N_max], the valid ones first (N = their count).
    language_ids: int [M]; language_valid: bool [M] (default all).
    formula: one of FORMULAS.

  Returns:
    float32 [N_max + 1]: point t is the MI after replacing the first t visual descriptors by a
    dummy id; points t > N are 0 (the zero padding of shorter curves).
  """
  if language_valid is None:
    language_valid = jnp.ones(language_ids.shape, bool)
  n_max = visual_ids.shape[0]
  n_visual = jnp.sum(visual_valid)
  n_language = jnp.sum(language_valid)
  steps = jnp.arange(n_max + 1)

  def point(t):
    # The dummy id never matches; the replaced descriptors still count in N (reference).
    kept = visual_valid & (jnp.arange(n_max) >= t)
    table = match_table(visual_ids, kept, language_ids, language_valid)
    return mutual_information(table, n_visual, n_language, formula)

  curve = jax.vmap(point)(steps)
  return jnp.where(steps <= n_visual, curve, 0.0)


@functools.partial(jax.jit, static_argnames=("formula",))
def mi_curves(visual_ids, visual_valid, language_ids, language_valid=None, formula="reference"):
  """`mi_curve` over a batch: int [B, N_max], bool [B, N_max], int [B, M] -> float32 [B, N_max+1]."""
  if language_valid is None:
    language_valid = jnp.ones(language_ids.shape, bool)
  fn = functools.partial(mi_curve, formula=formula)
  return jax.vmap(fn)(visual_ids, visual_valid, language_ids, language_valid)


def curve_auc(curve: np.ndarray, length: int | None = None) -> float:
  """Mean of a curve's points (its first `length` points; default all)."""
  curve = np.asarray(curve, np.float64)
  length = curve.shape[-1] if length is None else int(length)
  return float(np.mean(curve[..., :length])) if length else 0.0


def mean_curve(curves, lengths) -> np.ndarray:
  """Zero-padded mean of per-image curves (reference): float64 [max length].

  Args:
    curves: float [n, P] (points beyond each curve's length are ignored) or a list of 1-D curves.
    lengths: int [n], each curve's number of points (N + 1).
  """
  lengths = [int(n) for n in lengths]
  if not lengths:
    raise ValueError("mean_curve needs at least one curve")
  width = max(lengths)
  padded = np.zeros((len(lengths), width))
  for row, (curve, n) in enumerate(zip(curves, lengths)):
    padded[row, :n] = np.asarray(curve, np.float64)[:n]
  return padded.mean(axis=0)


def importance_order(
  ids: jax.Array, valid: jax.Array, image_scores: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """One image's visual descriptors: flattened, duplicates dropped, most image-relevant first.

  The reference ranks the chosen descriptors by their similarity to the whole image.

  Args:
    ids: int [L, k] chosen descriptors per concept; valid: bool [L, k].
    image_scores: float32 [D], cosine(whole image, descriptor).

  Returns:
    (int32 [L*k] ids, bool [L*k] valid, float32 [L*k] image scores): valid entries first, by
    decreasing score (ties keep concept order); padding after them.
  """
  ids, valid = ids.reshape(-1), valid.reshape(-1)
  n = ids.shape[0]
  earlier = jnp.arange(n)[None, :] < jnp.arange(n)[:, None]
  duplicate = jnp.any(earlier & valid[None, :] & (ids[None, :] == ids[:, None]), axis=1)
  keep = valid & ~duplicate
  scores = image_scores[ids]
  order = jnp.lexsort((jnp.arange(n), -scores, ~keep))
  return ids[order].astype(jnp.int32), keep[order], jnp.where(keep[order], scores[order], 0.0)
