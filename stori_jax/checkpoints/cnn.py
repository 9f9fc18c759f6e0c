"""CNN image towers in OpenAI / open_clip state dicts.

ModifiedResNet: OpenAI's keys (`visual.layer1.0.conv1.weight`,
`visual.attnpool.k_proj.weight`, ...), shared by open_clip. ConvNeXt: open_clip's
TimmModel keys (`visual.trunk.stages.1.blocks.0.conv_dw.weight`, ...,
`visual.head.proj.weight`).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from stori_jax.checkpoints.errors import CheckpointError
from stori_jax.checkpoints.mapping import StateDictReader, block_count, conv_kernel, linear_kernel
from stori_jax.models import ConvNeXtConfig, ResNetConfig, tower_kinds

RESNET_MARKER = "visual.layer1.0.conv1.weight"
CONVNEXT_MARKER = "visual.trunk.stem.0.weight"


def ignored_keys(state_dict: Mapping[str, np.ndarray]) -> list[str]:
  """Batch-norm step counters: buffers with no role at inference."""
  return [k for k in state_dict if k.endswith(".num_batches_tracked")]


def resnet_config(state_dict: Mapping[str, np.ndarray], head_width: int = 64) -> ResNetConfig:
  """The ModifiedResNet shapes, read as OpenAI's build_model reads them.

  The input size is 32x the attention-pooling grid; heads are width * 32 // 64.
  """
  layers = tuple(block_count(state_dict, f"visual.layer{i}.") for i in range(1, 5))
  width = state_dict[RESNET_MARKER].shape[0]
  grid = round((state_dict["visual.attnpool.positional_embedding"].shape[0] - 1) ** 0.5)
  return ResNetConfig(
    image_size=32 * grid, layers=layers, width=width, heads=width * 32 // head_width
  )


def convnext_needs_arch(state_dict: Mapping[str, np.ndarray], source: str) -> CheckpointError:
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


def _batch_norm(reader: StateDictReader, target: str, key: str):
  reader.put(f"{target}/scale", f"{key}.weight")
  reader.put(f"{target}/bias", f"{key}.bias")
  reader.put(f"{target}/mean", f"{key}.running_mean")
  reader.put(f"{target}/var", f"{key}.running_var")


def put_resnet(reader: StateDictReader, config: ResNetConfig):
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


def _conv_with_bias(reader: StateDictReader, target: str, key: str):
  reader.put(f"{target}/kernel", f"{key}.weight", conv_kernel)
  reader.put(f"{target}/bias", f"{key}.bias")


def put_convnext(reader: StateDictReader, config: ConvNeXtConfig):
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


def _resnet_from_state_dict(state_dict, source, activation, head_width) -> ResNetConfig | None:
  del source, activation  # ReLU towers
  return resnet_config(state_dict, head_width) if RESNET_MARKER in state_dict else None


def _convnext_from_state_dict(state_dict, source, activation, head_width) -> None:
  del activation, head_width
  if CONVNEXT_MARKER in state_dict:
    raise convnext_needs_arch(state_dict, source)


tower_kinds.attach(
  "resnet", state_dict_config=_resnet_from_state_dict, state_dict_params=put_resnet
)
tower_kinds.attach(
  "convnext", state_dict_config=_convnext_from_state_dict, state_dict_params=put_convnext
)
