"""Ranking metrics of preference retrieval (paper section 4.2.2 and App. B).

All functions take scores float [N] (or [W, N] for a batch of queries) where higher means
retrieved earlier, and labels over the same N images. Rankings break ties by image index
(a stable sort), so results are deterministic.
"""

from __future__ import annotations

import numpy as np


def ranking(scores: np.ndarray) -> np.ndarray:
  """int64 [..., N]: image indices by decreasing score, ties by increasing index."""
  scores = np.asarray(scores)
  return np.argsort(-scores, axis=-1, kind="stable")


def average_precision(y_true: np.ndarray, scores: np.ndarray) -> float:
  """Average precision of bool [N] labels ranked by float [N] scores.

  The step-wise area under the precision-recall curve, sum_n (R_n - R_{n-1}) P_n over
  the distinct score thresholds: tied scores enter together, as in scikit-learn's
  `average_precision_score`, which this equals.
  """
  y_true = np.asarray(y_true).astype(bool)
  scores = np.asarray(scores, np.float64)
  if y_true.shape != scores.shape or y_true.ndim != 1:
    raise ValueError(f"labels {y_true.shape} and scores {scores.shape} must both be [N]")
  positives = int(y_true.sum())
  if positives == 0:
    raise ValueError("average precision needs at least one positive image")
  order = np.argsort(-scores, kind="stable")
  hits = np.cumsum(y_true[order])
  # The last rank of each group of tied scores is a threshold.
  last = np.r_[np.flatnonzero(np.diff(scores[order])), len(scores) - 1]
  tp = hits[last]
  precision = tp / (last + 1.0)
  recall_steps = np.diff(np.r_[0, tp]) / positives
  return float(np.sum(recall_steps * precision))


def precision_at_k(y_true: np.ndarray, scores: np.ndarray, k: int | None = None) -> float:
  """Share of positives among the k top-ranked images (k None: the number of positives,
  the paper's P_400 on 800 half-positive CelebA images); ties broken by index."""
  y_true = np.asarray(y_true).astype(bool)
  k = int(y_true.sum()) if k is None else int(k)
  if not 1 <= k <= len(y_true):
    raise ValueError(f"k must be in [1, {len(y_true)}], got {k}")
  return float(y_true[ranking(scores)[:k]].mean())


def category_codes(labels: np.ndarray) -> np.ndarray:
  """bool [N, A] attribute labels -> int64 [N] category codes in [0, 2**A).

  Attribute 0 is the most significant bit, so code order equals itertools.product order
  over (True, False) reversed: code = sum_a labels[:, a] * 2**(A - 1 - a).
  """
  labels = np.asarray(labels).astype(np.int64)
  if labels.ndim != 2:
    raise ValueError(f"labels must be [N, attributes], got {labels.shape}")
  powers = 2 ** np.arange(labels.shape[1] - 1, -1, -1)
  return labels @ powers


def category_curves(
  scores: np.ndarray, categories: np.ndarray, n_categories: int, normalize: str = "share"
) -> np.ndarray:
  """Per-category retrieval curves over the ranking (the paper's Figure 4, second row).

  Args:
    scores: float [N] or [W, N].
    categories: int [N] in [0, n_categories).
    n_categories: C.
    normalize: "share": count of category c among the top n, divided by n (the curves sum
      to 1 at every n); "recall": divided by the size of category c (each curve rises to 1).

  Returns:
    float64 [C, N] (or [W, C, N]): curve[c, n - 1] for n = 1..N.
  """
  scores = np.asarray(scores)
  categories = np.asarray(categories, np.int64)
  if scores.shape[-1] != categories.shape[0]:
    raise ValueError(f"scores {scores.shape} and categories {categories.shape} disagree on N")
  if categories.min() < 0 or categories.max() >= n_categories:
    raise ValueError(f"categories must lie in [0, {n_categories})")
  ranked = categories[ranking(scores)]  # [..., N]
  onehot = ranked[..., None, :] == np.arange(n_categories)[:, None]  # [..., C, N]
  counts = np.cumsum(onehot, axis=-1, dtype=np.float64)
  if normalize == "share":
    return counts / np.arange(1, scores.shape[-1] + 1)
  if normalize == "recall":
    sizes = np.maximum(np.bincount(categories, minlength=n_categories), 1)
    return counts / sizes[:, None]
  raise ValueError(f"normalize must be 'share' or 'recall', got {normalize!r}")


def category_auc(
  scores: np.ndarray, categories: np.ndarray, n_categories: int, normalize: str = "share"
) -> np.ndarray:
  """Area under each category's curve (App. B) with n rescaled to (0, 1]: the mean of
  curve[c, n] over n = 1..N. float64 [C] (or [W, C]); higher: retrieved earlier."""
  return category_curves(scores, categories, n_categories, normalize).mean(axis=-1)
