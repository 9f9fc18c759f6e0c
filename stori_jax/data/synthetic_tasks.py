"""Tasks on the synthetic attribute world with known answers.

- Fine-grained few-shot classification tasks (the stand-in for CoOp's datasets): classes are
  colour/pattern/shape combinations (`class_from_name`) that differ by one to three attributes,
  like bird species that differ by a wing bar. Each class has CuPL-like descriptive prompts that
  also hold words irrelevant to the distinction, some of them misleading (`stated_nuisance`), so
  SToRI's learned token weights can be checked against the known discriminating words
  (`discriminating_words`, `nuisance_words`, `word_rank_auc`).
- A descriptor bank (the stand-in for Menon & Vondrick's per-class descriptors) with the
  attribute each descriptor names, for the mutual-knowledge analysis.

Size, position and background are nuisances here: random in every class's images.
"""

from __future__ import annotations

import dataclasses
import itertools
from types import MappingProxyType
from typing import Mapping, Sequence

import numpy as np

from stori_jax.data import synthetic
from stori_jax.data.synthetic import (
  ATTRIBUTE_WORDS,
  BACKGROUNDS,
  COLOURS,
  PATTERN_WITH_PHRASES,
  PATTERNS,
  SHAPES,
  SIZES,
  SyntheticBatch,
)

#: Attribute families that define a class, in the order its name lists them.
CLASS_FAMILIES = ("colour", "pattern", "shape")


@dataclasses.dataclass(frozen=True)
class ClassSpec:
  """A class of the synthetic world: the attributes all its images share (None: any)."""

  colour: str | None = None
  pattern: str | None = None
  shape: str | None = None

  def __post_init__(self):
    for family in CLASS_FAMILIES:
      value = getattr(self, family)
      if value is not None and value not in synthetic.VOCABULARIES[family]:
        raise ValueError(f"unknown {family} {value!r}")
    if all(getattr(self, f) is None for f in CLASS_FAMILIES):
      raise ValueError("a class needs at least one attribute")

  @property
  def name(self) -> str:
    """'red striped circle': the attribute words, so that text prompts can name it."""
    words = " ".join(self.attributes().values())
    return words if self.shape else words + " shape"

  def attributes(self) -> dict[str, str]:
    """The specified attributes, family -> value, in CLASS_FAMILIES order."""
    return {f: getattr(self, f) for f in CLASS_FAMILIES if getattr(self, f) is not None}


#: The default task and the mutual-knowledge analysis's classes: 3 colours x 2 patterns x
#: 2 shapes. Red vs orange and striped vs dotted are the fine-grained axes; circle vs star is the
#: easy one. (The few-shot demo, configs/demo.py, picks 12 classes the tiny CLIP confuses more.)
FEWSHOT_CLASSES: tuple[ClassSpec, ...] = tuple(
  ClassSpec(colour=c, pattern=p, shape=s)
  for s in ("circle", "star")
  for c in ("red", "orange", "blue")
  for p in ("striped", "dotted")
)


# ---------------------------------------------------------------------------------------------
# CuPL-like prompts. Fillers ("lovely", "sticker", ...) carry no class information. Two templates
# state a size and a background colour, as LLM-written descriptions state a typical look ("a
# small bird"): the stated values are fixed per class (`stated_nuisance`) but random in the
# images, so these words mislead a zero-shot classifier and training should weight them down.
# Placeholders: {a_name} "a red striped circle", {c} colour, {p} pattern adjective,
# {with_p} "with stripes", {s} shape, {size} and {background} the stated nuisance values.

_PROMPT_TEMPLATES = (
  "a photo of {a_name}, a simple geometric figure drawn on a flat background.",
  "{a_name} is a lovely shape, neatly drawn with clean edges.",
  "a clear picture of {a_name}, like a sticker in a children's book.",
  "you can recognize {a_name} by its color, its pattern and its outline.",
  "{a_name}, shown {size} on a {background} background.",
  "a {s} painted in bright {c} {with_p}, a common sight in puzzles.",
  "this {s} is {c} and {p}, with sharp and tidy edges.",
  "a {size} {p} {c} {s} in the corner of a drawing.",
)

