"""XAI metrics of App. E (mutual.xai) on constructed cases with known answers, and on the tiny
CLIP with the synthetic world's ground-truth object masks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stori_jax
from mutual import data, visual_prompts, xai

SIZE = 32


def _checker_scene(batch=3):
  """Left half: a 0/1 checkerboard (the "object"); right half: flat 0.5 (the "background").

  A stub scorer reads only the object's sharpness, so blurring the object removes the evidence
  and blurring the background removes none.
  """
  rows, cols = np.meshgrid(np.arange(SIZE), np.arange(SIZE), indexing="ij")
  left = cols < SIZE // 2
  image = np.where(left, ((rows + cols) % 2).astype(np.float32), 0.5)
  images = np.repeat(image[None, ..., None], 3, axis=-1).repeat(batch, axis=0)
  return images.astype(np.float32), np.broadcast_to(left, (batch, SIZE, SIZE))


def _sharpness_scorer(object_mask):
  """Class 0: 2 x mean |x - 0.5| over the object (1 sharp, about 0 blurred); class 1: 0.5."""
  mask = jnp.asarray(object_mask[0], jnp.float32)

  @jax.jit  # one program per batch shape (eagerly, one per op and shape)
  def scores(images):
    sharp = 2 * jnp.sum(jnp.abs(images[..., 0] - 0.5) * mask, axis=(1, 2)) / jnp.sum(mask)
    return jnp.stack([sharp, jnp.full_like(sharp, 0.5)], axis=1)

  def score(images):
    return np.asarray(scores(jnp.asarray(images)))

  return score


def _curves(order, valid=(True, True)):
  images, obj = _checker_scene()
  masks = np.stack([obj, ~obj], axis=1)[:, list(order)]  # [B, 2, H, W]
  batch = len(images)
  size, sigma = xai.blur_kernel(SIZE, 16.0)
  return xai.perturbation_curves(
    _sharpness_scorer(obj),
    images,
    masks,
    np.tile(np.array(valid), (batch, 1)),
    np.zeros(batch, int),
    np.zeros(batch, int),
    blur_size=size,
    blur_sigma=sigma,
  )


def test_object_first_explanation_wins_every_metric_with_the_known_values():
  """Concepts (object, background) vs (background, object): the curves and the four numbers are
  the ones worked out by hand."""
  good, bad = xai.summarize(_curves((0, 1))), xai.summarize(_curves((1, 0)))
  # Deletion: [1, ~0, ~0] -> 0.5; [1, 1, ~0] -> 1.5. Insertion: the reverse.
  assert good["deletion"] == pytest.approx(0.5, abs=0.05)
  assert bad["deletion"] == pytest.approx(1.5, abs=0.05)
  assert good["insertion"] == pytest.approx(1.5, abs=0.05)
  assert bad["insertion"] == pytest.approx(0.5, abs=0.05)
  np.testing.assert_allclose(good["curves"]["deletion"], [1, 0, 0], atol=0.1)
  # The accuracy curves are exact: class 0 wins while the object is sharp.
  assert good["curves"]["acc_drop"] == [1.0, 0.0, 0.0]
  assert (good["acc_drop"], bad["acc_drop"]) == (0.5, 1.5)
  assert (good["acc_increase"], bad["acc_increase"]) == (1.5, 0.5)
  for m in xai.METRICS:
    assert xai.BETTER[m] * (good[m] - bad[m]) > 0.9


def test_invalid_concepts_leave_the_image_as_it_was():
  c = _curves((0, 1), valid=(True, False))
  np.testing.assert_allclose(c.deletion[0], [1, 0, 0], atol=0.1)
  assert c.deletion[0, 1] == c.deletion[0, 2]
  c = _curves((0, 1), valid=(False, True))
  assert c.deletion[0, 1] == pytest.approx(1.0)  # background only: the object stays sharp


def test_curves_are_per_image_so_batching_changes_nothing():
  images, obj = _checker_scene(4)
  rng = np.random.default_rng(0)
  masks = rng.random((4, 3, SIZE, SIZE)) < 0.3
  valid = rng.random((4, 3)) < 0.8
  score = _sharpness_scorer(obj)
  kw = dict(blur_size=9, blur_sigma=3.0)
  labels = np.array([0, 1, 0, 1])
  whole = xai.perturbation_curves(score, images, masks, valid, labels, labels, **kw)
  parts = [
    xai.perturbation_curves(score, images[i : i + 1], masks[i : i + 1], valid[i : i + 1],
                            labels[i : i + 1], labels[i : i + 1], **kw)
    for i in range(4)
  ]  # fmt: skip
  joined = xai.Curves.concatenate(parts)
  np.testing.assert_allclose(whole.deletion, joined.deletion, atol=1e-6)
  np.testing.assert_allclose(whole.insertion, joined.insertion, atol=1e-6)
  np.testing.assert_array_equal(whole.insertion_correct, joined.insertion_correct)


def test_cumulative_masks_and_perturbed_images():
  rng = np.random.default_rng(1)
  masks = rng.random((2, 3, 5, 5)) < 0.4
  valid = np.array([[True, False, True], [True, True, True]])
  steps = np.asarray(xai.cumulative_masks(masks, valid))
  assert steps.shape == (2, 4, 5, 5) and not steps[:, 0].any()
  np.testing.assert_array_equal(steps[0, 2], masks[0, 0])  # the invalid concept adds nothing
  np.testing.assert_array_equal(steps[0, 3], masks[0, 0] | masks[0, 2])
  np.testing.assert_array_equal(steps[1, 3], masks[1].any(axis=0))
  images = rng.random((2, 5, 5, 3)).astype(np.float32)
  blurred = np.zeros_like(images)
  deleted = np.asarray(xai.perturbed_images(images, blurred, steps, "deletion"))
  inserted = np.asarray(xai.perturbed_images(images, blurred, steps, "insertion"))
  np.testing.assert_array_equal(deleted[:, 0], images)
  np.testing.assert_array_equal(inserted[:, 0], blurred)
  np.testing.assert_array_equal(deleted + inserted, np.repeat(images[:, None], 4, axis=1))
  with pytest.raises(ValueError, match="deletion"):
    xai.perturbed_images(images, blurred, steps, "zero")


def test_blur_reuses_the_visual_prompt_blur_and_fits_the_image():
  assert xai.blur_kernel(224, 16.0) == (97, 16.0)
  size, sigma = xai.blur_kernel(64, 16.0)
  assert size % 2 == 1 and size < 64 and sigma == pytest.approx(16 * 64 / 224)
  assert xai.blur_kernel(8, 100.0)[0] == 7  # capped below the image side
  x = np.random.default_rng(2).random((2, 16, 16, 3)).astype(np.float32)
  want = visual_prompts.gaussian_blur(jnp.asarray(x[1]), 7, 2.0)
  np.testing.assert_allclose(xai.blur_images(jnp.asarray(x), 7, 2.0)[1], want, atol=1e-6)


def test_auc_is_the_unit_spaced_trapezoid():
  curve = np.array([[1.0, 0.5, 0.25, 0.0], [2.0, 2.0, 2.0, 2.0]])
  np.testing.assert_allclose(xai.curve_auc(curve), np.trapezoid(curve, axis=-1))
  assert xai.curve_auc(curve)[1] == 6.0  # L s for a flat curve, L = 3


def test_importance_is_the_product_of_the_two_similarities():
  e = np.eye(4, dtype=np.float32)
  image = e[:1]  # [1, 4]

  # Concept 0: visual 0.9, textual 0.1 -> 0.09; concept 1: 0.6 x 0.6 = 0.36; concept 2 is the
  # best but invalid; concept 3: 0.5 x 0.5 = 0.25.
  def mix(c):
    return c * e[0] + np.sqrt(1 - c * c) * e[1]

  visual = np.stack([mix(0.9), mix(0.6), mix(1.0), mix(0.5)])[None] * 0.7  # not unit: fine
  textual = np.stack([mix(0.1), mix(0.6), mix(1.0), mix(0.5)])[None]
  valid = np.array([[True, True, False, True]])
  order, scores = xai.importance(image, visual, textual, valid)
  assert order.tolist() == [[1, 3, 0, 2]]
  np.testing.assert_allclose(scores[0, [0, 1, 3]], [0.09, 0.36, 0.25], atol=1e-5)
  assert scores[0, 2] == -np.inf


def test_random_order_is_a_seeded_permutation_with_valid_concepts_first():
  valid = jnp.array([[True, False, True, True, False]] * 50)
  order = np.asarray(xai.random_order(jax.random.PRNGKey(0), valid))
  assert all(sorted(o) == list(range(5)) for o in order)
  assert set(order[:, :3].ravel()) == {0, 2, 3} and set(order[:, 3:].ravel()) == {1, 4}
  assert len({tuple(o[:3]) for o in order}) > 3  # the orders vary
  np.testing.assert_array_equal(order, xai.random_order(jax.random.PRNGKey(0), valid))
  masks = np.arange(2 * 5 * 2).reshape(2, 5, 2)
  (taken,) = xai.reorder(order[:2], masks)
  np.testing.assert_array_equal(taken[0], masks[0][order[0]])


def test_table_rows_format():
  s = dict(deletion=2.4601, insertion=3.1682, acc_drop=1.582, acc_increase=1.849)
  text = xai.table_rows({"Ours (PCA)": s, "MM-CBM": s}, {"MM-CBM": True})
  assert "| Ours (PCA) | No | 2.460 | 3.168 | 1.582 | 1.849 |" in text
  assert "| MM-CBM | Yes |" in text


@pytest.fixture(scope="module")
def tiny():
  bundle = stori_jax.load("tiny-synthetic")
  cls = next(data.synthetic_classes(12, seed=3, classes=(2,)))
  return bundle, cls


def test_region_embeddings_match_the_analysis_concept_embeddings(tiny):
  """Disjoint regions prompted one by one embed as the analysis embeds a concept map."""
  bundle, cls = tiny
  images = cls.images[:3]
  maps = np.where(cls.truth.masks[:3] >= 0, 0, 1)  # concept 0: object, 1: background
  maps[:, :8] = -1
  want, valid = visual_prompts.concept_embeddings(bundle, images, maps, n_concepts=3)
  got = xai.region_embeddings(bundle, images, np.asarray(xai.label_masks(maps, 3)))
  np.testing.assert_allclose(got, want, atol=1e-4)  # batch composition moves float32 bits
  assert not valid[:, 2].any() and not got[:, 2].any()


def test_clip_scorer_does_not_depend_on_its_batches(tiny):
  """The scores are scale x cosine with the unit class embeddings, whatever the batching (the
  last batch is padded; all rows are scored in one product): equal to float32 rounding."""
  bundle, cls = tiny
  classes = np.random.default_rng(0).normal(size=(3, bundle.config.embed_dim)) * 4.0
  images = cls.images[:7].astype(np.float32) / 255
  got = xai.clip_scorer(bundle, classes, batch_size=3)(images)
  assert got.shape == (7, 3) and got.dtype == np.float32
  np.testing.assert_allclose(
    got, xai.clip_scorer(bundle, classes, batch_size=16)(images), atol=1e-6
  )
  pre = bundle.preprocess_config
  mean, std = np.asarray(pre.mean, np.float32), np.asarray(pre.std, np.float32)
  image = np.asarray(bundle.encode_image((images - mean) / std), np.float64)
  image /= np.linalg.norm(image, axis=1, keepdims=True)
  unit = classes / np.linalg.norm(classes, axis=1, keepdims=True)
  np.testing.assert_allclose(got, xai.SCORE_SCALE * image @ unit.T, atol=1e-6)
  assert xai.clip_scorer(bundle, classes)(images[:0]).shape == (0, 3)


def test_tiny_clip_object_explanation_beats_background_explanation(tiny):
  """On the tiny CLIP, blurring the ground-truth object lowers the predicted class's score more
  than blurring the background, and restoring it raises the score more."""
  bundle, cls = tiny
  from mutual import pipeline

  names = [c for c in data.synthetic_descriptors()]
  bank = pipeline.encode_bank(
    bundle, names, list(data.synthetic_descriptors().values()), ["x"], progress=False
  )
  score = xai.clip_scorer(bundle, bank.class_embeddings)
  obj = cls.truth.masks >= 0
  predicted = score(jnp.asarray(cls.images, jnp.float32) / 255).argmax(axis=1)
  labels = np.full(len(obj), cls.label)
  size, sigma = xai.blur_kernel(cls.images.shape[1])
  out = {}
  for name, mask in (("object", obj), ("background", ~obj)):
    c = xai.perturbation_curves(
      score, cls.images, mask[:, None], np.ones((len(obj), 1), bool), predicted, labels,
      blur_size=size, blur_sigma=sigma,
    )  # fmt: skip
    out[name] = xai.summarize(c)
  assert out["object"]["deletion"] < out["background"]["deletion"]
  assert out["object"]["insertion"] > out["background"]["insertion"]
  assert out["object"]["acc_drop"] <= out["background"]["acc_drop"]
