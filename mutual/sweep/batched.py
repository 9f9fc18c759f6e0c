"""Stages of the analysis batched across models: foreground eigendecomposition (one batched SVD per
patch grid), CRF (one call per image size) and the language stages (vmapped over a leading model
axis), with the feature / embedding dims zero-padded to the largest.

Zero padding changes nothing: a zero column adds nothing to a norm, a dot product or a distance
(cosine scores of unit vectors are unchanged), and the left singular vectors of [F, 0] are those
of F, so the padded stages compute each model's own result up to floating-point summation order.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mutual import crf, foreground, pipeline

#: `language_stages` arguments that are compile-time constants; the others are traced.
_STATIC_OPTIONS = ("top_k", "rule", "solver", "top", "u", "formula", "iterations", "max_iterations")


def pad_stack(arrays: Sequence, width: int | None = None) -> jax.Array:
  """Arrays differing only in their last dim -> one array [M, ..., width], zero-padded."""
  width = width or max(int(a.shape[-1]) for a in arrays)
  padded = [
    jnp.pad(jnp.asarray(a), [(0, 0)] * (a.ndim - 1) + [(0, width - a.shape[-1])]) for a in arrays
  ]
  return jnp.stack(padded)


def _groups(keys: Sequence) -> dict[Any, list[int]]:
  out: dict[Any, list[int]] = {}
  for i, key in enumerate(keys):
    out.setdefault(key, []).append(i)
  return out


@functools.partial(jax.jit, static_argnames=("center", "joint"))
def _stacked_split(features: jax.Array, center: bool, joint: bool) -> jax.Array:
  def one(f):
    if joint:
      return foreground.fiedler_vector(f, center=center) > 0
    return jax.vmap(lambda g: foreground.fiedler_vector(g[None], center=center)[0])(f) > 0

  return jax.vmap(one)(features)


def batched_foreground(
  patch_features: Sequence, joint: bool = True, center: bool = False, min_second: int = 5
) -> list[jax.Array]:
  """`foreground.prominent_patches` for several models' features of the same images.

  Args:
    patch_features: per model float32 [B, h, w, D_m]; models sharing (B, h, w) are split in one
      batched eigendecomposition with D zero-padded to the group's largest.
    joint, center, min_second: as prominent_patches.

  Returns:
    per model bool [B, h, w].
  """
  out: list[Any] = [None] * len(patch_features)
  for shape, members in _groups([tuple(f.shape[:3]) for f in patch_features]).items():
    stacked = pad_stack([patch_features[i] for i in members])
    masks = _stacked_split(stacked, center=center, joint=joint)
    regions = foreground.main_regions(masks.reshape(-1, *shape[1:]), min_second=min_second)
    regions = regions.reshape(len(members), *shape)
    for j, i in enumerate(members):
      out[i] = regions[j]
  return out


def batched_refine(images_by_model: Sequence[np.ndarray], coarse: Sequence, use_crf: bool = True):
  """The pipeline's CRF step for several models: models with images of one size are refined in
  one call (the CRF treats images one at a time, so batching is exact). A foreground the CRF
  removes entirely keeps its unrefined mask, as in `pipeline.analyze_class`.

  Args:
    images_by_model: per model uint8 [B, S_m, S_m, 3]; coarse: per model bool [B, S_m, S_m].

  Returns:
    per model bool [B, S_m, S_m].
  """
  out: list[Any] = [None] * len(coarse)
  for _, members in _groups([np.asarray(im).shape for im in images_by_model]).items():
    masks = jnp.concatenate([jnp.asarray(coarse[i]) for i in members])
    if use_crf:
      refined = crf.refine(np.concatenate([images_by_model[i] for i in members]), masks)
    else:
      refined = masks
    refined = jnp.where(jnp.any(refined, axis=(1, 2), keepdims=True), refined, masks)
    for j, chunk in zip(members, jnp.split(refined, len(members))):
      out[j] = chunk
  return out


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
