"""Synthetic-world evaluation: zero-shot, retrieval and the emphasis (Table 3) experiment."""

import jax
import numpy as np
import pytest
from sklearn.metrics import average_precision_score

import stori_jax
from stori_jax.data import synthetic
from stori_jax.world_evaluation import metrics as sw
from stori_jax.models import CLIPConfig, TextConfig, VisionConfig
from stori_jax.models.clip import param_shapes
from stori_jax.data.preprocess import PreprocessConfig
from stori_jax.tokenizer import default_tokenizer, tokenize_weighted, word_weights

# ---------------------------------------------------------------------------------------------
# A stub bundle with hand-made embeddings.

STUB_FAMILIES = ("colour", "shape", "pattern", "size", "position")
_OFFSETS = np.cumsum([0] + [len(synthetic.VOCABULARIES[f]) for f in STUB_FAMILIES])
STUB_DIM = int(_OFFSETS[-1])


def attribute_vector(values):
  """Concatenated one-hots of one object's attribute values {family: name}."""
  v = np.zeros(STUB_DIM, np.float32)
  for i, f in enumerate(STUB_FAMILIES):
    v[_OFFSETS[i] + synthetic.VOCABULARIES[f].index(values[f])] = 1.0
  return v


def attribute_text_fn(salience=None):
  """Text embedding: salience[family] * word weight on the one-hot of each attribute word."""
  salience = salience or {}
  lookup = {}
  for i, f in enumerate(STUB_FAMILIES):
    for k, value in enumerate(synthetic.VOCABULARIES[f]):
      word = value if f == "position" else synthetic.attribute_words(f, value)[0]
      lookup[word] = (_OFFSETS[i] + k, salience.get(f, 1.0))

  def fn(ids_row, words):
    del ids_row
    v = np.zeros(STUB_DIM, np.float32)
    for word, weight in words:
      if word in lookup:
        index, scale = lookup[word]
        v[index] += scale * weight
    return v

  return fn


class StubBundle:
  """The bundle interface of `synthetic_world` with hand-made embeddings.

  Images are looked up by their pixels (unknown images, e.g. batch padding, embed to 0);
  texts are turned into (word, weight) pairs by the real tokenizer and given to text_fn.
  """

  def __init__(self, image_table, text_fn, image_size=64):
    self.image_table = image_table
    self.text_fn = text_fn
    self.preprocess_config = PreprocessConfig(image_size)
    self.config = CLIPConfig(
      embed_dim=8,
      text=TextConfig(width=8, layers=1, heads=1),
      vision=VisionConfig(image_size=image_size, patch_size=16, width=8, layers=1, heads=1),
    )
    self.tokenizer = default_tokenizer()
    self.dim = len(next(iter(image_table.values())))
    self.method_calls = []

  def tokenize(self, texts, with_weights=False):
    if with_weights:
      return tokenize_weighted(self.tokenizer, texts, context_length=77)
    return self.tokenizer(texts, context_length=77)

  def encode_text(self, ids, weights=None, start_block=None, method="stori"):
    del start_block
    self.method_calls.append(method)
    ids = np.asarray(ids)
    weights = np.ones(ids.shape, np.float32) if weights is None else np.asarray(weights)
    return np.stack(
      [self.text_fn(row, word_weights(self.tokenizer, row, w)) for row, w in zip(ids, weights)]
    )

  def encode_image(self, images):
    mean = np.asarray(self.preprocess_config.mean, np.float32)
    std = np.asarray(self.preprocess_config.std, np.float32)
    pixels = np.rint((np.asarray(images) * std + mean) * 255).astype(np.uint8)
    return np.stack(
      [self.image_table.get(p.tobytes(), np.zeros(self.dim, np.float32)) for p in pixels]
    )


def attribute_table(batch, vectors=None):
  """{pixels: attribute one-hots of slot 0} for a single-object SyntheticBatch."""
  table = {}
  for i in range(len(batch)):
    values = {f: synthetic.VOCABULARIES[f][int(batch.labels(f)[i, 0])] for f in STUB_FAMILIES}
    table[batch.images[i].tobytes()] = attribute_vector(values) if vectors is None else vectors[i]
  return table


# ---------------------------------------------------------------------------------------------
# Metric plumbing with the stub.


