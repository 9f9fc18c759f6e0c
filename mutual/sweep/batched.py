"""The language stages batched across models (vmapped over a leading model axis), with the
embedding dims zero-padded to the largest.

Zero padding changes nothing: a zero column adds nothing to a norm or a dot product (cosine
scores of unit vectors are unchanged), so the padded stages compute each model's own result up to
floating-point summation order.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mutual import pipeline

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
