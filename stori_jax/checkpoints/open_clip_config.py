"""open_clip model configs (`model_cfg` of open_clip_config.json, or its built-in JSONs)."""

from __future__ import annotations

from typing import Any, Mapping

from stori_jax.checkpoints.errors import CheckpointError
from stori_jax.models import CLIPConfig, TextConfig, VisionConfig, get_architecture

# Keys that change nothing for the ViT/transformer towers we implement.
_HARMLESS = {
  "output_tokens",
  "timm_model_pretrained",
  "custom_text",
  "tokenizer_kwargs",
  "hf_tokenizer_name",
}
_VISION_KEYS = {"image_size", "layers", "width", "patch_size", "head_width", "mlp_ratio"}
_TEXT_KEYS = {"context_length", "vocab_size", "width", "heads", "layers", "mlp_ratio"}


def _check_keys(section: Mapping[str, Any], allowed: set[str], where: str, name: str):
  unsupported = sorted(set(section) - allowed - _HARMLESS)
  if unsupported:
    raise CheckpointError(
      f"open_clip model {name!r}: {where} options {unsupported} are not supported; "
      "this project implements the OpenAI CLIP ViT/transformer layout "
      f"(supported {where} keys: {sorted(allowed)})."
    )


def _mlp_dim(width: int, section: Mapping[str, Any]) -> int | None:
  ratio = section.get("mlp_ratio", 4.0)
  return None if ratio == 4.0 else int(width * ratio)


def config_from_open_clip(model_cfg: Mapping[str, Any], name: str = "") -> CLIPConfig:
  """open_clip's model config dict -> CLIPConfig; unsupported variants are rejected."""
  vision, text = dict(model_cfg.get("vision_cfg", {})), dict(model_cfg.get("text_cfg", {}))
  _check_keys(
    {k: v for k, v in model_cfg.items() if k not in ("vision_cfg", "text_cfg")},
    {"embed_dim", "quick_gelu"},
    "model",
    name,
  )
  if isinstance(vision.get("layers"), (list, tuple)):
    raise CheckpointError(
      f"open_clip model {name!r} has a ResNet image tower; only ViT towers are supported so far."
    )
  _check_keys(vision, _VISION_KEYS, "vision_cfg", name)
  _check_keys(text, _TEXT_KEYS, "text_cfg", name)
  image_size = vision.get("image_size", 224)
  if isinstance(image_size, (list, tuple)):
    if len(set(image_size)) != 1:
      raise CheckpointError(f"open_clip model {name!r}: non-square image_size {image_size}.")
    image_size = image_size[0]
  activation = "quick_gelu" if model_cfg.get("quick_gelu", False) else "gelu"
  v_width, t_width = vision.get("width", 768), text.get("width", 512)
  return CLIPConfig(
    embed_dim=model_cfg["embed_dim"],
    vision=VisionConfig(
      image_size=image_size,
      patch_size=vision.get("patch_size", 16),
      width=v_width,
      layers=vision.get("layers", 12),
      heads=v_width // vision.get("head_width", 64),
      mlp_dim=_mlp_dim(v_width, vision),
      activation=activation,
    ),
    text=TextConfig(
      vocab_size=text.get("vocab_size", 49408),
      context_length=text.get("context_length", 77),
      width=t_width,
      heads=text.get("heads", 8),
      layers=text.get("layers", 12),
      mlp_dim=_mlp_dim(t_width, text),
      activation=activation,
    ),
    name=name,
  )


def architecture_config(name: str) -> CLIPConfig:
  """Our preset for an architecture name, else open_clip's own config when installed."""
  try:
    return get_architecture(name)
  except ValueError as preset_error:
    try:
      import open_clip  # pylint: disable=import-outside-toplevel
    except ImportError:
      raise preset_error from None
    model_cfg = open_clip.get_model_config(name)
    if model_cfg is None:
      raise preset_error from None
    return config_from_open_clip(model_cfg, name)
