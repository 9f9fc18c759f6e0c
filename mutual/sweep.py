r"""The mutual-knowledge analysis over many CLIP models: the paper's Table 3 and Figure 3 (right).

  python -m mutual.sweep --config configs/mutual_sweep.py --workdir DIR \
      --config.data.root=/data/imagenet/val \
      --config.data.descriptors=data/descriptors/descriptors_imagenet.json
  python -m mutual.sweep --config configs/mutual_sweep.py:random --workdir DIR   # offline check

Every model of `config.models` (registry names, default the study's 13) runs the same analysis as
`mutual.pipeline.analyze_class`, a chunk of classes at a time, in four phases:

  1. per model    text bank (at its first load); image embeddings, zero-shot prediction, patch
                  features
  2. all models   foreground eigendecomposition, one batched SVD per patch grid (B, h, w) with the
                  feature dim D zero-padded to the group's largest; CRF, one call per image size;
                  PCA / K-means concepts per model (see `analyze_classes` for why)
  3. per model    concept embeddings from the visual prompts
  4. all models   language stages (descriptor scores, candidates, Sinkhorn OT, importance order,
                  MI curves) vmapped over a leading model axis, the embedding dim E zero-padded
                  to the largest

Zero padding changes nothing: a zero column adds nothing to a norm, a dot product or a distance
(cosine scores of unit vectors are unchanged), and the left singular vectors of [F, 0] are those
of F, so the padded stages compute each model's own result up to floating-point summation order;
tests/test_mutual_sweep.py finds the per-model pipeline's per-image records exactly.

Models are loaded through a pool (`config.max_loaded_models`; 0 holds all of them, the fastest on
an accelerator with room for the 13 models' ~11 GB of fp32 weights); a smaller pool reloads models
between the two per-model phases of each chunk of `config.classes_per_chunk` classes.

Missing weights stop the run before any image is read, with the registry's message (what to fetch
and where to put it), unless `config.skip_missing` is set: then the missing models are left out
with a warning and listed under "skipped" in results.json.

Writes to the workdir:
  results.json                  per model: Top-1, MI and AUC per method, images, the registry's
                                reported accuracies; the AUC-accuracy fits (slope, intercept,
                                Pearson r) per method, over all models and per family
  table.md                      Table 3 (family, model, data, Top-1, MI and AUC per method)
  fig3_auc_vs_accuracy.png      Figure 3 (right): Top-1 against AUC, least-squares lines, r
  fig3_curves_<method>.png      the models' MI curves (Figure 3 left / middle)
  per_image/<model>/<class>/<image>.json   with config.per_image
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
import zlib
from typing import Any, Callable, Mapping, MutableMapping, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from tqdm import tqdm

import stori_jax
from stori_jax import cli as stori_cli
from mutual import analyze, cli, crf, data, features, foreground, pipeline, report, visual_prompts
from stori_jax.bundle import CLIPBundle
from stori_jax.checkpoints import hub
from stori_jax.checkpoints.errors import CheckpointError
from stori_jax.config_files import ConfigError
from stori_jax.models import CLIPConfig, param_shapes, registry
from stori_jax.plotting import pyplot
from stori_jax.preprocess import PreprocessConfig, normalize

#: Table 3's model families, by tower kind, in the table's order.
FAMILIES = {"vit": "ViT", "resnet": "ResNet", "convnext": "ConvNeXt"}
#: Accuracies the AUC-accuracy fit can use.
ACCURACIES = ("measured", "paper", "open_clip")
#: Fewest models for a fit (two points always give |r| = 1).
MIN_FIT_MODELS = 3
#: `language_stages` arguments that are compile-time constants; the others are traced.
_STATIC_OPTIONS = ("top_k", "rule", "solver", "top", "u", "formula", "iterations", "max_iterations")


# ---------------------------------------------------------------------------------------------
# Config.


def sweep_config(base: ml_collections.ConfigDict, random_weights: bool = False):
  """A sweep config from an analysis config (configs/mutual_imagenet.py, mutual_synthetic.py):
  its data and analysis, plus the sweep's fields (see configs/mutual_sweep.py)."""
  config = ml_collections.ConfigDict()
  config.name = "mutual_sweep" + ("_random" if random_weights else "")
  config.models = tuple(registry.mutual_knowledge_models())
  config.skip_missing = False
  config.models_dir = ""  # hand-placed weights; default $STORI_JAX_MODELS or ~/.cache
  config.dtype = "float32"
  config.max_loaded_models = 0  # 0: hold every model
  config.classes_per_chunk = 8
  config.random_weights = random_weights
  config.random_models = ml_collections.ConfigDict(dict(image_size=64, shrink=1, seed=0))
  config.accuracy = "measured"  # the fit's accuracy: "measured", "paper" or "open_clip"
  config.per_image = False
  config.data = base.data
  config.analysis = base.analysis
  config.batch_size = base.batch_size
  return config