#: Attribute families random in every class's images (size, position, background).
NUISANCE_FAMILIES = tuple(f for f in synthetic.VOCABULARIES if f not in CLASS_FAMILIES)


def _article(phrase: str) -> str:
  return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def stated_nuisance(spec: ClassSpec) -> dict[str, str]:
  """The size and background a class's prompts state: {"size": ..., "background": ...}.

  A fixed function of the class's attribute values (the sum of their vocabulary indices), so
  classes that differ in one attribute usually state different values; the images ignore it.
  """
  index = sum(synthetic.VOCABULARIES[f].index(v) for f, v in spec.attributes().items())
  return {"size": SIZES[index % len(SIZES)], "background": BACKGROUNDS[index % len(BACKGROUNDS)]}


def class_prompts(spec: ClassSpec) -> tuple[str, ...]:
  """CuPL-like descriptive prompts for one class (8 for a full class, >= 5 for any)."""
  fields = {"a_name": _article(spec.name), **stated_nuisance(spec)}
  if spec.colour:
    fields["c"] = spec.colour
  if spec.pattern:
    fields["p"] = spec.pattern
    if spec.pattern in PATTERN_WITH_PHRASES:
      fields["with_p"] = PATTERN_WITH_PHRASES[spec.pattern]
  if spec.shape:
    fields["s"] = spec.shape
  prompts = []
  for template in _PROMPT_TEMPLATES:
    try:
      prompts.append(template.format(**fields))
    except KeyError:  # the template needs an attribute this class leaves open
      continue
  return tuple(prompts)


def class_words(spec: ClassSpec | str) -> dict[str, frozenset[str]]:
  """family -> the words naming the class's value of it (e.g. {"pattern": {"striped", "stripes"}})."""
  spec = _as_spec(spec)
  return {f: frozenset(ATTRIBUTE_WORDS[(f, v)]) for f, v in spec.attributes().items()}


def discriminative_words(class_a: ClassSpec | str, class_b: ClassSpec | str) -> frozenset[str]:
  """Words that tell the two classes apart: those naming an attribute where they differ.

  For "red striped circle" vs "red dotted circle": {"striped", "stripes", "dotted", "dots"}.
  An attribute one class fixes and the other leaves open counts as a difference. Classes are
  ClassSpecs or class names (`class_from_name`).
  """
  words_a, words_b = class_words(class_a), class_words(class_b)
  differing = set()
  for family in CLASS_FAMILIES:
    if words_a.get(family) != words_b.get(family):
      differing |= words_a.get(family, frozenset()) | words_b.get(family, frozenset())
  return frozenset(differing)


def class_from_name(name: str) -> ClassSpec:
  """The class a name denotes: "red striped star" -> ClassSpec("red", "striped", "star").

  The inverse of `ClassSpec.name`: attribute words in colour, pattern, shape order, and a
  trailing "shape" when the shape is left open ("red striped shape").
  """
  words = name.split()
  if len(words) > 1 and words[-1] == "shape":
    words = words[:-1]
  values = {}
  for word in words:
    family = next((f for f in CLASS_FAMILIES if word in synthetic.VOCABULARIES[f]), None)
    if family is None or family in values:
      problem = "names two values of one attribute" if family else f"has an unknown word {word!r}"
      raise ValueError(
        f"synthetic class {name!r} {problem}; a class name lists at most one colour "
        f"{COLOURS}, one pattern {PATTERNS} and one shape {SHAPES}, in that order"
      )
    values[family] = word
  if not values:
    raise ValueError(f"synthetic class {name!r} names no colour, pattern or shape")
  spec = ClassSpec(**values)
  if spec.name != name:
    raise ValueError(
      f"synthetic class {name!r}: write it as {spec.name!r} (colour, pattern, shape)"
    )
  return spec


