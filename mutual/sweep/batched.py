"""The stages batched across models (vmapped over a leading model axis): the language stages,
with the embedding dims zero-padded to the largest, and (config.spectral_across_models) the
foreground split of the models whose patch features share a shape.

Zero padding changes nothing: a zero column adds nothing to a norm or a dot product (cosine
scores of unit vectors are unchanged), so the padded stages compute each model's own result up to
floating-point summation order. The foreground split is not padded: padding every model's rows
to the largest grid and width would make each Gram matrix the largest model's (17.7x the
eigendecomposition work over the 13 models, benchmarks/mutual_sweep_split.py), so the models
are grouped by the shape of their patch features, each group one batched eigendecomposition.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mutual import pipeline
from stori_jax.plumbing.config_files import ConfigError

#: `language_stages` arguments that are compile-time constants; the others are traced.
_STATIC_OPTIONS = ("top_k", "rule", "solver", "top", "u", "formula", "iterations", "max_iterations")


def pad_stack(arrays: Sequence, width: int | None = None) -> jax.Array:
  """Arrays differing only in their last dim -> one array [M, ..., width], zero-padded."""
  width = width or max(int(a.shape[-1]) for a in arrays)
  padded = [
    jnp.pad(jnp.asarray(a), [(0, 0)] * (a.ndim - 1) + [(0, width - a.shape[-1])]) for a in arrays
  ]
  return jnp.stack(padded)


@functools.partial(jax.jit, static_argnames=_STATIC_OPTIONS)
def _stacked_language(concepts, valid, images, desc, classes, predicted, dynamic, **static):
  def one(c, v, i, d, k, p):
    return pipeline.language_stages(c, v, i, d, k, p, **dynamic, **static)

  return jax.vmap(one)(concepts, valid, images, desc, classes, predicted)


def batched_language_stages(
  concept_embeddings: Sequence,
  concept_valid: Sequence,
  image_embeddings: Sequence,
  descriptor_embeddings: Sequence,
  class_embeddings: Sequence,
  predicted: Sequence,
  **options,
) -> dict[str, jax.Array]:
  """`pipeline.language_stages` for M models at once.

  Every input is a per-model sequence (shapes as language_stages, the embedding dim E_m may
  differ; B, L, D and C must agree). Embeddings are zero-padded to the largest E: the scores are
  dot products, which zero entries leave unchanged, so each model gets its own result.

  Returns:
    language_stages' dict with a leading model axis [M, ...] on every array.
  """
  width = max(int(np.shape(e)[-1]) for e in descriptor_embeddings)
  static = {k: v for k, v in options.items() if k in _STATIC_OPTIONS}
  dynamic = {k: jnp.float32(v) for k, v in options.items() if k not in _STATIC_OPTIONS}
  return _stacked_language(
    pad_stack(concept_embeddings, width),
    jnp.stack([jnp.asarray(v, bool) for v in concept_valid]),
    pad_stack(image_embeddings, width),
    pad_stack(descriptor_embeddings, width),
    pad_stack(class_embeddings, width),
    jnp.stack([jnp.asarray(p) for p in predicted]),
    dynamic,
    **static,
  )


#: config.spectral_across_models = "auto": per JAX backend, whether the foreground split runs
#: batched across the models that share shapes, the faster of the two ways as
#: benchmarks/spectral_across_models.py measured them side by side (13 models of ViT-B/16's
#: shape, 50 images of 196 patches per class): on 2 shared CPU cores batched took 0.81 and 0.85
#: of the per-model time (two runs, medians of 7 and 9 interleaved rounds under a load of 11-15;
#: benchmarks/results/spectral_across_models_cpu*.json). The GPU is unmeasured by that benchmark
#: (benchmarks/gpu_check.py's spectral part times it where one is lent; an H100 found the SVD
#: batched across models no faster, 3.4 against 3.2 s per class): per model there, as on any
#: backend not listed.
SPECTRAL_ACROSS_MODELS_AUTO = {"cpu": True, "gpu": False}


def spectral_across_models(value, backend: str | None = None, holds_all: bool = True) -> bool:
  """config.spectral_across_models resolved: True / False as given (or as the strings "true" /
  "false"), "auto" the faster way on `backend` (default jax's; `SPECTRAL_ACROSS_MODELS_AUTO`),
  and only where the model pool holds every model (`holds_all`): batching visits each model
  twice per chunk, and a pool that drops models would reload their weights, which costs more
  than the batched split saves. ConfigError for anything else."""
  if isinstance(value, bool):
    return value
  if isinstance(value, str) and value.lower() in ("true", "false"):
    return value.lower() == "true"
  if value != "auto":
    raise ConfigError(
      "config.spectral_across_models must be True (the foreground split of the models that "
      'share shapes as one batched eigendecomposition), False (model by model) or "auto" (the '
      f"faster of the two on this backend), got {value!r}."
    )
  return holds_all and SPECTRAL_ACROSS_MODELS_AUTO.get(backend or jax.default_backend(), False)


def shape_groups(shapes: Sequence[tuple[int, ...]]) -> list[list[int]]:
  """The positions of equal shapes, grouped in order of first appearance: [[0, 2], [1], ...]."""
  groups: dict[tuple[int, ...], list[int]] = {}
  for position, shape in enumerate(shapes):
    groups.setdefault(tuple(shape), []).append(position)
  return list(groups.values())


def batched_foreground(patches: Sequence, analysis) -> list[jax.Array]:
  """`pipeline.split_foreground` of M models' patch features of one class (float32
  [B, h, w, D_m] each, shapes may differ): the models whose patch features share a shape as one
  batched eigendecomposition (`pipeline.split_foreground_across`), a model whose shape no other
  has on its own.

  Returns:
    the M foreground masks, bool [B, h, w] each, in the order of `patches`.
  """
  masks: list[jax.Array | None] = [None] * len(patches)
  for group in shape_groups([np.shape(p) for p in patches]):
    if len(group) == 1:
      masks[group[0]] = pipeline.split_foreground(patches[group[0]], analysis)
      continue
    for position, mask in zip(
      group, pipeline.split_foreground_across([patches[m] for m in group], analysis)
    ):
      masks[position] = mask
  return masks