def test_zero_shot_perfect_stub_is_exact():
  batch = sw.zero_shot_batch(160, sw.ZERO_SHOT_SEED)
  stub = StubBundle(attribute_table(batch), attribute_text_fn())
  result = sw.zero_shot_attributes(stub, n_images=160, batch_size=64)
  assert set(result["accuracy"]) == set(sw.ZERO_SHOT_FAMILIES)
  for family, accuracy in result["accuracy"].items():
    assert accuracy == 1.0, family
    matrix = np.array(result["confusion"][family]["matrix"])
    assert matrix.sum() == 160 and np.trace(matrix) == 160
    assert matrix.shape == (len(synthetic.VOCABULARIES[family]),) * 2
    # Rows are true classes.
    np.testing.assert_array_equal(
      matrix.sum(1), np.bincount(batch.labels(family)[:, 0], minlength=len(matrix))
    )


def test_zero_shot_shuffled_stub_is_at_chance():
  n = 400
  batch = sw.zero_shot_batch(n, sw.ZERO_SHOT_SEED)
  true_vectors = np.stack(list(attribute_table(batch).values()))
  shuffled = true_vectors[np.random.default_rng(0).permutation(n)]
  stub = StubBundle(attribute_table(batch, shuffled), attribute_text_fn())
  result = sw.zero_shot_attributes(stub, n_images=n, families=("colour", "shape", "pattern"))
  for family in ("colour", "shape", "pattern"):
    assert abs(result["accuracy"][family] - result["chance"][family]) < 0.08, (
      family,
      result["accuracy"][family],
    )


def test_retrieval_perfect_stub_has_recall_one():
  n = 48
  batch = sw.retrieval_batch(n, sw.RETRIEVAL_SEED)
  assert len(set(batch.captions)) == n  # so that "perfect" is well defined
  eye = np.eye(n, dtype=np.float32)
  tokenizer = default_tokenizer()
  caption_index = {
    tuple(row[row != 0].tolist()): i
    for i, row in enumerate(tokenizer(batch.captions, context_length=77))
  }
  image_table = {batch.images[i].tobytes(): eye[i] for i in range(n)}
  stub = StubBundle(
    image_table, lambda ids, words: eye[caption_index[tuple(ids[ids != 0].tolist())]]
  )
  result = sw.retrieval_recall(stub, n_pairs=n, ks=(1, 5), batch_size=20)
  for direction in ("text_to_image", "image_to_text"):
    assert result[direction] == {"R@1": 1.0, "R@5": 1.0}
    assert result["median_rank"][direction] == 1.0
  assert result["unique_captions"] == n

  # A stub that pairs caption i with image i + 1 gets R@1 = 0 in both directions.
  shifted = {batch.images[i].tobytes(): eye[(i + 1) % n] for i in range(n)}
  result = sw.retrieval_recall(StubBundle(shifted, stub.text_fn), n_pairs=n, ks=(1,))
  assert result["text_to_image"]["R@1"] == 0.0 and result["image_to_text"]["R@1"] == 0.0


def test_positive_ranks_break_ties_by_index():
  scores = np.array([[1.0, 1.0, 0.0], [1.0, 1.0, 2.0], [0.0, 0.0, 0.0]])
  np.testing.assert_array_equal(sw._positive_ranks(scores), [0, 2, 2])


def _emphasis_stub(n_triples, images_per_category, salience):
  table = {}
  for t, triple in enumerate(sw.emphasis_triples(n_triples, sw.EMPHASIS_SEED)):
    scenes, _ = sw.emphasis_scenes(triple, images_per_category)
    table.update(attribute_table(synthetic.render(scenes, (*sw.EMPHASIS_SEED, t))))
  return StubBundle(table, attribute_text_fn(salience))


def _plain_ap(y_true, scores):
  """AP without ties: the mean over positives of the precision at each positive's rank."""
  hits = y_true[np.argsort(-scores)]
  return float(np.mean((np.cumsum(hits) / np.arange(1, len(hits) + 1))[hits]))


# Chosen so that every family's ranking changes at w = 0.5 and at w = 1.5, without ties.
SALIENCE = {"colour": 1.0, "pattern": 0.7, "shape": 0.55}


