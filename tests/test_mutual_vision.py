"""Mutual-knowledge vision side: features, prominent patches, concepts, visual prompts, CRF.

Each JAX stage is checked against a plain numpy / scipy / scikit-learn version on small inputs,
and the pipeline against the synthetic world's ground-truth object masks.
"""

import jax
import numpy as np
import pytest
from scipy import ndimage
from sklearn.cluster import KMeans
from sklearn.decomposition import PCA
from sklearn.metrics import adjusted_rand_score

import stori_jax
from mutual import concepts, crf, foreground, visual_prompts
from mutual.features import embeddings_and_patches, image_embeddings, patch_features
from stori_jax.data import synthetic

EIGHT = np.ones((3, 3), int)


@pytest.fixture(scope="module")
def bundle():
  return stori_jax.load("tiny-synthetic")  # shipped in stori_jax/assets


@pytest.fixture(scope="module")
def world(bundle):
  """48 synthetic images, their token features and ground-truth object patches."""
  batch = synthetic.generate(48, 1)
  pixels = bundle.preprocess(list(batch.images))
  features = np.asarray(patch_features(bundle, pixels, "tokens"))
  grid = features.shape[1]
  cell = batch.images.shape[1] // grid
  objects = batch.masks >= 0
  # An object patch: at least a quarter of its pixels belong to an object.
  object_patches = objects.reshape(len(batch), grid, cell, grid, cell).mean((2, 4)) >= 0.25
  return batch, pixels, features, object_patches


def iou(a, b):
  """Intersection over union of bool masks; two empty masks agree (1)."""
  union = (a | b).sum()
  return (a & b).sum() / union if union else 1.0


# ---------------------------------------------------------------------------------------------
# Features.


def test_patch_features_match_image_details(bundle):
  pixels = bundle.preprocess(list(synthetic.generate(2, 0).images))
  _, details = bundle.image_details(pixels)
  grid = bundle.config.vision.image_size // bundle.config.vision.patch_size
  width = bundle.config.vision.width
  tokens = np.asarray(patch_features(bundle, pixels, "tokens"))
  keys = np.asarray(patch_features(bundle, pixels, "keys"))
  assert tokens.shape == keys.shape == (2, grid, grid, width)
  np.testing.assert_array_equal(tokens.reshape(2, -1, width), details["patch_tokens"])
  np.testing.assert_array_equal(keys.reshape(2, -1, width), np.asarray(details["keys"])[:, 1:])
  # Raster order: patch (r, c) is the conv1 output at row r, column c.
  assert not np.allclose(tokens, keys)
  embedded = np.asarray(image_embeddings(bundle, pixels))
  np.testing.assert_allclose(np.linalg.norm(embedded, axis=-1), 1.0, rtol=1e-5)
  # One tower pass gives both, unchanged.
  for kind, expected in (("tokens", tokens), ("keys", keys)):
    both, patches = embeddings_and_patches(bundle, pixels, kind)
    np.testing.assert_array_equal(both, embedded)
    np.testing.assert_array_equal(patches, expected)
  with pytest.raises(ValueError, match="kind"):
    patch_features(bundle, pixels, "values")


# ---------------------------------------------------------------------------------------------
# Prominent patches.


def test_connected_components_match_scipy():
  masks = np.random.default_rng(0).random((24, 9, 11)) < 0.45
  labels = np.asarray(foreground.connected_components(masks))
  for mask, ours in zip(masks, labels):
    expected, _ = ndimage.label(mask, structure=EIGHT)
    np.testing.assert_array_equal(ours, expected)


def reference_main_regions(mask, min_second=5):
  labels, count = ndimage.label(mask, structure=EIGHT)
  if count == 0:
    return np.zeros_like(mask)
  sizes = np.bincount(labels.ravel())[1:]
  order = np.argsort(-sizes, kind="stable")
  keep = labels == order[0] + 1
  if count > 1 and sizes[order[1]] >= min_second:
    keep |= labels == order[1] + 1
  return keep


