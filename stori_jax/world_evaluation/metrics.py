r"""Evaluation of a CLIP bundle on the synthetic attribute world (`stori_jax.data.synthetic`).

  python -m stori_jax.evaluate_world --source tiny-synthetic --output_dir workdirs/eval

Three measurements, each on freshly generated held-out images, deterministic given the seeds:

1. `zero_shot_attributes`: zero-shot accuracy per attribute family (colour, shape, pattern, size,
   position) on single-object images, with a prompt ensemble per class.
2. `retrieval_recall`: text->image and image->text recall@k on image-caption pairs drawn like the
   training data.
3. `emphasis_effect`: the paper's Table 3 (section 4.2) in this world. For a triple of attributes
   (colour c, pattern p, shape s) and alternatives (c', p', s'), the 8 categories
   {c, c'} x {p, p'} x {s, s'} are rendered with `images_per_category` images each; the prompt
   "a photo of a {c} {p} {s}" ranks them, once per weight w on one attribute's word; the average
   precision (AP) takes the images with that attribute's value as positives. Emphasis (w > 1)
   should raise AP, de-emphasis (w < 1) lower it. The same is computed with the paper's
   prompt-weighting baseline (App. C.1).

`markdown_tables` formats the results for docs/embedded_world.md; `evaluate` runs all three.

Seeds. Pretraining draws its batches with seeds (config.seed, step), step < 10**6, and its quick
evaluation (config.seed, 10**9); with config.seed = 0 these are (0, k). The defaults here live in a
separate namespace, (2024, k), so every evaluation image is held out. A seed may be an int or a
tuple of ints (numpy SeedSequence entropy); the emphasis experiment renders triple t with seed
(*seed, t).

Bundles. The functions use only `bundle.tokenize(texts, with_weights=...)`,
`bundle.encode_text(ids, weights=None, start_block=..., method=...)`,
`bundle.encode_image(images)`, `bundle.preprocess_config.mean/std` and
`bundle.config.vision.image_size`, so any object with those (a CLIPBundle, a test stub) works.
"""

from __future__ import annotations

import itertools
import time
from typing import Any, Mapping, Sequence

import numpy as np
from sklearn.metrics import average_precision_score

from stori_jax.data import synthetic
from stori_jax.data.synthetic_tasks import (  # the emphasis scenes, re-exported here
  EMPHASIS_FAMILIES,
  EMPHASIS_SEED,
  emphasis_scenes,
  emphasis_triples,
)
from stori_jax.data.synthetic_tasks import (
  EMPHASIS_PATTERNS as EMPHASIS_PATTERNS,
)
from stori_jax.clip.encoding import BATCH_SIZE, encode_images, encode_texts, l2_normalize
from stori_jax.retrieval.metrics import precision_at_k

#: Default seeds, disjoint from pretraining's (0, k) namespace.
ZERO_SHOT_SEED = (2024, 1)
RETRIEVAL_SEED = (2024, 2)

#: Noun phrases (without the article) of each zero-shot family's prompt ensemble. The class
#: value fills its own family's slot; the ensemble runs over every combination of the other
#: slots' values. Every caption of the training data names the colour and the shape, so every
#: template does too: a phrase without them would be out of distribution for the model.
#: "plain" is a regular pattern adjective ("a red plain circle", as captions say it); the other
#: patterns use their adjective ("striped", "dotted", "checkered"); positions use their phrase
#: ("a red circle on the left").
FAMILY_TEMPLATES: Mapping[str, str] = {
  "colour": "{colour} {shape}",
  "shape": "{colour} {shape}",
  "pattern": "{colour} {pattern} {shape}",
  "size": "{size} {colour} {shape}",
  "position": "{colour} {shape} {position}",
}
ZERO_SHOT_FAMILIES = ("colour", "shape", "pattern", "size", "position")

EMPHASIS_WEIGHTS = (0.5, 1.0, 1.5)
METHODS = ("stori", "prompt_weighting")
_REFERENCE_WEIGHT = 1.0


# ---------------------------------------------------------------------------------------------
# Helpers.


