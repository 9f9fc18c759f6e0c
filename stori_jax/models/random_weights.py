"""Random-weight instances of the registered architectures, for offline runs over many models
(the mutual-knowledge sweep, SToRI's retrieval across models): the architecture at a small input
size (`small_image_size`), optionally with shrunk widths (`shrink_config`), and its parameters
drawn with numpy (`random_params`). The bundle of such an instance is
`stori_jax.clip.loading.random_instance`."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from stori_jax.models import tower_kinds
from stori_jax.models.clip import param_shapes
from stori_jax.models.config import CLIPConfig


def small_image_size(config: CLIPConfig, target: int) -> int:
  """The input size nearest `target` that the tower takes: a multiple of its patch size (ViT)
  or of its stride 32 (CNNs), with at least a 2 x 2 grid."""
  patch = config.vision.patch_size
  return patch * max(2, int(round(target / patch)))


def shrink_config(config: CLIPConfig, factor: int) -> CLIPConfig:
  """The architecture with widths divided by `factor` and at most 2 blocks per stage / tower
  (factor 1: unchanged), the image tower as its kind shrinks it. Heads shrink by 4 (at least 1)
  so each keeps >= 16 channels at factor 16; the embedding dims stay distinct across
  architectures (they pad differently)."""
  if factor == 1:
    return config
  kind = tower_kinds.of(config.vision)
  if kind.shrink is None:
    raise ValueError(
      f"The {kind.name!r} image tower kind registers no `shrink`: it has no smaller random "
      "instances; use factor 1."
    )
  text = config.text
  t_width = max(8, text.width // factor)
  text = dataclasses.replace(
    text,
    width=t_width,
    layers=min(text.layers, 2),
    heads=tower_kinds.shrunk_heads(t_width, text.heads),
  )
  embed = max(8, config.embed_dim // factor)
  return config.replace(embed_dim=embed, text=text, vision=kind.shrink(config.vision, factor))


def random_params(config: CLIPConfig, seed) -> Any:
  """Random fp32 parameters for `config`, drawn with numpy (no model.init: its compile takes
  20-40 s per full-size architecture on a CPU).

  Kernels and projections uniform with variance 1 / fan_in (fan_in: all but the last axis),
  embeddings with standard deviation 0.02; LayerNorm / BatchNorm scales and variances 1, biases
  and running means 0, ConvNeXt layer scales 1, logit_scale log(1 / 0.07) (uniform draws are
  faster than normal ones). Same config and seed (an int or a tuple of ints), same parameters.
  """
  rng = np.random.default_rng(seed)

  def leaf(path, shape):
    key = getattr(path[-1], "key", str(path[-1]))
    dims = tuple(shape.shape)
    if key == "logit_scale":
      return jnp.asarray(np.log(1 / 0.07), jnp.float32)
    # Made with numpy and put on the device: jnp.ones / jnp.zeros compile a program per shape,
    # and jnp.asarray copies slower than device_put.
    if key in ("scale", "var", "gamma"):
      return jax.device_put(np.ones(dims, np.float32))
    if key in ("bias", "mean"):
      return jax.device_put(np.zeros(dims, np.float32))
    if key in ("embedding", "positional_embedding", "class_embedding") or len(dims) < 2:
      std = 0.02
    else:
      std = 1.0 / np.sqrt(np.prod(dims[:-1]))
    # U(-a, a) has variance a^2 / 3. In place: the same float32 operations without two fresh
    # arrays per leaf (half the time of a full-size model's ~150-430M draws).
    half = np.float32(2.0 * np.sqrt(3.0) * std)
    values = rng.random(dims, dtype=np.float32)
    values -= np.float32(0.5)
    values *= half
    return jax.device_put(values)

  return jax.tree_util.tree_map_with_path(leaf, param_shapes(config))
