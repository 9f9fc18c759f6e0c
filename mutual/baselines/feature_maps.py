"""Feature Maps (App. D.2): each channel of the patch features is an activation map; the channels
with the largest spatial L2 norm are the concepts (the first, which covers the main object, is
skipped by default: App. D.2 uses it as the object map, "the remaining neurons act as the visual
concepts"); a map normalised to [0, 1] keeps its values >= 0.9 as the region. A concept labeler
(a linear layer on the mean of the tokens of a region) is trained with binary cross-entropy to
predict the class's descriptors from DropBlock-masked feature maps, and labels each region with
its most likely descriptor.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from mutual.baselines import cache, fitting


def dropblock(key, shape: tuple[int, int, int], drop_rate: float, block_size: int) -> jax.Array:
  """DropBlock keep masks (Ghiasi et al. 2018): float32 [B, h, w], 0 on dropped square blocks.

  Block centres are drawn with the rate that drops about `drop_rate` of the patches; an image
  whose every patch is dropped keeps them all (the labeler needs one token to pool).
  """
  batch, height, width = shape
  block = max(1, min(int(block_size), height, width))
  valid = (height - block + 1) * (width - block + 1)
  gamma = drop_rate / block**2 * (height * width) / valid
  centres = jax.random.bernoulli(key, min(gamma, 1.0), shape).astype(jnp.float32)
  # Centres only where the whole block fits.
  lo, hi = block // 2, block - 1 - block // 2
  rows = (jnp.arange(height) >= lo) & (jnp.arange(height) < height - hi)
  cols = (jnp.arange(width) >= lo) & (jnp.arange(width) < width - hi)
  centres = centres * (rows[:, None] & cols[None, :])
  dropped = jax.lax.reduce_window(centres, 0.0, jax.lax.max, (1, block, block), (1, 1, 1), "SAME")
  keep = 1.0 - dropped
  return jnp.where(jnp.sum(keep, axis=(1, 2), keepdims=True) > 0, keep, 1.0)


class ConceptLabeler(nn.Module):
  """App. D.2's concept labeler: the mean of the tokens in a region -> D descriptor logits."""

  num_descriptors: int

  @nn.compact
  def __call__(self, tokens, weights):
    """tokens float [B, N, C], weights float [B, N] (region) -> logits float32 [B, D]."""
    tokens = tokens.astype(jnp.float32)
    pooled = jnp.einsum("bn,bnc->bc", weights, tokens)
    pooled = pooled / jnp.maximum(jnp.sum(weights, axis=1, keepdims=True), 1e-6)
    return nn.Dense(self.num_descriptors, name="labeler")(nn.LayerNorm(name="norm")(pooled))


def train_labeler(
  cached: cache.CachedFeatures,
  targets: np.ndarray,
  settings: fitting.FitSettings,
  *,
  drop_rate: float = 0.5,
  block_size: int = 3,
  workdir: str | None = None,
) -> tuple[ConceptLabeler, fitting.TrainResult]:
  """Trains the concept labeler with binary cross-entropy against the class's descriptors
  (targets float32 [C, D]) on DropBlock-masked feature maps; checkpoints in
  <workdir>/checkpoints when a workdir is given (see `fitting.fit`)."""
  model = ConceptLabeler(int(targets.shape[1]))
  grid = cached.tokens.shape[1:3]
  targets = jnp.asarray(targets, jnp.float32)
  sample = cache.flat_tokens(cached.tokens[:1])
  # Jitted: one program rather than one per initialiser op (the same values).
  params = jax.jit(model.init)(
    jax.random.PRNGKey(settings.seed), sample, jnp.ones(sample.shape[:2])
  )["params"]

  def loss_fn(params, batch, key, progress):
    del progress
    tokens = batch["tokens"]
    keep = dropblock(key, (tokens.shape[0], *grid), drop_rate, block_size)
    logits = model.apply(
      {"params": params}, cache.flat_tokens(tokens), keep.reshape(tokens.shape[0], -1)
    )
    return optax.sigmoid_binary_cross_entropy(logits, targets[batch["labels"]]).mean()

  result = fitting.fit(
    loss_fn,
    params,
    {"tokens": cached.tokens, "labels": cached.labels},
    settings,
    desc="Feature Maps labeler",
    workdir=workdir,
  )
  return model, result