def resolve_classes(class_names: Sequence[str] | None) -> tuple[ClassSpec, ...]:
  """The ClassSpecs of `class_names` (distinct, at least two); None: FEWSHOT_CLASSES."""
  if class_names is None:
    return FEWSHOT_CLASSES
  classes = tuple(class_from_name(name) for name in class_names)
  if len(classes) < 2 or len(set(classes)) != len(classes):
    raise ValueError(f"a task needs at least two distinct classes, got {list(class_names)}")
  return classes


def _as_spec(spec: ClassSpec | str) -> ClassSpec:
  return spec if isinstance(spec, ClassSpec) else class_from_name(spec)


# ---------------------------------------------------------------------------------------------
# Ground truth for trained word weights.


def discriminating_words(
  spec: ClassSpec | str, classes: Sequence[ClassSpec | str]
) -> frozenset[str]:
  """The class's own attribute words that tell it apart from at least one other of `classes`."""
  spec = _as_spec(spec)
  own = frozenset().union(*class_words(spec).values())
  others = (_as_spec(c) for c in classes)
  return own & frozenset().union(*(discriminative_words(spec, c) for c in others if c != spec))


def nuisance_words(spec: ClassSpec | str) -> frozenset[str]:
  """Words naming an attribute that is random in the class's images: every size, position and
  background word, and the words of any class family the class leaves open."""
  spec = _as_spec(spec)
  families = NUISANCE_FAMILIES + tuple(f for f in CLASS_FAMILIES if getattr(spec, f) is None)
  return frozenset(w for (f, _), words in ATTRIBUTE_WORDS.items() if f in families for w in words)


def word_rank_auc(
  prompt_words: Sequence[Sequence[tuple[str, float]]],
  prompt_classes: Sequence[str],
  classes: Sequence[ClassSpec | str],
  *,
  against: str = "nuisance",
) -> float:
  """How well trained word weights single out the words that discriminate each class.

  P(weight of a discriminating word > weight of an `against` word of the same prompt), ties
  counting 1/2, pooled over every such pair of every prompt:
    against="nuisance": words naming an attribute random in the class's images (the size and
      background the prompts state, see `stated_nuisance`);
    against="other": every other alphabetic word, fillers included. In a causal text tower a
      word after the class name carries the name's content, so its weight is not only about the
      word itself (the paper's App. C notes high weights on '.' for the same reason).

  Args:
    prompt_words: per prompt, its (word, weight) pairs (`fewshot.report.prompt_word_weights`).
    prompt_classes: per prompt, its class name.
    classes: every class of the task (defines which attribute words discriminate).
  """
  if against not in ("nuisance", "other"):
    raise ValueError(f"against must be 'nuisance' or 'other', not {against!r}")
  # Per class once, not per prompt.
  discriminating = {name: discriminating_words(name, classes) for name in set(prompt_classes)}
  nuisance = {name: nuisance_words(name) for name in discriminating}
  wins, pairs = 0.0, 0
  for words, name in zip(prompt_words, prompt_classes, strict=True):
    relevant = discriminating[name]
    if against == "nuisance":
      background = [w for word, w in words if word in nuisance[name]]
    else:
      background = [w for word, w in words if word.isalpha() and word not in relevant]
    foreground = np.array([w for word, w in words if word in relevant])
    for weight in background:
      wins += np.sum(foreground > weight) + 0.5 * np.sum(foreground == weight)
      pairs += len(foreground)
  if not pairs:
    raise ValueError("no prompt has both a discriminating word and a word to compare it with")
  return float(wins / pairs)


def classes_with_discriminating_top_words(
  top_words: Mapping[str, Sequence[tuple[str, float]]],
  classes: Sequence[ClassSpec | str],
  top: int = 3,
) -> list[str]:
  """The classes whose `top` highest-weighted words include one of their discriminating words.

  Args:
    top_words: per class name, its words by decreasing mean weight over its prompts
      (`fewshot.report.class_top_words`).
    classes: every class of the task.
  """
  return [
    name
    for name, words in top_words.items()
    if discriminating_words(name, classes) & {word for word, _ in words[:top]}
  ]


