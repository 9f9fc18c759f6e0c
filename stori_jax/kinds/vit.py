"""The ViT image-tower kind (OpenAI CLIP's VisionTransformer): everything the project knows of it
in one `TowerKind` entry, its model side (its config and Flax module, from stori_jax.models) and
its checkpoint conversions from every layout it is stored in: OpenAI / open_clip state dicts
(`visual.transformer.resblocks.*`), open_clip's `vision_cfg`, and transformers' CLIPModel
(`vision_model.*`). Its PyTorch reference (open_clip's / transformers' tower, for the
parity tool: stori_jax/reference/clip_towers.py) is built from its hooks too."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from stori_jax.checkpoints import hf, open_clip_config, openai
from stori_jax.checkpoints.mapping import StateDictReader, block_count, conv_kernel
from stori_jax.models import tower_kinds
from stori_jax.models.config import ACTIVATIONS, VisionConfig
from stori_jax.models.vision import VisionTransformer

# -- The model side ----------------------------------------------------------------------------

_FIELDS = frozenset(f.name for f in dataclasses.fields(VisionConfig))


def _check(vision: VisionConfig) -> None:
  if vision.activation not in ACTIVATIONS:
    raise ValueError(f"Unknown activation {vision.activation!r}; expected one of {ACTIVATIONS}.")
  if vision.heads < 1 or vision.width % vision.heads:
    raise ValueError(
      f"{type(vision).__name__}: width {vision.width} is not divisible by heads {vision.heads}."
    )
  if vision.image_size % vision.patch_size:
    raise ValueError(
      f"image_size {vision.image_size} is not a multiple of patch_size {vision.patch_size}."
    )


def _shrink(vision: VisionConfig, factor: int) -> VisionConfig:
  width = max(8, vision.width // factor)
  return dataclasses.replace(
    vision,
    width=width,
    layers=min(vision.layers, 2),
    heads=tower_kinds.shrunk_heads(width, vision.heads),
  )


def _activation_elements(vision: VisionConfig) -> int:
  # The MLP's hidden layer or the attention scores.
  tokens = vision.num_tokens
  return tokens * max(vision.mlp_width, vision.heads * tokens)


# -- OpenAI / open_clip state dicts ------------------------------------------------------------


def _state_dict_config(state_dict, source, activation, head_width) -> VisionConfig:
  """The shapes of OpenAI's `visual.*` ViT keys, as its build_model reads them (the default kind:
  a state dict no other kind claims is read as a ViT, whose missing keys are then named)."""
  require = openai.required
  conv = require(state_dict, "visual.conv1.weight", source)
  vision_width, _, patch, _ = conv.shape
  grid = round((require(state_dict, "visual.positional_embedding", source).shape[0] - 1) ** 0.5)
  vision_mlp = require(state_dict, "visual.transformer.resblocks.0.mlp.c_fc.weight", source)
  vision_mlp = vision_mlp.shape[0]
  return VisionConfig(
    image_size=patch * grid,
    patch_size=patch,
    width=vision_width,
    layers=block_count(state_dict, "visual.transformer.resblocks."),
    heads=max(1, vision_width // head_width),
    mlp_dim=None if vision_mlp == 4 * vision_width else vision_mlp,
    activation=activation,
  )


def _state_dict_params(reader: StateDictReader, vision: VisionConfig):
  """visual.* (OpenAI's ViT) -> vision/* of models.VisionTransformer."""
  reader.put("vision/conv1/kernel", "visual.conv1.weight", conv_kernel)
  reader.put("vision/class_embedding", "visual.class_embedding")
  reader.put("vision/positional_embedding", "visual.positional_embedding")
  reader.put_layer_norm("vision/ln_pre", "visual.ln_pre")
  openai.put_blocks(reader, "vision", "visual.transformer.resblocks.", vision.layers)
  reader.put_layer_norm("vision/ln_post", "visual.ln_post")
  reader.put("vision/proj", "visual.proj")


# -- open_clip's vision_cfg --------------------------------------------------------------------

_OPEN_CLIP_KEYS = {"image_size", "layers", "width", "patch_size", "head_width", "mlp_ratio"}


def _open_clip_config(vision: Mapping[str, Any], image_size: int, activation: str, name: str):
  """open_clip's VisionTransformer vision_cfg -> VisionConfig (the default kind)."""
  open_clip_config.check_keys(vision, _OPEN_CLIP_KEYS, "vision_cfg", name)
  width = vision.get("width", 768)
  return VisionConfig(
    image_size=image_size,
    patch_size=vision.get("patch_size", 16),
    width=width,
    layers=vision.get("layers", 12),
    heads=width // vision.get("head_width", 64),
    mlp_dim=open_clip_config.mlp_dim(width, vision),
    activation=activation,
  )


# -- transformers' CLIPModel (a ViT image tower only) ------------------------------------------


def _transformers_params(reader: StateDictReader, vision: VisionConfig):
  """vision_model.* and visual_projection -> vision/* of models.VisionTransformer."""
  reader.put("vision/conv1/kernel", "vision_model.embeddings.patch_embedding.weight", conv_kernel)
  reader.put("vision/class_embedding", "vision_model.embeddings.class_embedding")
  reader.put("vision/positional_embedding", "vision_model.embeddings.position_embedding.weight")
  reader.put_layer_norm("vision/ln_pre", "vision_model.pre_layrnorm")  # sic, HF's spelling.
  hf.put_blocks(reader, "vision", "vision_model.encoder.layers.", vision.layers)
  reader.put_layer_norm("vision/ln_post", "vision_model.post_layernorm")
  reader.put("vision/proj", "visual_projection.weight", lambda w: w.T)


# -- The PyTorch reference (stori_jax/reference/clip_towers.py, the parity tool) ----------------


def _reference_vision_cfg(config) -> dict:
  v = config.vision
  cfg = dict(
    image_size=v.image_size,
    layers=v.layers,
    width=v.width,
    head_width=v.width // v.heads,
    mlp_ratio=v.mlp_width / v.width,
    patch_size=v.patch_size,
  )
  if config.layer_norm_eps != 1e-5:
    cfg["norm_kwargs"] = {"eps": config.layer_norm_eps}
  return cfg


def _reference_hidden(visual):
  """The ViT's residual blocks, hooked like the text tower's."""
  if not hasattr(visual, "transformer"):
    return None
  blocks = visual.transformer.resblocks
  return blocks[0], blocks, "sequence"


def _reference_transformers_vision(config) -> dict:
  v = config.vision
  return dict(
    hidden_size=v.width,
    intermediate_size=v.mlp_width,
    num_hidden_layers=v.layers,
    num_attention_heads=v.heads,
    image_size=v.image_size,
    patch_size=v.patch_size,
    hidden_act=v.activation,
    layer_norm_eps=config.layer_norm_eps,
  )


VIT = tower_kinds.register(
  tower_kinds.TowerKind(
    name="vit",
    config=VisionConfig,
    module=lambda c, dtype: VisionTransformer(c.vision, c.embed_dim, c.layer_norm_eps, dtype),
    # Its own fields only, with one block count (a ResNet's layers are 4).
    recognises=lambda d: set(d) <= _FIELDS and not isinstance(d.get("layers"), (list, tuple)),
    family="ViT",
    describe=lambda v: f"ViT {v.layers}x{v.width} patch {v.patch_size}",
    activation_elements=_activation_elements,
    check=_check,
    shrink=_shrink,
    has_keys=True,
    class_token_layers=True,
    shares_activation=True,
    param_blocks=lambda v: (("vision.layers", v.layers, "vision/resblocks_"),),
    hooks=dict(
      state_dict_config=_state_dict_config,
      state_dict_params=_state_dict_params,
      open_clip_config=_open_clip_config,
      transformers_params=_transformers_params,
      reference_vision_cfg=_reference_vision_cfg,
      reference_hidden=_reference_hidden,
      reference_transformers_vision=_reference_transformers_vision,
    ),
  )
)