def test_main_regions_match_scipy():
  rng = np.random.default_rng(1)
  masks = rng.random((40, 8, 8)) < rng.uniform(0.1, 0.6, (40, 1, 1))
  masks[0] = False  # an empty mask stays empty
  ours = np.asarray(foreground.main_regions(masks, min_second=5))
  for mask, got in zip(masks, ours):
    np.testing.assert_array_equal(got, reference_main_regions(mask))
  only_largest = np.asarray(foreground.main_regions(masks, keep_second=False))
  assert (only_largest.sum((1, 2)) <= ours.sum((1, 2))).all()


def test_fiedler_vector_matches_numpy_svd():
  features = np.random.default_rng(2).normal(size=(3, 5, 6, 12)).astype(np.float32)
  flat = features.reshape(-1, 12)
  flat = flat / np.linalg.norm(flat, axis=1, keepdims=True)
  second = np.linalg.svd(flat, full_matrices=False)[0][:, 1]
  if 0.5 < (second > 0).mean() < 1:
    second = -second
  ours = np.asarray(foreground.fiedler_vector(features)).ravel()
  np.testing.assert_allclose(ours, second, atol=1e-4)
  assert (ours > 0).mean() <= 0.5
  # It is the second eigenvector of the affinity f f^T.
  affinity = flat @ flat.T
  values = np.linalg.eigvalsh(affinity)[::-1]
  np.testing.assert_allclose(affinity @ ours, values[1] * ours, atol=1e-3)
  raw = np.asarray(foreground.prominent_patches(features, largest_only=False))
  np.testing.assert_array_equal(raw.ravel(), second > 0)
  # joint=False splits each image on its own.
  single = np.asarray(foreground.prominent_patches(features, largest_only=False, joint=False))
  for i in range(3):
    alone = foreground.prominent_patches(features[i : i + 1], largest_only=False)
    np.testing.assert_array_equal(single[i], np.asarray(alone)[0])


def _cosine_distance(a, b):
  a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
  return 1.0 - abs(a @ b) / (np.linalg.norm(a) * np.linalg.norm(b))


def _exact_second(features, center=False):
  """float64 numpy: the second left singular vector of the unit (optionally centred) rows."""
  flat = np.asarray(features, np.float64).reshape(-1, features.shape[-1])
  if center:
    flat = flat - flat.mean(0)
  flat = flat / np.linalg.norm(flat, axis=1, keepdims=True)
  return np.linalg.svd(flat, full_matrices=False)[0][:, 1]


@pytest.mark.slow  # about a minute: the embedded world through both splits
def test_gram_split_equals_the_svd_split(world):
  """The Gram solver's second vector is the SVD's to 1e-5 cosine distance, its error bound holds,
  and the masks are identical, downstream of the region selection too: on the embedded world's
  tokens and keys (joint and per image, N > D) and on random features with N < D and N > D."""
  _, pixels, tokens, _ = world
  keys = np.asarray(patch_features(stori_jax.load("tiny-synthetic"), pixels[:16], "keys"))
  rng = np.random.default_rng(3)
  cases = [
    tokens,
    tokens[:16],
    keys,
    rng.normal(size=(4, 7, 7, 200)),
    rng.normal(size=(3, 5, 6, 12)),
  ]
  decided, oks = [], []
  for features in cases:
    features = np.asarray(features, np.float32)
    for center in (False, True):
      gram, bound = foreground.fiedler_pair(features, center=center, solver="gram")
      svd, _ = foreground.fiedler_pair(features, center=center, solver="svd")
      assert _cosine_distance(gram, svd) <= 1e-5
      # The bound is a bound (on sin of the angle to the float64 vector).
      exact = _exact_second(features, center)
      sine = np.sqrt(max(0.0, 1 - (1 - _cosine_distance(gram, exact)) ** 2))
      assert sine <= float(bound) + 1e-6
      decided.append(float(bound) <= foreground.GRAM_TOLERANCE)
      if decided[-1]:
        np.testing.assert_array_equal(np.asarray(gram) > 0, np.asarray(svd) > 0)
      for joint in (True, False):
        options = dict(center=center, joint=joint)
        _, ok = foreground.sign_split(features, solver="gram", **options)
        oks += list(np.asarray(ok))
        np.testing.assert_array_equal(
          foreground.prominent_patches(features, solver="gram", **options),
          foreground.prominent_patches(features, solver="svd", **options),
        )
  # The SVD is the exception (undecided signs: exactly half the patches positive).
  assert np.mean(decided) >= 0.8 and np.mean(oks) >= 0.8
  with pytest.raises(ValueError, match="solver"):
    foreground.prominent_patches(tokens, solver="qr")