def word_weight_medians(
  prompt_words: Sequence[Sequence[tuple[str, float]]], prompt_classes: Sequence[str]
) -> dict[str, float]:
  """Median trained weight of each kind of word over all prompts.

  Keys: the class families ("colour", "pattern", "shape": words naming the prompt's class's own
  value), "nuisance" (`nuisance_words`) and "other" (every other alphabetic word). A kind no
  prompt has is left out.
  """
  pooled: dict[str, list[float]] = {}
  for words, name in zip(prompt_words, prompt_classes, strict=True):
    own = class_words(name)
    nuisance = nuisance_words(name)
    for word, weight in words:
      kind = next((f for f, family_words in own.items() if word in family_words), None)
      if kind is None:
        kind = "nuisance" if word in nuisance else "other" if word.isalpha() else None
      if kind is not None:
        pooled.setdefault(kind, []).append(weight)
  order = (*CLASS_FAMILIES, "nuisance", "other")
  return {kind: float(np.median(pooled[kind])) for kind in order if kind in pooled}


# ---------------------------------------------------------------------------------------------
# Few-shot dataset.

# Seed streams: train and test images come from different streams, so they never coincide, and
# the test set does not depend on the shots or their seed (as in CoOp's fixed test split).
_TRAIN_STREAM, _TEST_STREAM = 7001, 7002


@dataclasses.dataclass(frozen=True)
class FewShotDataset:
  """Few-shot classification data; images are sorted by class.

  Attributes:
    train, test: SyntheticBatch (single-object images with all ground truth).
    train_labels: int32 [num_classes * shots].
    test_labels: int32 [num_classes * n_test_per_class].
    classes: ClassSpec per class; class_names: their names.
    prompts: per class, a tuple of CuPL-like prompts.
  """

  train: SyntheticBatch
  test: SyntheticBatch
  train_labels: np.ndarray
  test_labels: np.ndarray
  classes: tuple[ClassSpec, ...]
  class_names: tuple[str, ...]
  prompts: tuple[tuple[str, ...], ...]

  @property
  def train_images(self) -> np.ndarray:
    """uint8 [num_classes * shots, H, W, 3]."""
    return self.train.images

  @property
  def test_images(self) -> np.ndarray:
    """uint8 [num_classes * n_test_per_class, H, W, 3]."""
    return self.test.images


def _class_images(
  classes: Sequence[ClassSpec], per_class: int, seed, image_size: int
) -> SyntheticBatch:
  specs = [spec for spec in classes for _ in range(per_class)]
  return synthetic.generate_with(
    len(specs),
    seed,
    image_size=image_size,
    **{f: [getattr(spec, f) for spec in specs] for f in CLASS_FAMILIES},
  )


def fewshot_dataset(
  shots: int,
  seed: int,
  n_test_per_class: int = 50,
  *,
  classes: Sequence[ClassSpec] = FEWSHOT_CLASSES,
  test_seed: int = 0,
  image_size: int = 64,
) -> FewShotDataset:
  """K-shot training images per class (depend on `seed`) and a fixed test set (`test_seed`).

  Nuisance attributes (size, position, background, and any class attribute left None) are
  random per image.
  """
  if shots < 1 or n_test_per_class < 1:
    raise ValueError("shots and n_test_per_class must be >= 1")
  classes = tuple(classes)
  num_classes = len(classes)
  train = _class_images(classes, shots, [_TRAIN_STREAM, seed], image_size)
  test = _class_images(classes, n_test_per_class, [_TEST_STREAM, test_seed], image_size)
  return FewShotDataset(
    train=train,
    test=test,
    train_labels=np.repeat(np.arange(num_classes, dtype=np.int32), shots),
    test_labels=np.repeat(np.arange(num_classes, dtype=np.int32), n_test_per_class),
    classes=classes,
    class_names=tuple(c.name for c in classes),
    prompts=tuple(class_prompts(c) for c in classes),
  )


