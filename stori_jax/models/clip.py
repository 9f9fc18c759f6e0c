"""Both CLIP towers and the learned temperature."""

from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from stori_jax.models.config import CLIPConfig
from stori_jax.models.convnext import ConvNeXt
from stori_jax.models.modified_resnet import ModifiedResNet
from stori_jax.models.text import TextTransformer
from stori_jax.models.vision import VisionTransformer


def vision_tower(config: CLIPConfig, dtype: Any = jnp.float32) -> nn.Module:
  """The image tower module of this config (ViT, ModifiedResNet or ConvNeXt)."""
  kind = config.vision_kind
  if kind == "resnet":
    return ModifiedResNet(config.vision, config.embed_dim, dtype)
  if kind == "convnext":
    return ConvNeXt(config.vision, config.embed_dim, dtype)
  return VisionTransformer(config.vision, config.embed_dim, config.layer_norm_eps, dtype)


class CLIP(nn.Module):
  """Params: {'text': ..., 'vision': ..., 'logit_scale': f32 []}."""

  config: CLIPConfig
  dtype: Any = jnp.float32

  def setup(self):
    c = self.config
    self.text = TextTransformer(c.text, c.embed_dim, c.layer_norm_eps, self.dtype)
    self.vision = vision_tower(c, self.dtype)
    self.logit_scale = self.param("logit_scale", nn.initializers.constant(np.log(1 / 0.07)), ())

  def encode_text(
    self,
    ids: jax.Array,
    log_weights: jax.Array | None = None,
    reweight_blocks: Sequence[int] = (),
    return_hidden: bool = False,
  ):
    return self.text(ids, log_weights, reweight_blocks, return_hidden)

  def text_prefix(self, ids: jax.Array, stop: int) -> jax.Array:
    """Hidden states at the input of block `stop` (0-indexed): [B, L, W]."""
    return self.text.blocks(self.text.embed(ids), 0, stop)

  def encode_text_from(
    self,
    hidden: jax.Array,
    ids: jax.Array,
    first: int,
    log_weights: jax.Array | None = None,
    reweight_blocks: Sequence[int] = (),
  ) -> jax.Array:
    return self.text.encode_from(hidden, ids, first, log_weights, reweight_blocks)

  def encode_text_prompt_weighting(self, ids: jax.Array, weights: jax.Array, block: int):
    return self.text.prompt_weighting(ids, weights, block)

  def encode_image(self, images: jax.Array, return_hidden: bool = False):
    """images [B, S, S, 3] -> features float32 [B, E] (and details with return_hidden).

    Every tower's details hold hidden_states, patch_tokens and feature_map
    [B, h, w, C], the final spatial map the mutual-knowledge analysis reads
    (ViT: the last block's patch tokens on the g x g grid, before ln_post;
    ResNet/ConvNeXt: the last stage's output, before attention/average
    pooling). ViT and ResNet also give attention keys. See VisionTransformer,
    ModifiedResNet and ConvNeXt for the shapes.
    """
    out = self.vision(images, return_hidden)
    if return_hidden and self.config.vision_kind == "vit":
      features, details = out
      tokens = details["patch_tokens"]
      grid = self.config.vision.grid_size
      details = {**details, "feature_map": tokens.reshape(tokens.shape[0], grid, grid, -1)}
      return features, details
    return out

  def __call__(self, images: jax.Array, ids: jax.Array) -> jax.Array:
    """Logits float32 [B_images, B_texts] = exp(logit_scale) * cosine."""
    image = self.encode_image(images)
    text = self.encode_text(ids)
    image = image / jnp.linalg.norm(image, axis=-1, keepdims=True)
    text = text / jnp.linalg.norm(text, axis=-1, keepdims=True)
    return jnp.exp(self.logit_scale) * image @ text.T


def init_params(config: CLIPConfig, seed: int = 0) -> dict:
  """Random parameters (fp32) of a CLIP with this config."""
  model = CLIP(config)
  images = jnp.zeros((1, config.vision.image_size, config.vision.image_size, 3), jnp.float32)
  ids = jnp.zeros((1, config.text.context_length), jnp.int32)
  return jax.jit(model.init)(jax.random.PRNGKey(seed), images, ids)["params"]


def param_shapes(config: CLIPConfig) -> dict:
  """The parameter tree of this config as jax.ShapeDtypeStruct leaves, without allocating."""
  model = CLIP(config)
  images = jax.ShapeDtypeStruct(
    (1, config.vision.image_size, config.vision.image_size, 3), jnp.float32
  )
  ids = jax.ShapeDtypeStruct((1, config.text.context_length), jnp.int32)
  return jax.eval_shape(model.init, jax.random.PRNGKey(0), images, ids)["params"]
