"""Table 5's Standard row (App. D.1): "a MLP to classify images using solely vision features": the
tower's image embedding (unnormalised) -> LayerNorm -> Dense(q) -> GELU -> Dense(classes),
trained as the other baselines (`fitting.fit`).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from mutual.baselines import cache, fitting


class StandardMLP(nn.Module):
  """Table 5's Standard row: "a MLP to classify images using solely vision features" (App. D.1).

  The input is the tower's image embedding; the paper gives no layers, so: LayerNorm (the
  unnormalised embedding's scale varies across models), one hidden layer of `hidden` units
  (q) with a GELU, and the classifier.

  Attributes:
    num_classes: C.
    hidden: the hidden width.
  """

  num_classes: int
  hidden: int = 512

  @nn.compact
  def __call__(self, embeddings):
    """embeddings float [B, E] -> logits float32 [B, C]."""
    x = nn.LayerNorm(name="norm")(embeddings.astype(jnp.float32))
    x = nn.gelu(nn.Dense(self.hidden, name="hidden")(x))
    return nn.Dense(self.num_classes, name="classifier")(x)


def train_standard(
  cached: cache.CachedFeatures,
  num_classes: int,
  settings: fitting.FitSettings,
  *,
  hidden: int,
  workdir: str | None = None,
) -> tuple[StandardMLP, fitting.TrainResult]:
  """Trains the Standard MLP with cross-entropy on `cached.embeddings`, as the other baselines
  (App. D's Adam and schedule, `fitting.fit`); checkpoints in <workdir>/checkpoints."""
  embeddings = cache.embeddings_of(cached, "The Standard MLP")
  model = StandardMLP(num_classes, hidden)
  # Jitted: one program rather than one per initialiser op (the same values).
  params = jax.jit(model.init)(jax.random.PRNGKey(settings.seed), jnp.asarray(embeddings[:1]))[
    "params"
  ]

  def loss_fn(params, batch, key, progress):
    del key, progress
    logits = model.apply({"params": params}, batch["embeddings"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()

  result = fitting.fit(
    loss_fn,
    params,
    {"embeddings": embeddings, "labels": cached.labels},
    settings,
    desc="Standard",
    workdir=workdir,
  )
  return model, result