def _seed_tuple(seed: int | Sequence[int]) -> tuple[int, ...]:
  return tuple(int(s) for s in np.atleast_1d(np.asarray(seed, dtype=np.int64)))


def _image_size(bundle) -> int:
  return int(bundle.config.vision.image_size)


# ---------------------------------------------------------------------------------------------
# 1. Zero-shot attribute classification.


def _with_article(phrase: str) -> str:
  return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def _slot_text(family: str, value: str) -> str:
  if family == "position":
    return synthetic.POSITION_PHRASES[value]
  return synthetic.attribute_words(family, value)[0]


def zero_shot_prompts(family: str) -> tuple[list[str], int, int]:
  """The prompt ensemble of one family (see FAMILY_TEMPLATES).

  Returns:
    (prompts, n_classes, n_per_class): prompts class-major, i.e. prompts[k * n_per_class + j]
    is the j-th prompt of class `synthetic.VOCABULARIES[family][k]`.
  """
  if family not in FAMILY_TEMPLATES:
    raise ValueError(
      f"no zero-shot templates for {family!r}; expected one of {tuple(FAMILY_TEMPLATES)}"
    )
  template = FAMILY_TEMPLATES[family]
  others = [f for f in synthetic.FAMILIES if f != family and "{" + f + "}" in template]
  contexts = list(itertools.product(*(synthetic.VOCABULARIES[f] for f in others)))
  prompts = []
  for value in synthetic.VOCABULARIES[family]:
    for context in contexts:
      slots = {family: _slot_text(family, value)}
      slots.update({f: _slot_text(f, v) for f, v in zip(others, context)})
      prompts.append(_with_article(template.format(**slots)))
  return prompts, len(synthetic.VOCABULARIES[family]), len(contexts)


def zero_shot_batch(
  n_images: int, seed: int | Sequence[int] = ZERO_SHOT_SEED, image_size: int = 64
) -> synthetic.SyntheticBatch:
  """The held-out single-object images of `zero_shot_attributes` (uint8 [n, S, S, 3])."""
  return synthetic.generate(n_images, seed, image_size=image_size, max_objects=1)


def zero_shot_attributes(
  bundle,
  n_images: int = 1000,
  seed: int | Sequence[int] = ZERO_SHOT_SEED,
  families: Sequence[str] = ZERO_SHOT_FAMILIES,
  batch_size: int = BATCH_SIZE,
) -> dict[str, Any]:
  """Zero-shot accuracy per attribute family on held-out single-object images.

  Class k's embedding is the L2-normalised mean of the L2-normalised embeddings of its prompt
  ensemble (`zero_shot_prompts`); an image is assigned the class of highest cosine similarity.

  Args:
    bundle: the model.
    n_images: single-object images from `zero_shot_batch(n_images, seed)`; attributes uniform.
    seed: image seed (default outside pretraining's seed namespace).
    families: subset of ZERO_SHOT_FAMILIES.
    batch_size: images / prompts per encode call.

  Returns:
    {"n_images": int, "seed": [int], "families": [str],
     "accuracy": {family: float in [0, 1]}, "chance": {family: 1 / n_classes},
     "confusion": {family: {"classes": [str], "matrix": int [n_classes][n_classes] lists,
                            rows true class, columns predicted}},
     "prompts_per_class": {family: int}, "templates": {family: str}}
  """
  families = tuple(families)
  unknown = [f for f in families if f not in FAMILY_TEMPLATES]
  if unknown:
    raise ValueError(f"unknown families {unknown}; expected some of {ZERO_SHOT_FAMILIES}")
  batch = zero_shot_batch(n_images, seed, _image_size(bundle))
  image = encode_images(bundle, batch.images, batch_size, desc="zero-shot images")
  ensembles = {f: zero_shot_prompts(f) for f in families}
  all_prompts = [p for f in families for p in ensembles[f][0]]
  text = encode_texts(bundle, all_prompts, batch_size=batch_size, desc="zero-shot prompts")
  result: dict[str, Any] = {
    "n_images": int(n_images),
    "seed": list(_seed_tuple(seed)),
    "families": list(families),
    "accuracy": {},
    "chance": {},
    "confusion": {},
    "prompts_per_class": {},
    "templates": {},
  }
  offset = 0
  for family in families:
    prompts, n_classes, per_class = ensembles[family]
    block = text[offset : offset + len(prompts)]
    offset += len(prompts)
    classes = l2_normalize(block.reshape(n_classes, per_class, -1).mean(axis=1))
    predicted = np.argmax(image @ classes.T, axis=1)
    labels = batch.labels(family)[:, 0].astype(np.int64)
    confusion = np.zeros((n_classes, n_classes), np.int64)
    np.add.at(confusion, (labels, predicted), 1)
    result["accuracy"][family] = float(np.mean(predicted == labels))
    result["chance"][family] = 1.0 / n_classes
    result["confusion"][family] = {
      "classes": list(synthetic.VOCABULARIES[family]),
      "matrix": confusion.tolist(),
    }
    result["prompts_per_class"][family] = per_class
    result["templates"][family] = FAMILY_TEMPLATES[family]
  return result


