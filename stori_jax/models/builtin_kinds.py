"""The built-in image-tower kinds, registered in the order of the families in Table 3: OpenAI's
ViT, OpenAI's ModifiedResNet and timm's ConvNeXt (as open_clip wraps it). Their checkpoint
conversions and PyTorch references are attached by `checkpoints/openai.py`, `checkpoints/cnn.py`,
`checkpoints/hf.py`, `checkpoints/open_clip_config.py` and `reference/clip_towers.py`
(see tower_kinds)."""

from __future__ import annotations

import dataclasses

from stori_jax.models import tower_kinds
from stori_jax.models.config import ACTIVATIONS, ConvNeXtConfig, ResNetConfig, VisionConfig
from stori_jax.models.convnext import ConvNeXt
from stori_jax.models.modified_resnet import ModifiedResNet
from stori_jax.models.vision import VisionTransformer


def _check_stride_32(vision, kind: str) -> None:
  if vision.image_size % 32:
    raise ValueError(
      f"{kind} towers downsample by 32: image_size {vision.image_size} is not a multiple of 32."
    )


# -- ViT ---------------------------------------------------------------------------------------

_VIT_FIELDS = frozenset(f.name for f in dataclasses.fields(VisionConfig))


def _vit_check(vision: VisionConfig) -> None:
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


def _vit_shrink(vision: VisionConfig, factor: int) -> VisionConfig:
  width = max(8, vision.width // factor)
  return dataclasses.replace(
    vision,
    width=width,
    layers=min(vision.layers, 2),
    heads=tower_kinds.shrunk_heads(width, vision.heads),
  )


def _vit_activation(vision: VisionConfig) -> int:
  # The MLP's hidden layer or the attention scores.
  tokens = vision.num_tokens
  return tokens * max(vision.mlp_width, vision.heads * tokens)


VIT = tower_kinds.register(
  tower_kinds.TowerKind(
    name="vit",
    config=VisionConfig,
    module=lambda c, dtype: VisionTransformer(c.vision, c.embed_dim, c.layer_norm_eps, dtype),
    # Its own fields only, with one block count (a ResNet's layers are 4).
    recognises=lambda d: set(d) <= _VIT_FIELDS and not isinstance(d.get("layers"), (list, tuple)),
    family="ViT",
    describe=lambda v: f"ViT {v.layers}x{v.width} patch {v.patch_size}",
    activation_elements=_vit_activation,
    check=_vit_check,
    shrink=_vit_shrink,
    has_keys=True,
    class_token_layers=True,
    shares_activation=True,
    param_blocks=lambda v: (("vision.layers", v.layers, "vision/resblocks_"),),
  )
)


# -- ModifiedResNet ----------------------------------------------------------------------------


def _resnet_check(vision: ResNetConfig) -> None:
  _check_stride_32(vision, "resnet")
  if len(vision.layers) != 4 or min(vision.layers) < 1:
    raise ValueError(f"ResNetConfig.layers needs 4 positive counts, got {vision.layers}.")
  if vision.heads < 1 or vision.feature_width % vision.heads:
    raise ValueError(
      f"ResNetConfig: attention-pooling width {vision.feature_width} is not divisible by "
      f"heads {vision.heads}."
    )


def _resnet_shrink(vision: ResNetConfig, factor: int) -> ResNetConfig:
  width = max(2, vision.width // factor)
  return dataclasses.replace(
    vision,
    width=width,
    layers=(1, 1, 1, 1),
    heads=tower_kinds.shrunk_heads(width * 32, width * 32 // 64),
  )


RESNET = tower_kinds.register(
  tower_kinds.TowerKind(
    name="resnet",
    config=ResNetConfig,
    module=lambda c, dtype: ModifiedResNet(c.vision, c.embed_dim, dtype),
    # Its layers are 4 counts, a ViT's one.
    recognises=lambda d: isinstance(d.get("layers"), (list, tuple)),
    family="ResNet",
    describe=lambda v: "ResNet",
    # The first stage's output: 4 x width channels at 1/4 of the input.
    activation_elements=lambda v: (int(v.image_size) // 4) ** 2 * 4 * v.width,
    check=_resnet_check,
    shrink=_resnet_shrink,
    has_keys=True,  # the attention pool's
    hidden_labels=("stem", "stage"),
  )
)


# -- ConvNeXt ----------------------------------------------------------------------------------


def _convnext_check(vision: ConvNeXtConfig) -> None:
  _check_stride_32(vision, "convnext")
  if len(vision.depths) != 4 or len(vision.dims) != 4:
    raise ValueError(
      f"ConvNeXtConfig needs 4 depths and 4 dims, got {vision.depths} and {vision.dims}."
    )


def _convnext_shrink(vision: ConvNeXtConfig, factor: int) -> ConvNeXtConfig:
  return dataclasses.replace(
    vision, dims=tuple(max(4, d // factor) for d in vision.dims), depths=(1, 1, 1, 1)
  )


CONVNEXT = tower_kinds.register(
  tower_kinds.TowerKind(
    name="convnext",
    config=ConvNeXtConfig,
    module=lambda c, dtype: ConvNeXt(c.vision, c.embed_dim, dtype),
    recognises=lambda d: "depths" in d,
    family="ConvNeXt",
    describe=lambda v: "ConvNeXt",
    # The first stage's MLP: mlp_ratio x dims[0] at 1/4 of the input.
    activation_elements=lambda v: (int(v.image_size) // 4) ** 2 * v.mlp_ratio * v.dims[0],
    check=_convnext_check,
    shrink=_convnext_shrink,
    has_keys=False,  # no attention
    hidden_labels=("stem", "stage"),
  )
)
