"""Flax CLIP towers; pure modules that never import training or data code."""

from stori_jax.models import tower_kinds
from stori_jax.models.attention import attention_probs, reweighted_attention
from stori_jax.models.clip import CLIP, init_params, param_shapes, vision_tower
from stori_jax.models.config import (
  CLIPConfig,
  ConvNeXtConfig,
  ResNetConfig,
  TextConfig,
  VisionConfig,
  architecture_names,
  get_architecture,
)
from stori_jax.models.convnext import ConvNeXt
from stori_jax.models.modified_resnet import ModifiedResNet
from stori_jax.models.text import TextTransformer, default_start_block, reweighted_block_indices
from stori_jax.models.vision import VisionTransformer