# ---------------------------------------------------------------------------------------------
# 2. Image-caption retrieval.


def retrieval_batch(
  n_pairs: int, seed: int | Sequence[int] = RETRIEVAL_SEED, image_size: int = 64
) -> synthetic.SyntheticBatch:
  """The held-out image-caption pairs of `retrieval_recall` (drawn like the training data)."""
  return synthetic.generate(n_pairs, seed, image_size=image_size)


def _positive_ranks(scores: np.ndarray) -> np.ndarray:
  """int64 [N]: 0-based rank of candidate i among row i's scores [N, N] (descending, ties
  broken by candidate index, as a stable sort would)."""
  n = scores.shape[0]
  positive = np.diagonal(scores)[:, None]
  before = np.arange(n)[None, :] < np.arange(n)[:, None]
  return ((scores > positive) | ((scores == positive) & before)).sum(axis=1).astype(np.int64)


def retrieval_recall(
  bundle,
  n_pairs: int = 1000,
  seed: int | Sequence[int] = RETRIEVAL_SEED,
  ks: Sequence[int] = (1, 5, 10),
  batch_size: int = BATCH_SIZE,
) -> dict[str, Any]:
  """Recall@k of text->image and image->text retrieval over n held-out pairs.

  Caption i's only positive is image i (and vice versa), as usual, even though some captions
  are identical or nearly so ("a red circle"): their images are counted as misses, so R@k
  is a lower bound of attribute-level retrieval. `unique_captions` tells how many are distinct.

  Returns:
    {"n_pairs": int, "seed": [int], "ks": [int], "unique_captions": int,
     "text_to_image": {"R@k": float in [0, 1]}, "image_to_text": {"R@k": float},
     "median_rank": {"text_to_image": float, "image_to_text": float} (1-based)}
  """
  batch = retrieval_batch(n_pairs, seed, _image_size(bundle))
  image = encode_images(bundle, batch.images, batch_size, desc="retrieval images")
  text = encode_texts(bundle, batch.captions, batch_size=batch_size, desc="retrieval captions")
  similarity = text @ image.T  # [texts, images]
  ranks = {
    "text_to_image": _positive_ranks(similarity),
    "image_to_text": _positive_ranks(similarity.T),
  }
  result: dict[str, Any] = {
    "n_pairs": int(n_pairs),
    "seed": list(_seed_tuple(seed)),
    "ks": [int(k) for k in ks],
    "unique_captions": len(set(batch.captions)),
    "median_rank": {},
  }
  for direction, rank in ranks.items():
    result[direction] = {f"R@{int(k)}": float(np.mean(rank < k)) for k in ks}
    result["median_rank"][direction] = float(np.median(rank + 1))
  return result


# ---------------------------------------------------------------------------------------------
# 3. Emphasis and de-emphasis (the paper's Table 3).


def _weight_text(w: float) -> str:
  return f"{float(w):g}"