def test_emphasis_ap_matches_hand_computation():
  stub = _emphasis_stub(1, 1, SALIENCE)
  weights = (0.5, 1.0, 1.5)
  result = sw.emphasis_effect(
    stub, n_triples=1, images_per_category=1, weights=weights, methods=("stori",)
  )
  triple = sw.emphasis_triples(1, sw.EMPHASIS_SEED)[0]
  _, positives = sw.emphasis_scenes(triple, 1)
  # Image k of the 8 matches the prompt in the families where its category bit is 0;
  # similarity is proportional to sum over matching families of salience * weight.
  match = {f: positives[f].astype(float) for f in sw.EMPHASIS_FAMILIES}
  ap = result["triples"][0]["ap"]["stori"]
  for family in sw.EMPHASIS_FAMILIES:
    for w in weights:
      scores = sum(
        SALIENCE[f] * (w if f == family else 1.0) * match[f] for f in sw.EMPHASIS_FAMILIES
      )
      expected = _plain_ap(positives[family], scores)
      assert ap[family][repr(w)] == pytest.approx(expected, abs=1e-9), (family, w)
  # Worked by hand: colour at w=1 ranks + + + - + - - -  ->  (1 + 1 + 1 + 4/5) / 4.
  assert ap["colour"]["1.0"] == pytest.approx(0.95)
  # Shape (salience 0.55) at w=1 ranks + - + + - - + -  ->  (1 + 2/3 + 3/4 + 4/7) / 4.
  assert ap["shape"]["1.0"] == pytest.approx((1 + 2 / 3 + 3 / 4 + 4 / 7) / 4)
  # sklearn agrees (there are no ties here).
  assert ap["colour"]["1.5"] == pytest.approx(
    average_precision_score(
      positives["colour"], np.array([2.75, 2.2, 2.05, 1.5, 1.25, 0.7, 0.55, 0.0])
    )
  )
  # P@R = 1 whenever AP = 1.
  assert result["triples"][0]["p_at_r"]["stori"]["colour"]["1.5"] == 1.0


def test_emphasis_moves_ap_in_the_expected_direction():
  stub = _emphasis_stub(4, 2, SALIENCE)
  result = sw.emphasis_effect(stub, n_triples=4, images_per_category=2)
  assert set(result["methods"]) == {"stori", "prompt_weighting"}
  assert set(stub.method_calls) == {"stori", "prompt_weighting"}
  for method in result["methods"].values():
    mean, delta = method["ap"]["mean"], method["ap"]["delta_mean"]
    for family in list(sw.EMPHASIS_FAMILIES) + ["overall"]:
      assert mean[family]["0.5"] < mean[family]["1.0"] < mean[family]["1.5"], family
      assert delta[family]["0.5"] < 0 < delta[family]["1.5"]
      assert delta[family]["1.0"] == 0.0


def test_emphasis_triples_and_prompts():
  triples = sw.emphasis_triples(30, (7, 7))
  assert triples == sw.emphasis_triples(30, (7, 7))
  assert len({(t["colour"][0], t["pattern"][0], t["shape"][0]) for t in triples}) == 30
  for t in triples:
    assert t["pattern"][0] != "plain"
    for f in sw.EMPHASIS_FAMILIES:
      assert t[f][0] != t[f][1]
  triple = {
    "colour": ("orange", "red"),
    "pattern": ("checkered", "plain"),
    "shape": ("star", "moon"),
  }
  assert sw.emphasis_prompt(triple) == "a photo of an orange checkered star"
  assert sw.emphasis_prompt(triple, "pattern", 1.5) == "a photo of an orange (checkered:1.5) star"
  assert sw.emphasis_prompt(triple, "colour", 1.0) == sw.emphasis_prompt(triple)
  scenes, positives = sw.emphasis_scenes(triple, 3)
  assert len(scenes) == 24 and all(p.sum() == 12 for p in positives.values())
  assert scenes[0][0] == synthetic.ObjectSpec(shape="star", colour="orange", pattern="checkered")
  with pytest.raises(ValueError):
    sw.emphasis_triples(10**4)


def test_zero_shot_prompts_mention_class_and_context():
  prompts, n_classes, per_class = sw.zero_shot_prompts("pattern")
  assert (n_classes, per_class) == (4, 64) and len(prompts) == 256
  assert prompts[0] == "a red plain circle" and prompts[64] == "a red striped circle"
  prompts, n_classes, per_class = sw.zero_shot_prompts("colour")
  assert prompts[8:10] == ["an orange circle", "an orange square"]
  assert sw.zero_shot_prompts("position")[0][0] == "a red circle on the left"


# ---------------------------------------------------------------------------------------------
# End to end on a tiny random-weight CLIP.

TINY = CLIPConfig(
  embed_dim=16,
  text=TextConfig(context_length=64, width=32, layers=2, heads=2),
  vision=VisionConfig(image_size=64, patch_size=16, width=32, layers=2, heads=2),
)