def test_gram_split_leaves_undecided_signs_to_the_svd():
  """On 2 x 2 grids many per-image splits put two patches on each side (or all four on one),
  where the reference's sign rule keeps whatever sign the SVD returned: those go to the SVD, so
  every mask is the SVD's."""
  features = np.random.default_rng(6).normal(size=(64, 2, 2, 48)).astype(np.float32)
  _, ok = foreground.sign_split(features, center=False, joint=False, solver="gram")
  svd, _ = foreground.sign_split(features, center=False, joint=False, solver="svd")
  decided = np.isin(np.asarray(svd).reshape(64, 4).sum(1), (1, 3))
  assert 0 < decided.sum() < 64
  np.testing.assert_array_equal(ok, decided)
  for largest_only in (True, False):
    np.testing.assert_array_equal(
      foreground.prominent_patches(features, joint=False, largest_only=largest_only),
      foreground.prominent_patches(features, joint=False, largest_only=largest_only, solver="svd"),
    )


def test_gram_split_falls_back_to_the_svd_where_the_vector_is_ill_determined():
  """Degenerate top eigenvalues (three orthogonal directions in equal shares) leave the second
  vector undetermined: the bound is infinite and the split is the SVD's, joint and per image;
  a well-determined image in the same batch keeps the Gram split."""
  degenerate = np.zeros((2, 3, 4, 8), np.float32)
  for i in range(12):
    degenerate.reshape(2, 12, 8)[:, i, i % 3] = 1.0
  _, bound = foreground.fiedler_pair(degenerate, solver="gram")
  assert not float(bound) <= foreground.GRAM_TOLERANCE
  np.testing.assert_array_equal(
    foreground.fiedler_vector(degenerate), foreground.fiedler_pair(degenerate, solver="svd")[0]
  )
  mixed = np.concatenate([degenerate, np.random.default_rng(4).normal(size=(1, 3, 4, 8))])
  mixed = mixed.astype(np.float32)
  _, ok = foreground.sign_split(mixed, center=False, joint=False, solver="gram")
  np.testing.assert_array_equal(ok, [False, False, True])
  for joint in (True, False):
    np.testing.assert_array_equal(
      foreground.prominent_patches(mixed, joint=joint, largest_only=False),
      foreground.prominent_patches(mixed, joint=joint, largest_only=False, solver="svd"),
    )


@pytest.mark.parametrize("shape", [(3, 5, 6, 12), (2, 2, 2, 48), (4, 7, 7, 200)])
def test_split_batched_across_sets_equals_each_set_alone(shape):
  """Issue 41: M feature sets of one shape (models' patch features) split as one batched
  eigendecomposition: each set's second eigenvector is its own within 1e-5 (both sides of the
  Gram matrix: N <= D and N > D), its error bound the same, and every mask (main regions and
  raw split jointly, per image) equal to the set's own `prominent_patches`."""
  sets = np.random.default_rng(sum(shape)).normal(size=(3, *shape)).astype(np.float32)
  vectors, bounds = jax.vmap(lambda f: foreground.fiedler_pair(f, solver="gram"))(sets)
  assert vectors.shape == (3, *shape[:3]) and bounds.shape == (3,)
  for m, features in enumerate(sets):
    alone, bound = foreground.fiedler_pair(features, solver="gram")
    np.testing.assert_allclose(vectors[m], alone, atol=1e-5)
    if np.isfinite(float(bound)):
      assert float(bounds[m]) == pytest.approx(float(bound), rel=1e-3, abs=1e-6)
    else:
      assert not np.isfinite(float(bounds[m]))
  for options in (dict(joint=True), dict(joint=True, largest_only=False), dict(joint=False)):
    batched = np.asarray(foreground.prominent_patches_across(sets, **options))
    assert batched.shape == (3, *shape[:3]) and batched.dtype == bool
    for m, features in enumerate(sets):
      np.testing.assert_array_equal(
        batched[m], foreground.prominent_patches(features, **options), err_msg=str(options)
      )


