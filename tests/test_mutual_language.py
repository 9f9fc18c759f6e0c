"""Language-side stages of the mutual-knowledge analysis against plain numpy / scipy versions."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from mutual import data, descriptors, information, transport

SHARED_DESCRIPTORS = "/work/shared/data/descriptors"

# The library's per-image functions jitted, as the pipeline runs them (inside jitted batch
# functions): called eagerly, they compiled a program per op and shape.
masked_median = jax.jit(descriptors._masked_median)
reference_plan = jax.jit(transport.reference_plan)
ott_plan = jax.jit(transport.ott_plan)
choice_entropy = jax.jit(transport.choice_entropy)
top_descriptors = jax.jit(transport.top_descriptors, static_argnames="top")
importance_order = jax.jit(information.importance_order)
match_table = jax.jit(information.match_table)
mutual_information = jax.jit(information.mutual_information, static_argnames="formula")


# ---------------------------------------------------------------------------------------------
# numpy versions, written the straightforward way (per image, python sets and loops).


def np_candidates(scores, valid, image, k, rule, offset=0.02):
  common = None
  for row, ok in zip(scores, valid):
    if ok:
      top = set(np.argsort(-row, kind="stable")[:k].tolist())
      common = top if common is None else common & top
  common = np.array(sorted(common or []), int)
  if rule == "none" or not len(common):
    keep = common
  elif rule == "mean":
    keep = common[image[common] > image[common].mean() - offset]
  else:
    keep = common[image[common] > np.median(image[common]) + offset]
  out = np.zeros(scores.shape[1], bool)
  out[keep] = True
  return out


def np_sinkhorn(scores, scale=2.5, iterations=1000):
  p = np.exp(scale * scores.astype(np.float64))
  for _ in range(iterations):
    p /= p.sum(axis=1, keepdims=True)
    p /= p.sum(axis=0, keepdims=True)
  return p


def np_reference_mi(x, y):
  """The reference's get_intersection: log N + log M + joint entropy of the normalised table."""
  table = np.array([[1.0 if a == b else 0.0 for b in y] for a in x])
  if table.sum() == 0:
    return 0.0
  p = table / table.sum()
  return np.log(len(x)) + np.log(len(y)) - np.sum(p * np.log(p + 1e-9))


def np_deletion_curve(x, y):
  """The reference's get_deletion_score with a dummy id."""
  x = list(x)
  scores = [np_reference_mi(x, y)]
  for i in range(len(x)):
    x[i] = -12345
    scores.append(np_reference_mi(x, y))
  return scores


# ---------------------------------------------------------------------------------------------
# Descriptor scoring.


def test_unique_descriptors_keeps_first_seen_order():
  bank = {"a": ["red", "round", "red"], "b": ["blue", "round"], "c": ["tall"]}
  assert descriptors.unique_descriptors(bank) == ["red", "round", "blue", "tall"]


@pytest.mark.parametrize("rule", ["mean", "median", "none"])
def test_candidates_match_numpy(rule):
  rng = np.random.default_rng(0)
  b, l, d, k = 4, 5, 60, 25
  # A shared component makes the top-k sets overlap, as concepts of one image do.
  shared = rng.normal(size=(b, 1, d))
  scores = (shared + 0.5 * rng.normal(size=(b, l, d))).astype(np.float32)
  valid = np.ones((b, l), bool)
  valid[1, 3:] = False  # padded concepts do not restrict the intersection
  image = rng.normal(0.2, 0.05, size=(b, d)).astype(np.float32)
  got = np.asarray(descriptors.select_candidates(scores, valid, image, k=k, rule=rule))
  for i in range(b):
    want = np_candidates(scores[i], valid[i], image[i], k, rule)
    np.testing.assert_array_equal(got[i], want)
  assert got.sum() > 0
  if rule == "median":  # the paper's rule keeps fewer than half of the intersection
    both = np.asarray(descriptors.select_candidates(scores, valid, image, k=k, rule="none"))
    assert np.all(got.sum(1) <= both.sum(1) / 2 + 1)


def test_candidates_without_valid_concepts_are_empty():
  scores = np.ones((1, 3, 10), np.float32)
  got = descriptors.select_candidates(scores, np.zeros((1, 3), bool), np.ones((1, 10)), k=4)
  assert not np.asarray(got).any()


