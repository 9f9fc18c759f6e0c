"""The pre-LN residual attention block shared by both CLIP towers.

Parameter names follow OpenAI's CLIP (`ln_1`, `attn`, `ln_2`, `mlp/c_fc`,
`mlp/c_proj`) so a converted checkpoint reads like the original one; q, k and v
are separate Dense layers (OpenAI stores them fused as `in_proj_weight`).
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from stori_jax.models import initializers
from stori_jax.models.attention import matmul_precision, reweighted_attention

Dtype = Any


def quick_gelu(x: jax.Array) -> jax.Array:
  """OpenAI's GELU approximation x * sigmoid(1.702 x)."""
  return x * jax.nn.sigmoid(1.702 * x)


def exact_gelu(x: jax.Array) -> jax.Array:
  """torch.nn.GELU() default: the erf form, not the tanh approximation."""
  return jax.nn.gelu(x, approximate=False)


ACTIVATION_FNS = {"quick_gelu": quick_gelu, "gelu": exact_gelu}


def dense(features: int, dtype: Dtype, name: str | None = None, **kwargs) -> nn.Dense:
  """nn.Dense computing in `dtype` with float32 params. In a low-precision dtype (bf16) the
  product accumulates in float32 and is rounded to `dtype` once, as accelerators' matrix units
  do; XLA:CPU also runs bf16 x bf16 -> f32 products at about twice its f32 rate (where its
  bf16 -> bf16 ones run at the f32 rate, 2 cores with AVX512-BF16). float32: nn.Dense at
  HIGHEST precision (`matmul_precision`)."""
  if jnp.dtype(dtype) != jnp.float32:
    kwargs["dot_general"] = functools.partial(_accumulate_in_float32, dtype=dtype)
  kwargs.setdefault("precision", matmul_precision(dtype))
  kwargs.setdefault("kernel_init", initializers.lecun_normal())  # compiled: see initializers
  return nn.Dense(features, dtype=dtype, param_dtype=jnp.float32, name=name, **kwargs)


def _accumulate_in_float32(lhs, rhs, dimension_numbers, precision=None, dtype=None, **kwargs):
  del kwargs  # preferred_element_type: ours
  out = jax.lax.dot_general(
    lhs, rhs, dimension_numbers, precision=precision, preferred_element_type=jnp.float32
  )
  return out.astype(dtype)


def layer_norm(epsilon: float, name: str | None = None) -> nn.LayerNorm:
  """LayerNorm computed (and returned) in fp32 whatever the compute dtype.

  The next Dense casts back to the compute dtype; the residual stream keeps it.
  """
  return nn.LayerNorm(epsilon=epsilon, dtype=jnp.float32, param_dtype=jnp.float32, name=name)


class Attention(nn.Module):
  """Multi-head self-attention with optional SToRI log-weights on the keys."""

  heads: int
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(
    self,
    x: jax.Array,
    mask: jax.Array | None = None,
    log_weights: jax.Array | None = None,
    query_index: jax.Array | None = None,
  ):
    """x: [B, L, W]; mask: bool [L, L]; log_weights: float [B, L] or None.

    With query_index int [B], only that row of each sequence is a query (causal:
    it sees keys up to itself; `mask` is ignored) and out is [B, 1, W].
    Returns (out [B, L, W], keys [B, L, W]); keys are x times the key projection
    without its bias, as the mutual-knowledge reference reads them (ln_1's output times the
    key rows of in_proj_weight); the attention itself uses the biased keys.
    """
    batch, length, width = x.shape
    head_dim = width // self.heads
    projection = lambda name: dense(width, self.dtype, name)
    split = lambda t: t.reshape(batch, t.shape[1], self.heads, head_dim)
    key_projection = projection("key")
    key, value = key_projection(x), projection("value")(x)
    kernel = key_projection.variables["params"]["kernel"]
    bare_keys = jnp.dot(
      x.astype(self.dtype),
      kernel.astype(self.dtype),
      precision=matmul_precision(self.dtype),
      preferred_element_type=jnp.float32,
    ).astype(self.dtype)
    if query_index is not None:
      x = x[jnp.arange(batch), query_index][:, None]
      mask = (jnp.arange(length)[None, :] <= query_index[:, None])[:, None, None, :]
    query = projection("query")(x)
    out = reweighted_attention(split(query), split(key), split(value), mask, log_weights)
    out = projection("out")(out.reshape(batch, x.shape[1], width))
    return out, bare_keys


class MLP(nn.Module):
  hidden: int
  activation: str
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    width = x.shape[-1]
    x = dense(self.hidden, self.dtype, "c_fc")(x)
    x = ACTIVATION_FNS[self.activation](x)
    return dense(width, self.dtype, "c_proj")(x)


class ResidualBlock(nn.Module):
  """x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

  heads: int
  mlp_dim: int
  activation: str
  layer_norm_eps: float = 1e-5
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(
    self,
    x: jax.Array,
    mask: jax.Array | None = None,
    log_weights: jax.Array | None = None,
    query_index: jax.Array | None = None,
  ):
    """x: [B, L, W] -> (x [B, L, W], attention keys [B, L, W]).

    With query_index int [B] only that position is computed: x [B, 1, W]
    (exact under a causal mask; the last text block needs only the EOT row).
    """
    attn_out, keys = Attention(self.heads, dtype=self.dtype, name="attn")(
      layer_norm(self.layer_norm_eps, "ln_1")(x), mask, log_weights, query_index
    )
    if query_index is not None:
      x = x[jnp.arange(x.shape[0]), query_index][:, None]
    x = x + attn_out.astype(x.dtype)
    mlp_out = MLP(self.mlp_dim, self.activation, dtype=self.dtype, name="mlp")(
      layer_norm(self.layer_norm_eps, "ln_2")(x)
    )
    return x + mlp_out.astype(x.dtype), keys