def test_split_batched_across_sets_keeps_each_sets_svd_fallback():
  """A set whose second vector is ill-determined (degenerate top eigenvalues) batched with a
  well-determined one: the degenerate set gets the SVD's split, as alone, and the other keeps
  its Gram split (the fallback is chosen per image, not for the whole batch)."""
  degenerate = np.zeros((2, 3, 4, 8), np.float32)
  for i in range(12):
    degenerate.reshape(2, 12, 8)[:, i, i % 3] = 1.0
  regular = np.random.default_rng(4).normal(size=(2, 3, 4, 8)).astype(np.float32)
  sets = np.stack([regular, degenerate])
  _, ok = jax.vmap(lambda f: foreground.sign_split(f, center=False, joint=True))(sets)
  np.testing.assert_array_equal(ok, [[True, True], [False, False]])
  for joint in (True, False):
    batched = foreground.checked_split_across(sets, center=False, joint=joint)
    for m, features in enumerate(sets):
      np.testing.assert_array_equal(
        batched[m], foreground.checked_split(features, center=False, joint=joint)
      )
  np.testing.assert_array_equal(
    foreground.checked_split_across(sets, center=False, joint=True)[1],
    foreground.sign_split(degenerate, center=False, joint=True, solver="svd")[0],
  )
  with pytest.raises(ValueError, match=r"\[M, B, h, w, D\]"):
    foreground.prominent_patches_across(regular)


def test_prominent_patches_find_the_objects(world):
  batch, _, features, objects = world
  chance = objects.mean()
  # The tiny model's shared direction hides the objects from the joint second eigenvector, but
  # each image's own split finds them (readme_mutual_vision.md has the numbers).
  mask = np.asarray(foreground.prominent_patches(features, joint=False))
  precision = (mask & objects).sum() / mask.sum()
  recall = (mask & objects).sum() / objects.sum()
  assert precision > 2.5 * chance, (precision, chance)
  assert recall > 0.7, recall
  assert iou(mask, objects) > 2.5 * iou(np.ones_like(objects), objects)
  # Per image at most two 8-connected regions.
  for m in mask:
    assert ndimage.label(m, structure=EIGHT)[1] <= 2


def test_upsample_mask():
  mask = np.array([[[True, False], [False, True]]])
  up = np.asarray(foreground.upsample_mask(mask, 4))
  np.testing.assert_array_equal(up[0], np.kron(mask[0], np.ones((2, 2))).astype(bool))


# ---------------------------------------------------------------------------------------------
# Concepts.


def test_pca_concepts_match_sklearn():
  rng = np.random.default_rng(3)
  features = rng.normal(size=(3, 6, 6, 16)).astype(np.float32)
  mask = rng.random((3, 6, 6)) < 0.6
  ours = np.asarray(concepts.pca_concepts(features, mask, n_concepts=5))
  scores = PCA(5).fit_transform(features[mask])
  scores = (scores - scores.min(0)) / (scores.max(0) - scores.min(0))
  np.testing.assert_array_equal(ours[mask], scores.argmax(1))
  assert (ours[~mask] == -1).all() and ours.dtype == np.int32


