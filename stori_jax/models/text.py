"""CLIP's causal text transformer, with SToRI reweighting from a chosen block."""

from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from stori_jax.models import initializers
from stori_jax.models.attention import causal_mask, matmul_precision
from stori_jax.plumbing.errors import InputError
from stori_jax.models.config import TextConfig
from stori_jax.models.transformer import ResidualBlock, layer_norm


def default_start_block(text: "TextConfig | int") -> int:
  """First reweighted block (1-indexed) when none is asked for.

  A text config that stores its own (`TextConfig.default_start_block`, measured for that
  model) gives it. Otherwise the paper's relative depth: it reweights blocks 7-12 of ViT-L/14's
  12-block text tower, i.e. the second half; for another depth we start at the same relative
  position, layers // 2 + 1 (6 blocks: 4-6; 24 blocks: 13-24).
  """
  if isinstance(text, TextConfig):
    if text.default_start_block is not None:
      return int(text.default_start_block)
    text = text.layers
  return int(text) // 2 + 1


def reweighted_block_indices(
  text: "TextConfig | int", start_block: int | None = None, stop_block: int | None = None
) -> tuple[int, ...]:
  """0-indexed blocks that apply log-weights: start_block..stop_block (1-indexed, inclusive).

  `text` is the text tower's config (its stored default start block applies) or its number of
  blocks; start_block None: `default_start_block(text)`; stop_block None: the last block.
  """
  layers = text.layers if isinstance(text, TextConfig) else int(text)
  start = default_start_block(text) if start_block is None else start_block
  stop = layers if stop_block is None else stop_block
  if not 1 <= start <= stop <= layers:
    raise InputError(
      f"Reweighting blocks {start}..{stop} are outside the text tower's blocks 1..{layers} "
      "(start_block and stop_block are 1-indexed and inclusive)."
    )
  return tuple(range(start - 1, stop))


def eot_positions(ids: jax.Array, eot_token_id: int) -> jax.Array:
  """int32 [B]: the first position of the end-of-text token in each row of ids [B, L]."""
  return jnp.argmax(ids == eot_token_id, axis=-1).astype(jnp.int32)


