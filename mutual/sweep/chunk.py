"""One chunk of classes through every model of the sweep (`analyze_classes`), in two phases:

1. per model    text bank (at its first load); then per class `pipeline.vision_side`: image
                embeddings and patch features (one tower pass), zero-shot prediction,
                foreground split, CRF, PCA / K-means concepts, concept embeddings from the
                visual prompts. Each model is fetched from the pool once per chunk, and its
                patch features are dropped as soon as its concepts are fitted.
2. all models   language stages (descriptor scores to MI curves), vmapped over models

With `spectral_across_models` phase 1 visits the models twice: their towers first (the chunk's
patch features of every model held), then the foreground split of each class for all models
whose patch features share a shape as one batched eigendecomposition, then the rest of each
model's vision side.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, MutableMapping, Sequence

import numpy as np
from tqdm import tqdm

from mutual import data, pipeline
from mutual.sweep.batched import batched_foreground, batched_language_stages
from mutual.sweep.models import ModelPool
from stori_jax.clip.bundle import CLIPBundle


def analyze_classes(
  pool: ModelPool,
  indices: Sequence[int],
  banks: MutableMapping[int, pipeline.TextBank],
  class_images: Sequence[Sequence[data.ClassImages]],
  analysis,
  methods: Sequence[str] = pipeline.METHODS,
  progress: bool = False,
  encode: Callable[[CLIPBundle], pipeline.TextBank] | None = None,
  embed_images: Callable[[CLIPBundle, np.ndarray], np.ndarray] | None = None,
  spectral_across_models: bool = False,
) -> list[list[dict[str, Any]]]:
  """`pipeline.analyze_class` for several models on a chunk of classes.

  Args:
    pool: the models; indices: the M pool indices to run.
    banks: pool index -> the model's encoded text bank (the same descriptors and classes for
      all); a missing one is made with `encode(bundle)` at the model's first load and stored.
    class_images: per model, the chunk's classes (same labels and images, at the model's size).
    analysis: config.analysis; methods: concept methods.
    progress: show progress bars (each with its total).
    embed_images: (bundle, uint8 images [B, S, S, 3]) -> float32 [B, E]; when given, each
      class's result also holds "embedded_images", its output while the model is loaded (Table
      2 classifies the images with mutual.evaluate's embeddings, `protocols.image_embeddings`).
    spectral_across_models: the vision side in two visits of the models: their towers (the
      chunk's patch features of every model held), then per class the foreground split of the
      models that share a patch-feature shape as one batched eigendecomposition
      (`batched_foreground`), then the rest of each model's vision side. The same results as
      one visit (False); a pool holding fewer than the M models loads each twice per chunk.

  Returns:
    results[model][class]: analyze_class's dict of numpy arrays.
  """
  n_models, n_classes = len(indices), len(class_images[0])
  position = {index: m for m, index in enumerate(indices)}
  options = pipeline.stage_options(analysis)
  bar = functools.partial(tqdm, disable=not progress, dynamic_ncols=True)

  def visit_models(step: Callable[[int, CLIPBundle, int], None], what: str) -> None:
    """step(m, bundle, c) for every model (fetched from the pool once) and class."""
    with bar(total=n_models, desc=f"{what}: models", leave=False) as models_bar:
      for index in pool.order(indices):
        m, bundle = position[index], pool.get(index)
        models_bar.set_postfix_str(pool.models[index].name)
        if index not in banks:
          if encode is None:
            raise ValueError(f"no text bank for model {index} and no `encode` to make one")
          banks[index] = encode(bundle)
        classes_bar = bar(total=n_classes, desc=f"{what}: classes", leave=False)
        for c in range(n_classes):
          step(m, bundle, c)
          if embed_images is not None and embedded[m][c] is None:
            embedded[m][c] = np.asarray(embed_images(bundle, class_images[m][c].images))
          if c == 0 and n_classes > 1:
            # The first class compiles the model's programs: the bar restarts after it, so its
            # rate and ETA count the classes that only run.
            classes_bar.close()
            classes_bar = bar(total=n_classes, initial=1, desc=f"{what}: classes", leave=False)
          else:
            classes_bar.update()
        classes_bar.close()
        models_bar.update()
        del bundle  # the pool alone decides what stays loaded

  vision: list[list[Any]] = [[None] * n_classes for _ in range(n_models)]
  embedded: list[list[Any]] = [[None] * n_classes for _ in range(n_models)]
  if not spectral_across_models:

    def whole(m: int, bundle: CLIPBundle, c: int) -> None:
      vision[m][c] = pipeline.vision_side(
        bundle, class_images[m][c].images, banks[indices[m]], analysis, methods
      )

    visit_models(whole, "vision side")
  else:
    towers: list[list[Any]] = [[None] * n_classes for _ in range(n_models)]

    def tower(m: int, bundle: CLIPBundle, c: int) -> None:
      towers[m][c] = pipeline.vision_tower(
        bundle, class_images[m][c].images, banks[indices[m]], analysis
      )

    visit_models(tower, "vision side (towers)")
    masks = [
      batched_foreground([towers[m][c]["patch"] for m in range(n_models)], analysis)
      for c in bar(range(n_classes), desc="foreground (batched across models)", leave=False)
    ]

    def rest(m: int, bundle: CLIPBundle, c: int) -> None:
      vision[m][c] = pipeline.vision_after_foreground(
        bundle, class_images[m][c].images, towers[m][c], masks[c][m], analysis, methods
      )
      towers[m][c] = None  # the patch features, dropped once the concepts are fitted

    visit_models(rest, "vision side (after the foreground)")

  results: list[list[Any]] = [[None] * n_classes for _ in range(n_models)]
  for c in tqdm(
    range(n_classes),
    desc="language stages (batched)",
    disable=not progress,
    dynamic_ncols=True,
    leave=False,
  ):
    for m in range(n_models):
      v = vision[m][c]
      results[m][c] = {k: v[k] for k in ("predicted", "class_scores", "foreground", "refined")}
      if embed_images is not None:
        results[m][c]["embedded_images"] = embedded[m][c]
    for method in methods:
      stages = batched_language_stages(
        [vision[m][c][method]["concept_embeddings"] for m in range(n_models)],
        [vision[m][c][method]["concept_valid"] for m in range(n_models)],
        [vision[m][c]["image_embeddings"] for m in range(n_models)],
        [banks[i].descriptor_embeddings for i in indices],
        [banks[i].class_embeddings for i in indices],
        [vision[m][c]["predicted"] for m in range(n_models)],
        **options,
      )
      stages = {k: np.asarray(v) for k, v in stages.items()}
      for m in range(n_models):
        v = vision[m][c][method]
        results[m][c][method] = dict(
          concept_maps=v["concept_maps"],
          pixel_maps=v["pixel_maps"],
          concept_valid=v["concept_valid"],
          **{k: s[m] for k, s in stages.items()},
        )
    for m in range(n_models):
      vision[m][c] = None  # reduced into results
  return results