def test_kmeans_concepts_match_sklearn():
  rng = np.random.default_rng(4)
  mask = rng.random((3, 6, 6)) < 0.7
  # Separated clusters: the same partition as scikit-learn and as the truth.
  centers = rng.normal(size=(5, 16)) * 3
  truth = rng.integers(0, 5, size=(3, 6, 6))
  features = (centers[truth] + 0.3 * rng.normal(size=(3, 6, 6, 16))).astype(np.float32)
  ours = np.asarray(concepts.kmeans_concepts(features, mask, n_concepts=5, seed=0))
  unit = features[mask] / np.linalg.norm(features[mask], axis=1, keepdims=True)
  theirs = KMeans(5, n_init=10, random_state=0).fit(unit)
  assert adjusted_rand_score(theirs.labels_, ours[mask]) == 1.0
  assert adjusted_rand_score(truth[mask], ours[mask]) == 1.0
  assert (ours[~mask] == -1).all()
  # Unstructured data: a local optimum about as good as scikit-learn's, deterministic by seed.
  noise = rng.normal(size=(3, 6, 6, 16)).astype(np.float32)
  labels = np.asarray(concepts.kmeans_concepts(noise, mask, seed=7))
  np.testing.assert_array_equal(labels, concepts.kmeans_concepts(noise, mask, seed=7))
  unit = noise[mask] / np.linalg.norm(noise[mask], axis=1, keepdims=True)
  inertia = sum(
    ((unit[labels[mask] == k] - unit[labels[mask] == k].mean(0)) ** 2).sum() for k in range(5)
  )
  assert inertia <= 1.05 * KMeans(5, n_init=10, random_state=0).fit(unit).inertia_


def test_concepts_land_on_the_objects(world):
  _, _, features, objects = world
  mask = np.asarray(foreground.prominent_patches(features, joint=False))
  for fit in (concepts.pca_concepts, concepts.kmeans_concepts):
    labels = np.asarray(fit(features, mask, n_concepts=5))
    np.testing.assert_array_equal(labels >= 0, mask)
    # Some concepts are object parts: mostly object patches (chance: objects.mean() = 0.11);
    # the others share the foreground's overshoot onto the background next to the objects.
    on_object = [(objects[labels == k]).mean() for k in range(5) if (labels == k).any()]
    assert len(on_object) == 5
    assert max(on_object) > 0.5, (fit.__name__, on_object)
    assert sorted(on_object)[-2] > 2.5 * objects.mean(), (fit.__name__, on_object)


# ---------------------------------------------------------------------------------------------
# Visual prompts.


def test_moment_ellipse_recovers_a_drawn_ellipse():
  rows, cols = np.mgrid[0:64, 0:64]
  center, (a, b), angle = np.array([30.0, 25.0]), (20.0, 8.0), np.deg2rad(30)
  u = (rows - center[0]) * np.cos(angle) + (cols - center[1]) * np.sin(angle)
  v = -(rows - center[0]) * np.sin(angle) + (cols - center[1]) * np.cos(angle)
  region = (u / a) ** 2 + (v / b) ** 2 <= 1
  got_center, shape, valid = visual_prompts.fit_ellipse(region)
  assert bool(valid)
  np.testing.assert_allclose(got_center, center, atol=0.2)
  np.testing.assert_allclose(np.sqrt(np.linalg.eigvalsh(np.asarray(shape))), (b, a), rtol=0.05)
  inside, _ = visual_prompts.ellipse_geometry(got_center, shape, 64, 64)
  assert iou(np.asarray(inside), region) > 0.95


def test_render_prompts():
  rng = np.random.default_rng(5)
  images = rng.random((2, 32, 32, 3)).astype(np.float32)
  maps = np.full((2, 8, 8), -1, np.int32)
  maps[0, 2:5, 1:6] = 0
  maps[0, 7, 7] = 0  # a stray patch: the ellipse goes round the largest region only
  maps[1, 6, 6] = 2
  prompted, valid = visual_prompts.render_prompts(images, maps, n_concepts=3)
  prompted, valid = np.asarray(prompted), np.asarray(valid)
  assert prompted.shape == (2, 3, 3, 32, 32, 3)
  np.testing.assert_array_equal(valid, [[True, False, False], [False, False, True]])
  main = np.zeros((8, 8), bool)
  main[2:5, 1:6] = True
  region = np.kron(main, np.ones((4, 4))).astype(bool)
  everything, _ = visual_prompts.render_prompts(images, maps, 3, largest_region=False)
  assert not np.allclose(everything[0, 0], prompted[0, 0])
  center, shape, _ = visual_prompts.fit_ellipse(region)
  inside, distance = map(np.asarray, visual_prompts.ellipse_geometry(center, shape, 32, 32))
  plain = (distance > 1.5)[..., None]  # away from the stroke
  outline, gray, blurred = prompted[0, 0]
  # A one-pixel red stroke on the boundary, blended by pixel coverage; the rest untouched.
  alpha = np.clip(1.0 - distance, 0.0, 1.0)[..., None]
  np.testing.assert_allclose(outline, (1 - alpha) * images[0] + alpha * [1.0, 0.0, 0.0], atol=1e-5)
  assert (alpha > 0.75).sum() >= 16 and (alpha == 0).mean() > 0.8
  luma = images[0] @ np.array([0.299, 0.587, 0.114])
  keep = plain[..., 0] & ~inside
  np.testing.assert_allclose(gray[keep], np.repeat(luma[keep][:, None], 3, 1), atol=1e-6)
  np.testing.assert_allclose(gray[plain[..., 0] & inside], images[0][plain[..., 0] & inside])
  # OpenCV's 11x11 Gaussian (sigma 2, mirrored borders) is scipy's with radius 5.
  expected = ndimage.gaussian_filter(images[0], (2, 2, 0), mode="mirror", truncate=2.5)
  np.testing.assert_allclose(blurred[keep], expected[keep], atol=1e-5)
  # Absent concepts render the plain image.
  np.testing.assert_array_equal(prompted[0, 1], np.broadcast_to(images[0], (3, 32, 32, 3)))


