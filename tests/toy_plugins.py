"""Toy plugins: one small entry for each of the four extension points (a few-shot method, an
evaluation protocol, a concept method, an image-tower kind), written as a researcher adding one
would write it, each in its own section of this one file, using only the project's public
registries (docs/design.md, "Extend it", shows them as the examples).

The few-shot method and the protocol register when this module is imported and are named in a
config as `toy_plugins:<name>` (tests/test_toy_plugins.py runs them through `train` and
`evaluate`). The concept method and the tower kind are registered by their tests, which take
them out again (tests/test_mutual_concept_methods.py, tests/test_tower_kinds.py): the built-in
lists those tests check stay as shipped for every other test.
"""

from __future__ import annotations

import dataclasses
import os
import sys

import flax.linen as nn
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from mutual import concept_methods, protocols
from stori_jax.checkpoints.mapping import block_count, conv_kernel
from stori_jax.clip import encoding
from stori_jax.fewshot import methods
from stori_jax.fewshot.schedules import stori_schedule
from stori_jax.models import tower_kinds
from stori_jax.plumbing import jsonio, paths
from stori_jax.plumbing.config_files import ConfigError

# ---------------------------------------------------------------------------------------------
# A few-shot method (stori_jax.fewshot.methods): --config.method=toy_plugins:class_bias
# ---------------------------------------------------------------------------------------------

#: The file the toy method writes beside the shared ones.
CLASS_BIAS_FILE = "class_bias.json"


def _class_bias_build(config, bundle, classifier, total_steps, steps_per_epoch) -> methods.Method:
  """A bias vector per class added to the unit zero-shot class embeddings (all prompts at
  w = 1): normalize(z_c + b_c), b_c float32 [C, E] trained from 0 with Adam on SToRI's schedule
  (config.optim: lr, schedule)."""
  del bundle, steps_per_epoch
  zero_shot = jnp.asarray(classifier.embed(classifier.init_log_weights()))  # [C, E] unit

  def class_embeddings(bias, base):
    return encoding.l2_normalize_jax(base + bias, eps=None)

  schedule = stori_schedule(config, total_steps)
  return methods.Method(
    "class_bias",
    lambda: jnp.zeros_like(zero_shot),
    class_embeddings,
    zero_shot,
    optax.adam(schedule),
    schedule=schedule,
  )


def _class_bias_report(params, bundle, bank, workdir, is_main):
  """class_bias.json: the norm of every class's trained bias, {class name: float}."""
  del bundle
  norms = np.linalg.norm(np.asarray(params, np.float64), axis=1)
  if is_main:
    with paths.open(os.path.join(workdir, CLASS_BIAS_FILE), "w") as f:
      f.write(jsonio.dumps_strict(dict(zip(bank.class_names, map(float, norms)))))
  return None, None


CLASS_BIAS = methods.register(
  methods.FewShotMethod(
    name="class_bias",
    label="class bias (toy)",
    build=_class_bias_build,
    lr_key="optim.lr",
    warmup_block=lambda config: (
      "optim" if config.optim.get("schedule", "cosine") == "taskres" else None
    ),
    report=_class_bias_report,
  )
)


# ---------------------------------------------------------------------------------------------
# An evaluation protocol (mutual.protocols): config.evaluation.protocols =
# ("toy_plugins:zero_shot_topk",)
# ---------------------------------------------------------------------------------------------


def _zero_shot_topk_run(inputs: protocols.ProtocolInputs) -> dict:
  """Top-k accuracy (%) of the descriptor bank's class embeddings on the Table 1 pass's image
  embeddings (k: settings.k), and the number of images."""
  k = int(inputs.settings.k)
  hits = protocols.topk_hits(
    inputs.concepts.image_embeddings,
    inputs.concepts.labels,
    np.asarray(inputs.bank.class_embeddings),
    ks=(k,),
  )
  return dict(k=k, images=int(len(hits)), accuracy=float(100.0 * hits[:, 0].mean()))


def _zero_shot_topk_markdown(results) -> str:
  lines = ["| Model | Images | k | Top-k (%) |", "|---|---|---|---|"]
  for model, r in results.items():
    lines.append(f"| {model} | {r['images']} | {r['k']} | {r['accuracy']:.2f} |")
  return "\n".join(lines) + "\n"


ZERO_SHOT_TOPK = protocols.register(
  protocols.Protocol(
    name="zero_shot_topk",
    title="Toy: zero-shot top-k (%) of the descriptor classifier on the evaluated images",
    run=_zero_shot_topk_run,
    markdown=_zero_shot_topk_markdown,
    defaults=lambda: ml_collections.ConfigDict(dict(k=2)),
  )
)


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


def forget() -> None:
  """Takes the toys that this module registers on import out of their registries, and the module
  out of sys.modules, so that other tests see the built-in entries alone and a later
  `toy_plugins:<name>` imports (and registers) it afresh. tests/conftest.py calls it once the
  test files (two of which import this one for their toys) are collected."""
  methods.unregister(CLASS_BIAS.name)
  protocols.unregister(ZERO_SHOT_TOPK.name)
  sys.modules.pop(__name__, None)
