"""CLIP's ViT image tower."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from stori_jax.models.config import VisionConfig
from stori_jax.models import initializers
from stori_jax.models.attention import matmul_precision
from stori_jax.models.transformer import ResidualBlock, layer_norm


class VisionTransformer(nn.Module):
  """Images float32 NHWC [B, S, S, 3] (normalised) -> features [B, embed_dim]."""

  config: VisionConfig
  embed_dim: int
  layer_norm_eps: float = 1e-5
  dtype: Any = jnp.float32

  def setup(self):
    c = self.config
    scale = c.width**-0.5
    self.conv1 = nn.Conv(
      c.width,
      (c.patch_size, c.patch_size),
      strides=c.patch_size,
      padding="VALID",
      use_bias=False,
      dtype=self.dtype,
      param_dtype=jnp.float32,
      precision=matmul_precision(self.dtype),
      kernel_init=initializers.lecun_normal(),
    )
    self.class_embedding = self.param("class_embedding", initializers.normal(scale), (c.width,))
    self.positional_embedding = self.param(
      "positional_embedding", initializers.normal(scale), (c.num_tokens, c.width)
    )
    self.ln_pre = layer_norm(self.layer_norm_eps)
    self.resblocks = [
      ResidualBlock(c.heads, c.mlp_width, c.activation, self.layer_norm_eps, self.dtype)
      for _ in range(c.layers)
    ]
    self.ln_post = layer_norm(self.layer_norm_eps)
    self.proj = self.param("proj", initializers.normal(scale), (c.width, self.embed_dim))

  def embed(self, images: jax.Array) -> jax.Array:
    """[B, S, S, 3] -> ln_pre(class token + patch tokens + positions) [B, 1 + g*g, W]."""
    size = self.config.image_size
    if images.ndim != 4 or images.shape[1:] != (size, size, 3):
      raise ValueError(
        f"Expected images of shape [batch, {size}, {size}, 3] (NHWC, normalised), "
        f"got {tuple(images.shape)}. Resize and crop with bundle.preprocess, which "
        f"produces {size}x{size} inputs for this model."
      )
    patches = self.conv1(images.astype(self.dtype))
    batch = patches.shape[0]
    patches = patches.reshape(batch, -1, self.config.width)
    cls = jnp.broadcast_to(self.class_embedding.astype(self.dtype), (batch, 1, self.config.width))
    x = jnp.concatenate([cls, patches], axis=1)
    x = x + self.positional_embedding.astype(self.dtype)
    return self.ln_pre(x).astype(self.dtype)

  def __call__(self, images: jax.Array, return_hidden: bool = False):
    """images [B, S, S, 3] -> features float32 [B, embed_dim].

    With return_hidden, returns (features, details) where details holds
      hidden_states: ln_pre output and every block's output, [B, T, W] each
        (layers + 1; T = 1 + grid**2, class token first);
      patch_tokens: the last block's output without the class token [B, T-1, W]
        (before ln_post);
      feature_map: patch_tokens on the patch grid [B, grid, grid, W];
      keys: the last block's attention keys as the mutual-knowledge reference reads
        them: ln_1's output times the key projection, without its bias [B, T, W];
      class_keys: the class token's key (the same projection) of every block, first block
        first [B, layers, W] (the mutual-knowledge paper's layer similarity, App. A.1).
    """
    x = self.embed(images)
    hidden = [x]
    keys = None
    class_keys = []
    for block in self.resblocks:
      x, keys = block(x)
      hidden.append(x)
      class_keys.append(keys[:, 0])
    pooled = self.ln_post(x[:, 0])
    # pooled is fp32 (ln_post); the product keeps the compute dtype's precision.
    features = jnp.matmul(pooled, self.proj, precision=matmul_precision(self.dtype))
    features = features.astype(jnp.float32)
    if not return_hidden:
      return features
    grid = self.config.grid_size
    return features, {
      "hidden_states": hidden,
      "patch_tokens": x[:, 1:],
      "feature_map": x[:, 1:].reshape(x.shape[0], grid, grid, -1),
      "keys": keys,
      "class_keys": jnp.stack(class_keys, axis=1),
    }
