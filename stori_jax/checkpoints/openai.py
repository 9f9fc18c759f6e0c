"""OpenAI / open_clip state dicts (`visual.transformer.resblocks.0.attn.in_proj_weight`, ...).

OpenAI's JIT archives, its plain state dicts and open_clip's CLIP models share
these key names. The text tower and the shared layout are read here; each image tower's
`visual.*` keys by its kind (stori_jax/kinds/, the `state_dict_config` and `state_dict_params`
hooks).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from stori_jax.checkpoints.errors import CheckpointError
from stori_jax.checkpoints.mapping import StateDictReader, block_count, linear_kernel
from stori_jax.models import CLIPConfig, TextConfig, tower_kinds

# Buffers and metadata with no parameter counterpart: the causal mask buffer
# and the integers OpenAI's JIT archives carry.
IGNORED_KEYS = ("attn_mask", "input_resolution", "context_length", "vocab_size")


def required(state_dict, key, source):
  if key not in state_dict:
    raise CheckpointError(
      f"{source} has no key {key!r}: it is not an OpenAI/open_clip CLIP state dict. "
      f"First keys: {sorted(state_dict)[:8]}"
    )
  return state_dict[key]


def config_from_state_dict(
  state_dict: Mapping[str, np.ndarray],
  source: str = "checkpoint",
  activation: str = "quick_gelu",
  head_width: int = 64,
  name: str = "",
) -> CLIPConfig:
  """Infers the architecture from the tensor shapes, as OpenAI's build_model does.

  Heads are width // head_width (64 for every OpenAI model), at least 1; a
  ModifiedResNet pools with width * 32 // head_width heads. The activation is
  not visible in the weights: OpenAI's models use QuickGELU. ConvNeXt towers do
  not record their input size and need an architecture name.
  """
  # Each tower kind reads its own `visual.*` keys; a ViT where no other kind claims them.
  vision = tower_kinds.detect("state_dict_config", state_dict, source, activation, head_width)
  text_width = required(state_dict, "ln_final.weight", source).shape[0]
  text_mlp = required(state_dict, "transformer.resblocks.0.mlp.c_fc.weight", source).shape[0]
  return CLIPConfig(
    embed_dim=required(state_dict, "text_projection", source).shape[1],
    text=TextConfig(
      vocab_size=required(state_dict, "token_embedding.weight", source).shape[0],
      context_length=required(state_dict, "positional_embedding", source).shape[0],
      width=text_width,
      heads=max(1, text_width // head_width),
      layers=block_count(state_dict, "transformer.resblocks."),
      mlp_dim=None if text_mlp == 4 * text_width else text_mlp,
      activation=activation,
    ),
    vision=vision,
    name=name,
  )


def put_blocks(reader: StateDictReader, target: str, prefix: str, layers: int):
  for i in range(layers):
    src, dst = f"{prefix}{i}.", f"{target}/resblocks_{i}/"
    reader.put_layer_norm(dst + "ln_1", src + "ln_1")
    reader.put_layer_norm(dst + "ln_2", src + "ln_2")
    attn = dst + "attn/"
    reader.put_split(
      (attn + "query/kernel", attn + "key/kernel", attn + "value/kernel"),
      src + "attn.in_proj_weight",
      linear_kernel,
    )
    reader.put_split(
      (attn + "query/bias", attn + "key/bias", attn + "value/bias"), src + "attn.in_proj_bias"
    )
    reader.put_linear(attn + "out", src + "attn.out_proj")
    reader.put_linear(dst + "mlp/c_fc", src + "mlp.c_fc")
    reader.put_linear(dst + "mlp/c_proj", src + "mlp.c_proj")


def params_from_state_dict(
  state_dict: Mapping[str, np.ndarray], config: CLIPConfig, source: str = "checkpoint"
) -> dict:
  """OpenAI/open_clip state dict -> this project's params for `config`.

  Raises CheckpointMismatchError naming absent, unexpected and misshaped keys.
  """
  # Batch-norm step counters (a ResNet's): buffers with no role at inference.
  counters = [k for k in state_dict if k.endswith(".num_batches_tracked")]
  ignored = (*IGNORED_KEYS, *counters)
  reader = StateDictReader(state_dict, source, ignored=ignored)
  reader.put("text/token_embedding/embedding", "token_embedding.weight")
  reader.put("text/positional_embedding", "positional_embedding")
  put_blocks(reader, "text", "transformer.resblocks.", config.text.layers)
  reader.put_layer_norm("text/ln_final", "ln_final")
  reader.put("text/text_projection", "text_projection")
  put_vision = _kind_hook(config, "state_dict_params", source)
  put_vision(reader, config.vision)
  reader.put("logit_scale", "logit_scale", lambda x: x.reshape(()))
  return reader.params(config)


def _kind_hook(config: CLIPConfig, hook: str, source: str):
  """The tower kind's hook, or a CheckpointError where the kind has no such conversion."""
  try:
    return tower_kinds.of(config.vision).hook(hook)
  except ValueError as e:
    raise CheckpointError(f"{source}: {e}") from None
