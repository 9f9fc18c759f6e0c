"""OpenAI CLIP's ModifiedResNet image tower (RN50, RN101, RN50x4, RN50x16), NHWC.

Differences from a torchvision ResNet, all kept here: a 3-conv stem with an
average pool, anti-aliased strides (an average pool after the 3x3 conv and
before the 1x1 shortcut conv), and attention pooling with the mean token as the
only query. Parameter names follow the torch module names (conv1, bn1,
layer1_0/downsample_conv, attnpool/k_proj, ...).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from stori_jax.models import initializers
from stori_jax.models.attention import matmul_precision, reweighted_attention
from stori_jax.models.config import ResNetConfig
from stori_jax.models.transformer import dense

BATCH_NORM_EPS = 1e-5  # torch.nn.BatchNorm2d default.


class FrozenBatchNorm(nn.Module):
  """Batch norm in inference mode: (x - mean) / sqrt(var + eps) * scale + bias.

  The running statistics are parameters (not a `batch_stats` collection) so a
  converted model is one params tree; these towers are never trained here.
  """

  eps: float = BATCH_NORM_EPS

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    channels = x.shape[-1]
    scale = self.param("scale", nn.initializers.ones, (channels,))
    bias = self.param("bias", nn.initializers.zeros, (channels,))
    mean = self.param("mean", nn.initializers.zeros, (channels,))
    var = self.param("var", nn.initializers.ones, (channels,))
    # Folded into one multiply-add, as torch's CPU inference kernel does.
    alpha = scale * jax.lax.rsqrt(var + self.eps)
    beta = bias - mean * alpha
    return x * alpha.astype(x.dtype) + beta.astype(x.dtype)


def _conv(features: int, kernel: int, dtype, name: str, stride: int = 1) -> nn.Conv:
  pad = (kernel - 1) // 2
  return nn.Conv(
    features,
    (kernel, kernel),
    strides=stride,
    padding=((pad, pad), (pad, pad)),
    use_bias=False,
    dtype=dtype,
    param_dtype=jnp.float32,
    precision=matmul_precision(dtype),
    kernel_init=initializers.lecun_normal(),
    name=name,
  )


def _avg_pool(x: jax.Array, size: int) -> jax.Array:
  return nn.avg_pool(x, (size, size), strides=(size, size), padding="VALID") if size > 1 else x


class Bottleneck(nn.Module):
  """1x1 -> 3x3 -> avgpool(stride) -> 1x1 (x4 channels), plus the shortcut."""

  planes: int
  stride: int = 1
  downsample: bool = False
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    out = nn.relu(FrozenBatchNorm(name="bn1")(_conv(self.planes, 1, self.dtype, "conv1")(x)))
    out = nn.relu(FrozenBatchNorm(name="bn2")(_conv(self.planes, 3, self.dtype, "conv2")(out)))
    out = _avg_pool(out, self.stride)
    out = FrozenBatchNorm(name="bn3")(_conv(4 * self.planes, 1, self.dtype, "conv3")(out))
    identity = x
    if self.downsample:
      identity = _conv(4 * self.planes, 1, self.dtype, "downsample_conv")(_avg_pool(x, self.stride))
      identity = FrozenBatchNorm(name="downsample_bn")(identity)
    return nn.relu(out + identity)


class AttentionPool(nn.Module):
  """Multi-head attention of the mean token (plus positions) over all tokens."""

  heads: int
  output_dim: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, feature_map: jax.Array):
    """feature_map [B, h, w, C] -> (pooled [B, output_dim], keys [B, 1 + h*w, C])."""
    batch, height, width, channels = feature_map.shape
    tokens = feature_map.reshape(batch, height * width, channels)
    x = jnp.concatenate([tokens.mean(axis=1, keepdims=True), tokens], axis=1)
    positions = self.param(
      "positional_embedding",
      initializers.normal(channels**-0.5),
      (height * width + 1, channels),
    )
    x = x + positions.astype(x.dtype)
    linear = lambda features, name: dense(features, self.dtype, name)
    split = lambda t: t.reshape(batch, t.shape[1], self.heads, channels // self.heads)
    keys = linear(channels, "k_proj")(x)
    values = linear(channels, "v_proj")(x)
    query = linear(channels, "q_proj")(x[:, :1])  # Only the mean token's output is kept.
    out = reweighted_attention(split(query), split(keys), split(values))
    out = linear(self.output_dim, "c_proj")(out.reshape(batch, channels))
    return out, keys


class ModifiedResNet(nn.Module):
  """Images float32 NHWC [B, S, S, 3] (normalised) -> features [B, embed_dim]."""

  config: ResNetConfig
  embed_dim: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, images: jax.Array, return_hidden: bool = False):
    """images [B, S, S, 3] -> features float32 [B, embed_dim].

    With return_hidden, returns (features, details) where details holds
      hidden_states: the stem output and each stage's output, NHWC
        ([B, S/4, S/4, width], then [B, S/4/2**i, ..., 4 * width * 2**i] for
        stages i = 0..3);
      feature_map: the last stage's output [B, S/32, S/32, 32 * width], the
        map attention pooling reads (its spatial cells are the patches);
      patch_tokens: feature_map flattened row-major [B, (S/32)**2, 32 * width];
      keys: the attention pool's keys (mean token first, positions added, key
        bias included: the mutual-knowledge reference reads keys of ViTs only, and
        this keeps the pool's own keys) [B, 1 + (S/32)**2, 32 * width].
    """
    c = self.config
    check_image_size(images, c.image_size)
    x = images.astype(self.dtype)
    stem = ((c.width // 2, 2), (c.width // 2, 1), (c.width, 1))
    for i, (features, stride) in enumerate(stem, start=1):
      x = _conv(features, 3, self.dtype, f"conv{i}", stride=stride)(x)
      x = nn.relu(FrozenBatchNorm(name=f"bn{i}")(x))
    x = _avg_pool(x, 2)
    hidden = [x]
    inplanes = c.width
    for stage, blocks in enumerate(c.layers):
      planes = c.width * 2**stage
      for block in range(blocks):
        stride = 2 if stage > 0 and block == 0 else 1
        x = Bottleneck(
          planes,
          stride,
          downsample=block == 0 and (stride > 1 or inplanes != 4 * planes),
          dtype=self.dtype,
          name=f"layer{stage + 1}_{block}",
        )(x)
        inplanes = 4 * planes
      hidden.append(x)
    pooled, keys = AttentionPool(c.heads, self.embed_dim, self.dtype, name="attnpool")(x)
    features = pooled.astype(jnp.float32)
    if not return_hidden:
      return features
    return features, {**spatial_details(hidden), "keys": keys}


def spatial_details(hidden: list[jax.Array]) -> dict:
  """hidden_states, and the last one as feature_map [B, h, w, C] and patch_tokens [B, h*w, C]."""
  feature_map = hidden[-1]
  batch, height, width, channels = feature_map.shape
  return {
    "hidden_states": hidden,
    "feature_map": feature_map,
    "patch_tokens": feature_map.reshape(batch, height * width, channels),
  }


def check_image_size(images: jax.Array, size: int):
  if images.ndim != 4 or images.shape[1:] != (size, size, 3):
    raise ValueError(
      f"Expected images of shape [batch, {size}, {size}, 3] (NHWC, normalised), "
      f"got {tuple(images.shape)}. Resize and crop with bundle.preprocess, which "
      f"produces {size}x{size} inputs for this model."
    )
