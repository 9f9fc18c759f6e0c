"""The synthetic attribute world: determinism, ground truth against pixels, captions, tasks."""

import itertools
import re

import numpy as np
import pytest

from stori_jax.data import synthetic as S
from stori_jax.data import synthetic_tasks as T


@pytest.fixture(scope="module")
def batch():
  return S.generate(256, 123)


def _words(text):
  return set(re.findall(r"[a-z]+", text))


# --------------------------------------------------------------------------------------------
# Generator: determinism, shapes, dtypes.


def test_same_seed_same_bytes_different_seed_different():
  a, b, c = S.generate(24, 5), S.generate(24, 5), S.generate(24, 6)
  assert a.images.tobytes() == b.images.tobytes()
  assert a.masks.tobytes() == b.masks.tobytes()
  assert a.captions == b.captions
  for family in S.FAMILIES + ("background",):
    np.testing.assert_array_equal(a.labels(family), b.labels(family))
  assert a.images.tobytes() != c.images.tobytes()
  assert a.captions != c.captions


def test_shapes_and_dtypes(batch):
  n = len(batch)
  assert batch.images.shape == (n, 64, 64, 3) and batch.images.dtype == np.uint8
  assert batch.masks.shape == (n, 64, 64) and batch.masks.dtype == np.int8
  assert len(batch.captions) == n and all(isinstance(c, str) for c in batch.captions)
  assert batch.mentioned.shape == (n, 2, len(S.FAMILIES)) and batch.mentioned.dtype == bool
  assert batch.background_mentioned.shape == (n,)
  for family, vocab in S.VOCABULARIES.items():
    labels = batch.labels(family)
    assert labels.dtype == np.int8 and labels.max() < len(vocab)
  assert (batch.shape[:, 0] >= 0).all()  # slot 0 always holds an object
  assert set(np.unique(batch.num_objects)) == {1, 2}
  absent = batch.shape < 0
  for family in S.FAMILIES:
    assert ((batch.labels(family) < 0) == absent).all()
  assert batch.background.min() >= 0


@pytest.mark.parametrize("size", [32, 96])
def test_other_image_sizes(size):
  b = S.generate(6, 0, image_size=size)
  assert b.images.shape == (6, size, size, 3) and b.masks.shape == (6, size, size)
  assert (b.masks >= 0).any(axis=(1, 2)).all()


def test_single_object_option():
  b = S.generate(40, 1, max_objects=1)
  assert b.shape.shape == (40, 1) and (b.num_objects == 1).all()
  with pytest.raises(ValueError):
    S.generate(4, 0, max_objects=3)


def test_select_and_objects(batch):
  sub = batch.select(np.array([3, 1]))
  assert sub.captions == (batch.captions[3], batch.captions[1])
  np.testing.assert_array_equal(sub.images[1], batch.images[1])
  specs = batch.objects(3)
  assert len(specs) == batch.num_objects[3]
  assert specs[0].colour == S.COLOURS[batch.colour[3, 0]]


# --------------------------------------------------------------------------------------------
# Labels agree with pixels.


def test_masks_cover_exactly_the_present_objects(batch):
  for k in range(2):
    has_pixels = (batch.masks == k).any(axis=(1, 2))
    np.testing.assert_array_equal(has_pixels, batch.shape[:, k] >= 0)


def test_object_colour_matches_pixels(batch):
  palette = np.array([S.COLOUR_RGB[c] for c in S.COLOURS], np.float32)
  backgrounds = np.array([S.BACKGROUND_RGB[b] for b in S.BACKGROUNDS], np.float32)
  references = np.concatenate([palette, palette * S.PATTERN_SHADE, backgrounds])
  reference_colour = np.concatenate([np.arange(8), np.arange(8), [-1] * len(backgrounds)])
  for i, k in zip(*np.nonzero(batch.shape >= 0)):
    pixels = batch.images[i][batch.masks[i] == k].astype(np.float32)
    nearest = reference_colour[
      np.argmin(((pixels[:, None] - references[None]) ** 2).sum(-1), axis=1)
    ]
    votes = np.bincount(nearest[nearest >= 0], minlength=8)
    assert votes.argmax() == batch.colour[i, k], (i, k, batch.captions[i])
    assert votes.max() > 0.5 * len(pixels)


