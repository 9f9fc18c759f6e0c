"""MM-CBM and MM-ProtoSim (App. D.1): one model, `MultimodalBottleneck`, whose attention switches
between the two.

- MM-CBM: descriptors -> linear -> queries Q [D, q]; patch tokens -> linear -> keys = values
  K [N, q]; cross-attention softmax over the N tokens, softmax(Q K^T / sqrt(q)) K; a linear map
  to one value per descriptor and a sigmoid: the bottleneck U [D]; a linear classifier over the
  classes. Explanation of class p: the descriptors with the largest U * w_p, each with its
  attention map over the tokens as its visual concept.
- MM-ProtoSim: the same with a hard assignment of every token to one descriptor: Gumbel-softmax
  over the D descriptors (straight-through: one-hot forward, relaxed gradient; the noise fades
  linearly to zero over training), and the noise-free argmax at evaluation; the visual concept
  of a descriptor is the set of tokens assigned to it.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from mutual.baselines import cache, fitting


class MultimodalBottleneck(nn.Module):
  """App. D.1's multimodal concept bottleneck.

  Attributes:
    num_classes: C.
    width: q, the attention width.
    attention: "softmax" (MM-CBM: softmax over the tokens) or "gumbel" (MM-ProtoSim: a hard
      assignment of each token to one descriptor).
    temperature: the Gumbel-softmax temperature.
  """

  num_classes: int
  width: int = 512
  attention: str = "softmax"
  temperature: float = 1.0

  @nn.compact
  def __call__(self, tokens, descriptors, train: bool = False, noise_scale=1.0):
    """tokens float [B, N, C], descriptors float [D, E] -> (logits float32 [B, C], bottleneck U
    float32 [B, D], attention float32 [B, D, N]). noise_scale multiplies the Gumbel noise
    (training only)."""
    # The residual stream's scale varies across channels; normalise each token first.
    tokens = nn.LayerNorm(name="token_norm")(tokens.astype(jnp.float32))
    queries = nn.Dense(self.width, name="query")(descriptors)  # [D, q]
    keys = nn.Dense(self.width, name="key")(tokens)  # [B, N, q], also the values
    scores = jnp.einsum("dq,bnq->bdn", queries, keys) / jnp.sqrt(float(self.width))
    if self.attention == "softmax":
      attention = jax.nn.softmax(scores, axis=-1)
      pooled = jnp.einsum("bdn,bnq->bdq", attention, keys)
    elif self.attention == "gumbel":
      if train:
        scores = scores + noise_scale * jax.random.gumbel(self.make_rng("gumbel"), scores.shape)
      soft = jax.nn.softmax(scores / self.temperature, axis=1)
      hard = jax.nn.one_hot(jnp.argmax(scores, axis=1), scores.shape[1], axis=1)
      attention = hard + soft - jax.lax.stop_gradient(soft)  # straight-through
      pooled = jnp.einsum("bdn,bnq->bdq", attention, keys) / scores.shape[-1]
    else:
      raise ValueError(f"attention must be 'softmax' or 'gumbel', got {self.attention!r}.")
    bottleneck = jax.nn.sigmoid(nn.Dense(1, name="concept")(pooled)[..., 0])
    logits = nn.Dense(self.num_classes, name="classifier")(bottleneck)
    return logits, bottleneck, attention


def train_bottleneck(
  cached: cache.CachedFeatures,
  descriptor_embeddings: np.ndarray,
  num_classes: int,
  settings: fitting.FitSettings,
  *,
  attention: str,
  width: int,
  temperature: float = 1.0,
  workdir: str | None = None,
) -> tuple[MultimodalBottleneck, fitting.TrainResult]:
  """Trains MM-CBM (attention="softmax") or MM-ProtoSim ("gumbel") with cross-entropy;
  checkpoints in <workdir>/checkpoints when a workdir is given (see `fitting.fit`)."""
  model = MultimodalBottleneck(num_classes, width, attention, temperature)
  descriptors = jnp.asarray(descriptor_embeddings, jnp.float32)
  init_key, gumbel_key = jax.random.split(jax.random.PRNGKey(settings.seed))
  # Jitted: one program rather than one per initialiser op (the same values).
  params = jax.jit(functools.partial(model.init, train=True))(
    {"params": init_key, "gumbel": gumbel_key},
    cache.flat_tokens(cached.tokens[:1]),
    descriptors,
  )["params"]

  def loss_fn(params, batch, key, progress):
    # The Gumbel noise fades linearly to zero, so that training ends in the noise-free regime
    # evaluation uses (with full noise throughout, the noise-free argmax assigns the tokens
    # differently from anything seen in training).
    logits, _, _ = model.apply(
      {"params": params},
      cache.flat_tokens(batch["tokens"]),
      descriptors,
      train=True,
      noise_scale=1.0 - progress,
      rngs={"gumbel": key},
    )
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()

  result = fitting.fit(
    loss_fn,
    params,
    {"tokens": cached.tokens, "labels": cached.labels},
    settings,
    desc="MM-ProtoSim" if attention == "gumbel" else "MM-CBM",
    workdir=workdir,
  )
  return model, result


def _regions(maps: jax.Array, threshold: float) -> jax.Array:
  """Activation maps float [..., h, w] -> bool regions: values >= low + threshold (high - low)
  (min-max normalised >= threshold) and > 0 (a hard map's unassigned tokens stay out)."""
  low = jnp.min(maps, axis=(-2, -1), keepdims=True)
  high = jnp.max(maps, axis=(-2, -1), keepdims=True)
  return (maps >= low + threshold * (high - low)) & (maps > 0)


@functools.partial(jax.jit, static_argnames=("model", "n_concepts", "grid"))
def _explain_bottleneck(model, params, tokens, descriptors, predicted, n_concepts, grid, threshold):
  logits, bottleneck, attention = model.apply({"params": params}, tokens, descriptors)
  weights = params["classifier"]["kernel"]  # [D, C]
  contribution = bottleneck * weights[:, predicted].T  # U^p = U * w_p, [B, D]
  maps = attention.reshape(*attention.shape[:2], *grid)
  regions = _regions(maps, threshold)
  present = jnp.any(regions, axis=(-2, -1))
  _, ids = jax.lax.top_k(jnp.where(present, contribution, -jnp.inf), n_concepts)
  take = jnp.take_along_axis
  chosen = take(regions, ids[..., None, None], axis=1)
  valid = take(present, ids, axis=1)
  return logits, ids.astype(jnp.int32), chosen, valid, take(contribution, ids, axis=1)


def explain_bottleneck(
  model: MultimodalBottleneck,
  params,
  tokens,
  descriptor_embeddings,
  predicted,
  n_concepts: int = 5,
  region_threshold: float = 0.5,
) -> dict[str, np.ndarray]:
  """MM-CBM / MM-ProtoSim explanations of the classes `predicted`.

  Args:
    tokens: float [B, h, w, C] patch features; descriptor_embeddings: float [D, E].
    predicted: int [B], the class to explain.
    n_concepts: L, how many descriptors (largest U * w_p first) to keep.
    region_threshold: a descriptor's attention map, min-max normalised, kept >= this.

  Returns:
    dict: logits float32 [B, C]; ids int32 [B, L] descriptor ids; regions bool [B, L, h, w];
    valid bool [B, L] (False for an empty region); contribution float32 [B, L].
  """
  tokens = np.asarray(tokens)
  grid = tuple(int(s) for s in tokens.shape[1:3])
  out = _explain_bottleneck(
    model,
    params,
    cache.flat_tokens(tokens),
    jnp.asarray(descriptor_embeddings, jnp.float32),
    jnp.asarray(predicted),
    int(n_concepts),
    grid,
    float(region_threshold),
  )
  return dict(zip(("logits", "ids", "regions", "valid", "contribution"), map(np.asarray, out)))
