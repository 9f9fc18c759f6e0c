"""config.analysis.mode (issue 18): the mode -> stage resolution, the two PCA sign rules and the
reference's single random-start K-means, each against an independent implementation."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import sklearn
from sklearn.decomposition import PCA
from sklearn.preprocessing import MinMaxScaler
from sklearn.utils.extmath import svd_flip

from mutual import concepts, paper_config, pipeline
from mutual.ellipse import pixels
from stori_jax.plumbing.config_files import ConfigError

STAGES = ("ellipse", "crf_confidence", "pca_sign_rule", "kmeans_init", "crf_filter")


# ---------------------------------------------------------------------------------------------
# Mode resolution.


def test_each_mode_sets_every_stage():
  reference = paper_config.analysis_stages(paper_config.analysis_config(mode="reference"))
  assert reference == dict(
    ellipse="reference",
    crf_confidence=0.99,
    pca_sign_rule="sklearn<1.5",
    kmeans_init="random",
    crf_filter="lattice",
  )
  improved = paper_config.analysis_stages(paper_config.analysis_config(mode="improved"))
  assert improved == dict(
    ellipse="moments",
    crf_confidence=0.9,
    pca_sign_rule="sklearn>=1.5",
    kmeans_init="k-means++",
    crf_filter="exact",
  )
  assert set(paper_config.MODE_STAGES) == set(paper_config.ANALYSIS_MODES)
  default = paper_config.analysis_config()
  assert default.mode in paper_config.ANALYSIS_MODES
  assert all(default[key] is None for key in STAGES)  # None: the mode decides


def test_a_stage_set_alone_overrides_its_mode():
  analysis = paper_config.analysis_config(mode="reference")
  # Placeholders take a value of their type, as a --config.analysis.<key> override does.
  analysis.kmeans_init = "k-means++"
  analysis.crf_confidence = 0.95
  stages = paper_config.analysis_stages(analysis)
  assert stages == dict(
    ellipse="reference",
    crf_confidence=0.95,
    pca_sign_rule="sklearn<1.5",
    kmeans_init="k-means++",
    crf_filter="lattice",
  )
  improved = paper_config.analysis_config(mode="improved", ellipse="reference")
  assert paper_config.analysis_stages(improved)["ellipse"] == "reference"


def test_a_config_without_the_switch_takes_the_one_default_mode():
  # The mode analysis_config writes and the one a config without the key gets are one value.
  old = ml_collections.ConfigDict(dict(n_concepts=5))
  default = paper_config.ANALYSIS_DEFAULTS["mode"]
  assert default == paper_config.analysis_config().mode == "reference"
  assert paper_config.analysis_stages(old) == paper_config.MODE_STAGES[default]


@pytest.mark.parametrize(
  "overrides, message",
  [
    (dict(mode="paper"), r"mode must be one of \('reference', 'improved'\), got 'paper'"),
    (dict(ellipse="contour"), r"ellipse must be one of \('reference', 'moments'\)"),
    (dict(pca_sign_rule="v"), r"pca_sign_rule must be one of \('sklearn<1.5', 'sklearn>=1.5'\)"),
    (dict(kmeans_init="kmeans++"), r"kmeans_init must be one of \('random', 'k-means\+\+'\)"),
    (dict(crf_confidence=1.0), r"crf_confidence must be a number in \(0.5, 1\), got 1.0"),
  ],
)
def test_unknown_mode_or_stage_value_is_a_config_error(overrides, message):
  with pytest.raises(ConfigError, match=message):
    paper_config.analysis_stages(paper_config.analysis_config(**overrides))


def test_vision_side_checks_the_mode_before_any_work():
  images = np.zeros((1, 16, 16, 3), np.uint8)
  analysis = paper_config.analysis_config(mode="exact")
  with pytest.raises(ConfigError, match="mode must be one of"):
    pipeline.vision_side(None, images, None, analysis)  # no model needed to fail


def test_vision_side_passes_each_stage_on(tiny_synthetic, monkeypatch):
  """The resolved stages reach the CRF, the concept fits and the visual prompts."""
  seen = {}

  drawn = {}

  def refine(images, mask, **kwargs):
    seen["crf"] = kwargs
    drawn["images"] = np.asarray(images)
    return jnp.asarray(mask)

  def embeddings(bundle, images, maps_per_method, n_concepts, **kwargs):
    seen["prompts"] = dict(ellipse=kwargs["ellipse"])
    b = maps_per_method[0].shape[0]
    return [(jnp.zeros((b, n_concepts, 4)), jnp.ones((b, n_concepts), bool))] * len(maps_per_method)

  def pca(features, mask, n_concepts, sign_rule):
    seen["pca"] = sign_rule
    return jnp.zeros(mask.shape, jnp.int32)

  def kmeans(features, mask, n_concepts, seed, init):
    seen["kmeans"] = init
    return jnp.zeros(mask.shape, jnp.int32)

  monkeypatch.setattr(pipeline.crf, "refine", refine)
  monkeypatch.setattr(pipeline.visual_prompts, "concept_embeddings_of_maps", embeddings)
  monkeypatch.setattr(concepts, "pca_concepts", pca)
  monkeypatch.setattr(concepts, "kmeans_concepts", kmeans)
  bundle = tiny_synthetic
  size = bundle.preprocess_config.image_size
  images = np.random.default_rng(0).integers(0, 256, (2, size, size, 3), dtype=np.uint8)
  e = bundle.config.embed_dim
  bank = pipeline.TextBank(("a",), np.ones((1, e), np.float32), ("x", "y"), np.eye(2, e))
  for mode, stages in paper_config.MODE_STAGES.items():
    seen.clear()
    analysis = paper_config.analysis_config(mode=mode, joint_foreground=False)
    pipeline.vision_side(bundle, images, bank, analysis)
    expected = images
    if stages["crf_filter"] == "lattice":  # the reference's CRF: on its uint8 round trip
      mean, std = bundle.preprocess_config.mean, bundle.preprocess_config.std
      expected = np.asarray(pixels.reference_uint8(images, tuple(mean), tuple(std)))
      assert not np.array_equal(expected, images)  # the round trip changes pixels
    np.testing.assert_array_equal(drawn["images"], expected)
    assert seen == dict(
      crf=dict(confidence=stages["crf_confidence"], filter=stages["crf_filter"]),
      prompts=dict(ellipse=stages["ellipse"]),
      pca=stages["pca_sign_rule"],
      kmeans=stages["kmeans_init"],
    )


# ---------------------------------------------------------------------------------------------
# PCA sign rules.


def _data(seed=0, b=2, h=6, w=6, d=12):
  rng = np.random.default_rng(seed)
  features = rng.normal(size=(b, h, w, d)).astype(np.float32)
  features[..., :3] *= np.array([4.0, 3.0, 2.0], np.float32)  # clear gaps between the axes
  mask = rng.random((b, h, w)) < 0.7
  return features, mask


def _labels_from_scores(scores, mask):
  """min-max scaling over the foreground rows, argmax, -1 on background (as the reference)."""
  scaled = MinMaxScaler(clip=True).fit_transform(scores)
  labels = np.full(mask.size, -1)
  labels[mask.reshape(-1)] = scaled.argmax(axis=1)
  return labels.reshape(mask.shape)


def test_new_sign_rule_equals_the_installed_scikit_learn():
  major, minor = (int(v) for v in sklearn.__version__.split(".")[:2])
  assert (major, minor) >= (1, 5)  # the installed release flips by the components
  features, mask = _data()
  fg = features[mask].astype(np.float64)
  want = _labels_from_scores(PCA(n_components=5, svd_solver="full").fit_transform(fg), mask)
  got = concepts.pca_concepts(features, mask, n_concepts=5, sign_rule="sklearn>=1.5")
  np.testing.assert_array_equal(got, want)
  # The default is that rule.
  np.testing.assert_array_equal(concepts.pca_concepts(features, mask, n_concepts=5), want)


def _old_svd_flip(u, vt):
  """svd_flip(u_based_decision=True) written out: each column of u has its largest-|value|
  entry made positive, the matching row of vt flipped with it."""
  rows = np.argmax(np.abs(u), axis=0)
  signs = np.sign(u[rows, np.arange(u.shape[1])])
  return u * signs, vt * signs[:, None]


def test_old_sign_rule_equals_a_numpy_u_based_svd_flip():
  features, mask = _data()
  fg = features[mask].astype(np.float64)
  centred = fg - fg.mean(axis=0)
  u, s, vt = np.linalg.svd(centred, full_matrices=False)
  u, vt = _old_svd_flip(u[:, :5], vt[:5])
  # The written-out rule is scikit-learn's u-based one (its code path still exists).
  ref_u, ref_vt = svd_flip(*(a.copy() for a in np.linalg.svd(centred, full_matrices=False)[::2]))
  np.testing.assert_allclose(vt, ref_vt[:5])
  want = _labels_from_scores(u * s[:5], mask)  # PCA.transform before 1.5: U S
  got = concepts.pca_concepts(features, mask, n_concepts=5, sign_rule="sklearn<1.5")
  np.testing.assert_array_equal(got, want)
  x = jnp.asarray(features.reshape(-1, features.shape[-1]))
  _, components = concepts.pca_components(x, jnp.asarray(mask.reshape(-1)), 5, "sklearn<1.5")
  np.testing.assert_allclose(components, vt, atol=1e-4)


def test_the_sign_rules_disagree_on_some_axis_and_then_on_labels():
  """The case the switch exists for: at least one axis flips between the two rules, which
  changes the labels."""
  features, mask = _data()
  x = jnp.asarray(features.reshape(-1, features.shape[-1]))
  fg = jnp.asarray(mask.reshape(-1))
  _, old = concepts.pca_components(x, fg, 5, "sklearn<1.5")
  _, new = concepts.pca_components(x, fg, 5, "sklearn>=1.5")
  same = np.sign(np.sum(np.asarray(old) * np.asarray(new), axis=1))
  assert np.all(np.abs(same) == 1) and np.any(same < 0)
  a = concepts.pca_concepts(features, mask, 5, sign_rule="sklearn<1.5")
  b = concepts.pca_concepts(features, mask, 5, sign_rule="sklearn>=1.5")
  assert np.any(np.asarray(a) != np.asarray(b))


def test_unknown_sign_rule_or_init_is_refused():
  features, mask = _data()
  with pytest.raises(ValueError, match="sign_rule must be one of"):
    concepts.pca_concepts(features, mask, 3, sign_rule="svd")
  with pytest.raises(ValueError, match="init must be one of"):
    concepts.kmeans_concepts(features, mask, 3, init="kmeans++")


# ---------------------------------------------------------------------------------------------
# The reference's K-means.


def _pytorch_kmeans(x, centers, tol=1e-4, max_iter=500):
  """kmeans_pytorch's loop in numpy (no empty cluster expected): returns (labels, centers,
  iterations)."""
  centers = centers.astype(np.float64).copy()
  step = 0
  while True:
    d = ((x[:, None] - centers[None]) ** 2).sum(-1)
    labels = d.argmin(axis=1)
    previous = centers.copy()
    for j in range(len(centers)):
      assert np.any(labels == j)
      centers[j] = x[labels == j].mean(axis=0)
    shift = np.sqrt(((centers - previous) ** 2).sum(axis=1)).sum()
    step += 1
    if shift**2 < tol or step >= max_iter:
      return labels, centers, step


def _blobs(seed=0, n=120, d=8, k=4):
  rng = np.random.default_rng(seed)
  means = rng.normal(size=(k, d)) * 1.5
  x = means[rng.integers(0, k, n)] + rng.normal(size=(n, d))
  return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


# Jitted, as random_start_kmeans runs it (eagerly, a program per op; integer ops: the same rows).
random_start = jax.jit(concepts.random_start, static_argnums=2)


def _words(seed, size, k):
  return jnp.asarray(concepts.reference_words(seed, size, k))


def test_random_start_draws_distinct_foreground_rows():
  weights = np.zeros(50, bool)
  weights[::3] = True
  for seed in range(5):
    rows = np.asarray(random_start(_words(seed, 50, 5), jnp.asarray(weights), 5))
    assert len(set(rows.tolist())) == 5 and np.all(weights[rows])
    # np.random.choice over the foreground rows, as kmeans_pytorch draws from its tokens.
    np.random.seed(seed)
    np.testing.assert_array_equal(rows, np.flatnonzero(weights)[np.random.choice(17, 5, False)])


def test_kmeans_pytorch_loop_equals_a_numpy_implementation():
  x = _blobs()
  weights = np.ones(len(x), bool)
  words = _words(3, len(x), 4)
  start = np.asarray(random_start(words, jnp.asarray(weights), 4))
  want_labels, want_centers, steps = _pytorch_kmeans(x.astype(np.float64), x[start])
  assert steps > 1  # the loop did move the centres
  centers, labels = concepts.kmeans_pytorch_loop(
    words, jnp.asarray(x), jnp.asarray(weights), jnp.asarray(x[start])
  )
  np.testing.assert_array_equal(labels, want_labels)
  np.testing.assert_allclose(centers, want_centers, atol=1e-5)
  # An iteration limit stops it early, with the assignments of the last iteration.
  one_labels, _, _ = _pytorch_kmeans(x.astype(np.float64), x[start], max_iter=1)
  _, labels = concepts.kmeans_pytorch_loop(
    words, jnp.asarray(x), jnp.asarray(weights), jnp.asarray(x[start]), 1e-4, 1
  )
  np.testing.assert_array_equal(labels, one_labels)


def test_background_rows_neither_start_nor_move_a_cluster():
  x = _blobs(1)
  weights = np.ones(len(x), bool)
  weights[::4] = False
  noisy = x.copy()
  noisy[~weights] = 100.0  # far-off background rows would drag any centre they joined
  words = _words(2, len(x), 3)
  a_centers, _ = concepts.random_start_kmeans(words, jnp.asarray(noisy), jnp.asarray(weights), 3)
  rows = np.asarray(random_start(words, jnp.asarray(weights), 3))
  _, want, _ = _pytorch_kmeans(x[weights].astype(np.float64), x[rows])
  np.testing.assert_allclose(a_centers, want, atol=1e-5)


def test_reference_kmeans_concepts_are_seeded():
  features, mask = _data(2)
  a = concepts.kmeans_concepts(features, mask, 4, seed=5, init="random")
  np.testing.assert_array_equal(a, concepts.kmeans_concepts(features, mask, 4, 5, init="random"))
  a = np.asarray(a)
  assert np.all((a == -1) == ~mask) and set(np.unique(a[mask])) <= set(range(4))


def test_cli_takes_stage_overrides_and_refuses_a_bad_mode_before_claiming(tmp_path, run_command):
  """--config.analysis.<stage> overrides parse into the typed None fields, and a bad mode stops
  the command (exit 2, one paragraph) before the workdir is claimed or a model loads."""
  from mutual import analyze  # pylint: disable=import-outside-toplevel

  config = "configs/mutual_synthetic.py:smoke"
  done = run_command(
    analyze,
    "--config",
    config,
    f"--workdir={tmp_path / 'out'}",
    "--config.analysis.mode=paper",
    "--config.analysis.crf_confidence=0.95",
    "--config.analysis.kmeans_init=k-means++",
  )
  assert done.returncode == 2 and "Traceback" not in done.stderr
  assert "config.analysis.mode must be one of ('reference', 'improved')" in done.stderr
  assert not (tmp_path / "out").exists()
  done = run_command(
    analyze,
    "--config",
    config,
    f"--workdir={tmp_path / 'out'}",
    "--config.analysis.pca_sign_rule=sklearn",
  )
  assert done.returncode == 2 and "pca_sign_rule must be one of" in done.stderr
