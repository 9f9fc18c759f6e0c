"""Toy plugins: one of each extension point, written as a researcher adding one would write it,
each in its own section of this one file. A test registers a toy from here, runs it through the
command that uses it, and unregisters it (tests/test_mutual_concept_methods.py,
tests/test_tower_kinds.py). Each section is self-contained: it imports the registry it extends
and nothing of the other sections."""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax.numpy as jnp

from mutual import concept_methods
from stori_jax.checkpoints.mapping import block_count, conv_kernel
from stori_jax.models import tower_kinds
from stori_jax.plumbing.config_files import ConfigError

# =============================================================================================
# A concept method: vertical or horizontal bands of the patch grid (mutual.concept_methods).
# Everything up to TOY_CONCEPTS is what a new concept method writes; registering it and naming it
# in config.analysis.methods is all the analysis needs.
# =============================================================================================

#: Its own config.analysis key (a method's settings are named after it).
TOY_BANDS_AXES = ("columns", "rows")


def _toy_bands_fit(features, mask, n_concepts: int, settings):
  """int32 [B, h, w]: each foreground patch's band of the grid (n_concepts equal bands of the
  columns, or of the rows), -1 on background. features float32 [B, h, w, D] (unused: the bands
  are the patches' places); mask bool [B, h, w]."""
  del features
  _, height, width = mask.shape
  if settings["toy_bands_axis"] == "columns":
    band = (jnp.arange(width) * n_concepts) // width
    grid = jnp.broadcast_to(band[None, :], (height, width))
  else:
    band = (jnp.arange(height) * n_concepts) // height
    grid = jnp.broadcast_to(band[:, None], (height, width))
  return jnp.where(mask, grid[None], -1).astype(jnp.int32)


def _toy_bands_check(settings) -> None:
  if settings["toy_bands_axis"] not in TOY_BANDS_AXES:
    raise ConfigError(
      f"config.analysis.toy_bands_axis must be one of {TOY_BANDS_AXES}, got "
      f"{settings['toy_bands_axis']!r}."
    )


TOY_CONCEPTS = concept_methods.ConceptMethod(
  name="toy_bands",
  title="Toy bands",
  fit=_toy_bands_fit,
  defaults=dict(toy_bands_axis="columns"),
  check=_toy_bands_check,
)


# =============================================================================================
# An image-tower kind: a patch mixer with its own config fields and its own OpenAI-style
# state-dict keys (stori_jax.models.tower_kinds). Everything up to TOY_TOWER is what a new kind
# writes.
# =============================================================================================


@dataclasses.dataclass(frozen=True)
class ToyConfig:
  """A patch embedding with positions, residual tanh mixers, a mean pool and a projection."""

  image_size: int = 32
  patch_size: int = 8
  width: int = 16
  mixer_layers: int = 2  # this kind's own field

  @property
  def grid_size(self) -> int:
    return self.image_size // self.patch_size


class ToyTower(nn.Module):
  config: ToyConfig
  embed_dim: int
  dtype: object = jnp.float32

  @nn.compact
  def __call__(self, images, return_hidden: bool = False):
    c, batch = self.config, images.shape[0]
    dense = lambda n, name, bias=True: nn.Dense(
      n, use_bias=bias, dtype=self.dtype, param_dtype=jnp.float32, name=name
    )
    stem = nn.Conv(c.width, (c.patch_size,) * 2, strides=c.patch_size, padding="VALID", name="stem")
    x = stem(images.astype(self.dtype))
    x = x + self.param("pos", nn.initializers.normal(0.1), (c.grid_size, c.grid_size, c.width))
    hidden = [x]
    for i in range(c.mixer_layers):
      x = x + dense(c.width, f"mix_{i}")(jnp.tanh(x))
      hidden.append(x)
    tokens = x.reshape(batch, c.grid_size**2, c.width)
    pooled = tokens.mean(axis=1)
    features = dense(self.embed_dim, "proj", bias=False)(pooled).astype(jnp.float32)
    # Keys of a one-query attention pool, the pooled token first (computed on every call, so
    # the parameter exists whatever path initialised the model).
    keys = dense(c.width, "key", bias=False)(jnp.concatenate([pooled[:, None], tokens], axis=1))
    if not return_hidden:
      return features
    return features, {
      "hidden_states": hidden,
      "feature_map": x,
      "patch_tokens": tokens,
      "keys": keys,
    }


def _toy_check(vision: ToyConfig) -> None:
  if vision.image_size % vision.patch_size:
    raise ValueError(f"image_size {vision.image_size} is not a multiple of {vision.patch_size}.")


def _toy_from_state_dict(state_dict, source, activation, head_width):
  """The toy's `visual.toy_*` keys define its shapes (None: another kind's state dict)."""
  del source, activation, head_width
  if "visual.toy_stem.weight" not in state_dict:
    return None
  width, _, patch, _ = state_dict["visual.toy_stem.weight"].shape
  grid = state_dict["visual.toy_pos"].shape[0]
  return ToyConfig(
    image_size=patch * grid,
    patch_size=patch,
    width=width,
    mixer_layers=block_count(state_dict, "visual.toy_mix."),
  )


def _toy_params(reader, vision: ToyConfig) -> None:
  reader.put("vision/stem/kernel", "visual.toy_stem.weight", conv_kernel)
  reader.put("vision/stem/bias", "visual.toy_stem.bias")
  reader.put("vision/pos", "visual.toy_pos")
  for i in range(vision.mixer_layers):
    reader.put_linear(f"vision/mix_{i}", f"visual.toy_mix.{i}")
  reader.put("vision/proj/kernel", "visual.toy_proj.weight", lambda w: w.T)
  reader.put("vision/key/kernel", "visual.toy_key.weight", lambda w: w.T)


TOY_TOWER = tower_kinds.TowerKind(
  name="toy",
  config=ToyConfig,
  module=lambda c, dtype: ToyTower(c.vision, c.embed_dim, dtype),
  recognises=lambda d: "mixer_layers" in d,
  family="Toy",
  describe=lambda v: f"Toy {v.mixer_layers}x{v.width} patch {v.patch_size}",
  activation_elements=lambda v: v.grid_size**2 * v.width,
  check=_toy_check,
  shrink=lambda v, factor: dataclasses.replace(v, width=max(4, v.width // factor)),
  has_keys=True,
  class_token_layers=False,
  hidden_labels=("stem", "mixer"),
  param_blocks=lambda v: (("vision.mixer_layers", v.mixer_layers, "vision/mix_"),),
  hooks={"state_dict_config": _toy_from_state_dict, "state_dict_params": _toy_params},
)