def test_concept_embeddings(bundle):
  batch = synthetic.generate(2, 6)
  maps = np.full((2, 8, 8), -1, np.int32)
  maps[0, 1:4, 1:4], maps[0, 5:7, 4:8], maps[1, 2:6, 2:6] = 0, 1, 1
  embeddings, valid = visual_prompts.concept_embeddings(bundle, batch.images, maps, n_concepts=2)
  embeddings, valid = np.asarray(embeddings), np.asarray(valid)
  assert embeddings.shape == (2, 2, bundle.config.embed_dim)
  np.testing.assert_array_equal(valid, [[True, True], [False, True]])
  assert (embeddings[1, 0] == 0).all()
  # By hand: the three prompts, normalised with the bundle's mean/std, each L2-normalised.
  prompted, _ = visual_prompts.render_prompts(batch.images / np.float32(255), maps, 2)
  mean, std = np.asarray(bundle.preprocess_config.mean), np.asarray(bundle.preprocess_config.std)
  own = np.asarray(bundle.encode_image(((np.asarray(prompted[0, 1]) - mean) / std)))
  own = own / np.linalg.norm(own, axis=1, keepdims=True)
  np.testing.assert_allclose(embeddings[0, 1], own.mean(0), atol=1e-5)
  assert np.linalg.norm(embeddings[0, 1]) < 1.0  # averaged, not re-normalised
  # bundle.preprocess output gives the same with normalized=True.
  again, _ = visual_prompts.concept_embeddings(
    bundle, bundle.preprocess(list(batch.images)), maps, n_concepts=2, normalized=True
  )
  np.testing.assert_allclose(again, embeddings, atol=1e-4)
  with pytest.raises(ValueError, match="normalized=True"):
    visual_prompts.concept_embeddings(bundle, bundle.preprocess(list(batch.images)), maps, 2)


# ---------------------------------------------------------------------------------------------
# Dense CRF.


def test_appearance_filter_is_the_dense_sum():
  rng = np.random.default_rng(7)
  features = rng.normal(size=(6, 7, 5)).astype(np.float32)
  values = rng.random((6, 7, 2)).astype(np.float32)
  flat = features.reshape(-1, 5)
  kernel = np.exp(-0.5 * ((flat[:, None] - flat[None]) ** 2).sum(-1))
  expected = (kernel @ values.reshape(-1, 2)).reshape(6, 7, 2)
  for dense_entries in (0, 2**25):  # kernel rebuilt in blocks / built once
    got = crf.appearance_operator(features, 1, 16, dense_entries)(values)
    np.testing.assert_allclose(got, expected, rtol=1e-4)
  # Pooled keys: 2 x 2 cells (the 7th column pads), each standing for its pixels.
  pooled = crf.appearance_operator(features, 2, 16, 0)(values)
  np.testing.assert_allclose(pooled, crf.appearance_operator(features, 2)(values), rtol=1e-5)
  cells = [(r, c) for r in range(0, 6, 2) for c in range(0, 7, 2)]
  by_hand = np.zeros_like(expected)
  for r, c in cells:
    mean = features[r : r + 2, c : c + 2].reshape(-1, 5).mean(0)
    total = values[r : r + 2, c : c + 2].reshape(-1, 2).sum(0)
    by_hand += np.exp(-0.5 * ((features - mean) ** 2).sum(-1))[..., None] * total
  np.testing.assert_allclose(pooled, by_hand, rtol=1e-4)
  positions = np.stack(np.mgrid[0:6, 0:7], -1).reshape(-1, 2).astype(np.float32)
  spatial = np.exp(-((positions[:, None] - positions[None]) ** 2).sum(-1) / (2 * 1.5**2))
  np.testing.assert_allclose(
    crf.smoothness_filter(values, 1.5),
    (spatial @ values.reshape(-1, 2)).reshape(6, 7, 2),
    rtol=1e-4,
  )


