"""Architecture configs of CLIP towers and the named presets.

A config holds only what fixes the parameter shapes and the forward pass; the
compute dtype is a run-time choice (see `stori_jax.load(..., dtype=)`).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, Mapping

from stori_jax.models import tower_kinds

ACTIVATIONS = ("quick_gelu", "gelu")


@dataclasses.dataclass(frozen=True)
class TextConfig:
  """Causal text transformer (OpenAI CLIP layout)."""

  vocab_size: int = 49408
  context_length: int = 77
  width: int = 512
  layers: int = 12
  heads: int = 8
  mlp_dim: int | None = None  # None: 4 * width.
  activation: str = "quick_gelu"
  eot_token_id: int = 49407  # Pooling reads the first position holding this id.
  # First block SToRI reweights when none is asked for (1-indexed). None: the paper's relative
  # depth, layers // 2 + 1. A checkpoint may store its own, measured with
  # `python -m stori_jax.start_block` (the shipped tiny CLIP does).
  default_start_block: int | None = None

  def __post_init__(self):
    if self.default_start_block is not None and not 1 <= self.default_start_block <= self.layers:
      raise ValueError(
        f"text.default_start_block {self.default_start_block} is outside the text tower's "
        f"blocks 1..{self.layers}."
      )

  @property
  def mlp_width(self) -> int:
    return self.mlp_dim or 4 * self.width


@dataclasses.dataclass(frozen=True)
class VisionConfig:
  """ViT image tower (OpenAI CLIP layout)."""

  image_size: int = 224
  patch_size: int = 32
  width: int = 768
  layers: int = 12
  heads: int = 12
  mlp_dim: int | None = None  # None: 4 * width.
  activation: str = "quick_gelu"

  @property
  def mlp_width(self) -> int:
    return self.mlp_dim or 4 * self.width

  @property
  def grid_size(self) -> int:
    return self.image_size // self.patch_size

  @property
  def num_tokens(self) -> int:
    """Class token plus patches."""
    return self.grid_size**2 + 1


@dataclasses.dataclass(frozen=True)
class ResNetConfig:
  """OpenAI's ModifiedResNet image tower: 3-conv stem, bottleneck stages with
  anti-aliased (avg-pool) strides, attention pooling over the final 1/32 map.

  Batch norm runs in inference mode; its running statistics are parameters.
  """

  image_size: int = 224
  layers: tuple[int, int, int, int] = (3, 4, 6, 3)  # Bottlenecks per stage.
  width: int = 64  # Stem width; stage i has 4 * width * 2**i output channels.
  heads: int = 32  # Attention-pooling heads; open_clip uses width * 32 // 64.

  @property
  def feature_width(self) -> int:
    """Channels of the final feature map (the attention-pooling width)."""
    return self.width * 32

  @property
  def patch_size(self) -> int:
    """Pixels per cell of the final feature map (its stride), like a ViT's patch."""
    return 32

  @property
  def grid_size(self) -> int:
    return self.image_size // self.patch_size


@dataclasses.dataclass(frozen=True)
class ConvNeXtConfig:
  """timm's ConvNeXt trunk as open_clip wraps it (avg pool, LayerNorm, linear projection).

  Patch stem (4x4 conv + LayerNorm), four stages of blocks (depthwise conv,
  LayerNorm, MLP with exact GELU, layer scale), a LayerNorm + 2x2 conv
  downsampling before stages 2-4; the head averages the final map, normalises it
  and projects it without bias (open_clip's timm_pool="", timm_proj="linear").
  """

  image_size: int = 224
  depths: tuple[int, int, int, int] = (3, 3, 27, 3)
  dims: tuple[int, int, int, int] = (128, 256, 512, 1024)
  kernel_size: int = 7
  mlp_ratio: int = 4
  layer_norm_eps: float = 1e-6  # timm's LayerNorm default, unlike CLIP's 1e-5.
  proj_bias: bool = False

  @property
  def feature_width(self) -> int:
    return self.dims[-1]

  @property
  def patch_size(self) -> int:
    """Pixels per cell of the final feature map (its stride), like a ViT's patch."""
    return 32

  @property
  def grid_size(self) -> int:
    return self.image_size // self.patch_size


def tower_kind(vision) -> str:
  """The name of a vision config's registered tower kind ('vit', 'resnet', 'convnext', ...)."""
  return tower_kinds.of(vision).name


@dataclasses.dataclass(frozen=True)
class CLIPConfig:
  """Both towers, the shared embedding size and LayerNorm epsilon.

  `vision` is the config of a registered image-tower kind (`tower_kinds`): a VisionConfig
  (ViT), ResNetConfig or ConvNeXtConfig built in; the layer_norm_eps here applies to the text
  tower and the ViT.
  """

  embed_dim: int = 512
  text: TextConfig = TextConfig()
  vision: Any = VisionConfig()  # the config dataclass of a registered tower kind
  layer_norm_eps: float = 1e-5
  name: str = ""  # Architecture name, informative only.

  def __post_init__(self):
    text = self.text
    if text.activation not in ACTIVATIONS:
      raise ValueError(f"Unknown activation {text.activation!r}; expected one of {ACTIVATIONS}.")
    if text.heads < 1 or text.width % text.heads:
      raise ValueError(
        f"{type(text).__name__}: width {text.width} is not divisible by heads {text.heads}."
      )
    tower_kinds.of(self.vision).check(self.vision)

  @property
  def vision_kind(self) -> str:
    """The name of the image tower's registered kind (`tower_kinds.get` gives the kind)."""
    return tower_kind(self.vision)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: Mapping[str, Any]) -> "CLIPConfig":
    d = dict(d)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - known
    if unknown:
      raise ValueError(f"Unknown CLIPConfig fields {sorted(unknown)}; known: {sorted(known)}.")
    d["text"] = TextConfig(**d.get("text", {}))
    d["vision"] = tower_kinds.vision_from_dict(d.get("vision", {}))
    return cls(**d)

  def replace(self, **changes) -> "CLIPConfig":
    return dataclasses.replace(self, **changes)

  def with_image_size(self, image_size: int) -> "CLIPConfig":
    """The same architecture at another input size (positional/pooling tables resize)."""
    return self.replace(vision=dataclasses.replace(self.vision, image_size=image_size))

  def with_activation(self, activation: str) -> "CLIPConfig":
    """Sets the transformer activation; CNN towers keep theirs (ReLU, or timm's exact GELU)."""
    vision = self.vision
    if tower_kinds.of(vision).shares_activation:
      vision = dataclasses.replace(vision, activation=activation)
    return dataclasses.replace(
      self, text=dataclasses.replace(self.text, activation=activation), vision=vision
    )