def test_background_colour_matches_pixels(batch):
  for i in range(0, len(batch), 8):
    median = np.median(batch.images[i][batch.masks[i] < 0].astype(np.float32), axis=0)
    expected = S.BACKGROUND_RGB[S.BACKGROUNDS[batch.background[i]]]
    np.testing.assert_allclose(median, expected, atol=15)


def test_large_objects_have_more_pixels_than_small_ones(batch):
  present = np.nonzero(batch.shape >= 0)
  area = np.array([(batch.masks[i] == k).sum() for i, k in zip(*present)])
  shape, size = batch.shape[present], batch.size[present]
  small, large = S.SIZES.index("small"), S.SIZES.index("large")
  for s in np.unique(shape):
    small_areas, large_areas = (
      area[(shape == s) & (size == small)],
      area[(shape == s) & (size == large)],
    )
    if len(small_areas) and len(large_areas):
      assert small_areas.max() < large_areas.min(), S.SHAPES[s]


def test_position_label_agrees_with_mask_centroid(batch):
  anchors = np.array([S._POSITION_CENTRES[p] for p in S.POSITIONS]) * 64
  for i, k in zip(*np.nonzero(batch.shape >= 0)):
    ys, xs = np.nonzero(batch.masks[i] == k)
    centroid = np.array([xs.mean() + 0.5, ys.mean() + 0.5])
    assert np.argmin(((anchors - centroid) ** 2).sum(1)) == batch.position[i, k]


def test_two_objects_sit_in_a_layout_pair(batch):
  two = batch.num_objects == 2
  pairs = {tuple(S.POSITIONS.index(p) for p in pair) for pair in S._TWO_OBJECT_LAYOUTS}
  assert {tuple(row) for row in batch.position[two]} <= pairs


# --------------------------------------------------------------------------------------------
# Captions.


def test_captions_mention_the_labelled_attributes_and_no_others(batch):
  assert batch.mentioned[batch.shape >= 0][:, :2].all()  # shape and colour always
  assert not batch.mentioned[batch.shape < 0].any()
  for i, caption in enumerate(batch.captions):
    words = _words(caption)
    for k in np.nonzero(batch.shape[i] >= 0)[0]:
      for f, family in enumerate(S.FAMILIES):
        value = S.VOCABULARIES[family][batch.labels(family)[i, k]]
        if batch.mentioned[i, k, f]:
          assert words & set(S.attribute_words(family, value)), (caption, family, value)
    for family in S.FAMILIES:
      held = {S.VOCABULARIES[family][v] for v in batch.labels(family)[i] if v >= 0}
      for value in set(S.VOCABULARIES[family]) - held:
        assert not words & set(S.attribute_words(family, value)), (caption, family, value)
    background = S.BACKGROUNDS[batch.background[i]]
    assert (background in words) == batch.background_mentioned[i], caption
    assert not words & (set(S.BACKGROUNDS) - {background}), caption
  # Optional attributes are sometimes left out, and the wording varies.
  present = batch.shape >= 0
  assert 0.3 < batch.mentioned[present][:, 2:].mean() < 0.95
  assert len({c.split()[0] for c in batch.captions}) >= 5


def test_captions_fit_the_text_context(batch):
  from stori_jax.tokenizer import default_tokenizer

  tokenizer = default_tokenizer()
  # Pretraining cuts token rows to 40 (configs/tiny_clip_pretrain.py: text_length).
  lengths = [len(tokenizer.encode(c)) + 2 for c in batch.captions]  # + SOT, EOT
  assert max(lengths) <= 40


# --------------------------------------------------------------------------------------------
# Controlled rendering.


def test_render_all_combinations_of_three_binary_attributes():
  combos = list(itertools.product(("red", "blue"), ("striped", "dotted"), ("circle", "square")))
  scenes = [
    [S.ObjectSpec(shape=s, colour=c, pattern=p, size="large", position="center")]
    for c, p, s in combos
  ]
  b = S.render(scenes, seed=0, backgrounds="gray")
  for i, (c, p, s) in enumerate(combos):
    assert (S.COLOURS[b.colour[i, 0]], S.PATTERNS[b.pattern[i, 0]], S.SHAPES[b.shape[i, 0]]) == (
      c,
      p,
      s,
    )
  assert (b.background == S.BACKGROUNDS.index("gray")).all()
  assert (b.size[:, 0] == S.SIZES.index("large")).all()