def emphasis_prompt(
  triple: Mapping[str, Sequence[str]], family: str | None = None, weight: float = 1.0
) -> str:
  """ "a photo of a red striped circle", with `(word:weight)` on one family's word.

  The pattern reads as its adjective ("striped", "dotted", "checkered"). A weight of 1 (or
  family None) gives the plain prompt.
  """
  words = {f: synthetic.attribute_words(f, triple[f][0])[0] for f in EMPHASIS_FAMILIES}
  if family is not None and float(weight) != 1.0:
    if family not in words:
      raise ValueError(f"family must be one of {EMPHASIS_FAMILIES}, got {family!r}")
    words[family] = f"({words[family]}:{_weight_text(weight)})"
  phrase = " ".join(words[f] for f in EMPHASIS_FAMILIES)
  article = (
    "an" if synthetic.attribute_words("colour", triple["colour"][0])[0][0] in "aeiou" else "a"
  )
  return f"a photo of {article} {phrase}"


def _precision_at_positives(y_true: np.ndarray, scores: np.ndarray) -> float:
  """Precision among the R top-ranked images, R = number of positives (the paper's P_400 on
  800 CelebA images, half of them positive); ties broken by index."""
  return precision_at_k(y_true, scores)


def _summary(values: np.ndarray, weights: Sequence[float]) -> dict[str, Any]:
  """values float [T, F, W] -> per-family and overall mean/std per weight, and deltas."""
  keys = [repr(float(w)) for w in weights]
  rows = {f: values[:, i, :] for i, f in enumerate(EMPHASIS_FAMILIES)}
  rows["overall"] = values.reshape(-1, values.shape[-1])
  out: dict[str, Any] = {"mean": {}, "std": {}, "delta_mean": None, "delta_std": None}
  for name, v in rows.items():
    out["mean"][name] = {k: float(v[:, j].mean()) for j, k in enumerate(keys)}
    out["std"][name] = {k: float(v[:, j].std()) for j, k in enumerate(keys)}
  if _REFERENCE_WEIGHT in [float(w) for w in weights]:
    ref = [float(w) for w in weights].index(_REFERENCE_WEIGHT)
    out["delta_mean"], out["delta_std"] = {}, {}
    for name, v in rows.items():
      delta = v - v[:, ref : ref + 1]
      out["delta_mean"][name] = {k: float(delta[:, j].mean()) for j, k in enumerate(keys)}
      out["delta_std"][name] = {k: float(delta[:, j].std()) for j, k in enumerate(keys)}
  return out