def _vit(
  name, embed_dim, image_size, patch, v_width, v_layers, v_heads, t_width, t_heads, t_layers=12
):
  return CLIPConfig(
    embed_dim=embed_dim,
    text=TextConfig(width=t_width, heads=t_heads, layers=t_layers, activation="gelu"),
    vision=VisionConfig(
      image_size=image_size,
      patch_size=patch,
      width=v_width,
      layers=v_layers,
      heads=v_heads,
      activation="gelu",
    ),
    name=name,
  )


def _text(width, heads):
  return TextConfig(width=width, heads=heads, layers=12, activation="gelu")


def _resnet(name, embed_dim, image_size, layers, width, t_width, t_heads):
  # Attention-pooling heads as open_clip and OpenAI compute them: width * 32 // 64.
  vision = ResNetConfig(image_size=image_size, layers=layers, width=width, heads=width * 32 // 64)
  return CLIPConfig(embed_dim=embed_dim, text=_text(t_width, t_heads), vision=vision, name=name)


def _convnext(name, embed_dim, image_size, t_width, t_heads):
  # Both use timm's convnext_base trunk; "_w" widens the text tower and embedding.
  vision = ConvNeXtConfig(image_size=image_size)
  return CLIPConfig(embed_dim=embed_dim, text=_text(t_width, t_heads), vision=vision, name=name)


# open_clip's architecture names. The plain names use exact GELU, as in
# open_clip; "-quickgelu" selects QuickGELU (OpenAI weights, MetaCLIP, DFN). Built on first use:
# a config checks its towers through the registered kinds, which register after this module.
@functools.cache
def _base_architectures() -> dict[str, CLIPConfig]:
  return {
    "ViT-B-32": _vit("ViT-B-32", 512, 224, 32, 768, 12, 12, 512, 8),
    "ViT-B-16": _vit("ViT-B-16", 512, 224, 16, 768, 12, 12, 512, 8),
    "ViT-L-14": _vit("ViT-L-14", 768, 224, 14, 1024, 24, 16, 768, 12),
    "ViT-L-14-336": _vit("ViT-L-14-336", 768, 336, 14, 1024, 24, 16, 768, 12),
    "ViT-H-14": _vit("ViT-H-14", 1024, 224, 14, 1280, 32, 16, 1024, 16, t_layers=24),
    # CNN towers (open_clip's model_configs/RN*.json, convnext_base*.json).
    "RN50": _resnet("RN50", 1024, 224, (3, 4, 6, 3), 64, 512, 8),
    "RN101": _resnet("RN101", 512, 224, (3, 4, 23, 3), 64, 512, 8),
    "RN50x4": _resnet("RN50x4", 640, 288, (4, 6, 10, 6), 80, 640, 10),
    "RN50x16": _resnet("RN50x16", 768, 384, (6, 8, 18, 8), 96, 768, 12),
    "convnext_base": _convnext("convnext_base", 512, 224, 512, 8),
    "convnext_base_w": _convnext("convnext_base_w", 640, 256, 640, 10),
    # Small configs for tests and the embedded default.
    "test-tiny": CLIPConfig(
      embed_dim=32,
      text=TextConfig(
        vocab_size=49408, context_length=77, width=32, layers=4, heads=4, activation="gelu"
      ),
      vision=VisionConfig(
        image_size=32, patch_size=8, width=48, layers=3, heads=4, activation="gelu"
      ),
      name="test-tiny",
    ),
  }


def architecture_names() -> list[str]:
  """Every name `get_architecture` accepts."""
  names = []
  for name in _base_architectures():
    names += [name, name + "-quickgelu"]
  return names


def get_architecture(name: str) -> CLIPConfig:
  """The config of an open_clip-style architecture name, e.g. 'ViT-B-32-quickgelu'.

  Also accepts OpenAI's spelling ('ViT-B/32', 'ViT-L/14@336px'), which means the
  QuickGELU variant, as OpenAI's weights need it.
  """
  openai = re.fullmatch(r"ViT-([BLH])/(\d+)(@(\d+)px)?", name)
  if openai:
    size, patch, _, res = openai.groups()
    base = f"ViT-{size}-{patch}" + (f"-{res}" if res else "")
    return get_architecture(base + "-quickgelu")
  base, quick = (name[: -len("-quickgelu")], True) if name.endswith("-quickgelu") else (name, False)
  if base not in _base_architectures():
    raise ValueError(
      f"Unknown architecture {name!r}. Known: {', '.join(architecture_names())}. "
      "For other shapes pass a CLIPConfig, or load a checkpoint whose shapes define it."
    )
  config = _base_architectures()[base]
  config = config.with_activation("quick_gelu") if quick else config
  return config.replace(name=name)