def _random_params(config, seed):
  """Random params from the shapes alone (no compiled init: keeps the test fast)."""
  rng = np.random.default_rng(seed)

  def fill(path, leaf):
    name = str(getattr(path[-1], "key", path[-1]))
    if name == "logit_scale":
      return np.full(leaf.shape, np.log(1 / 0.07), np.float32)
    if name == "scale":
      return (1.0 + 0.1 * rng.standard_normal(leaf.shape)).astype(np.float32)
    return (0.05 * rng.standard_normal(leaf.shape)).astype(np.float32)

  return jax.tree_util.tree_map_with_path(fill, param_shapes(config))


@pytest.fixture(scope="module")
def tiny_bundle():
  return stori_jax.CLIPBundle(
    config=TINY, params=_random_params(TINY, seed=1), preprocess_config=PreprocessConfig(64)
  )


def _in_unit_interval(tree):
  if isinstance(tree, dict):
    return all(_in_unit_interval(v) for v in tree.values())
  return 0.0 <= tree <= 1.0


def test_end_to_end_on_tiny_random_bundle(tiny_bundle):
  # Batch size 16 throughout: one compiled image encoder, few text encoders.
  results = sw.evaluate(
    tiny_bundle, n_images=48, n_pairs=16, n_triples=2, images_per_category=1, batch_size=16
  )
  zero = results["zero_shot"]
  assert set(zero["accuracy"]) == set(sw.ZERO_SHOT_FAMILIES)
  assert _in_unit_interval(zero["accuracy"])
  assert all(np.sum(zero["confusion"][f]["matrix"]) == 48 for f in sw.ZERO_SHOT_FAMILIES)
  retrieval = results["retrieval"]
  assert _in_unit_interval(retrieval["text_to_image"]) and _in_unit_interval(
    retrieval["image_to_text"]
  )
  assert set(retrieval["text_to_image"]) == {"R@1", "R@5", "R@10"}
  assert retrieval["text_to_image"]["R@10"] >= retrieval["text_to_image"]["R@1"]
  emphasis = results["emphasis"]
  for method in sw.METHODS:
    summary = emphasis["methods"][method]["ap"]
    assert set(summary["mean"]) == set(sw.EMPHASIS_FAMILIES) | {"overall"}
    assert _in_unit_interval(summary["mean"])
    assert set(summary["mean"]["overall"]) == {"0.5", "1.0", "1.5"}
  # w = 1 is the plain prompt for both methods.
  assert emphasis["methods"]["stori"]["ap"]["mean"]["overall"]["1.0"] == pytest.approx(
    emphasis["methods"]["prompt_weighting"]["ap"]["mean"]["overall"]["1.0"], abs=1e-6
  )
  assert len(emphasis["triples"]) == 2
  text = sw.markdown_tables(results)
  for heading in (
    "Zero-shot",
    "Retrieval",
    "SToRI",
    "prompt weighting",
    "| **overall** |",
    "AP w=1.5",
    "Δ w=0.5",
  ):
    assert heading in text
  import json

  json.dumps(results)  # JSON-serialisable


# ---------------------------------------------------------------------------------------------
# The shipped model meets the thresholds.


def _tiny_synthetic():
  return stori_jax.load("tiny-synthetic")  # shipped in stori_jax/assets


@pytest.mark.slow
def test_tiny_synthetic_colour_shape_and_emphasis_signs():
  bundle = _tiny_synthetic()
  zero = sw.zero_shot_attributes(bundle, n_images=1000, families=("colour", "shape"))
  assert zero["accuracy"]["colour"] >= 0.90, zero["accuracy"]
  assert zero["accuracy"]["shape"] >= 0.90, zero["accuracy"]
  emphasis = sw.emphasis_effect(bundle, n_triples=24, images_per_category=8, methods=("stori",))
  means = emphasis["methods"]["stori"]["ap"]["mean"]
  for family in ("overall", "colour", "pattern", "shape"):
    assert means[family]["1.5"] > means[family]["1.0"] > means[family]["0.5"], (family, means)


@pytest.mark.slow
def test_tiny_synthetic_pattern_accuracy():
  bundle = _tiny_synthetic()
  zero = sw.zero_shot_attributes(bundle, n_images=1000, families=("pattern",))
  assert zero["accuracy"]["pattern"] >= 0.80, zero["accuracy"]