def two_colour_case(size):
  rng = np.random.default_rng(8)
  image = np.zeros((1, size, size, 3), np.uint8)
  image[..., 0] = 40
  image[:, :, size // 2 :] = (200, 60, 60)
  truth = np.zeros((1, size, size), bool)
  truth[:, :, size // 2 :] = True
  noisy = truth.copy()
  noisy[:, :, size // 2 - size // 8 : size // 2] = True  # a patch-sized overshoot
  noisy ^= rng.random(noisy.shape) < 0.1
  return image, noisy, truth


def test_crf_snaps_a_noisy_mask_to_the_colour_edge():
  image, noisy, truth = two_colour_case(32)
  refined = np.asarray(crf.refine(image, noisy))
  assert iou(noisy, truth) < 0.8
  assert iou(refined, truth) > 0.98
  # Pooled keys (the large-image path) do the same.
  pooled = np.asarray(crf.refine(image, noisy, max_keys=256))
  assert crf.pooling_factor(32, 32, 256) == 2
  assert iou(pooled, truth) > 0.98
  with pytest.raises(ValueError, match="uint8"):
    crf.refine(image.astype(np.float32), noisy)


def test_crf_matches_pydensecrf(world):
  densecrf = pytest.importorskip(
    "pydensecrf.densecrf", reason="pydensecrf (pip install pydensecrf2) gives the reference"
  )
  from pydensecrf.utils import unary_from_labels

  batch, _, features, _ = world
  images = batch.images[:12]
  patches = foreground.prominent_patches(features[:12], joint=False)
  masks = np.asarray(foreground.upsample_mask(patches, images.shape[1]))
  ours = np.asarray(crf.refine(images, masks))
  size = images.shape[1]
  ious, kept = [], 0
  for image, mask, got in zip(images, masks, ours):
    model = densecrf.DenseCRF2D(size, size, 2)
    model.setUnaryEnergy(
      np.ascontiguousarray(unary_from_labels(mask.astype(np.int64), 2, 0.9, zero_unsure=False))
    )
    model.addPairwiseGaussian(sxy=3, compat=3)
    model.addPairwiseBilateral(sxy=40, srgb=13, rgbim=np.ascontiguousarray(image), compat=10)
    q = np.array(model.inference(5)).reshape(2, size, size)
    ious.append(iou(got, q[1] > q[0]))
    kept += (q[1] > q[0]).any()
  assert kept >= 8  # the reference keeps a foreground in most images: a real comparison
  assert min(ious) > 0.95 and np.mean(ious) > 0.98, ious


def test_the_svd_fallback_compiles_nothing_new():
  """A batch that needs the SVD's split after one that did not runs the same program (the
  fallback is a branch on the device, not a host decision)."""
  features = np.random.default_rng(6).normal(size=(64, 2, 2, 48)).astype(np.float32)
  _, ok = foreground.sign_split(features, center=False, joint=False, solver="gram")
  ok = np.asarray(ok)
  decided, undecided = features[ok][:4], features[~ok][:4]
  assert len(decided) == len(undecided) == 4
  foreground.prominent_patches(decided, joint=False)
  programs = foreground.checked_split._cache_size()
  foreground.prominent_patches(undecided, joint=False)
  assert foreground.checked_split._cache_size() == programs