def test_masked_median_matches_numpy():
  rng = np.random.default_rng(1)
  for n in (1, 2, 7, 8):
    values = rng.normal(size=20).astype(np.float32)
    mask = np.zeros(20, bool)
    mask[rng.choice(20, n, replace=False)] = True
    got = float(masked_median(values, mask))
    assert got == pytest.approx(float(np.median(values[mask])), abs=1e-6)


def test_relevance_rule_is_checked():
  with pytest.raises(ValueError, match="relevance rule"):
    descriptors.relevance_filter(jnp.ones(3, bool), jnp.ones(3), rule="mode")


def test_language_concepts_match_argsort():
  rng = np.random.default_rng(2)
  classes = rng.normal(size=(6, 16)).astype(np.float32)
  bank = rng.normal(size=(40, 16)).astype(np.float32)
  bank /= np.linalg.norm(bank, axis=1, keepdims=True)
  predicted = np.array([3, 0, 3, 5])
  ids, values = descriptors.language_concepts(classes, bank, predicted, u=7)
  for row, c in enumerate(predicted):
    want = np.argsort(-(bank @ classes[c]))[:7]
    np.testing.assert_array_equal(np.asarray(ids[row]), want)
    np.testing.assert_allclose(np.asarray(values[row]), (bank @ classes[c])[want], rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# Optimal transport.


def test_reference_plan_matches_numpy_loop():
  rng = np.random.default_rng(3)
  scores = rng.uniform(0.1, 0.35, size=(5, 30)).astype(np.float32)
  got = reference_plan(scores, np.ones(5, bool), np.ones(30, bool))
  np.testing.assert_allclose(np.asarray(got), np_sinkhorn(scores), rtol=1e-4, atol=1e-7)


def test_masked_plans_equal_the_plans_of_the_valid_block():
  rng = np.random.default_rng(4)
  scores = rng.uniform(0.1, 0.35, size=(5, 30)).astype(np.float32)
  rows = np.array([True, True, False, True, True])
  cols = rng.random(30) < 0.5
  block = scores[rows][:, cols]
  ref = np.asarray(reference_plan(scores, rows, cols))
  np.testing.assert_allclose(ref[rows][:, cols], np_sinkhorn(block), rtol=1e-4, atol=1e-7)
  assert np.all(ref[~rows] == 0) and np.all(ref[:, ~cols] == 0)
  ott = np.asarray(ott_plan(scores, rows, cols))
  assert np.all(np.isfinite(ott)) and np.all(ott[~rows] == 0) and np.all(ott[:, ~cols] == 0)


@pytest.mark.parametrize("seed", range(5))
def test_ott_and_reference_agree_at_convergence(seed):
  """Both are diag(u) K diag(v) of the same kernel: proportional plans, the same top 3."""
  rng = np.random.default_rng(seed)
  scores = rng.uniform(0.1, 0.35, size=(2, 5, 40)).astype(np.float32)
  valid = np.ones((2, 5), bool)
  cand = rng.random((2, 40)) < 0.7
  ref = np.asarray(reference_plan(scores[0], valid[0], cand[0]))
  ott = np.asarray(ott_plan(scores[0], valid[0], cand[0]))
  np.testing.assert_allclose(ott / float(ott.sum()), ref / float(ref.sum()), atol=1e-5)
  a, va = transport.concept_descriptors(scores, valid, cand, solver="ott")
  b, vb = transport.concept_descriptors(scores, valid, cand, solver="reference")
  np.testing.assert_array_equal(np.asarray(va), np.asarray(vb))
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_ot_diversifies_concepts_that_share_a_favourite():
  """Without OT every concept takes the descriptors all of them score highest; OT spreads them
  (App. A.2): the entropy diagnostic rises. A reference loop stopped after 0 rounds is plain
  top-k, so it differs from the converged plan exactly here."""
  rng = np.random.default_rng(5)
  popular = np.array([2.0, 1.9, 1.8] + [0.0] * 27, np.float32)
  scores = (popular[None] + rng.uniform(0, 0.8, size=(5, 30))).astype(np.float32)[None]
  valid, cand = jnp.ones((1, 5), bool), jnp.ones((1, 30), bool)
  raw, raw_ok = transport.concept_descriptors(scores, valid, cand, use_ot=False)
  ot, ot_ok = transport.concept_descriptors(scores, valid, cand, solver="ott")
  ref, _ = transport.concept_descriptors(scores, valid, cand, solver="reference")
  early, _ = transport.concept_descriptors(scores, valid, cand, solver="reference", iterations=0)
  np.testing.assert_array_equal(np.asarray(ot), np.asarray(ref))
  np.testing.assert_array_equal(np.asarray(early), np.asarray(raw))
  assert np.all(np.sort(np.asarray(raw)[0], axis=1) == [0, 1, 2])
  h_raw = float(choice_entropy(raw[0], raw_ok[0]))
  h_ot = float(choice_entropy(ot[0], ot_ok[0]))
  assert h_raw == pytest.approx(np.log(3), abs=1e-5)
  assert h_ot > h_raw + 0.5


def test_single_concept_ties_go_to_the_best_raw_scores_for_both_solvers():
  """One valid concept: the plan's row is uniform over the candidates (all ties); both solvers
  then take the concept's best-scoring candidates."""
  rng = np.random.default_rng(8)
  scores = jnp.asarray(rng.uniform(0.1, 0.35, size=(1, 5, 30)).astype(np.float32))
  valid = jnp.zeros((1, 5), bool).at[0, 2].set(True)
  cand = jnp.asarray(rng.random((1, 30)) < 0.5)
  want = np.argsort(-np.where(np.asarray(cand[0]), np.asarray(scores[0, 2]), -np.inf))[:3]
  for solver in transport.SOLVERS:
    ids, ok = transport.concept_descriptors(scores, valid, cand, solver=solver)
    np.testing.assert_array_equal(np.asarray(ids)[0, 2], want)
    assert np.asarray(ok)[0].sum() == 3


def test_top_descriptors_with_fewer_candidates_than_top():
  scores = np.random.default_rng(6).normal(size=(3, 8)).astype(np.float32)
  cols = np.zeros(8, bool)
  cols[[1, 6]] = True
  rows = np.array([True, True, False])
  ids, ok = top_descriptors(scores, rows, cols, top=3)
  assert np.asarray(ok).sum(1).tolist() == [2, 2, 0]
  assert set(np.asarray(ids)[0, :2].tolist()) == {1, 6}


def test_choice_entropy_matches_scipy():
  ids = jnp.array([[4, 7, 9], [4, 8, 9], [4, 1, 2]])
  valid = jnp.array([[True, True, True], [True, True, False], [True, False, False]])
  picks = np.asarray(ids)[np.asarray(valid)]
  _, counts = np.unique(picks, return_counts=True)
  assert float(choice_entropy(ids, valid)) == pytest.approx(scipy.stats.entropy(counts))


def test_solver_is_checked():
  with pytest.raises(ValueError, match="solver"):
    transport.concept_descriptors(
      jnp.ones((1, 2, 4)), jnp.ones((1, 2), bool), jnp.ones((1, 4), bool), solver="lp"
    )


# ---------------------------------------------------------------------------------------------
# Mutual information.


@pytest.mark.parametrize(
  "x, y, k",
  [
    ([1, 2, 3], [2, 3, 4, 5], 2),
    ([7, 8, 9, 10, 11], [11], 1),
    ([1, 2], [1, 2], 2),
    ([1, 2, 3], [4, 5], 0),
  ],
)
def test_mi_formulas_on_hand_made_tables(x, y, k):
  table = np.asarray(match_table(np.asarray(x), np.ones(len(x), bool), np.asarray(y)))
  assert float(table.sum()) == k
  n, m = len(x), len(y)
  ref = float(mutual_information(table, n, m, "reference"))
  eq1 = float(mutual_information(table, n, m, "eq1"))
  tab = float(mutual_information(table, n, m, "table"))
  assert ref == pytest.approx(np_reference_mi(x, y), abs=1e-5)
  if k:
    assert ref == pytest.approx(np.log(n * m * k), abs=1e-5)
    assert eq1 == pytest.approx(np.log(n * m / k), abs=1e-5)
    p = np.asarray(table) / k
    want = scipy.stats.entropy(p.sum(1)) + scipy.stats.entropy(p.sum(0)) - np.log(k)
    assert tab == pytest.approx(want, abs=1e-5)
    assert tab == pytest.approx(np.log(k), abs=1e-5)
  else:
    assert ref == eq1 == tab == 0.0


def test_mi_formula_is_checked():
  with pytest.raises(ValueError, match="formula"):
    information.mutual_information(jnp.ones((2, 2)), 2, 2, "shannon")


def test_mi_curves_match_the_reference_deletion_loop():
  rng = np.random.default_rng(7)
  n_max, m = 15, 12
  lengths = [15, 9, 4]
  ids, valid, lang, want = [], [], [], []
  for n in lengths:
    x = rng.choice(40, n, replace=False)
    y = rng.choice(40, m, replace=False)
    ids.append(np.pad(x, (0, n_max - n), constant_values=0))
    valid.append(np.arange(n_max) < n)
    lang.append(y)
    want.append(np_deletion_curve(x.tolist(), y.tolist()))
  curves = np.asarray(information.mi_curves(np.stack(ids), np.stack(valid), np.stack(lang)))
  assert curves.shape == (3, n_max + 1)
  for row, (n, w) in enumerate(zip(lengths, want)):
    np.testing.assert_allclose(curves[row, : n + 1], w, atol=1e-5)
    assert np.all(curves[row, n + 1 :] == 0)
    assert information.curve_auc(curves[row], n + 1) == pytest.approx(np.mean(w), abs=1e-5)
  mean = information.mean_curve(curves, [n + 1 for n in lengths])
  padded = np.zeros((3, 16))
  for row, w in enumerate(want):
    padded[row, : len(w)] = w
  np.testing.assert_allclose(mean, padded.mean(0), atol=1e-5)


def test_importance_order_drops_duplicates_and_sorts_by_image_score():
  ids = np.array([[5, 2, 9], [2, 7, 0], [3, 3, 3]], np.int32)
  valid = np.array([[True, True, True], [True, True, False], [False, False, False]])
  image = np.linspace(0.0, 1.0, 10).astype(np.float32)  # score = id / 9
  order, keep, scores = importance_order(ids, valid, image)
  n = int(keep.sum())
  assert np.asarray(order)[:n].tolist() == [9, 7, 5, 2]
  assert not np.asarray(keep)[n:].any()
  np.testing.assert_allclose(np.asarray(scores)[:n], np.array([9, 7, 5, 2]) / 9, rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# Descriptor files.


def test_missing_descriptor_file_names_the_url_and_place(tmp_path):
  path = tmp_path / "descriptors_imagenet.json"
  with pytest.raises(FileNotFoundError) as info:
    data.load_descriptors(path, "imagenet")
  message = str(info.value)
  assert data.descriptors_url("imagenet") in message and str(path) in message


def test_bad_descriptor_file_is_refused(tmp_path):
  path = tmp_path / "bad.json"
  path.write_text(json.dumps({"a": "not a list"}))
  with pytest.raises(ValueError, match="descriptor file"):
    data.load_descriptors(path)


def test_download_failure_is_a_clear_error(tmp_path):
  with pytest.raises(FileNotFoundError, match="Could not download"):
    data.download_descriptors("food101", tmp_path, url="http://127.0.0.1:9/none.json", timeout=2)


@pytest.mark.skipif(
  not os.path.isfile(os.path.join(SHARED_DESCRIPTORS, "descriptors_imagenet.json")),
  reason="Menon & Vondrick's ImageNet descriptors are not in /work/shared/data (not shipped).",
)
def test_real_imagenet_descriptors_give_the_papers_bank_size():
  bank = data.load_descriptors(os.path.join(SHARED_DESCRIPTORS, "descriptors_imagenet.json"))
  assert len(bank) == 1000
  assert len(descriptors.unique_descriptors(bank)) == 4229  # paper Sec. 3: D = 4,229


def test_class_stream_prefetched_yields_the_same_classes_and_errors():
  """Reading ahead on a thread changes neither the classes, their order, nor the count; an
  error while reading surfaces where its class would have come."""
  stream = data.ClassStream(iter(range(5)), 5).prefetched(2)
  assert len(stream) == 5 and list(stream) == [0, 1, 2, 3, 4]

  def failing():
    yield 0
    raise OSError("unreadable image")

  stream = data.ClassStream(failing(), 2).prefetched()
  assert next(stream) == 0
  with pytest.raises(OSError, match="unreadable image"):
    next(stream)
