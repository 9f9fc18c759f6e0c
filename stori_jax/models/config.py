"""Architecture configs of CLIP towers and the named presets.

A config holds only what fixes the parameter shapes and the forward pass; the
compute dtype is a run-time choice (see `stori_jax.load(..., dtype=)`).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping

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
class CLIPConfig:
  """Both towers, the shared embedding size and LayerNorm epsilon."""

  embed_dim: int = 512
  text: TextConfig = TextConfig()
  vision: VisionConfig = VisionConfig()
  layer_norm_eps: float = 1e-5
  name: str = ""  # Architecture name, informative only.

  def __post_init__(self):
    for tower in (self.text, self.vision):
      if tower.activation not in ACTIVATIONS:
        raise ValueError(f"Unknown activation {tower.activation!r}; expected one of {ACTIVATIONS}.")
      if tower.heads < 1 or tower.width % tower.heads:
        raise ValueError(
          f"{type(tower).__name__}: width {tower.width} is not divisible by heads {tower.heads}."
        )
    if self.vision.image_size % self.vision.patch_size:
      raise ValueError(
        f"image_size {self.vision.image_size} is not a multiple of patch_size "
        f"{self.vision.patch_size}."
      )

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
    d["vision"] = VisionConfig(**d.get("vision", {}))
    return cls(**d)

  def replace(self, **changes) -> "CLIPConfig":
    return dataclasses.replace(self, **changes)

  def with_activation(self, activation: str) -> "CLIPConfig":
    return dataclasses.replace(
      self,
      text=dataclasses.replace(self.text, activation=activation),
      vision=dataclasses.replace(self.vision, activation=activation),
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


# open_clip's architecture names. The plain names use exact GELU, as in
# open_clip; "-quickgelu" selects QuickGELU (OpenAI weights, MetaCLIP, DFN).
_BASE_ARCHITECTURES = {
  "ViT-B-32": _vit("ViT-B-32", 512, 224, 32, 768, 12, 12, 512, 8),
  "ViT-B-16": _vit("ViT-B-16", 512, 224, 16, 768, 12, 12, 512, 8),
  "ViT-L-14": _vit("ViT-L-14", 768, 224, 14, 1024, 24, 16, 768, 12),
  "ViT-L-14-336": _vit("ViT-L-14-336", 768, 336, 14, 1024, 24, 16, 768, 12),
  "ViT-H-14": _vit("ViT-H-14", 1024, 224, 14, 1280, 32, 16, 1024, 16, t_layers=24),
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
  for name in _BASE_ARCHITECTURES:
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
  if base not in _BASE_ARCHITECTURES:
    raise ValueError(
      f"Unknown architecture {name!r}. Known: {', '.join(architecture_names())}. "
      "For other shapes pass a CLIPConfig, or load a checkpoint whose shapes define it."
    )
  config = _BASE_ARCHITECTURES[base]
  config = config.with_activation("quick_gelu") if quick else config
  return config.replace(name=name)