# ---------------------------------------------------------------------------------------------
# Descriptor bank (Menon & Vondrick style): short phrases, each naming one attribute value,
# built from words the world's captions use, plus distractors that name nothing.


def _value_descriptors(family: str, value: str) -> tuple[str, ...]:
  if family == "colour":
    return (f"{value} color", f"painted {value}")
  if family == "pattern":
    return (f"{value} pattern", PATTERN_WITH_PHRASES.get(value, "plain fill"))
  if family == "shape":
    return (f"{value} shape", f"{value} outline")
  if family == "size":
    return (f"{value} size",)
  raise KeyError(family)


DISTRACTOR_DESCRIPTORS = (
  "a simple drawing",
  "a flat picture",
  "sharp clean edges",
  "a shape on a background",
  "a computer graphic",
  "no shading",
)

#: Every descriptor phrase -> the (family, value) it names, or None for distractors.
DESCRIPTOR_ATTRIBUTES: Mapping[str, tuple[str, str] | None] = MappingProxyType(
  {
    **{
      d: (f, v)
      for f, vocab in (
        ("colour", COLOURS),
        ("pattern", PATTERNS),
        ("shape", SHAPES),
        ("size", SIZES),
      )
      for v in vocab
      for d in _value_descriptors(f, v)
    },
    **{d: None for d in DISTRACTOR_DESCRIPTORS},
  }
)


def descriptor_bank(classes: Sequence[ClassSpec] = FEWSHOT_CLASSES) -> dict[str, list[str]]:
  """class name -> descriptors: two per class attribute, one size phrase (a plausible but
  non-defining attribute, as real descriptor lists have), and two distractors."""
  bank = {}
  for i, spec in enumerate(classes):
    phrases = [d for f, v in spec.attributes().items() for d in _value_descriptors(f, v)]
    phrases += list(_value_descriptors("size", SIZES[i % len(SIZES)]))
    phrases += [DISTRACTOR_DESCRIPTORS[(2 * i + j) % len(DISTRACTOR_DESCRIPTORS)] for j in range(2)]
    bank[spec.name] = phrases
  return bank


#: Distractor sentences of the second set (`sentence_descriptor_bank`): they name nothing.
DISTRACTOR_SENTENCES = (
  "it is drawn on a computer",
  "the picture has no shading",
  "the edges are crisp",
  "it sits on a background",
)


def _value_sentences(family: str, value: str) -> tuple[str, ...]:
  if family == "colour":
    return (f"the object is {value}",)
  if family == "pattern":
    return (f"it is drawn {PATTERN_WITH_PHRASES.get(value, 'without a pattern')}",)
  if family == "shape":
    return (f"it is shaped like a {value}", f"its outline is a {value}")
  if family == "size":
    return (f"it looks {value}",)
  raise KeyError(family)


def sentence_descriptor_bank(
  classes: Sequence[ClassSpec] = FEWSHOT_CLASSES,
) -> dict[str, list[str]]:
  """The world's second descriptor set, as another LLM or prompt would write one (App. A.4's
  Table 4 compares such sets): class name -> short sentences by rule, one per colour and
  pattern, two per shape, one size sentence (non-defining, as in `descriptor_bank`) and one
  distractor; fewer descriptors per class than `descriptor_bank`, worded differently."""
  bank = {}
  for i, spec in enumerate(classes):
    sentences = [d for f, v in spec.attributes().items() for d in _value_sentences(f, v)]
    sentences += list(_value_sentences("size", SIZES[(i + 1) % len(SIZES)]))
    sentences.append(DISTRACTOR_SENTENCES[i % len(DISTRACTOR_SENTENCES)])
    bank[spec.name] = sentences
  return bank


#: The world's descriptor sets by name (App. A.4's Table 4 rows on this world:
#: config.protocols.bank_quality.descriptor_sets names them in place of descriptor files).
DESCRIPTOR_SETS = MappingProxyType(
  {"attributes": descriptor_bank, "sentences": sentence_descriptor_bank}
)


