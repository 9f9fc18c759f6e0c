"""Hugging Face transformers CLIP (`text_model.encoder.layers.0.self_attn.q_proj.weight`, ...)."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from stori_jax.checkpoints.errors import CheckpointError
from stori_jax.checkpoints.mapping import StateDictReader
from stori_jax.models import CLIPConfig, TextConfig, VisionConfig, tower_kinds

IGNORED_KEYS = ("text_model.embeddings.position_ids", "vision_model.embeddings.position_ids")
_ACTIVATIONS = {"quick_gelu": "quick_gelu", "gelu": "gelu"}


def _activation(tower: Mapping[str, Any], source: str) -> str:
  act = tower.get("hidden_act", "quick_gelu")
  if act not in _ACTIVATIONS:
    raise CheckpointError(
      f"{source}: hidden_act {act!r} is not supported; CLIP checkpoints use 'quick_gelu' "
      "or 'gelu' (exact)."
    )
  return _ACTIVATIONS[act]


def _value(section: Mapping[str, Any], key: str, default, kind: type, source: str, where: str):
  """section[key] (default when absent), checked to be a positive `kind` (int or float)."""
  value = section.get(key, default)
  ok = isinstance(value, (int, float) if kind is float else int) and not isinstance(value, bool)
  if not ok or value <= 0:
    expected = "a positive integer" if kind is int else "a positive number"
    raise CheckpointError(
      f"{source}: {where}{key} is {value!r:.80} ({type(value).__name__}); it must be "
      f"{expected}. Fix that key of the file (transformers' CLIPConfig layout)."
    )
  return value


def config_from_hf(hf_config: Mapping[str, Any], source: str = "config.json") -> CLIPConfig:
  """A transformers CLIPConfig dict (config.json) -> CLIPConfig.

  Raises:
    CheckpointError: naming `source` and the key whose value has the wrong type or range.
  """
  if not isinstance(hf_config, Mapping):
    raise CheckpointError(f"{source} must hold a JSON object, got {type(hf_config).__name__}.")
  if hf_config.get("model_type") not in (None, "clip"):
    raise CheckpointError(
      f"{source} describes a {hf_config.get('model_type')!r} model; only model_type 'clip' "
      "is supported."
    )
  text, vision = hf_config.get("text_config") or {}, hf_config.get("vision_config") or {}
  for name, section in (("text_config", text), ("vision_config", vision)):
    if not isinstance(section, Mapping):
      raise CheckpointError(f"{source}: {name} must be a JSON object, got {section!r:.80}.")

  def text_int(key, default):
    return _value(text, key, default, int, source, "text_config.")

  def vision_int(key, default):
    return _value(vision, key, default, int, source, "vision_config.")

  eps = {
    _value(text, "layer_norm_eps", 1e-5, float, source, "text_config."),
    _value(vision, "layer_norm_eps", 1e-5, float, source, "vision_config."),
  }
  if len(eps) != 1:
    raise CheckpointError(f"{source}: the towers use different layer_norm_eps {sorted(eps)}.")
  eot = text_int("eos_token_id", 49407)
  vocab = text_int("vocab_size", 49408)
  if eot == 2:
    # Configs written before transformers PR #24773 say 2 but pool at the
    # argmax id, which is the end-of-text token, the largest id in CLIP's vocab.
    eot = vocab - 1
  text_width, vision_width = text_int("hidden_size", 512), vision_int("hidden_size", 768)
  text_mlp = text_int("intermediate_size", 2048)
  vision_mlp = vision_int("intermediate_size", 3072)
  try:
    return CLIPConfig(
      embed_dim=_value(hf_config, "projection_dim", 512, int, source, ""),
      text=TextConfig(
        vocab_size=vocab,
        context_length=text_int("max_position_embeddings", 77),
        width=text_width,
        layers=text_int("num_hidden_layers", 12),
        heads=text_int("num_attention_heads", 8),
        mlp_dim=None if text_mlp == 4 * text_width else text_mlp,
        activation=_activation(text, source),
        eot_token_id=eot,
      ),
      vision=VisionConfig(
        image_size=vision_int("image_size", 224),
        patch_size=vision_int("patch_size", 32),
        width=vision_width,
        layers=vision_int("num_hidden_layers", 12),
        heads=vision_int("num_attention_heads", 12),
        mlp_dim=None if vision_mlp == 4 * vision_width else vision_mlp,
        activation=_activation(vision, source),
      ),
      layer_norm_eps=eps.pop(),
      name=str(hf_config.get("_name_or_path", "")),
    )
  except ValueError as e:  # inconsistent sizes, e.g. a width not divisible by the heads
    raise CheckpointError(f"{source}: the architecture is inconsistent: {e}") from None


def put_blocks(reader: StateDictReader, target: str, prefix: str, layers: int):
  for i in range(layers):
    src, dst = f"{prefix}{i}.", f"{target}/resblocks_{i}/"
    reader.put_layer_norm(dst + "ln_1", src + "layer_norm1")
    reader.put_layer_norm(dst + "ln_2", src + "layer_norm2")
    for ours, theirs in (
      ("query", "q_proj"),
      ("key", "k_proj"),
      ("value", "v_proj"),
      ("out", "out_proj"),
    ):
      reader.put_linear(f"{dst}attn/{ours}", f"{src}self_attn.{theirs}")
    reader.put_linear(dst + "mlp/c_fc", src + "mlp.fc1")
    reader.put_linear(dst + "mlp/c_proj", src + "mlp.fc2")


def params_from_state_dict(
  state_dict: Mapping[str, np.ndarray], config: CLIPConfig, source: str = "checkpoint"
) -> dict:
  """transformers CLIPModel state dict -> this project's params for `config`."""
  reader = StateDictReader(state_dict, source, ignored=IGNORED_KEYS)
  reader.put("text/token_embedding/embedding", "text_model.embeddings.token_embedding.weight")
  reader.put("text/positional_embedding", "text_model.embeddings.position_embedding.weight")
  put_blocks(reader, "text", "text_model.encoder.layers.", config.text.layers)
  reader.put_layer_norm("text/ln_final", "text_model.final_layer_norm")
  reader.put("text/text_projection", "text_projection.weight", lambda w: w.T)
  try:
    put_vision = tower_kinds.of(config.vision).hook("transformers_params")
  except ValueError as e:
    raise CheckpointError(f"{source}: {e}") from None
  put_vision(reader, config.vision)
  reader.put("logit_scale", "logit_scale", lambda x: x.reshape(()))
  return reader.params(config)