def test_render_two_objects_and_checks_layouts():
  b = S.render(
    [
      [S.ObjectSpec("star", "red", position="top"), S.ObjectSpec("heart", "blue")],
      [S.ObjectSpec("moon", "pink")],
    ],
    seed=3,
  )
  assert S.POSITIONS[b.position[0, 1]] == "bottom" and b.position[1, 1] == -1
  assert (b.masks[0] == 1).any() and not (b.masks[1] == 1).any()
  with pytest.raises(ValueError):
    S.render([[S.ObjectSpec(position="left"), S.ObjectSpec(position="top")]], seed=0)
  with pytest.raises(ValueError):
    S.render([[S.ObjectSpec(colour="mauve")]], seed=0)


def test_without_jitter_images_depend_only_on_attributes():
  scenes = [[S.ObjectSpec("triangle", "green", "checkered", "small", "left")]]
  a = S.render(scenes, seed=0, backgrounds="white", jitter=False)
  b = S.render(scenes, seed=99, backgrounds="white", jitter=False)
  assert a.images.tobytes() == b.images.tobytes()


def test_generate_with_fixes_the_chosen_attributes():
  b = S.generate_with(20, 4, colour="yellow", pattern=["dotted"] * 10 + [None] * 10)
  assert (b.colour[:, 0] == S.COLOURS.index("yellow")).all()
  assert (b.pattern[:10, 0] == S.PATTERNS.index("dotted")).all()
  assert len(np.unique(b.shape)) > 1


def test_generate_with_always_mention_states_the_family_in_every_caption():
  b = S.generate_with(64, 5, pattern="plain", always_mention=("pattern", "size"))
  assert b.mentioned[:, 0, S.FAMILIES.index("pattern")].all()
  assert b.mentioned[:, 0, S.FAMILIES.index("size")].all()
  assert all("plain" in c for c in b.captions)
  assert all(("small" in c) != ("large" in c) for c in b.captions)
  # without it, "plain" is said only about half of the time
  default = S.generate_with(64, 5, pattern="plain")
  assert 0 < sum("plain" in c for c in default.captions) < 64
  # same seed: only the wording changes, not the images
  assert default.images.tobytes() == b.images.tobytes()
  with pytest.raises(ValueError, match="choose from"):
    S.generate_with(4, 0, always_mention=("colour",))


# --------------------------------------------------------------------------------------------
# Few-shot task.


def test_fewshot_classes_are_distinct_fine_grained_and_named_by_attributes():
  names = [c.name for c in T.FEWSHOT_CLASSES]
  assert len(names) >= 10 and len(set(names)) == len(names)
  differences = [
    len(T.discriminative_words(a, b)) > 0 for a, b in itertools.combinations(T.FEWSHOT_CLASSES, 2)
  ]
  assert all(differences)
  for spec in T.FEWSHOT_CLASSES:
    assert set(spec.attributes().values()) <= set(spec.name.split())
  # Some pairs differ in a single attribute (the fine-grained ones).
  single = [
    a
    for a, b in itertools.combinations(T.FEWSHOT_CLASSES, 2)
    if sum(getattr(a, f) != getattr(b, f) for f in T.CLASS_FAMILIES) == 1
  ]
  assert single


def test_fewshot_split_is_deterministic_and_disjoint():
  a, b = T.fewshot_dataset(2, 0, 3), T.fewshot_dataset(2, 0, 3)
  other = T.fewshot_dataset(2, 1, 3)
  num_classes = len(T.FEWSHOT_CLASSES)
  assert a.train_images.shape == (2 * num_classes, 64, 64, 3)
  assert a.test_images.shape == (3 * num_classes, 64, 64, 3)
  assert a.train_images.tobytes() == b.train_images.tobytes()
  assert a.test_images.tobytes() == b.test_images.tobytes()
  assert a.train_images.tobytes() != other.train_images.tobytes()
  assert a.test_images.tobytes() == other.test_images.tobytes()  # the test set is fixed
  train = {img.tobytes() for img in a.train_images}
  assert not train & {img.tobytes() for img in a.test_images}
  np.testing.assert_array_equal(a.train_labels, np.repeat(np.arange(num_classes), 2))