def _check_config(config) -> None:
  if not config.models:
    raise ConfigError(
      "config.models is empty: name registered models (python -m stori_jax.models)."
    )
  for name in config.models:
    try:
      registry.get(name)
    except ValueError as error:  # an unknown name: the message lists the registered ones
      raise ConfigError(str(error)) from None
  if config.accuracy not in ACCURACIES:
    raise ConfigError(f"config.accuracy must be one of {ACCURACIES}, got {config.accuracy!r}.")
  if config.classes_per_chunk < 1:
    raise ConfigError(f"config.classes_per_chunk must be >= 1, got {config.classes_per_chunk}.")


# ---------------------------------------------------------------------------------------------
# Models: registered weights, or random-weight instances of the registered architectures.


def family(config: CLIPConfig) -> str:
  """Table 3's family of a model: "ViT", "ResNet" or "ConvNeXt"."""
  return FAMILIES[config.vision_kind]


def small_image_size(config: CLIPConfig, target: int) -> int:
  """The input size nearest `target` that the tower takes: a multiple of its patch size (ViT)
  or of its stride 32 (CNNs), with at least a 2 x 2 grid."""
  patch = config.vision.patch_size
  return patch * max(2, int(round(target / patch)))


def shrink_config(config: CLIPConfig, factor: int) -> CLIPConfig:
  """The architecture with widths divided by `factor` and at most 2 blocks per stage / tower
  (factor 1: unchanged). Heads shrink by 4 (at least 1) so each keeps >= 16 channels at
  factor 16; the embedding dims stay distinct across architectures (they pad differently)."""
  if factor == 1:
    return config

  def heads(width, count):
    count = max(1, count // 4)
    while width % count:
      count -= 1
    return count

  text = config.text
  t_width = max(8, text.width // factor)
  text = dataclasses.replace(
    text, width=t_width, layers=min(text.layers, 2), heads=heads(t_width, text.heads)
  )
  vision = config.vision
  kind = config.vision_kind
  if kind == "vit":
    v_width = max(8, vision.width // factor)
    vision = dataclasses.replace(
      vision, width=v_width, layers=min(vision.layers, 2), heads=heads(v_width, vision.heads)
    )
  elif kind == "resnet":
    width = max(2, vision.width // factor)
    vision = dataclasses.replace(
      vision, width=width, layers=(1, 1, 1, 1), heads=heads(width * 32, width * 32 // 64)
    )
  else:
    vision = dataclasses.replace(
      vision, dims=tuple(max(4, d // factor) for d in vision.dims), depths=(1, 1, 1, 1)
    )
  embed = max(8, config.embed_dim // factor)
  return config.replace(embed_dim=embed, text=text, vision=vision)


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
    if key in ("scale", "var", "gamma"):
      return jnp.ones(dims, jnp.float32)
    if key in ("bias", "mean"):
      return jnp.zeros(dims, jnp.float32)
    if key in ("embedding", "positional_embedding", "class_embedding") or len(dims) < 2:
      std = 0.02
    else:
      std = 1.0 / np.sqrt(np.prod(dims[:-1]))
    # U(-a, a) has variance a^2 / 3.
    half = np.float32(2.0 * np.sqrt(3.0) * std)
    return jnp.asarray((rng.random(dims, dtype=np.float32) - np.float32(0.5)) * half)

  return jax.tree_util.tree_map_with_path(leaf, param_shapes(config))


def random_bundle(
  name: str, image_size: int = 64, shrink: int = 1, seed: int = 0, dtype=jnp.float32
) -> CLIPBundle:
  """A random-weight instance of a registered model's architecture at a small input size (0: the
  entry's own size), with the entry's mean / std. The seed mixes in the name, so models of one
  architecture differ."""
  entry = registry.get(name)
  config = shrink_config(entry.config, int(shrink))
  size = small_image_size(config, int(image_size)) if image_size else entry.image_size
  config = config.with_image_size(size)
  params = random_params(config, seed=(int(seed), zlib.crc32(entry.name.encode())))
  preprocess = PreprocessConfig(size, entry.mean, entry.std)
  return CLIPBundle(
    config=config, params=params, dtype=dtype, preprocess_config=preprocess, source=f"random:{name}"
  )


@dataclasses.dataclass(frozen=True)
class SweepModel:
  """One model of the sweep: its registry entry, how to (re)load it and, for registered
  weights, how to make sure they are here (local copy, HF cache or download) without building
  the model; it raises CheckpointError with what to fetch and where to put it."""

  entry: registry.ModelEntry
  load: Callable[[], CLIPBundle]
  fetch: Callable[[], Any] | None = None

  @property
  def name(self) -> str:
    return self.entry.name


class ModelPool:
  """Bundles by model index, at most `max_loaded` held at once (0: all); least recently used
  goes first. Passes alternate their direction (`order`), so consecutive passes over the
  models start with the ones still held."""

  def __init__(self, models: Sequence[SweepModel], max_loaded: int = 0):
    self.models = list(models)
    self.max_loaded = int(max_loaded) or len(self.models)
    self._held: dict[int, CLIPBundle] = {}
    self._forward = False
    self.loads = 0

  def get(self, index: int) -> CLIPBundle:
    if index in self._held:
      self._held[index] = self._held.pop(index)  # most recently used last
      return self._held[index]
    while len(self._held) >= self.max_loaded:
      self._held.pop(next(iter(self._held)))
    self.loads += 1
    self._held[index] = self.models[index].load()
    return self._held[index]

  def order(self, indices: Sequence[int] | None = None) -> list[int]:
    """`indices` (default all) forwards, then backwards on the next call, and so on."""
    indices = list(range(len(self.models)) if indices is None else indices)
    self._forward = not self._forward
    return indices if self._forward else indices[::-1]


def model_image_size(config, entry: registry.ModelEntry) -> int:
  """The input size of a sweep model: the entry's, or the random instance's small size."""
  if not config.random_weights:
    return int(entry.image_size)
  if not config.random_models.image_size:
    return int(entry.image_size)
  arch = shrink_config(entry.config, int(config.random_models.shrink))
  return small_image_size(arch, int(config.random_models.image_size))


def sweep_models(config) -> list[SweepModel]:
  """The models of config.models, as registered weights or (config.random_weights) random
  instances of their architectures."""
  dtype = jnp.dtype(config.dtype)
  out = []
  for name in config.models:
    entry = registry.get(name)
    if config.random_weights:
      r = config.random_models
      load = functools.partial(
        random_bundle, entry.name, int(r.image_size), int(r.shrink), int(r.seed), dtype
      )
      out.append(SweepModel(entry, load))
      continue
    models_dir = config.models_dir or None
    load = functools.partial(stori_jax.load, entry.name, dtype=dtype, models_dir=models_dir)
    fetch = functools.partial(
      hub.fetch_weights, entry.name, entry.hf_repo, entry.weights_files, models_dir
    )
    out.append(SweepModel(entry, load, fetch))
  return out


# ---------------------------------------------------------------------------------------------
# Stages batched across models.


def pad_stack(arrays: Sequence, width: int | None = None) -> jax.Array:
  """Arrays differing only in their last dim -> one array [M, ..., width], zero-padded."""
  width = width or max(int(a.shape[-1]) for a in arrays)
  padded = [
    jnp.pad(jnp.asarray(a), [(0, 0)] * (a.ndim - 1) + [(0, width - a.shape[-1])]) for a in arrays
  ]
  return jnp.stack(padded)


def _groups(keys: Sequence) -> dict[Any, list[int]]:
  out: dict[Any, list[int]] = {}
  for i, key in enumerate(keys):
    out.setdefault(key, []).append(i)
  return out


@functools.partial(jax.jit, static_argnames=("center", "joint"))
def _stacked_split(features: jax.Array, center: bool, joint: bool) -> jax.Array:
  def one(f):
    if joint:
      return foreground.fiedler_vector(f, center=center) > 0
    return jax.vmap(lambda g: foreground.fiedler_vector(g[None], center=center)[0])(f) > 0

  return jax.vmap(one)(features)


def batched_foreground(
  patch_features: Sequence, joint: bool = True, center: bool = False, min_second: int = 5
) -> list[jax.Array]:
  """`foreground.prominent_patches` for several models' features of the same images.

  Args:
    patch_features: per model float32 [B, h, w, D_m]; models sharing (B, h, w) are split in one
      batched eigendecomposition with D zero-padded to the group's largest.
    joint, center, min_second: as prominent_patches.

  Returns:
    per model bool [B, h, w].
  """
  out: list[Any] = [None] * len(patch_features)
  for shape, members in _groups([tuple(f.shape[:3]) for f in patch_features]).items():
    stacked = pad_stack([patch_features[i] for i in members])
    masks = _stacked_split(stacked, center=center, joint=joint)
    regions = foreground.main_regions(masks.reshape(-1, *shape[1:]), min_second=min_second)
    regions = regions.reshape(len(members), *shape)
    for j, i in enumerate(members):
      out[i] = regions[j]
  return out


def batched_refine(images_by_model: Sequence[np.ndarray], coarse: Sequence, use_crf: bool = True):
  """The pipeline's CRF step for several models: models with images of one size are refined in
  one call (the CRF treats images one at a time, so batching is exact). A foreground the CRF
  removes entirely keeps its unrefined mask, as in `pipeline.analyze_class`.

  Args:
    images_by_model: per model uint8 [B, S_m, S_m, 3]; coarse: per model bool [B, S_m, S_m].

  Returns:
    per model bool [B, S_m, S_m].
  """
  out: list[Any] = [None] * len(coarse)
  for _, members in _groups([np.asarray(im).shape for im in images_by_model]).items():
    masks = jnp.concatenate([jnp.asarray(coarse[i]) for i in members])
    if use_crf:
      refined = crf.refine(np.concatenate([images_by_model[i] for i in members]), masks)
    else:
      refined = masks
    refined = jnp.where(jnp.any(refined, axis=(1, 2), keepdims=True), refined, masks)
    for j, chunk in zip(members, jnp.split(refined, len(members))):
      out[j] = chunk
  return out


@functools.partial(jax.jit, static_argnames=_STATIC_OPTIONS)
def _stacked_language(concepts, valid, images, desc, classes, predicted, dynamic, **static):
  def one(c, v, i, d, k, p):
    return pipeline.language_stages(c, v, i, d, k, p, **dynamic, **static)

  return jax.vmap(one)(concepts, valid, images, desc, classes, predicted)


def batched_language_stages(
  concept_embeddings: Sequence,
  concept_valid: Sequence,
  image_embeddings: Sequence,
  descriptor_embeddings: Sequence,
  class_embeddings: Sequence,
  predicted: Sequence,
  **options,
) -> dict[str, jax.Array]:
  """`pipeline.language_stages` for M models at once.

  Every input is a per-model sequence (shapes as language_stages, the embedding dim E_m may
  differ; B, L, D and C must agree). Embeddings are zero-padded to the largest E: the scores are
  dot products, which zero entries leave unchanged, so each model gets its own result.

  Returns:
    language_stages' dict with a leading model axis [M, ...] on every array.
  """
  width = max(int(np.shape(e)[-1]) for e in descriptor_embeddings)
  static = {k: v for k, v in options.items() if k in _STATIC_OPTIONS}
  dynamic = {k: jnp.float32(v) for k, v in options.items() if k not in _STATIC_OPTIONS}
  return _stacked_language(
    pad_stack(concept_embeddings, width),
    jnp.stack([jnp.asarray(v, bool) for v in concept_valid]),
    pad_stack(image_embeddings, width),
    pad_stack(descriptor_embeddings, width),
    pad_stack(class_embeddings, width),
    jnp.stack([jnp.asarray(p) for p in predicted]),
    dynamic,
    **static,
  )


# ---------------------------------------------------------------------------------------------
# One chunk of classes through every model.


def _vision_outputs(bundle, images: np.ndarray, bank: pipeline.TextBank, feature_kind: str):
  """Phase 1 of one model on one class, as the start of pipeline.analyze_class."""
  x = normalize(images, bundle.preprocess_config.mean, bundle.preprocess_config.std)
  embeddings = features.image_embeddings(bundle, x)
  scores = embeddings @ jnp.asarray(bank.class_embeddings).T
  return dict(
    image_embeddings=np.asarray(embeddings),
    class_scores=np.asarray(scores),
    predicted=np.asarray(jnp.argmax(scores, axis=-1)),
    patch=np.asarray(features.patch_features(bundle, x, kind=feature_kind)),
  )


def analyze_classes(
  pool: ModelPool,
  indices: Sequence[int],
  banks: MutableMapping[int, pipeline.TextBank],
  class_images: Sequence[Sequence[data.ClassImages]],
  analysis,
  methods: Sequence[str] = pipeline.METHODS,
  progress: bool = False,
  encode: Callable[[CLIPBundle], pipeline.TextBank] | None = None,
) -> list[list[dict[str, Any]]]:
  """`pipeline.analyze_class` for several models on a chunk of classes.

  Args:
    pool: the models; indices: the M pool indices to run.
    banks: pool index -> the model's encoded text bank (the same descriptors and classes for
      all); a missing one is made with `encode(bundle)` at the model's first load and stored.
    class_images: per model, the chunk's classes (same labels and images, at the model's size).
    analysis: config.analysis; methods: concept methods.

  Returns:
    results[model][class]: analyze_class's dict of numpy arrays.
  """
  n_models, n_classes = len(indices), len(class_images[0])
  position = {index: m for m, index in enumerate(indices)}
  options = pipeline.stage_options(analysis)
  n = int(analysis.n_concepts)
  seed = int(analysis.kmeans_seed)

  def bar(iterable, desc):
    return tqdm(iterable, desc=desc, disable=not progress, dynamic_ncols=True, leave=False)

  vision: list[list[Any]] = [[None] * n_classes for _ in range(n_models)]
  for index in bar(pool.order(indices), "features (per model)"):
    m, bundle = position[index], pool.get(index)
    if index not in banks:
      if encode is None:
        raise ValueError(f"no text bank for model {index} and no `encode` to make one")
      banks[index] = encode(bundle)
    for c in range(n_classes):
      vision[m][c] = _vision_outputs(
        bundle, class_images[m][c].images, banks[index], analysis.feature_kind
      )

  shared = []  # per class: foreground, refined, per-method concept and pixel maps (per model)
  for c in bar(range(n_classes), "foreground and CRF (batched), concepts"):
    patch = [vision[m][c]["patch"] for m in range(n_models)]
    fg = batched_foreground(
      patch, joint=bool(analysis.joint_foreground), center=bool(analysis.center_features)
    )
    images = [class_images[m][c].images for m in range(n_models)]
    coarse = [foreground.upsample_mask(fg[m], images[m].shape[1]) for m in range(n_models)]
    refined = batched_refine(images, coarse, bool(analysis.crf))
    # PCA / K-means stay per model: PCA's min-max argmax has exact ties (a patch that is the
    # extreme of two axes scores 1 on both), which padding D could break by rounding.
    maps = {
      method: [pipeline.concept_maps(patch[m], fg[m], method, n, seed) for m in range(n_models)]
      for method in methods
    }
    pixels = {
      method: [pipeline.pixel_concepts(maps[method][m], refined[m]) for m in range(n_models)]
      for method in methods
    }
    shared.append(dict(fg=fg, refined=refined, maps=maps, pixels=pixels))
    for m in range(n_models):
      vision[m][c].pop("patch")  # no longer needed; bounds the chunk's memory

  embedded: list[list[Any]] = [[None] * n_classes for _ in range(n_models)]
  for index in bar(pool.order(indices), "concept embeddings (per model)"):
    m, bundle = position[index], pool.get(index)
    for c in range(n_classes):
      embedded[m][c] = {
        method: visual_prompts.concept_embeddings(
          bundle, class_images[m][c].images, shared[c]["pixels"][method][m], n_concepts=n
        )
        for method in methods
      }

  results: list[list[Any]] = [[None] * n_classes for _ in range(n_models)]
  for c in bar(range(n_classes), "language stages (batched)"):
    for m in range(n_models):
      v = vision[m][c]
      results[m][c] = dict(
        predicted=v["predicted"],
        class_scores=v["class_scores"],
        foreground=np.asarray(shared[c]["fg"][m]),
        refined=np.asarray(shared[c]["refined"][m]),
      )
    for method in methods:
      stages = batched_language_stages(
        [embedded[m][c][method][0] for m in range(n_models)],
        [embedded[m][c][method][1] for m in range(n_models)],
        [vision[m][c]["image_embeddings"] for m in range(n_models)],
        [banks[i].descriptor_embeddings for i in indices],
        [banks[i].class_embeddings for i in indices],
        [vision[m][c]["predicted"] for m in range(n_models)],
        **options,
      )
      stages = {k: np.asarray(v) for k, v in stages.items()}
      for m in range(n_models):
        results[m][c][method] = dict(
          concept_maps=np.asarray(shared[c]["maps"][method][m]),
          pixel_maps=np.asarray(shared[c]["pixels"][method][m]),
          concept_valid=np.asarray(embedded[m][c][method][1]),
          **{k: v[m] for k, v in stages.items()},
        )
  return results


# ---------------------------------------------------------------------------------------------
# Fits, tables and figures.


def fit_line(x: Sequence[float], y: Sequence[float]) -> dict[str, Any]:
  """Least-squares y = slope * x + intercept and Pearson r (scipy.stats.linregress).

  Returns a JSON-ready dict (n, slope, intercept, pearson_r, p_value); the numbers are None when
  there are fewer than MIN_FIT_MODELS points or x or y does not vary.
  """
  from scipy import stats  # pylint: disable=import-outside-toplevel

  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  out: dict[str, Any] = dict(n=len(x), slope=None, intercept=None, pearson_r=None, p_value=None)
  if len(x) < MIN_FIT_MODELS or np.ptp(x) == 0 or np.ptp(y) == 0:
    return out
  fit = stats.linregress(x, y)
  out.update(
    slope=float(fit.slope),
    intercept=float(fit.intercept),
    pearson_r=float(fit.rvalue),
    p_value=float(fit.pvalue),
  )
  return out


def accuracy_of(row: Mapping[str, Any], accuracy: str) -> float | None:
  """The Top-1 (%) a fit uses: measured, or the registry's paper / open_clip value."""
  if accuracy == "measured":
    return row["top1"]
  return row["reported_top1"][accuracy]


def auc_accuracy_fits(
  rows: Sequence[Mapping[str, Any]], methods: Sequence[str], accuracy: str = "measured"
) -> dict[str, dict[str, Any]]:
  """Figure 3 (right): Top-1 = slope * AUC + intercept per method, over all models ("all") and
  within each family (the paper fits ViTs and ResNets separately; its ViT line is 11.24 AUC +
  25.97). Models without the chosen accuracy are left out."""
  out: dict[str, dict[str, Any]] = {}
  for method in methods:
    out[method] = {}
    groups = {"all": list(rows)}
    for fam in FAMILIES.values():
      groups[fam] = [r for r in rows if r["family"] == fam]
    for group, members in groups.items():
      members = [r for r in members if accuracy_of(r, accuracy) is not None]
      fit = fit_line(
        [r[method]["auc"] for r in members], [accuracy_of(r, accuracy) for r in members]
      )
      fit["models"] = [r["name"] for r in members]
      if group == "all" or members:
        out[method][group] = fit
  return out


def _table_order(rows):
  rank = {f: i for i, f in enumerate(FAMILIES.values())}
  return sorted(rows, key=lambda r: (rank[r["family"]], r["top1"], r["name"]))


def markdown_table(rows: Sequence[Mapping[str, Any]], methods: Sequence[str]) -> str:
  """Table 3: family, model, training data, Top-1 (%), MI and AUC per method, and the Top-1
  the paper reports; rows by family, then measured Top-1 (the paper's order)."""
  names = {"pca": "PCA", "kmeans": "K-means"}
  head = ["Family", "Model", "Data", "Top-1 (%)"]
  head += [f"MI {names.get(m, m)}" for m in methods] + [f"AUC {names.get(m, m)}" for m in methods]
  head.append("Top-1 paper (%)")
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in _table_order(rows):
    paper = r["reported_top1"]["paper"]
    cells = [r["family"], r["label"], r["data"], f"{r['top1']:.2f}"]
    cells += [f"{r[m]['mi']:.3f}" for m in methods] + [f"{r[m]['auc']:.3f}" for m in methods]
    cells.append("-" if paper is None else f"{paper:.2f}")
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def plot_auc_vs_accuracy(
  path: str,
  rows: Sequence[Mapping[str, Any]],
  fits: Mapping[str, Mapping[str, Any]],
  methods: Sequence[str],
  accuracy: str = "measured",
  title: str = "",
) -> None:
  """Figure 3 (right): one panel per method, Top-1 against AUC, models coloured by family, the
  least-squares line over all models (solid) and per family (dashed), Pearson r in the legend."""
  plt = pyplot()
  colours = {"ViT": "tab:blue", "ResNet": "tab:green", "ConvNeXt": "tab:orange"}
  names = {"pca": "PCA", "kmeans": "K-means"}
  fig, axes = plt.subplots(1, len(methods), figsize=(5.2 * len(methods), 4.2), squeeze=False)
  for ax, method in zip(axes[0], methods):
    for fam, colour in colours.items():
      members = [r for r in rows if r["family"] == fam and accuracy_of(r, accuracy) is not None]
      if not members:
        continue
      x = [r[method]["auc"] for r in members]
      y = [accuracy_of(r, accuracy) for r in members]
      ax.scatter(x, y, color=colour, s=22, zorder=3)
      for r, xi, yi in zip(members, x, y):
        ax.annotate(r["label"], (xi, yi), fontsize=6, xytext=(3, 2), textcoords="offset points")
    aucs = {r["name"]: r[method]["auc"] for r in rows}
    for group, fit in fits[method].items():
      if fit["slope"] is None:
        continue
      colour = "black" if group == "all" else colours[group]
      xs = [aucs[name] for name in fit["models"]]  # the line spans its own models
      line = np.linspace(min(xs), max(xs), 2)
      ax.plot(
        line,
        fit["slope"] * line + fit["intercept"],
        color=colour,
        ls="-" if group == "all" else "--",
        lw=1.2,
        label=f"{group}: {fit['slope']:.2f} AUC + {fit['intercept']:.2f}, "
        f"r = {fit['pearson_r']:.2f} (n = {fit['n']})",
      )
    ax.set_xlabel(f"AUC ({names.get(method, method)})")
    ax.set_ylabel("zero-shot Top-1 (%)" + ("" if accuracy == "measured" else f", {accuracy}"))
    ax.set_title(f"{title} {names.get(method, method)}".strip(), fontsize=9)
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=6, loc="best")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


# ---------------------------------------------------------------------------------------------
# The run.

#: What report.aggregate reads of an image record (the rest is dropped to bound memory).
_KEEP = (
  "mi",
  "auc",
  "curve",
  "visual_descriptors",
  "mutual_descriptors",
  "entropy",
  "entropy_without_ot",
)


def _slim(record: Mapping[str, Any]) -> dict[str, Any]:
  methods = {m: {k: v for k, v in r.items() if k in _KEEP} for m, r in record["methods"].items()}
  return dict(class_name=record["class_name"], correct=record["correct"], methods=methods)


def _class_chunks(streams: Mapping[int, Any], sizes: Sequence[int], chunk: int):
  """Yields per-size tuples of ClassImages, `chunk` classes at a time; every size must see the
  same classes in the same order."""
  batch: list[tuple] = []
  for items in zip(*(streams[size] for size in sizes)):
    if len({(c.label, c.images.shape[0]) for c in items}) != 1:
      raise ConfigError("The image streams of the models' input sizes disagree; check config.data.")
    batch.append(items)
    if len(batch) == chunk:
      yield batch
      batch = []
  if batch:
    yield batch


def _encode_bank(bundle, config, class_names, per_class):
  a = config.analysis
  lists = [list(per_class[n]) for n in class_names]
  return pipeline.encode_bank(
    bundle,
    class_names,
    lists,
    analyze.bank_descriptors(config, per_class),
    mode=a.class_prompts,
    templates=tuple(a.templates),
    descriptor_template=a.descriptor_template,
    batch_size=config.batch_size,
    progress=False,
  )


def run(config, workdir: str, progress: bool = True, restart: bool = False) -> dict:
  """Runs the sweep; returns results.json's content (also written with table.md and figures).

  The data (descriptor file, classes matched by name, no empty class) and every model's weights
  are checked, and the workdir claimed for this config (`restart` moves another run aside),
  before any image is read.
  """
  _check_config(config)
  dataset = data.prepare(config)  # a data mistake stops before any model loads
  a = config.analysis
  methods = tuple(a.methods)
  models = sweep_models(config)
  sizes_by_model = [model_image_size(config, m.entry) for m in models]
  pool = ModelPool(models, config.max_loaded_models)

  # Phase 0: registered weights are fetched / found before any image is read, so a missing one
  # stops here (or is skipped). Text banks are encoded at each model's first load.
  skipped = {}
  for model in models:
    if model.fetch is None:
      continue
    try:
      model.fetch()
    except CheckpointError as error:
      if not config.skip_missing:
        raise
      logging.warning("Skipping %s: %s", model.name, error)
      skipped[model.name] = str(error)
  kept = [i for i, model in enumerate(models) if model.name not in skipped]
  if not kept:
    raise CheckpointError("No model of config.models could be loaded (see the warnings above).")
  # Run identity once the inputs are known good (a missing model is a mistake to fix first).
  cli.claim_workdir(config, workdir, restart, "mutual-knowledge sweep")
  sizes = sorted({sizes_by_model[i] for i in kept})
  # One class stream per input size (each resizes the source images itself).
  class_names, per_class = list(dataset.names), dataset.descriptors
  streams = {size: dataset.classes(size) for size in sizes}
  banks: dict[int, pipeline.TextBank] = {}
  encode = functools.partial(
    _encode_bank, config=config, class_names=class_names, per_class=per_class
  )

  records: list[list[dict]] = [[] for _ in kept]
  n_images, start = 0, time.perf_counter()
  chunks = _class_chunks(streams, sizes, int(config.classes_per_chunk))
  for chunk in tqdm(chunks, desc="class chunks", disable=not progress, dynamic_ncols=True):
    class_images = [[items[sizes.index(sizes_by_model[i])] for items in chunk] for i in kept]
    results = analyze_classes(pool, kept, banks, class_images, a, methods, progress, encode)
    for j, i in enumerate(kept):
      for c, cls in enumerate(class_images[j]):
        image_records = report.image_records(
          cls, results[j][c], banks[i].descriptors, class_names, methods
        )
        if config.per_image:
          for k, record in enumerate(image_records):
            report.write_json(
              os.path.join(
                workdir, "per_image", models[i].name, f"{cls.label:04d}", f"{k:05d}.json"
              ),
              record,
            )
        records[j] += [_slim(r) for r in image_records]
    n_images += sum(len(items[0].images) for items in chunk)
  seconds = time.perf_counter() - start
  if not n_images:
    raise ConfigError("No images were analysed: check config.data (classes, images_per_class).")

  rows = []
  for j, i in enumerate(kept):
    entry = models[i].entry
    summary = report.aggregate(records[j], methods)["dataset"]
    arch = entry.config
    if config.random_weights:
      arch = shrink_config(arch, int(config.random_models.shrink))
    rows.append(
      dict(
        name=entry.name,
        label=entry.label,
        family=family(arch),
        arch=entry.arch,
        data=entry.data,
        image_size=sizes_by_model[i],
        embed_dim=int(arch.embed_dim),
        images=summary["images"],
        top1=summary["top1"],
        reported_top1=dict(paper=entry.imagenet_paper, open_clip=entry.imagenet_open_clip),
        **{m: summary[m] for m in methods},
      )
    )
  fits = auc_accuracy_fits(rows, methods, config.accuracy)
  results = dict(
    models={r["name"]: r for r in rows},
    order=[r["name"] for r in _table_order(rows)],
    fits=fits,
    accuracy=config.accuracy,
    weights="random" if config.random_weights else "registered",
    skipped=skipped,
    images_per_model=n_images,
    **({"skipped_classes": dataset.skipped} if dataset.skipped else {}),
    config=config.to_dict(),
  )
  report.write_json(os.path.join(workdir, "results.json"), results)
  table = markdown_table(rows, methods)
  if config.random_weights:
    size = config.random_models.image_size
    where = f"at about {size} px" if size else "at each model's own input size"
    table += (
      f"\nRandom-weight instances {where} (an offline check of the path: the numbers carry no "
      "meaning).\n"
    )
  with open(os.path.join(workdir, "table.md"), "w", encoding="utf-8") as f:
    f.write(table)
  plot_auc_vs_accuracy(
    os.path.join(workdir, "fig3_auc_vs_accuracy.png"), rows, fits, methods, config.accuracy
  )
  for method in methods:
    report.plot_curves(
      os.path.join(workdir, f"fig3_curves_{method}.png"),
      {r["label"]: r[method]["curve"] for r in _table_order(rows)},
      title=f"{config.name}: MI curves ({method})",
    )
  # Timing and load counts vary run to run: returned and logged, kept out of results.json.
  results.update(seconds=round(seconds, 3), model_loads=pool.loads)
  logging.info(
    "%d models x %d images in %.1f s (%d model loads)", len(rows), n_images, seconds, pool.loads
  )
  return results


def main(argv):
  config, workdir, results = cli.run_from_flags(
    argv, run, "python -m mutual.sweep --config configs/mutual_sweep.py:random --workdir DIR"
  )
  rows = [results["models"][n] for n in results["order"]]
  print(markdown_table(rows, tuple(config.analysis.methods)))
  for method, groups in results["fits"].items():
    for group, fit in groups.items():
      if fit["slope"] is not None:
        print(
          f"{method} {group}: Top-1 = {fit['slope']:.2f} AUC + {fit['intercept']:.2f}, "
          f"r = {fit['pearson_r']:.3f} (n = {fit['n']})"
        )
  print(f"Wrote {os.path.join(workdir, 'results.json')}")


if __name__ == "__main__":
  cli.define_flags("Sweep")
  stori_cli.run(main)
