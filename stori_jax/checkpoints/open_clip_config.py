"""open_clip model configs (`model_cfg` of open_clip_config.json, or its built-in JSONs): the
model and text_cfg sections here, the vision_cfg by the tower kind that claims it
(stori_jax/kinds/, the `open_clip_config` hook)."""

from __future__ import annotations

from typing import Any, Mapping

from stori_jax.checkpoints.errors import CheckpointError
from stori_jax.models import CLIPConfig, TextConfig, get_architecture, tower_kinds

# Keys that change nothing for the towers we implement.
_HARMLESS = {
  "output_tokens",
  "timm_model_pretrained",
  "custom_text",
  "tokenizer_kwargs",
  "hf_tokenizer_name",
}
_TEXT_KEYS = {"context_length", "vocab_size", "width", "heads", "layers", "mlp_ratio"}


def check_keys(section: Mapping[str, Any], allowed: set[str], where: str, name: str):
  """A CheckpointError naming the keys of `section` (an open_clip config's `where`: "model",
  "text_cfg", "vision_cfg") outside `allowed` (a tower kind's own for its vision_cfg)."""
  unsupported = sorted(set(section) - allowed - _HARMLESS)
  if unsupported:
    raise CheckpointError(
      f"open_clip model {name!r}: {where} options {unsupported} are not supported; "
      "this project implements OpenAI CLIP's ViT/ModifiedResNet/transformer layouts and "
      "timm ConvNeXt towers "
      f"(supported {where} keys: {sorted(allowed)})."
    )


def mlp_dim(width: int, section: Mapping[str, Any]) -> int | None:
  """A tower's MLP width from its section's mlp_ratio; None for the default 4x."""
  ratio = section.get("mlp_ratio", 4.0)
  return None if ratio == 4.0 else int(width * ratio)


def _vision_config(vision: Mapping[str, Any], activation: str, name: str):
  """open_clip's vision_cfg -> the vision config of the tower kind that claims it (a ViT where
  no other kind does)."""
  image_size = _square_size(vision.get("image_size", 224), name)
  return tower_kinds.detect("open_clip_config", vision, image_size, activation, name)


def config_from_open_clip(model_cfg: Mapping[str, Any], name: str = "") -> CLIPConfig:
  """open_clip's model config dict -> CLIPConfig; unsupported variants are rejected."""
  vision, text = dict(model_cfg.get("vision_cfg", {})), dict(model_cfg.get("text_cfg", {}))
  check_keys(
    {k: v for k, v in model_cfg.items() if k not in ("vision_cfg", "text_cfg")},
    {"embed_dim", "quick_gelu"},
    "model",
    name,
  )
  check_keys(text, _TEXT_KEYS, "text_cfg", name)
  # open_clip's quick_gelu switches the transformers only; timm towers keep GELU.
  activation = "quick_gelu" if model_cfg.get("quick_gelu", False) else "gelu"
  t_width = text.get("width", 512)
  return CLIPConfig(
    embed_dim=model_cfg["embed_dim"],
    vision=_vision_config(vision, activation, name),
    text=TextConfig(
      vocab_size=text.get("vocab_size", 49408),
      context_length=text.get("context_length", 77),
      width=t_width,
      heads=text.get("heads", 8),
      layers=text.get("layers", 12),
      mlp_dim=mlp_dim(t_width, text),
      activation=activation,
    ),
    name=name,
  )


def _square_size(image_size, name: str) -> int:
  if isinstance(image_size, (list, tuple)):
    if len(set(image_size)) != 1:
      raise CheckpointError(f"open_clip model {name!r}: non-square image_size {image_size}.")
    return image_size[0]
  return image_size


def architecture_config(name: str) -> CLIPConfig:
  """Our preset for an architecture name, else open_clip's own config when installed."""
  try:
    return get_architecture(name)
  except ValueError as preset_error:
    try:
      import open_clip  # optional: the torch extra
    except ImportError:
      raise preset_error from None
    model_cfg = open_clip.get_model_config(name)
    if model_cfg is None:
      raise preset_error from None
    return config_from_open_clip(model_cfg, name)
