"""open_clip model configs (`model_cfg` of open_clip_config.json, or its built-in JSONs)."""

from __future__ import annotations

from typing import Any, Mapping

from stori_jax.checkpoints.errors import CheckpointError
from stori_jax.models import (
  CLIPConfig,
  ConvNeXtConfig,
  ResNetConfig,
  TextConfig,
  VisionConfig,
  get_architecture,
  tower_kinds,
)

# Keys that change nothing for the towers we implement.
_HARMLESS = {
  "output_tokens",
  "timm_model_pretrained",
  "custom_text",
  "tokenizer_kwargs",
  "hf_tokenizer_name",
}
_VISION_KEYS = {"image_size", "layers", "width", "patch_size", "head_width", "mlp_ratio"}
_TEXT_KEYS = {"context_length", "vocab_size", "width", "heads", "layers", "mlp_ratio"}
_RESNET_KEYS = {"image_size", "layers", "width", "patch_size", "head_width"}
# timm_drop and timm_drop_path act only in training.
_TIMM_KEYS = {
  "image_size",
  "timm_model_name",
  "timm_pool",
  "timm_proj",
  "timm_proj_bias",
  "timm_drop",
  "timm_drop_path",
}
# timm's ConvNeXt variants with its default LayerNorm eps (1e-6), from
# timm/models/convnext.py: name -> (depths, dims).
TIMM_CONVNEXTS = {
  "convnext_tiny": ((3, 3, 9, 3), (96, 192, 384, 768)),
  "convnext_small": ((3, 3, 27, 3), (96, 192, 384, 768)),
  "convnext_base": ((3, 3, 27, 3), (128, 256, 512, 1024)),
  "convnext_large": ((3, 3, 27, 3), (192, 384, 768, 1536)),
}


def _check_keys(section: Mapping[str, Any], allowed: set[str], where: str, name: str):
  unsupported = sorted(set(section) - allowed - _HARMLESS)
  if unsupported:
    raise CheckpointError(
      f"open_clip model {name!r}: {where} options {unsupported} are not supported; "
      "this project implements OpenAI CLIP's ViT/ModifiedResNet/transformer layouts and "
      "timm ConvNeXt towers "
      f"(supported {where} keys: {sorted(allowed)})."
    )


def _mlp_dim(width: int, section: Mapping[str, Any]) -> int | None:
  ratio = section.get("mlp_ratio", 4.0)
  return None if ratio == 4.0 else int(width * ratio)


def _vision_config(vision: Mapping[str, Any], activation: str, name: str):
  """open_clip's vision_cfg -> the vision config of the tower kind that claims it (a ViT where
  no other kind does)."""
  image_size = _square_size(vision.get("image_size", 224), name)
  return tower_kinds.detect("open_clip_config", vision, image_size, activation, name)


def _resnet_config(vision: Mapping[str, Any], image_size: int, activation: str, name: str):
  """open_clip's ModifiedResNet vision_cfg (its layers are 4 counts) -> ResNetConfig."""
  del activation  # ReLU towers
  if not isinstance(vision.get("layers"), (list, tuple)):
    return None
  _check_keys(vision, _RESNET_KEYS, "vision_cfg", name)
  width = vision.get("width", 64)
  return ResNetConfig(
    image_size=image_size,
    layers=tuple(vision["layers"]),
    width=width,
    heads=width * 32 // vision.get("head_width", 64),
  )


def _vit_config(vision: Mapping[str, Any], image_size: int, activation: str, name: str):
  """open_clip's VisionTransformer vision_cfg -> VisionConfig."""
  _check_keys(vision, _VISION_KEYS, "vision_cfg", name)
  width = vision.get("width", 768)
  return VisionConfig(
    image_size=image_size,
    patch_size=vision.get("patch_size", 16),
    width=width,
    layers=vision.get("layers", 12),
    heads=width // vision.get("head_width", 64),
    mlp_dim=_mlp_dim(width, vision),
    activation=activation,
  )


def config_from_open_clip(model_cfg: Mapping[str, Any], name: str = "") -> CLIPConfig:
  """open_clip's model config dict -> CLIPConfig; unsupported variants are rejected."""
  vision, text = dict(model_cfg.get("vision_cfg", {})), dict(model_cfg.get("text_cfg", {}))
  _check_keys(
    {k: v for k, v in model_cfg.items() if k not in ("vision_cfg", "text_cfg")},
    {"embed_dim", "quick_gelu"},
    "model",
    name,
  )
  _check_keys(text, _TEXT_KEYS, "text_cfg", name)
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
      mlp_dim=_mlp_dim(t_width, text),
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


def _timm_config(
  vision: Mapping[str, Any], image_size: int, activation: str, name: str
) -> ConvNeXtConfig | None:
  """open_clip's TimmModel settings -> ConvNeXtConfig; other timm towers are rejected."""
  del activation  # timm's ConvNeXt keeps its exact GELU
  if not vision.get("timm_model_name"):
    return None
  _check_keys(vision, _TIMM_KEYS, "vision_cfg", name)
  trunk = vision["timm_model_name"]
  if trunk not in TIMM_CONVNEXTS:
    raise CheckpointError(
      f"open_clip model {name!r}: timm tower {trunk!r} is not supported; supported timm "
      f"towers: {sorted(TIMM_CONVNEXTS)}."
    )
  pool, proj = vision.get("timm_pool", "avg"), vision.get("timm_proj", "linear")
  # pool "" keeps ConvNeXt's own head (average pool + LayerNorm), as "avg" does.
  if pool not in ("", "avg") or proj != "linear":
    raise CheckpointError(
      f"open_clip model {name!r}: timm_pool={pool!r}, timm_proj={proj!r} is not supported; "
      "this project implements timm_pool '' or 'avg' with timm_proj 'linear'."
    )
  depths, dims = TIMM_CONVNEXTS[trunk]
  return ConvNeXtConfig(
    image_size=image_size,
    depths=depths,
    dims=dims,
    proj_bias=bool(vision.get("timm_proj_bias", False)),
  )


tower_kinds.attach("vit", open_clip_config=_vit_config)
tower_kinds.attach("resnet", open_clip_config=_resnet_config)
tower_kinds.attach("convnext", open_clip_config=_timm_config)


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