def test_fewshot_images_have_their_class_attributes():
  d = T.fewshot_dataset(3, 2, 4)
  for batch, labels in ((d.train, d.train_labels), (d.test, d.test_labels)):
    for family in T.CLASS_FAMILIES:
      expected = [S.VOCABULARIES[family].index(getattr(d.classes[y], family)) for y in labels]
      np.testing.assert_array_equal(batch.labels(family)[:, 0], expected)
    # Nuisance attributes vary within the split.
    assert len(np.unique(batch.size)) == 2


def test_prompts_describe_each_class_with_filler_words():
  d = T.fewshot_dataset(1, 0, 1)
  vocabulary_words = {w for words in S.ATTRIBUTE_WORDS.values() for w in words}
  for spec, prompts in zip(d.classes, d.prompts):
    assert len(prompts) >= 5 and len(set(prompts)) == len(prompts)
    for prompt in prompts:
      words = _words(prompt)
      for family, family_words in T.class_words(spec).items():
        assert words & family_words, (prompt, family)
      assert words - vocabulary_words, prompt  # words irrelevant to the class
  assert len(T.class_prompts(T.ClassSpec(colour="red"))) >= 5


def test_discriminative_words_are_the_differing_attribute_words():
  for a, b in itertools.combinations(T.FEWSHOT_CLASSES, 2):
    words_a = set().union(*T.class_words(a).values())
    words_b = set().union(*T.class_words(b).values())
    assert T.discriminative_words(a, b) == words_a ^ words_b
    assert T.discriminative_words(a.name, b.name) == T.discriminative_words(b, a)
  for spec in T.FEWSHOT_CLASSES:
    assert T.discriminative_words(spec, spec) == frozenset()
  assert T.discriminative_words("red striped circle", "red dotted circle") == {
    "striped",
    "stripes",
    "dotted",
    "dots",
  }
  # Every discriminative word of a class is used by some of its prompts.
  prompts = dict(zip(T.FEWSHOT_CLASSES, (T.class_prompts(c) for c in T.FEWSHOT_CLASSES)))
  for a, b in itertools.permutations(T.FEWSHOT_CLASSES, 2):
    own = T.discriminative_words(a, b) & set().union(*T.class_words(a).values())
    assert own <= set().union(*(_words(p) for p in prompts[a]))


def test_class_names_round_trip_and_bad_names_say_what_to_write():
  for spec in (
    *T.FEWSHOT_CLASSES,
    T.ClassSpec(colour="red"),
    T.ClassSpec(pattern="dotted", shape="star"),
  ):
    assert T.class_from_name(spec.name) == spec
  assert T.class_from_name("red shape") == T.ClassSpec(colour="red")
  with pytest.raises(ValueError, match="unknown word 'blob'.*one shape"):
    T.class_from_name("red striped blob")
  with pytest.raises(ValueError, match="two values of one attribute"):
    T.class_from_name("red blue star")
  with pytest.raises(ValueError, match="write it as 'red striped star'"):
    T.class_from_name("striped red star")
  with pytest.raises(ValueError, match="at least two distinct"):
    T.resolve_classes(["red star", "red star"])
  assert T.resolve_classes(None) == T.FEWSHOT_CLASSES
  chosen = T.fewshot_dataset(1, 0, 1, classes=T.resolve_classes(["red star", "blue dotted shape"]))
  assert chosen.class_names == ("red star", "blue dotted shape")
  assert chosen.train.shape[0, 0] == S.SHAPES.index("star")
  assert chosen.test.pattern[1, 0] == S.PATTERNS.index("dotted")