@functools.partial(jax.jit, static_argnames=("n_concepts", "skip_object"))
def feature_map_concepts(tokens, n_concepts: int = 5, threshold: float = 0.9, skip_object=True):
  """App. D.2's visual concepts: the channels with the largest spatial norm.

  Args:
    tokens: float [B, h, w, C] patch features.
    n_concepts: L channels kept.
    threshold: each channel's map, min-max normalised to [0, 1], keeps its values >= this.
    skip_object: drop the channel with the largest norm (the main object's map, App. D.2).

  Returns:
    (channels int32 [B, L], regions bool [B, L, h, w], valid bool [B, L]: non-empty regions.)
  """
  tokens = jnp.asarray(tokens, jnp.float32)
  norms = jnp.sqrt(jnp.sum(tokens**2, axis=(1, 2)))  # [B, C]
  first = 1 if skip_object else 0
  _, channels = jax.lax.top_k(norms, n_concepts + first)
  channels = channels[:, first:]
  maps = jnp.take_along_axis(tokens, channels[:, None, None, :], axis=3)
  maps = jnp.moveaxis(maps, 3, 1)  # [B, L, h, w]
  low = jnp.min(maps, axis=(2, 3), keepdims=True)
  high = jnp.max(maps, axis=(2, 3), keepdims=True)
  regions = (maps - low) / jnp.maximum(high - low, 1e-12) >= threshold
  regions = regions & (high > low)
  return channels.astype(jnp.int32), regions, jnp.any(regions, axis=(2, 3))


@functools.partial(jax.jit, static_argnames=("model",))
def _label(model, params, tokens, regions):
  batch, n = regions.shape[:2]
  weights = regions.reshape(batch, n, -1).astype(jnp.float32)
  flat = cache.flat_tokens(tokens)
  logits = jax.vmap(lambda w: model.apply({"params": params}, flat, w), in_axes=1, out_axes=1)(
    weights
  )
  return logits


def explain_feature_maps(
  model: ConceptLabeler,
  params,
  tokens,
  n_concepts: int = 5,
  threshold: float = 0.9,
  skip_object: bool = True,
) -> dict[str, np.ndarray]:
  """Feature Maps explanations: channels, their regions and their labels.

  Returns:
    dict: channels int32 [B, L]; ids int32 [B, L] (each region's most likely descriptor);
    regions bool [B, L, h, w]; valid bool [B, L]; label_scores float32 [B, L, D] (logits).
  """
  channels, regions, valid = feature_map_concepts(
    jnp.asarray(tokens), int(n_concepts), float(threshold), bool(skip_object)
  )
  logits = _label(model, params, jnp.asarray(tokens), regions)
  return dict(
    channels=np.asarray(channels),
    ids=np.asarray(jnp.argmax(logits, axis=-1)).astype(np.int32),
    regions=np.asarray(regions),
    valid=np.asarray(valid),
    label_scores=np.asarray(logits),
  )


def feature_map_figure(
  model: ConceptLabeler, params, tokens, n_concepts: int = 5, threshold: float = 0.9
) -> dict[str, np.ndarray]:
  """App. D.2's Fig. 6 for B images: the channel of largest spatial norm (the main object's map)
  and the next `n_concepts` (Feature Maps' concepts, `feature_map_concepts`), each map min-max
  normalised to [0, 1] and kept >= threshold, each region labelled by the labeler's most likely
  descriptor, as `explain_feature_maps` labels the concepts.

  Returns:
    dict: channels int32 [B, 1 + L] (the object's first); maps float32 [B, 1 + L, h, w], the
    normalised maps; regions bool [B, 1 + L, h, w] (maps >= threshold); valid bool [B, 1 + L];
    ids int32 [B, 1 + L], each region's most likely descriptor; label_scores float32
    [B, 1 + L, D] (the labeler's logits).
  """
  out = explain_feature_maps(model, params, tokens, int(n_concepts) + 1, threshold, False)
  tokens = np.asarray(tokens, np.float32)
  maps = np.moveaxis(np.take_along_axis(tokens, out["channels"][:, None, None, :], axis=3), 3, 1)
  low = maps.min(axis=(2, 3), keepdims=True)
  high = maps.max(axis=(2, 3), keepdims=True)
  out["maps"] = ((maps - low) / np.maximum(high - low, 1e-12)).astype(np.float32)
  return out