def descriptor_attribute(descriptor: str) -> tuple[str, str] | None:
  """The (family, value) a descriptor names, or None for a distractor."""
  return DESCRIPTOR_ATTRIBUTES[descriptor]


# ---------------------------------------------------------------------------------------------
# The emphasis experiment's scenes (paper Table 3 in this world; measured by
# `stori_jax.world_evaluation.metrics.emphasis_effect`, ranked by `stori_jax.retrieval`).

#: The emphasis triples' default seed, disjoint from pretraining's (0, k) namespace.
EMPHASIS_SEED = (2024, 3)
#: Attribute families of an emphasis triple, in prompt order ("a photo of a {c} {p} {s}").
EMPHASIS_FAMILIES = ("colour", "pattern", "shape")
#: Patterns the prompt may name: "plain" is never the prompt's pattern (a plain object has no
#: visible pattern to retrieve by, and "a photo of a red plain circle" is an odd query), but it
#: is a valid alternative p' (the negatives of the pattern family are then plain objects).
EMPHASIS_PATTERNS = tuple(p for p in synthetic.PATTERNS if p != "plain")


def _seed_tuple(seed: int | Sequence[int]) -> tuple[int, ...]:
  return tuple(int(s) for s in np.atleast_1d(np.asarray(seed, dtype=np.int64)))


def emphasis_triples(
  n_triples: int, seed: int | Sequence[int] = EMPHASIS_SEED
) -> list[dict[str, tuple[str, str]]]:
  """Distinct attribute triples with alternatives, deterministic given the seed.

  Returns:
    n_triples dicts {"colour": (c, c'), "pattern": (p, p'), "shape": (s, s')}: the first value
    is the prompt's, the second the alternative (c != c', etc.). p is never "plain"; p' may be.
    No two triples share the prompt (c, p, s).
  """
  limit = len(synthetic.COLOURS) * len(EMPHASIS_PATTERNS) * len(synthetic.SHAPES)
  if not 1 <= n_triples <= limit:
    raise ValueError(f"n_triples must be in [1, {limit}] (distinct prompts), got {n_triples}")
  rng = np.random.default_rng(_seed_tuple(seed))
  triples, seen = [], set()
  while len(triples) < n_triples:
    c, c_alt = (synthetic.COLOURS[i] for i in rng.choice(len(synthetic.COLOURS), 2, replace=False))
    p = EMPHASIS_PATTERNS[rng.integers(len(EMPHASIS_PATTERNS))]
    others = [q for q in synthetic.PATTERNS if q != p]
    p_alt = others[rng.integers(len(others))]
    s, s_alt = (synthetic.SHAPES[i] for i in rng.choice(len(synthetic.SHAPES), 2, replace=False))
    if (c, p, s) in seen:
      continue
    seen.add((c, p, s))
    triples.append({"colour": (c, c_alt), "pattern": (p, p_alt), "shape": (s, s_alt)})
  return triples


def emphasis_scenes(
  triple: Mapping[str, Sequence[str]], images_per_category: int
) -> tuple[list[tuple[synthetic.ObjectSpec]], dict[str, np.ndarray]]:
  """Scenes of the 8 categories of one triple, and which images carry the prompt's values.

  Categories follow itertools.product over (colour, pattern, shape) in {value, alternative},
  `images_per_category` consecutive scenes each; size and position are left to the renderer
  (random), as is the background.

  Returns:
    (scenes [8 * images_per_category], positives {family: bool [8 * images_per_category]}).
  """
  scenes, positives = [], {f: [] for f in EMPHASIS_FAMILIES}
  for values in itertools.product(*(triple[f] for f in EMPHASIS_FAMILIES)):
    spec = synthetic.ObjectSpec(**dict(zip(EMPHASIS_FAMILIES, values)))
    scenes.extend([(spec,)] * images_per_category)
    for f, v in zip(EMPHASIS_FAMILIES, values):
      positives[f].extend([v == triple[f][0]] * images_per_category)
  return scenes, {f: np.asarray(v, bool) for f, v in positives.items()}
