"""Scaled dot-product attention with SToRI's per-token log-weights.

SToRI (paper Eq. 4) rescales the attention every query pays to key n by a weight
w_n >= 0 and renormalises: a_mn = w_n exp(s_mn) / sum_j w_j exp(s_mj), which is
exactly softmax(s_mn + log w_n). The weights are per key position, shared by all
heads and all queries.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# log w is floored here so that w = 0 (log w = -inf) gives a finite logit whose
# exp underflows to exactly 0 in fp32: the token is excluded, and neither the
# forward pass (no -inf - -inf) nor the backward pass (max() routes a zero
# gradient to the floored entry) produces NaN or inf.
LOG_WEIGHT_FLOOR = -1e4


def matmul_precision(dtype) -> jax.lax.Precision | None:
  """The `precision=` of a matrix product or convolution computing in `dtype`: HIGHEST for
  float32, so that a GPU does not multiply in TF32 nor a TPU in bf16 passes ("fp32 means fp32";
  XLA:CPU is exact either way); None (DEFAULT) otherwise: bf16 operands are already bf16."""
  return jax.lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else None


def causal_mask(length: int) -> jax.Array:
  """bool [length, length]; True where query m may attend to key n (n <= m)."""
  return jnp.tril(jnp.ones((length, length), dtype=bool))


def attention_probs(
  query: jax.Array,
  key: jax.Array,
  mask: jax.Array | None = None,
  log_weights: jax.Array | None = None,
) -> jax.Array:
  """softmax(q k^T / sqrt(d) + log w) under `mask`: fp32 [B, H, L, L].

  Args:
    query, key: [B, L, H, D] in the compute dtype (fp32 or bf16).
    mask: bool, broadcastable to [B, H, L, L]; False entries are excluded.
    log_weights: float [B, L] log-weights of the key positions, or None for
      plain attention. -inf (w = 0) excludes a key cleanly.
  """
  # Heads moved ahead of positions first: XLA:CPU runs the batched products far faster with the
  # batch dims leading on both sides (same values).
  logits = jnp.einsum(
    "bhqd,bhkd->bhqk",
    query.transpose(0, 2, 1, 3),
    key.transpose(0, 2, 1, 3),
    precision=matmul_precision(query.dtype),
    preferred_element_type=jnp.float32,
  )
  logits = logits / jnp.sqrt(jnp.float32(query.shape[-1]))
  if log_weights is not None:
    log_weights = jnp.maximum(log_weights.astype(jnp.float32), LOG_WEIGHT_FLOOR)
    logits = logits + log_weights[:, None, None, :]
  if mask is not None:
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  return jax.nn.softmax(logits, axis=-1)


@jax.jit
def reweighted_attention(
  query: jax.Array,
  key: jax.Array,
  value: jax.Array,
  mask: jax.Array | None = None,
  log_weights: jax.Array | None = None,
) -> jax.Array:
  """attention_probs(...) v: [B, L, H, D] in the dtype of `value`.

  Logits and softmax are fp32 whatever the compute dtype; see `attention_probs`
  for the arguments.
  """
  probs = attention_probs(query, key, mask, log_weights)
  # [B, H, L, D], then back to [B, L, H, D]: XLA:CPU runs this layout several times faster than
  # writing "bqhd" directly.
  out = jnp.einsum(
    "bhqk,bhkd->bhqd",
    probs.astype(value.dtype),
    value.transpose(0, 2, 1, 3),
    precision=matmul_precision(value.dtype),
    preferred_element_type=jnp.float32,
  )
  return out.transpose(0, 2, 1, 3).astype(value.dtype)
