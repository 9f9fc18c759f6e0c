"""The ModifiedResNet image-tower kind (OpenAI CLIP's RN50, RN101, RN50x4, ...): its `TowerKind`
entry, with its model side (its config and Flax module, from stori_jax.models) and its checkpoint
conversions: OpenAI's state-dict keys (`visual.layer1.0.conv1.weight`,
`visual.attnpool.k_proj.weight`, ..., shared by open_clip) and open_clip's `vision_cfg` (its
layers are 4 counts); and its PyTorch reference's build (open_clip's tower, for the parity tool:
stori_jax/reference/clip_towers.py asks these hooks)."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from stori_jax.checkpoints import open_clip_config
from stori_jax.checkpoints.mapping import StateDictReader, block_count, conv_kernel
from stori_jax.models import tower_kinds
from stori_jax.models.config import ResNetConfig
from stori_jax.models.modified_resnet import ModifiedResNet

# -- The model side ----------------------------------------------------------------------------


def _check(vision: ResNetConfig) -> None:
  tower_kinds.check_stride_32(vision, "resnet")
  if len(vision.layers) != 4 or min(vision.layers) < 1:
    raise ValueError(f"ResNetConfig.layers needs 4 positive counts, got {vision.layers}.")
  if vision.heads < 1 or vision.feature_width % vision.heads:
    raise ValueError(
      f"ResNetConfig: attention-pooling width {vision.feature_width} is not divisible by "
      f"heads {vision.heads}."
    )


def _shrink(vision: ResNetConfig, factor: int) -> ResNetConfig:
  width = max(2, vision.width // factor)
  return dataclasses.replace(
    vision,
    width=width,
    layers=(1, 1, 1, 1),
    heads=tower_kinds.shrunk_heads(width * 32, width * 32 // 64),
  )


# -- OpenAI / open_clip state dicts ------------------------------------------------------------

MARKER = "visual.layer1.0.conv1.weight"


def state_dict_config(state_dict: Mapping[str, np.ndarray], head_width: int = 64) -> ResNetConfig:
  """The ModifiedResNet shapes, read as OpenAI's build_model reads them.

  The input size is 32x the attention-pooling grid; heads are width * 32 // 64.
  """
  layers = tuple(block_count(state_dict, f"visual.layer{i}.") for i in range(1, 5))
  width = state_dict[MARKER].shape[0]
  grid = round((state_dict["visual.attnpool.positional_embedding"].shape[0] - 1) ** 0.5)
  return ResNetConfig(
    image_size=32 * grid, layers=layers, width=width, heads=width * 32 // head_width
  )


def _claimed_config(state_dict, source, activation, head_width) -> ResNetConfig | None:
  del source, activation  # ReLU towers
  return state_dict_config(state_dict, head_width) if MARKER in state_dict else None


def _batch_norm(reader: StateDictReader, target: str, key: str):
  reader.put(f"{target}/scale", f"{key}.weight")
  reader.put(f"{target}/bias", f"{key}.bias")
  reader.put(f"{target}/mean", f"{key}.running_mean")
  reader.put(f"{target}/var", f"{key}.running_var")


def state_dict_params(reader: StateDictReader, config: ResNetConfig):
  """visual.* (ModifiedResNet) -> vision/* of models.ModifiedResNet."""
  for i in (1, 2, 3):
    reader.put(f"vision/conv{i}/kernel", f"visual.conv{i}.weight", conv_kernel)
    _batch_norm(reader, f"vision/bn{i}", f"visual.bn{i}")
  inplanes = config.width
  for stage, blocks in enumerate(config.layers, start=1):
    planes = config.width * 2 ** (stage - 1)
    for block in range(blocks):
      src, dst = f"visual.layer{stage}.{block}.", f"vision/layer{stage}_{block}/"
      for i in (1, 2, 3):
        reader.put(f"{dst}conv{i}/kernel", f"{src}conv{i}.weight", conv_kernel)
        _batch_norm(reader, f"{dst}bn{i}", f"{src}bn{i}")
      if block == 0 and (stage > 1 or inplanes != 4 * planes):
        reader.put(f"{dst}downsample_conv/kernel", f"{src}downsample.0.weight", conv_kernel)
        _batch_norm(reader, f"{dst}downsample_bn", f"{src}downsample.1")
      inplanes = 4 * planes
  reader.put("vision/attnpool/positional_embedding", "visual.attnpool.positional_embedding")
  for name in ("q_proj", "k_proj", "v_proj", "c_proj"):
    reader.put_linear(f"vision/attnpool/{name}", f"visual.attnpool.{name}")


# -- open_clip's vision_cfg --------------------------------------------------------------------

_OPEN_CLIP_KEYS = {"image_size", "layers", "width", "patch_size", "head_width"}


def _open_clip_config(vision: Mapping[str, Any], image_size: int, activation: str, name: str):
  """open_clip's ModifiedResNet vision_cfg (its layers are 4 counts) -> ResNetConfig."""
  del activation  # ReLU towers
  if not isinstance(vision.get("layers"), (list, tuple)):
    return None
  open_clip_config.check_keys(vision, _OPEN_CLIP_KEYS, "vision_cfg", name)
  width = vision.get("width", 64)
  return ResNetConfig(
    image_size=image_size,
    layers=tuple(vision["layers"]),
    width=width,
    heads=width * 32 // vision.get("head_width", 64),
  )


# -- The PyTorch reference (stori_jax/reference/clip_towers.py, the parity tool) ----------------


def _reference_vision_cfg(config) -> dict:
  v = config.vision
  return dict(
    image_size=v.image_size,
    layers=list(v.layers),
    width=v.width,
    head_width=v.feature_width // v.heads,
  )


def _reference_hidden(visual):
  """The stem output (layer1's input) and the four layers of a ModifiedResNet."""
  if not hasattr(visual, "layer1"):
    return None
  return visual.layer1, [visual.layer1, visual.layer2, visual.layer3, visual.layer4], "nchw"


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
    check=_check,
    shrink=_shrink,
    has_keys=True,  # the attention pool's
    hidden_labels=("stem", "stage"),
    hooks=dict(
      state_dict_config=_claimed_config,
      state_dict_params=state_dict_params,
      open_clip_config=_open_clip_config,
      reference_vision_cfg=_reference_vision_cfg,
      reference_hidden=_reference_hidden,
    ),
  )
)
