"""One chunk of classes through every model of the sweep (`analyze_classes`), in four phases:

1. per model    text bank (at its first load); image embeddings, zero-shot prediction, patch
                features
2. all models   foreground (batched SVD), CRF; PCA / K-means concepts per model
3. per model    concept embeddings from the visual prompts
4. all models   language stages (descriptor scores to MI curves), vmapped over models
"""

from __future__ import annotations

from typing import Any, Callable, MutableMapping, Sequence

import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from mutual import data, features, foreground, pipeline, visual_prompts
from mutual.sweep.batched import batched_foreground, batched_language_stages, batched_refine
from mutual.sweep.models import ModelPool
from stori_jax.bundle import CLIPBundle
from stori_jax.preprocess import normalize


def _vision_outputs(bundle, images: np.ndarray, bank: pipeline.TextBank, feature_kind: str):
  """Phase 1 of one model on one class, as the start of pipeline.analyze_class."""
  x = normalize(images, bundle.preprocess_config.mean, bundle.preprocess_config.std)
  embeddings = features.image_embeddings(bundle, x)
  scores = embeddings @ jnp.asarray(bank.class_embeddings).T
  return dict(
    image_embeddings=np.asarray(embeddings),
    class_scores=np.asarray(scores),
    predicted=np.asarray(jnp.argmax(scores, axis=-1)),
    patch=np.asarray(features.patch_features(bundle, x, kind=feature_kind)),
  )


def analyze_classes(
  pool: ModelPool,
  indices: Sequence[int],
  banks: MutableMapping[int, pipeline.TextBank],
  class_images: Sequence[Sequence[data.ClassImages]],
  analysis,
  methods: Sequence[str] = pipeline.METHODS,
  progress: bool = False,
  encode: Callable[[CLIPBundle], pipeline.TextBank] | None = None,
) -> list[list[dict[str, Any]]]:
  """`pipeline.analyze_class` for several models on a chunk of classes.

  Args:
    pool: the models; indices: the M pool indices to run.
    banks: pool index -> the model's encoded text bank (the same descriptors and classes for
      all); a missing one is made with `encode(bundle)` at the model's first load and stored.
    class_images: per model, the chunk's classes (same labels and images, at the model's size).
    analysis: config.analysis; methods: concept methods.

  Returns:
    results[model][class]: analyze_class's dict of numpy arrays.
  """
  n_models, n_classes = len(indices), len(class_images[0])
  position = {index: m for m, index in enumerate(indices)}
  options = pipeline.stage_options(analysis)
  n = int(analysis.n_concepts)
  seed = int(analysis.kmeans_seed)

  def bar(iterable, desc):
    return tqdm(iterable, desc=desc, disable=not progress, dynamic_ncols=True, leave=False)

  vision: list[list[Any]] = [[None] * n_classes for _ in range(n_models)]
  for index in bar(pool.order(indices), "features (per model)"):
    m, bundle = position[index], pool.get(index)
    if index not in banks:
      if encode is None:
        raise ValueError(f"no text bank for model {index} and no `encode` to make one")
      banks[index] = encode(bundle)
    for c in range(n_classes):
      vision[m][c] = _vision_outputs(
        bundle, class_images[m][c].images, banks[index], analysis.feature_kind
      )

  shared = []  # per class: foreground, refined, per-method concept and pixel maps (per model)
  for c in bar(range(n_classes), "foreground and CRF (batched), concepts"):
    patch = [vision[m][c]["patch"] for m in range(n_models)]
    fg = batched_foreground(
      patch, joint=bool(analysis.joint_foreground), center=bool(analysis.center_features)
    )
    images = [class_images[m][c].images for m in range(n_models)]
    coarse = [foreground.upsample_mask(fg[m], images[m].shape[1]) for m in range(n_models)]
    refined = batched_refine(images, coarse, bool(analysis.crf))
    # PCA / K-means stay per model: PCA's min-max argmax has exact ties (a patch that is the
    # extreme of two axes scores 1 on both), which padding D could break by rounding.
    maps = {
      method: [pipeline.concept_maps(patch[m], fg[m], method, n, seed) for m in range(n_models)]
      for method in methods
    }
    pixels = {
      method: [pipeline.pixel_concepts(maps[method][m], refined[m]) for m in range(n_models)]
      for method in methods
    }
    shared.append(dict(fg=fg, refined=refined, maps=maps, pixels=pixels))
    for m in range(n_models):
      vision[m][c].pop("patch")  # no longer needed; bounds the chunk's memory

  embedded: list[list[Any]] = [[None] * n_classes for _ in range(n_models)]
  for index in bar(pool.order(indices), "concept embeddings (per model)"):
    m, bundle = position[index], pool.get(index)
    for c in range(n_classes):
      embedded[m][c] = {
        method: visual_prompts.concept_embeddings(
          bundle, class_images[m][c].images, shared[c]["pixels"][method][m], n_concepts=n
        )
        for method in methods
      }

  results: list[list[Any]] = [[None] * n_classes for _ in range(n_models)]
  for c in bar(range(n_classes), "language stages (batched)"):
    for m in range(n_models):
      v = vision[m][c]
      results[m][c] = dict(
        predicted=v["predicted"],
        class_scores=v["class_scores"],
        foreground=np.asarray(shared[c]["fg"][m]),
        refined=np.asarray(shared[c]["refined"][m]),
      )
    for method in methods:
      stages = batched_language_stages(
        [embedded[m][c][method][0] for m in range(n_models)],
        [embedded[m][c][method][1] for m in range(n_models)],
        [vision[m][c]["image_embeddings"] for m in range(n_models)],
        [banks[i].descriptor_embeddings for i in indices],
        [banks[i].class_embeddings for i in indices],
        [vision[m][c]["predicted"] for m in range(n_models)],
        **options,
      )
      stages = {k: np.asarray(v) for k, v in stages.items()}
      for m in range(n_models):
        results[m][c][method] = dict(
          concept_maps=np.asarray(shared[c]["maps"][method][m]),
          pixel_maps=np.asarray(shared[c]["pixels"][method][m]),
          concept_valid=np.asarray(embedded[m][c][method][1]),
          **{k: v[m] for k, v in stages.items()},
        )
  return results
