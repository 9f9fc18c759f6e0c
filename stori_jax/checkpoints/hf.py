"""Hugging Face transformers CLIP (`text_model.encoder.layers.0.self_attn.q_proj.weight`, ...)."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from stori_jax.checkpoints.errors import CheckpointError
from stori_jax.checkpoints.mapping import StateDictReader, conv_kernel
from stori_jax.models import CLIPConfig, TextConfig, VisionConfig

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


def config_from_hf(hf_config: Mapping[str, Any], source: str = "config.json") -> CLIPConfig:
  """A transformers CLIPConfig dict (config.json) -> CLIPConfig."""
  if hf_config.get("model_type") not in (None, "clip"):
    raise CheckpointError(
      f"{source} describes a {hf_config.get('model_type')!r} model; only model_type 'clip' "
      "is supported."
    )
  text, vision = hf_config.get("text_config") or {}, hf_config.get("vision_config") or {}
  eps = {text.get("layer_norm_eps", 1e-5), vision.get("layer_norm_eps", 1e-5)}
  if len(eps) != 1:
    raise CheckpointError(f"{source}: the towers use different layer_norm_eps {sorted(eps)}.")
  eot = text.get("eos_token_id", 49407)
  vocab = text.get("vocab_size", 49408)
  if eot == 2:
    # Configs written before transformers PR #24773 say 2 but pool at the
    # argmax id, which is the end-of-text token, the largest id in CLIP's vocab.
    eot = vocab - 1
  text_width, vision_width = text.get("hidden_size", 512), vision.get("hidden_size", 768)
  text_mlp, vision_mlp = text.get("intermediate_size", 2048), vision.get("intermediate_size", 3072)
  return CLIPConfig(
    embed_dim=hf_config.get("projection_dim", 512),
    text=TextConfig(
      vocab_size=vocab,
      context_length=text.get("max_position_embeddings", 77),
      width=text_width,
      layers=text.get("num_hidden_layers", 12),
      heads=text.get("num_attention_heads", 8),
      mlp_dim=None if text_mlp == 4 * text_width else text_mlp,
      activation=_activation(text, source),
      eot_token_id=eot,
    ),
    vision=VisionConfig(
      image_size=vision.get("image_size", 224),
      patch_size=vision.get("patch_size", 32),
      width=vision_width,
      layers=vision.get("num_hidden_layers", 12),
      heads=vision.get("num_attention_heads", 12),
      mlp_dim=None if vision_mlp == 4 * vision_width else vision_mlp,
      activation=_activation(vision, source),
    ),
    layer_norm_eps=eps.pop(),
    name=hf_config.get("_name_or_path", ""),
  )


def _blocks(reader: StateDictReader, target: str, prefix: str, layers: int):
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
  _blocks(reader, "text", "text_model.encoder.layers.", config.text.layers)
  reader.put_layer_norm("text/ln_final", "text_model.final_layer_norm")
  reader.put("text/text_projection", "text_projection.weight", lambda w: w.T)
  reader.put("vision/conv1/kernel", "vision_model.embeddings.patch_embedding.weight", conv_kernel)
  reader.put("vision/class_embedding", "vision_model.embeddings.class_embedding")
  reader.put("vision/positional_embedding", "vision_model.embeddings.position_embedding.weight")
  reader.put_layer_norm("vision/ln_pre", "vision_model.pre_layrnorm")  # sic, HF's spelling.
  _blocks(reader, "vision", "vision_model.encoder.layers.", config.vision.layers)
  reader.put_layer_norm("vision/ln_post", "vision_model.post_layernorm")
  reader.put("vision/proj", "visual_projection.weight", lambda w: w.T)
  reader.put("logit_scale", "logit_scale", lambda x: x.reshape(()))
  return reader.params(config)
