"""Zero-shot classification for the protocols, batched in JAX: top-k hits of a classifier and the
descriptor classifier of App. K (per-class sums of unit prompt embeddings, `prompt_sums`)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mutual import paper_config
from stori_jax.clip import encoding

AGGREGATES = ("scores", "embedding")


def percent(x) -> float:
  """A fraction as a percentage rounded to 4 decimals (the protocols' JSON)."""
  return round(100.0 * float(x), 4)


@functools.partial(jax.jit, static_argnames=("ks",))
def hits_at_k(scores: jax.Array, labels: jax.Array, ks: tuple[int, ...]) -> jax.Array:
  """bool [N, len(ks)]: whether each row's true class (labels int [N]) is among the top k of its
  scores float32 [N, C], for each k of ks."""
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
    np.asarray(hits_at_k(jnp.asarray(x[i : i + chunk]) @ w.T, labels[i : i + chunk], tuple(ks)))
    for i in range(0, len(x), chunk)
  ]
  return np.concatenate(out) if out else np.zeros((0, len(ks)), bool)


def image_embeddings(bundle, images, batch_size: int = 256) -> np.ndarray:
  """uint8 [B, S, S, 3] at the model's input size -> float32 [B, E], unit rows."""
  return encoding.encode_images(bundle, images, batch_size=batch_size, desc=None)


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
      mean = encoding.l2_normalize(mean, axis=1, dtype=mean.dtype)
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
  prompt: str = paper_config.DESCRIPTOR_PROMPT,
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
  encoded = encoding.encode_texts(bundle, texts, batch_size=batch_size, desc=desc)
  sums = np.asarray(jax.ops.segment_sum(jnp.asarray(encoded), jnp.asarray(owner), n))
  return PromptSums(sums.astype(np.float32), np.bincount(owner, minlength=n))