class TextTransformer(nn.Module):
  """Token ids int32 [B, L<=context] -> features [B, embed_dim] (unnormalised).

  The mask is causal, so the EOT output depends only on tokens up to EOT: ids
  may be cut to any length that keeps every EOT.
  """

  config: TextConfig
  embed_dim: int
  layer_norm_eps: float = 1e-5
  dtype: Any = jnp.float32

  def setup(self):
    c = self.config
    self.token_embedding = nn.Embed(
      c.vocab_size,
      c.width,
      dtype=self.dtype,
      param_dtype=jnp.float32,
      embedding_init=initializers.normal(0.02),
    )
    self.positional_embedding = self.param(
      "positional_embedding", initializers.normal(0.01), (c.context_length, c.width)
    )
    self.resblocks = [
      ResidualBlock(c.heads, c.mlp_width, c.activation, self.layer_norm_eps, self.dtype)
      for _ in range(c.layers)
    ]
    self.ln_final = layer_norm(self.layer_norm_eps)
    self.text_projection = self.param(
      "text_projection", initializers.normal(c.width**-0.5), (c.width, self.embed_dim)
    )

  def embed(self, ids: jax.Array) -> jax.Array:
    """ids int32 [B, L] -> token + position embeddings [B, L, width] (compute dtype)."""
    length = ids.shape[-1]
    if length > self.config.context_length:
      raise ValueError(
        f"Token sequences of length {length} exceed the text tower's context length "
        f"{self.config.context_length}; tokenize with context_length="
        f"{self.config.context_length}."
      )
    pos = self.positional_embedding[:length].astype(self.dtype)
    return self.token_embedding(ids) + pos

  def blocks(
    self,
    x: jax.Array,
    first: int = 0,
    last: int | None = None,
    log_weights: jax.Array | None = None,
    reweight_blocks: Sequence[int] = (),
    return_hidden: bool = False,
  ):
    """Runs blocks first..last-1 (0-indexed) on x [B, L, W].

    log_weights float [B, L] apply in the blocks listed in reweight_blocks.
    Returns x, or (x, [output of each block run]) with return_hidden.
    """
    mask = causal_mask(x.shape[1])
    hidden = []
    for index in range(first, len(self.resblocks) if last is None else last):
      block_log_weights = log_weights if index in reweight_blocks else None
      x, _ = self.resblocks[index](x, mask, block_log_weights)
      hidden.append(x)
    return (x, hidden) if return_hidden else x

  def encode_from(
    self,
    x: jax.Array,
    ids: jax.Array,
    first: int,
    log_weights: jax.Array | None = None,
    reweight_blocks: Sequence[int] = (),
  ) -> jax.Array:
    """Features from the input of block `first` (0-indexed): x [B, L, W] -> float32 [B, E].

    Equals pool(blocks(x, first)) but computes only the EOT row in the last
    block, exact under the causal mask. Used with a cached prefix (the blocks
    before the first reweighted one do not depend on the weights).
    """
    last = len(self.resblocks) - 1
    if first <= last:
      x = self.blocks(x, first, last, log_weights, reweight_blocks)
      eot = eot_positions(ids, self.config.eot_token_id)
      x, _ = self.resblocks[last](
        x, None, log_weights if last in reweight_blocks else None, query_index=eot
      )
      pooled = self.ln_final(x[:, 0])
    else:
      pooled = self.ln_final(
        x[jnp.arange(x.shape[0]), eot_positions(ids, self.config.eot_token_id)]
      )
    return self.project(pooled)

  def project(self, pooled: jax.Array) -> jax.Array:
    """ln_final's output float32 [B, W] -> features float32 [B, embed_dim]; the product keeps
    the compute dtype's precision (HIGHEST in float32)."""
    projected = jnp.matmul(pooled, self.text_projection, precision=matmul_precision(self.dtype))
    return projected.astype(jnp.float32)

  def pool(self, x: jax.Array, ids: jax.Array) -> jax.Array:
    """ln_final at the EOT position, projected: [B, L, W] -> float32 [B, embed_dim]."""
    batch = jnp.arange(x.shape[0])
    pooled = self.ln_final(x[batch, eot_positions(ids, self.config.eot_token_id)])
    return self.project(pooled)

  def __call__(
    self,
    ids: jax.Array,
    log_weights: jax.Array | None = None,
    reweight_blocks: Sequence[int] = (),
    return_hidden: bool = False,
  ):
    """ids int32 [B, L] -> features float32 [B, embed_dim].

    With return_hidden, returns (features, hidden) where hidden is the list of
    the embedding output and every block's output, each [B, L, W] (layers + 1).
    """
    embedded = self.embed(ids)
    x, hidden = self.blocks(embedded, 0, None, log_weights, reweight_blocks, return_hidden=True)
    features = self.pool(x, ids)
    return (features, [embedded] + hidden) if return_hidden else features

  def prompt_weighting(self, ids: jax.Array, weights: jax.Array, block: int) -> jax.Array:
    """The paper's baseline "modified prompt weighting" (App. C.1): [B, L] -> [B, embed_dim].

    At the input of `block` (0-indexed: after `block` blocks), each token's
    state h is replaced by e + w (h - e), where e is the state at the same
    position of the empty prompt (SOT, EOT, padding). The remaining blocks run
    unweighted. w = 1 gives plain CLIP.
    """
    empty = jnp.zeros_like(ids).at[:, 0].set(ids[:, 0]).at[:, 1].set(self.config.eot_token_id)
    h = self.blocks(self.embed(ids), 0, block)
    e = self.blocks(self.embed(empty), 0, block)
    h = e + weights[..., None].astype(h.dtype) * (h - e)
    return self.pool(self.blocks(h, block), ids)