def emphasis_effect(
  bundle,
  n_triples: int = 24,
  images_per_category: int = 8,
  weights: Sequence[float] = EMPHASIS_WEIGHTS,
  seed: int | Sequence[int] = EMPHASIS_SEED,
  methods: Sequence[str] = METHODS,
  start_block: int | None = None,
  batch_size: int = BATCH_SIZE,
) -> dict[str, Any]:
  """AP of attribute retrieval while one attribute's word is (de-)emphasised (Table 3).

  For each triple of `emphasis_triples(n_triples, seed)`, the 8 * images_per_category images
  of `emphasis_scenes` are rendered (seed (*seed, t), jittered, random size, position and
  background) and ranked by cosine similarity to `emphasis_prompt(triple, family, w)`; the
  AP (sklearn's average_precision_score) counts the images with the triple's value of
  `family` as positives (half of them). P@R is the precision among the top R = #positives.

  Args:
    bundle: the model.
    n_triples: prompts (distinct (c, p, s)).
    images_per_category: images of each of the 8 categories.
    weights: weights put on the emphasised word; 1.0 (the plain prompt) is the reference of
      the deltas.
    seed: triple choice and rendering.
    methods: "stori" (SToRI's reweighted attention) and/or "prompt_weighting" (baseline).
    start_block: first reweighted block (1-indexed); None: the bundle's default.
    batch_size: images / prompts per encode call.

  Returns:
    {"n_triples", "images_per_category", "seed", "weights": [float], "families": [str],
     "methods": {method: {"ap": summary, "p_at_r": summary}}, where summary is
       {"mean": {family or "overall": {repr(w): float}}, "std": ...,
        "delta_mean": {...: {repr(w): AP(w) - AP(1.0)}}, "delta_std": ...}
       (deltas None when 1.0 is not among the weights; std over triples, or over
       (triple, family) pairs for "overall"),
     "triples": [{"colour": [c, c'], "pattern": [p, p'], "shape": [s, s'], "prompt": str,
                  "ap": {method: {family: {repr(w): float}}}, "p_at_r": {...}}]}
  """
  weights = [float(w) for w in weights]
  methods = tuple(methods)
  for method in methods:
    if method not in METHODS:
      raise ValueError(f"unknown method {method!r}; expected some of {METHODS}")
  if images_per_category < 1:
    raise ValueError(f"images_per_category must be >= 1, got {images_per_category}")
  triples = emphasis_triples(n_triples, seed)
  base_seed = _seed_tuple(seed)
  pool = 8 * images_per_category
  images, positives = [], []
  for t, triple in enumerate(triples):
    scenes, is_positive = emphasis_scenes(triple, images_per_category)
    images.append(synthetic.render(scenes, (*base_seed, t), image_size=_image_size(bundle)).images)
    positives.append(is_positive)
  image = encode_images(bundle, np.concatenate(images), batch_size, desc="emphasis images")
  image = image.reshape(len(triples), pool, -1)
  prompts = [
    emphasis_prompt(triple, f, w) for triple in triples for f in EMPHASIS_FAMILIES for w in weights
  ]

  shape = (len(triples), len(EMPHASIS_FAMILIES), len(weights))
  ap = {m: np.zeros(shape) for m in methods}
  p_at_r = {m: np.zeros(shape) for m in methods}
  for method in methods:
    text = encode_texts(
      bundle,
      prompts,
      weighted=True,
      method=method,
      start_block=start_block,
      batch_size=batch_size,
      desc=f"emphasis prompts ({method})",
    )
    text = text.reshape(len(triples), len(EMPHASIS_FAMILIES), len(weights), -1)
    for t in range(len(triples)):
      scores = np.einsum("ne,fwe->nfw", image[t], text[t])
      for i, family in enumerate(EMPHASIS_FAMILIES):
        y = positives[t][family]
        for j in range(len(weights)):
          ap[method][t, i, j] = average_precision_score(y, scores[:, i, j])
          p_at_r[method][t, i, j] = _precision_at_positives(y, scores[:, i, j])

  keys = [repr(w) for w in weights]
  details = []
  for t, triple in enumerate(triples):
    entry: dict[str, Any] = {f: list(triple[f]) for f in EMPHASIS_FAMILIES}
    entry["prompt"] = emphasis_prompt(triple)
    for name, values in (("ap", ap), ("p_at_r", p_at_r)):
      entry[name] = {
        m: {
          f: {k: float(values[m][t, i, j]) for j, k in enumerate(keys)}
          for i, f in enumerate(EMPHASIS_FAMILIES)
        }
        for m in methods
      }
    details.append(entry)
  return {
    "n_triples": int(n_triples),
    "images_per_category": int(images_per_category),
    "seed": list(base_seed),
    "weights": weights,
    "families": list(EMPHASIS_FAMILIES),
    "start_block": start_block,
    "methods": {
      m: {"ap": _summary(ap[m], weights), "p_at_r": _summary(p_at_r[m], weights)} for m in methods
    },
    "triples": details,
  }


# ---------------------------------------------------------------------------------------------
# Reports.

_METHOD_TITLES = {
  "stori": "SToRI (reweighted attention)",
  "prompt_weighting": "prompt weighting (baseline, paper App. C.1)",
}


def _signed(x: float) -> str:
  return f"{x:+.3f}"


def _emphasis_table(summary: Mapping[str, Any], weights: Sequence[float]) -> list[str]:
  keys = [repr(float(w)) for w in weights]
  has_delta = summary["delta_mean"] is not None
  header = ["emphasised word"]
  for w, k in zip(weights, keys):
    header.append(f"AP w={float(w)!r}")
    if has_delta and float(w) != _REFERENCE_WEIGHT:
      header.append(f"Δ w={float(w)!r}")
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for row in list(EMPHASIS_FAMILIES) + ["overall"]:
    cells = [f"**{row}**" if row == "overall" else row]
    for w, k in zip(weights, keys):
      cells.append(f"{summary['mean'][row][k]:.3f} ± {summary['std'][row][k]:.3f}")
      if has_delta and float(w) != _REFERENCE_WEIGHT:
        cells.append(
          f"{_signed(summary['delta_mean'][row][k])} ± {summary['delta_std'][row][k]:.3f}"
        )
    lines.append("| " + " | ".join(cells) + " |")
  return lines


