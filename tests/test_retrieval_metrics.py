"""Metrics of preference retrieval against scikit-learn and hand-computed cases."""

import numpy as np
import pytest
from sklearn.metrics import average_precision_score

from stori_jax.world_evaluation import metrics as sw
from stori_jax.retrieval import metrics


@pytest.mark.parametrize("seed", range(6))
def test_average_precision_matches_sklearn_with_and_without_ties(seed):
  rng = np.random.default_rng(seed)
  n = int(rng.integers(5, 300))
  y = rng.random(n) < rng.uniform(0.1, 0.9)
  y[rng.integers(n)] = True
  scores = rng.normal(size=n) + y * rng.uniform(0, 2)
  if seed % 2:  # coarse scores: many ties, which sklearn counts as one threshold
    scores = np.round(scores, 1)
  assert metrics.average_precision(y, scores) == pytest.approx(
    average_precision_score(y, scores), abs=1e-12
  )


def test_average_precision_hand_cases():
  # positives at ranks 1 and 3: (1/1 + 2/3) / 2
  assert metrics.average_precision([1, 0, 1, 0], [0.9, 0.8, 0.7, 0.6]) == pytest.approx(5 / 6)
  # one tie group holding everything: precision 1/2 at recall 1
  assert metrics.average_precision([1, 0], [0.5, 0.5]) == pytest.approx(0.5)
  # positives last: (1/3 + 2/4) / 2
  assert metrics.average_precision([0, 0, 1, 1], [4, 3, 2, 1]) == pytest.approx(5 / 12)
  with pytest.raises(ValueError, match="positive"):
    metrics.average_precision([0, 0], [1, 2])


def test_precision_at_k_hand_cases_and_ties_by_index():
  y = np.array([0, 1, 1, 0, 1])
  scores = np.array([5.0, 4.0, 1.0, 3.0, 2.0])
  assert metrics.precision_at_k(y, scores, 1) == 0.0
  assert metrics.precision_at_k(y, scores, 2) == 0.5
  assert metrics.precision_at_k(y, scores) == pytest.approx(1 / 3)  # k = 3 positives
  # equal scores: the lower index ranks first
  assert metrics.precision_at_k([0, 1], [1.0, 1.0], 1) == 0.0
  assert metrics.precision_at_k([1, 0], [1.0, 1.0], 1) == 1.0
  with pytest.raises(ValueError, match="k must be"):
    metrics.precision_at_k(y, scores, 6)
  # synthetic_world's P@R is this function
  assert sw._precision_at_positives(y.astype(bool), scores) == metrics.precision_at_k(y, scores)


def test_category_codes_put_attribute_zero_first():
  labels = np.array([[1, 0, 1], [0, 0, 0], [1, 1, 1], [0, 1, 0]], bool)
  np.testing.assert_array_equal(metrics.category_codes(labels), [5, 0, 7, 2])


def test_category_curves_and_auc_hand_case():
  categories = np.array([0, 1, 0, 1])
  scores = np.array([4.0, 3.0, 2.0, 1.0])
  share = metrics.category_curves(scores, categories, 2)
  np.testing.assert_allclose(share[0], [1, 1 / 2, 2 / 3, 1 / 2])
  np.testing.assert_allclose(share[1], [0, 1 / 2, 1 / 3, 1 / 2])
  recall = metrics.category_curves(scores, categories, 2, normalize="recall")
  np.testing.assert_allclose(recall, [[0.5, 0.5, 1, 1], [0, 0.5, 0.5, 1]])
  auc = metrics.category_auc(scores, categories, 2)
  np.testing.assert_allclose(auc, [(1 + 1 / 2 + 2 / 3 + 1 / 2) / 4, (1 / 2 + 1 / 3 + 1 / 2) / 4])
  np.testing.assert_allclose(metrics.category_auc(scores, categories, 2, "recall"), [0.75, 0.5])


def test_category_curves_properties_and_batching():
  rng = np.random.default_rng(0)
  categories = rng.integers(0, 8, 200)
  scores = rng.normal(size=(3, 200))
  share = metrics.category_curves(scores, categories, 8)
  np.testing.assert_allclose(share.sum(axis=1), 1.0)  # shares of all categories sum to 1
  recall = metrics.category_curves(scores, categories, 8, "recall")
  np.testing.assert_allclose(recall[..., -1], 1.0)  # every category is fully retrieved at N
  auc = metrics.category_auc(scores, categories, 8)
  for w in range(3):
    np.testing.assert_allclose(auc[w], metrics.category_auc(scores[w], categories, 8))
  # retrieving category 3 first gives it the highest AUC
  first = np.where(categories == 3, 10.0, 0.0) + scores[0] * 1e-3
  assert metrics.category_auc(first, categories, 8).argmax() == 3
  with pytest.raises(ValueError, match="normalize"):
    metrics.category_curves(scores, categories, 8, "area")
  with pytest.raises(ValueError, match="categories must lie"):
    metrics.category_curves(scores, categories, 4)
