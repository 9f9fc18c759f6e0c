"""timm's ConvNeXt as open_clip's TimmModel wraps it (convnext_base, convnext_base_w), NHWC.

Parameter names follow timm's (stem_conv/stem_norm, stages_i/downsample_*,
stages_i/blocks_j/{conv_dw, norm, fc1, fc2, gamma}, head_norm) and open_clip's
`head.proj` (proj).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from stori_jax.models import initializers
from stori_jax.models.attention import matmul_precision
from stori_jax.models.config import ConvNeXtConfig
from stori_jax.models.modified_resnet import check_image_size, spatial_details
from stori_jax.models.transformer import dense, exact_gelu, layer_norm


class ConvNeXtBlock(nn.Module):
  """x + gamma * fc2(gelu(fc1(norm(dwconv(x))))) with channels-last LayerNorm."""

  config: ConvNeXtConfig
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    c = self.config
    channels = x.shape[-1]
    pad = (c.kernel_size - 1) // 2
    y = nn.Conv(
      channels,
      (c.kernel_size, c.kernel_size),
      padding=((pad, pad), (pad, pad)),
      feature_group_count=channels,  # Depthwise.
      dtype=self.dtype,
      param_dtype=jnp.float32,
      precision=matmul_precision(self.dtype),
      kernel_init=initializers.lecun_normal(),
      name="conv_dw",
    )(x)
    y = layer_norm(c.layer_norm_eps, "norm")(y).astype(self.dtype)
    linear = lambda features, name: dense(features, self.dtype, name)
    y = linear(channels, "fc2")(exact_gelu(linear(c.mlp_ratio * channels, "fc1")(y)))
    gamma = self.param("gamma", nn.initializers.constant(1e-6), (channels,))
    return x + y * gamma.astype(y.dtype)


class ConvNeXt(nn.Module):
  """Images float32 NHWC [B, S, S, 3] (normalised) -> features [B, embed_dim]."""

  config: ConvNeXtConfig
  embed_dim: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, images: jax.Array, return_hidden: bool = False):
    """images [B, S, S, 3] -> features float32 [B, embed_dim].

    With return_hidden, returns (features, details) where details holds
      hidden_states: the stem output [B, S/4, S/4, dims[0]] and each stage's
        output [B, S/4/2**i, S/4/2**i, dims[i]], NHWC;
      feature_map: the last stage's output [B, S/32, S/32, dims[-1]], before
        the head's average pooling and LayerNorm (its cells are the patches);
      patch_tokens: feature_map flattened row-major [B, (S/32)**2, dims[-1]].
    ConvNeXt has no attention, so there are no keys.
    """
    c = self.config
    check_image_size(images, c.image_size)
    conv = lambda features, size, name: nn.Conv(
      features,
      (size, size),
      strides=size,
      padding="VALID",
      dtype=self.dtype,
      param_dtype=jnp.float32,
      precision=matmul_precision(self.dtype),
      kernel_init=initializers.lecun_normal(),
      name=name,
    )
    x = conv(c.dims[0], 4, "stem_conv")(images.astype(self.dtype))
    x = layer_norm(c.layer_norm_eps, "stem_norm")(x).astype(self.dtype)
    hidden = [x]
    for stage, (depth, dim) in enumerate(zip(c.depths, c.dims)):
      if stage > 0:
        x = layer_norm(c.layer_norm_eps, f"stages_{stage}_downsample_norm")(x).astype(self.dtype)
        x = conv(dim, 2, f"stages_{stage}_downsample_conv")(x)
      for block in range(depth):
        x = ConvNeXtBlock(c, self.dtype, name=f"stages_{stage}_blocks_{block}")(x)
      hidden.append(x)
    pooled = layer_norm(c.layer_norm_eps, "head_norm")(x.astype(jnp.float32).mean(axis=(1, 2)))
    features = nn.Dense(
      self.embed_dim,
      use_bias=c.proj_bias,
      dtype=self.dtype,
      param_dtype=jnp.float32,
      precision=matmul_precision(self.dtype),
      kernel_init=initializers.lecun_normal(),
      name="proj",
    )(pooled.astype(self.dtype)).astype(jnp.float32)
    if not return_hidden:
      return features
    return features, spatial_details(hidden)