def markdown_tables(results: Mapping[str, Any]) -> str:
  """Markdown tables of `evaluate`'s results (any of "zero_shot", "retrieval", "emphasis").

  Zero-shot accuracy per family; retrieval R@k in both directions; and per method the
  Table 3 analogue: rows the emphasised attribute family (and overall), columns AP (mean ±
  std over triples) at each weight and its change from w = 1.
  """
  out = []
  if results.get("source"):
    out += [f"Model: `{results['source']}`", ""]
  zero = results.get("zero_shot")
  if zero:
    out += [
      f"### Zero-shot attribute classification ({zero['n_images']} single-object images)",
      "",
      "| family | classes | prompts per class | chance | accuracy |",
      "|---|---|---|---|---|",
    ]
    for family in zero["families"]:
      out.append(
        f"| {family} | {len(zero['confusion'][family]['classes'])} | "
        f"{zero['prompts_per_class'][family]} | {zero['chance'][family]:.3f} | "
        f"{zero['accuracy'][family]:.3f} |"
      )
    out.append("")
  retrieval = results.get("retrieval")
  if retrieval:
    ks = retrieval["ks"]
    out += [
      f"### Retrieval ({retrieval['n_pairs']} image-caption pairs, "
      f"{retrieval['unique_captions']} distinct captions)",
      "",
      "| direction | " + " | ".join(f"R@{k}" for k in ks) + " | median rank |",
      "|---|" + "---|" * (len(ks) + 1),
    ]
    for direction, title in (("text_to_image", "text → image"), ("image_to_text", "image → text")):
      cells = [f"{retrieval[direction][f'R@{k}']:.3f}" for k in ks]
      out.append(
        f"| {title} | " + " | ".join(cells) + f" | {retrieval['median_rank'][direction]:g} |"
      )
    out.append("")
  emphasis = results.get("emphasis")
  if emphasis:
    pool = 8 * emphasis["images_per_category"]
    for method, summaries in emphasis["methods"].items():
      out += [
        f"### Emphasis effect, {_METHOD_TITLES.get(method, method)}",
        "",
        f"AP of retrieving the images with the emphasised attribute value among "
        f"{pool} images (8 categories), mean ± std over {emphasis['n_triples']} "
        'prompts "a photo of a {colour} {pattern} {shape}" (cf. the paper\'s Table 3).',
        "",
      ]
      out += _emphasis_table(summaries["ap"], emphasis["weights"])
      out.append("")
  return "\n".join(out).rstrip() + "\n"


def evaluate(
  bundle,
  n_images: int = 1000,
  n_pairs: int = 1000,
  n_triples: int = 24,
  images_per_category: int = 8,
  weights: Sequence[float] = EMPHASIS_WEIGHTS,
  batch_size: int = BATCH_SIZE,
  start_block: int | None = None,
) -> dict[str, Any]:
  """All three measurements with their default seeds, plus wall-clock seconds of each."""
  results: dict[str, Any] = {"source": getattr(bundle, "source", "") or "", "seconds": {}}
  for name, fn in (
    ("zero_shot", lambda: zero_shot_attributes(bundle, n_images, batch_size=batch_size)),
    ("retrieval", lambda: retrieval_recall(bundle, n_pairs, batch_size=batch_size)),
    (
      "emphasis",
      lambda: emphasis_effect(
        bundle,
        n_triples,
        images_per_category,
        weights,
        start_block=start_block,
        batch_size=batch_size,
      ),
    ),
  ):
    start = time.perf_counter()
    results[name] = fn()
    results["seconds"][name] = round(time.perf_counter() - start, 3)
  return results
