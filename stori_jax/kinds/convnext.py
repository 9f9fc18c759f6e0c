"""The ConvNeXt image-tower kind (timm's ConvNeXt as open_clip's TimmModel wraps it): its
`TowerKind` entry, with its model side (its config and Flax module, from stori_jax.models) and its
checkpoint conversions: open_clip's TimmModel state-dict keys
(`visual.trunk.stages.1.blocks.0.conv_dw.weight`, ..., `visual.head.proj.weight`) and open_clip's
`vision_cfg` (`timm_model_name`); and its PyTorch reference's build (open_clip's TimmModel,
resized where the config is no timm variant; stori_jax/reference/clip_towers.py asks these
hooks)."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from stori_jax.checkpoints import open_clip_config
from stori_jax.checkpoints.errors import CheckpointError
from stori_jax.checkpoints.mapping import StateDictReader, block_count, conv_kernel, linear_kernel
from stori_jax.models import tower_kinds
from stori_jax.models.config import ConvNeXtConfig
from stori_jax.models.convnext import ConvNeXt

#: timm's ConvNeXt variants with its default LayerNorm eps (1e-6), from
#: timm/models/convnext.py: name -> (depths, dims).
TIMM_CONVNEXTS = {
  "convnext_tiny": ((3, 3, 9, 3), (96, 192, 384, 768)),
  "convnext_small": ((3, 3, 27, 3), (96, 192, 384, 768)),
  "convnext_base": ((3, 3, 27, 3), (128, 256, 512, 1024)),
  "convnext_large": ((3, 3, 27, 3), (192, 384, 768, 1536)),
}

# -- The model side ----------------------------------------------------------------------------


def _check(vision: ConvNeXtConfig) -> None:
  tower_kinds.check_stride_32(vision, "convnext")
  if len(vision.depths) != 4 or len(vision.dims) != 4:
    raise ValueError(
      f"ConvNeXtConfig needs 4 depths and 4 dims, got {vision.depths} and {vision.dims}."
    )


def _shrink(vision: ConvNeXtConfig, factor: int) -> ConvNeXtConfig:
  return dataclasses.replace(
    vision, dims=tuple(max(4, d // factor) for d in vision.dims), depths=(1, 1, 1, 1)
  )


# -- open_clip state dicts ---------------------------------------------------------------------

MARKER = "visual.trunk.stem.0.weight"


def needs_arch(state_dict: Mapping[str, np.ndarray], source: str) -> CheckpointError:
  """The error for a ConvNeXt state dict without an architecture name.

  A fully convolutional tower runs at any size, but the checkpoint was trained at
  one, which the preprocessing must match, and the weights do not record it.
  """
  depths = tuple(block_count(state_dict, f"visual.trunk.stages.{i}.blocks.") for i in range(4))
  return CheckpointError(
    f"{source} holds a ConvNeXt image tower (depths {depths}); its input size is not "
    "stored in the weights. Pass the architecture, e.g. arch='convnext_base' (224 px) or "
    "arch='convnext_base_w' (256 px), or load it by its registry name "
    "(python -m stori_jax.list_models lists them)."
  )


def _claimed_config(state_dict, source, activation, head_width) -> None:
  del activation, head_width
  if MARKER in state_dict:
    raise needs_arch(state_dict, source)


def _conv_with_bias(reader: StateDictReader, target: str, key: str):
  reader.put(f"{target}/kernel", f"{key}.weight", conv_kernel)
  reader.put(f"{target}/bias", f"{key}.bias")


def state_dict_params(reader: StateDictReader, config: ConvNeXtConfig):
  """visual.trunk.* and visual.head.proj (open_clip TimmModel) -> vision/* of models.ConvNeXt."""
  trunk = "visual.trunk."
  _conv_with_bias(reader, "vision/stem_conv", trunk + "stem.0")
  reader.put_layer_norm("vision/stem_norm", trunk + "stem.1")
  for stage, depth in enumerate(config.depths):
    src, dst = f"{trunk}stages.{stage}.", f"vision/stages_{stage}_"
    if stage > 0:
      reader.put_layer_norm(dst + "downsample_norm", src + "downsample.0")
      _conv_with_bias(reader, dst + "downsample_conv", src + "downsample.1")
    for block in range(depth):
      b_src, b_dst = f"{src}blocks.{block}.", f"{dst}blocks_{block}/"
      _conv_with_bias(reader, b_dst + "conv_dw", b_src + "conv_dw")
      reader.put_layer_norm(b_dst + "norm", b_src + "norm")
      reader.put_linear(b_dst + "fc1", b_src + "mlp.fc1")
      reader.put_linear(b_dst + "fc2", b_src + "mlp.fc2")
      reader.put(b_dst + "gamma", b_src + "gamma")
  reader.put_layer_norm("vision/head_norm", trunk + "head.norm")
  if config.proj_bias:
    reader.put_linear("vision/proj", "visual.head.proj")
  else:
    reader.put("vision/proj/kernel", "visual.head.proj.weight", linear_kernel)


# -- open_clip's vision_cfg --------------------------------------------------------------------

# timm_drop and timm_drop_path act only in training.
_OPEN_CLIP_KEYS = {
  "image_size",
  "timm_model_name",
  "timm_pool",
  "timm_proj",
  "timm_proj_bias",
  "timm_drop",
  "timm_drop_path",
}


def _open_clip_config(
  vision: Mapping[str, Any], image_size: int, activation: str, name: str
) -> ConvNeXtConfig | None:
  """open_clip's TimmModel settings -> ConvNeXtConfig; other timm towers are rejected."""
  del activation  # timm's ConvNeXt keeps its exact GELU
  if not vision.get("timm_model_name"):
    return None
  open_clip_config.check_keys(vision, _OPEN_CLIP_KEYS, "vision_cfg", name)
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


# -- The PyTorch reference (stori_jax/reference/clip_towers.py, the parity tool) ----------------


def _reference_vision_cfg(config) -> dict:
  v = config.vision
  return dict(
    timm_model_name=_timm_name(v),
    timm_pool="",
    timm_proj="linear",
    timm_proj_bias=v.proj_bias,
    timm_drop=0.0,
    image_size=v.image_size,
  )


def _timm_name(vision) -> str:
  """The timm ConvNeXt with these depths and dims, or convnext_base (resized later)."""
  for name, (depths, dims) in TIMM_CONVNEXTS.items():
    if (tuple(vision.depths), tuple(vision.dims)) == (depths, dims):
      return name
  return "convnext_base"


def _resize_trunk_(model, config):
  """Replaces open_clip's timm trunk by one with the config's depths and dims.

  open_clip builds timm towers by name only; small test towers need other
  shapes, so the trunk and projection are rebuilt as open_clip's TimmModel
  would build them (timm head kept: average pool + LayerNorm, no classifier).
  """
  import timm  # optional: the torch extra (open_clip's ConvNeXt towers)
  from torch import nn  # optional: the torch extra

  v = config.vision
  model.visual.trunk = timm.create_model(
    "convnext_base", depths=v.depths, dims=v.dims, kernel_sizes=v.kernel_size, num_classes=0
  )
  model.visual.head.proj = nn.Linear(v.dims[-1], config.embed_dim, bias=v.proj_bias)


def _reference_finish(model, config):
  v = config.vision
  if v.layer_norm_eps != 1e-6 or v.mlp_ratio != 4:
    raise ValueError("The timm ConvNeXt reference has LayerNorm eps 1e-6 and MLP ratio 4.")
  if ((tuple(v.depths), tuple(v.dims)) not in TIMM_CONVNEXTS.values()) or v.kernel_size != 7:
    _resize_trunk_(model, config)


def _reference_hidden(visual):
  """The stem and the four stages of timm's ConvNeXt."""
  if not hasattr(visual, "trunk"):
    return None
  return None, [visual.trunk.stem, *visual.trunk.stages], "nchw"


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
    check=_check,
    shrink=_shrink,
    has_keys=False,  # no attention
    hidden_labels=("stem", "stage"),
    hooks=dict(
      state_dict_config=_claimed_config,
      state_dict_params=state_dict_params,
      open_clip_config=_open_clip_config,
      reference_vision_cfg=_reference_vision_cfg,
      reference_finish=_reference_finish,
      reference_hidden=_reference_hidden,
    ),
  )
)
