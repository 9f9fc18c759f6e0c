"""Both CLIP towers and the learned temperature."""

from __future__ import annotations

import contextlib
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from stori_jax.models import tower_kinds
from stori_jax.models.attention import matmul_precision
from stori_jax.models.config import CLIPConfig
from stori_jax.models.text import TextTransformer


def vision_tower(config: CLIPConfig, dtype: Any = jnp.float32) -> nn.Module:
  """The image tower module of this config, as its registered kind builds it."""
  return tower_kinds.of(config.vision).module(config, dtype)


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
    ModifiedResNet and ConvNeXt for the shapes, and tower_kinds for the contract.
    """
    return self.vision(images, return_hidden)

  def __call__(self, images: jax.Array, ids: jax.Array) -> jax.Array:
    """Logits float32 [B_images, B_texts] = exp(logit_scale) * cosine."""
    image = self.encode_image(images)
    text = self.encode_text(ids)
    image = image / jnp.linalg.norm(image, axis=-1, keepdims=True)
    text = text / jnp.linalg.norm(text, axis=-1, keepdims=True)
    # (scale * image) @ text^T, as `scale * image @ text.T` groups.
    scaled = jnp.exp(self.logit_scale) * image
    return jnp.matmul(scaled, text.T, precision=matmul_precision(self.dtype))


def init_params(config: CLIPConfig, seed: int = 0) -> dict:
  """Random parameters (fp32) of a CLIP with this config, on the default device.

  Computed on the CPU whatever the default device, so a seed gives the same values everywhere,
  and op by op (`lazy_init`, without a forward pass): jitting the whole init compiled one big
  program, about a minute for ViT-B/16 on a CPU and on an H200 alike; now each random
  initialiser is one small compiled program per shape (`initializers`), giving the jitted
  init's values bit for bit. Without a CPU backend (JAX_PLATFORMS without "cpu") it runs on the
  default device.
  """
  model = CLIP(config)
  size = config.vision.image_size
  images = jax.ShapeDtypeStruct((1, size, size, 3), jnp.float32)
  ids = jax.ShapeDtypeStruct((1, config.text.context_length), jnp.int32)
  cpu = _cpu_device()
  with jax.default_device(cpu) if cpu is not None else contextlib.nullcontext():
    params = model.lazy_init(jax.random.PRNGKey(seed), images, ids)["params"]
  if cpu is not None and _default_device() != cpu:
    # Through host memory, so the arrays land uncommitted on the default device, as a jitted
    # init's outputs did (a device_put to a device would commit them to it).
    return jax.device_put(jax.device_get(params))
  # lazy_init returns a constant computed while tracing (logit_scale) as a numpy array.
  return jax.tree_util.tree_map(jnp.asarray, params)


def _cpu_device():
  """The first CPU device, or None where the CPU backend is not enabled."""
  try:
    return jax.devices("cpu")[0]
  except RuntimeError:
    return None


def _default_device():
  """The device uncommitted arrays land on (`jax.default_device`'s, or the first device)."""
  return next(iter(jax.device_put(np.zeros((), np.float32)).devices()))


def param_shapes(config: CLIPConfig) -> dict:
  """The parameter tree of this config as jax.ShapeDtypeStruct leaves, without allocating."""
  model = CLIP(config)
  images = jax.ShapeDtypeStruct(
    (1, config.vision.image_size, config.vision.image_size, 3), jnp.float32
  )
  ids = jax.ShapeDtypeStruct((1, config.text.context_length), jnp.int32)
  return jax.eval_shape(model.init, jax.random.PRNGKey(0), images, ids)["params"]