def test_prompts_state_a_class_specific_size_and_background_the_images_do_not_keep():
  stated = {spec: T.stated_nuisance(spec) for spec in T.FEWSHOT_CLASSES}
  assert len({tuple(v.values()) for v in stated.values()}) > 1  # differs between classes
  for spec, values in stated.items():
    mentioned = set().union(*(_words(p) for p in T.class_prompts(spec)))
    assert {values["size"], values["background"]} <= mentioned
    assert {values["size"], values["background"]} <= T.nuisance_words(spec)
  # The images draw size and background at random, whatever the prompts say.
  data = T.fewshot_dataset(40, 0, 1, classes=T.FEWSHOT_CLASSES[:1])
  assert len(set(data.train.size[:, 0].tolist())) == len(S.SIZES)
  assert len(set(data.train.background.tolist())) == len(S.BACKGROUNDS)


def test_nuisance_and_discriminating_words():
  red_star = T.ClassSpec(colour="red", shape="star")
  assert {"small", "large", "left", "gray"} <= T.nuisance_words(red_star)
  assert {"striped", "dots", "plain"} <= T.nuisance_words(red_star)  # pattern left open
  assert not T.nuisance_words(red_star) & {"red", "star"}
  classes = ["red striped star", "red dotted star", "blue striped star"]
  assert T.discriminating_words("red striped star", classes) == {"red", "striped", "stripes"}
  # Striped tells it from the red dotted star; star is shared by all three.
  assert T.discriminating_words("blue striped star", classes) == {"blue", "striped", "stripes"}
  assert T.discriminating_words("red dotted star", classes[:2]) == {"dotted", "dots"}


def test_word_rank_auc_and_medians_on_known_weights():
  classes = ["red striped star", "red dotted star"]
  words = [("a", 1.0), ("small", 0.5), ("red", 2.0), ("striped", 3.0), ("star", 1.0), (",", 9.0)]
  prompt_classes = ["red striped star"]
  # Discriminating: "striped" only (red and star are shared). Nuisance: "small".
  assert T.word_rank_auc([words], prompt_classes, classes) == 1.0
  # Against other words: striped (3.0) beats a, red, star, small; "," is not a word.
  assert T.word_rank_auc([words], prompt_classes, classes, against="other") == 1.0
  flipped = [(w, 1.0 / v) for w, v in words]
  assert T.word_rank_auc([flipped], prompt_classes, classes) == 0.0
  tied = [(w, 1.0) for w, _ in words]
  assert T.word_rank_auc([tied], prompt_classes, classes, against="other") == 0.5
  with pytest.raises(ValueError, match="no prompt has both"):
    T.word_rank_auc([[("a", 1.0), ("striped", 2.0)]], prompt_classes, classes)
  with pytest.raises(ValueError, match="against"):
    T.word_rank_auc([words], prompt_classes, classes, against="fillers")
  medians = T.word_weight_medians([words, flipped], prompt_classes * 2)
  assert list(medians) == ["colour", "pattern", "shape", "nuisance", "other"]
  assert medians["pattern"] == pytest.approx((3.0 + 1 / 3.0) / 2)
  assert medians["nuisance"] == pytest.approx((0.5 + 2.0) / 2)
  assert medians["other"] == 1.0


def test_descriptor_bank_is_well_formed():
  bank = T.descriptor_bank()
  assert list(bank) == [c.name for c in T.FEWSHOT_CLASSES]
  for spec in T.FEWSHOT_CLASSES:
    descriptors = bank[spec.name]
    assert len(descriptors) == len(set(descriptors)) >= 5
    named = [T.descriptor_attribute(d) for d in descriptors]
    assert None in named  # distractors
    for family, value in spec.attributes().items():
      assert (family, value) in named
    for attribute, descriptor in zip(named, descriptors):
      if attribute is None:
        continue
      family, value = attribute
      if family in T.CLASS_FAMILIES:
        assert getattr(spec, family) == value, descriptor  # never a wrong class attribute
      assert _words(descriptor) & set(S.attribute_words(family, value)), descriptor
  # Descriptor phrases are unique across attributes, so the mapping is unambiguous.
  assert len(T.DESCRIPTOR_ATTRIBUTES) == sum(
    len(T._value_descriptors(f, v))
    for f, vocab in (
      ("colour", S.COLOURS),
      ("pattern", S.PATTERNS),
      ("shape", S.SHAPES),
      ("size", S.SIZES),
    )
    for v in vocab
  ) + len(T.DISTRACTOR_DESCRIPTORS)
