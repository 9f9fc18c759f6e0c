"""Descriptor scoring: concept x descriptor similarities, the top-k intersection, relevance filter.

Sammani & Deligiannis (2024), Sec. 3.1 and App. K. For one image with L visual concepts and a bank
of D descriptors, the candidates for the optimal transport are the descriptors that are in the
top k (500) of every concept, then only those relevant to the whole image:
  - reference code: cosine(image, descriptor) > mean over the candidates - 0.02;
  - paper (footnote 3): cosine > median over the candidates + 0.02.
Everything is per image with fixed shapes and masks, so `jax.vmap` batches the B images of a class.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp

RELEVANCE_RULES = ("mean", "median", "none")


def unique_descriptors(per_class: dict[str, Sequence[str]]) -> list[str]:
  """The class-agnostic bank D: every class's descriptors, duplicates dropped, first-seen order."""
  seen: dict[str, None] = {}
  for descriptors in per_class.values():
    for d in descriptors:
      seen.setdefault(d, None)
  return list(seen)


def cosine_scores(embeddings: jax.Array, descriptor_embeddings: jax.Array) -> jax.Array:
  """embeddings float [..., E] x unit descriptor embeddings [D, E] -> float32 [..., D].

  The embeddings are used as given: the concept embeddings are means of unit vectors and are not
  re-normalised (reference), so their scores are dot products rather than cosines. The product
  runs at HIGHEST precision: fp32 on accelerators too (no TF32 / bf16 passes).
  """
  return jnp.einsum(
    "...e,de->...d", embeddings, descriptor_embeddings, precision=jax.lax.Precision.HIGHEST
  ).astype(jnp.float32)


def _masked_median(values: jax.Array, mask: jax.Array) -> jax.Array:
  """Median of values[mask] (numpy's: the mean of the two middle values for an even count)."""
  count = jnp.sum(mask)
  ordered = jnp.sort(jnp.where(mask, values, jnp.inf))
  lower = ordered[jnp.maximum((count - 1) // 2, 0)]
  upper = ordered[jnp.maximum(count // 2, 0)]
  return jnp.where(count > 0, 0.5 * (lower + upper), 0.0)


def top_k_intersection(concept_scores: jax.Array, concept_valid: jax.Array, k: int) -> jax.Array:
  """Descriptors in the top k of every valid concept of one image.

  Args:
    concept_scores: float32 [L, D].
    concept_valid: bool [L]; invalid (padding) concepts do not take part.
    k: how many top descriptors per concept (clipped to D).

  Returns:
    bool [D]; all False when no concept is valid.
  """
  num_concepts, num_descriptors = concept_scores.shape
  k = min(int(k), num_descriptors)
  _, top = jax.lax.top_k(concept_scores, k)
  in_top = jnp.zeros((num_concepts, num_descriptors), bool)
  in_top = in_top.at[jnp.arange(num_concepts)[:, None], top].set(True)
  in_all = jnp.all(in_top | ~concept_valid[:, None], axis=0)
  return in_all & jnp.any(concept_valid)


def relevance_filter(
  candidates: jax.Array, image_scores: jax.Array, rule: str = "mean", offset: float = 0.02
) -> jax.Array:
  """Keeps the candidates whose similarity to the whole image passes the rule's threshold.

  Args:
    candidates: bool [D].
    image_scores: float32 [D], cosine(whole image, descriptor).
    rule: "mean" (reference: > mean - offset), "median" (paper: > median + offset) or "none".
    offset: the 0.02 of both rules.

  Returns:
    bool [D], a subset of candidates.
  """
  if rule not in RELEVANCE_RULES:
    raise ValueError(f"relevance rule must be one of {RELEVANCE_RULES}, got {rule!r}.")
  if rule == "none":
    return candidates
  count = jnp.maximum(jnp.sum(candidates), 1)
  if rule == "mean":
    threshold = jnp.sum(jnp.where(candidates, image_scores, 0.0)) / count - offset
  else:
    threshold = _masked_median(image_scores, candidates) + offset
  return candidates & (image_scores > threshold)


@functools.partial(jax.jit, static_argnames=("u",))
def language_concepts(
  class_embeddings: jax.Array, descriptor_embeddings: jax.Array, predicted: jax.Array, u: int = 50
) -> tuple[jax.Array, jax.Array]:
  """Sec. 3.2: the top u descriptors of each image's predicted class in the language space.

  Args:
    class_embeddings: float32 [C, E] unit class embeddings.
    descriptor_embeddings: float32 [D, E] unit descriptor embeddings.
    predicted: int [B] predicted class per image.
    u: descriptors per class (clipped to D).

  Returns:
    (int32 [B, u] descriptor ids, best first; float32 [B, u] their scores).
  """
  scores = cosine_scores(class_embeddings, descriptor_embeddings)  # [C, D]
  values, idx = jax.lax.top_k(scores, min(int(u), scores.shape[-1]))
  return idx[predicted].astype(jnp.int32), values[predicted]


@functools.partial(jax.jit, static_argnames=("k", "rule"))
def select_candidates(
  concept_scores: jax.Array,
  concept_valid: jax.Array,
  image_scores: jax.Array,
  k: int = 500,
  rule: str = "mean",
  offset: float = 0.02,
) -> jax.Array:
  """The OT's candidate descriptors of a batch of images: top-k intersection, relevance filter.

  Args:
    concept_scores: float32 [B, L, D], concept embedding x descriptor embedding.
    concept_valid: bool [B, L].
    image_scores: float32 [B, D], whole-image embedding x descriptor embedding.
    k, rule, offset: see `top_k_intersection` and `relevance_filter`.

  Returns:
    bool [B, D].
  """

  def one(scores, valid, image):
    return relevance_filter(top_k_intersection(scores, valid, k), image, rule, offset)

  return jax.vmap(one)(concept_scores, concept_valid, image_scores)
