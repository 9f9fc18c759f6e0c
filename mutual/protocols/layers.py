"""App. A.1 of the mutual-knowledge paper, its Fig. 1: the cosine similarity of the [CLS] token
across all layers of a ViT tower, for the token features (a) and the key features (b)
(`layer_similarity`, drawn by `plot_layer_similarity`).

The paper's reading on ViT-B/16: the last layer's token is dissimilar to every earlier layer's
(the tokens adapt to the language space), while the keys stay similar across layers.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from mutual import features, paper_config, pipeline
from mutual.protocols.progress import stage_bar
from stori_jax.plumbing.config_files import ConfigError
from stori_jax.plumbing.plotting import pyplot, save_figure
from stori_jax.data.preprocess import normalize
from stori_jax.models import tower_kinds

#: The two panels of the figure: the features compared, and their titles.
FEATURES = ("tokens", "keys")
TITLES = {"tokens": "(a) token features", "keys": "(b) key features"}
#: Up to this many layers, each cell of the heat maps is labelled with its value.
ANNOTATED_LAYERS = 12


def check_model(bundle) -> None:
  """Raises ConfigError where the tower has no class token in every layer (CNN towers)."""
  kind = bundle.config.vision_kind
  if not tower_kinds.get(kind).class_token_layers:
    raise ConfigError(
      f"The layer similarity (App. A.1, Fig. 1) compares the [CLS] token across the layers of "
      f"a ViT; this model's image tower is {kind!r}, which has none. Evaluate a ViT model, or "
      "leave 'layer_similarity' out of config.evaluation.protocols."
    )


def cosine_matrices(vectors) -> np.ndarray:
  """Per image, the cosine similarity of its vectors across layers.

  Args:
    vectors: float [B, L, W], one vector per layer.

  Returns:
    float64 [B, L, L], symmetric, ones on the diagonal (up to rounding).
  """
  x = np.asarray(vectors, np.float64)
  x = x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), np.finfo(np.float64).tiny)
  return np.einsum("blw,bmw->blm", x, x)


def summary(matrix) -> dict[str, float]:
  """The two numbers behind the paper's reading of a layer-similarity matrix [L, L]:
  last_vs_earlier, the last layer's mean similarity to the earlier layers; among_earlier, the
  mean similarity of two different earlier layers (None with fewer than 3 layers)."""
  m = np.asarray(matrix, np.float64)
  n = len(m)
  earlier = m[: n - 1, : n - 1]
  pairs = earlier[~np.eye(n - 1, dtype=bool)]
  return dict(
    last_vs_earlier=round(float(m[-1, :-1].mean()), 4) if n > 1 else None,
    among_earlier=round(float(pairs.mean()), 4) if pairs.size else None,
  )


def layer_similarity(
  bundle, classes: Iterable, analysis, *, progress: bool = True
) -> dict[str, Any]:
  """App. A.1's Fig. 1: the [CLS] token's cosine similarity between every pair of layers.

  Layer l's token is the class token of block l's output (the residual stream; block 1
  first); its key is the class token's attention key in block l (ln_1's output times the key
  projection, without its bias, as the keys of the analysis). Each image gives an L x L
  matrix; the figure is their mean over the images (the paper does not say how its images
  are pooled).

  Args:
    bundle: a CLIPBundle with a ViT image tower (`check_model`).
    classes: iterable of mutual.data.ClassImages (consumed once).
    analysis: config.analysis (compute_dtype, tower_batch).

  Returns:
    dict: tokens, keys (float [L][L] lists, the mean matrices); summary {tokens, keys:
    `summary`}; layers (L); images.
  """
  check_model(bundle)
  tower = pipeline.tower_bundle(bundle, analysis)
  per_pass = features.images_per_pass(
    tower, int(paper_config.analysis_value(analysis, "tower_batch"))
  )
  sums = {name: 0.0 for name in FEATURES}
  count = 0
  for cls in stage_bar(
    classes, "App. A.1: [CLS] similarity across layers (classes)", show=progress
  ):
    images = np.asarray(cls.images)
    if images.dtype != np.uint8 or images.ndim != 4:
      raise ValueError(f"images must be uint8 [B, S, S, 3], got {images.dtype} {images.shape}")
    x = normalize(images, tower.preprocess_config.mean, tower.preprocess_config.std)
    tokens, keys = features.class_token_layers(tower, x, per_pass=per_pass)
    for name, vectors in zip(FEATURES, (tokens, keys)):
      sums[name] = sums[name] + cosine_matrices(vectors).sum(axis=0)
    count += len(images)
  if not count:
    raise ValueError("no image to evaluate: the class iterator was empty")
  means = {name: sums[name] / count for name in FEATURES}
  out: dict[str, Any] = {name: np.round(means[name], 6).tolist() for name in FEATURES}
  out["summary"] = {name: summary(means[name]) for name in FEATURES}
  out["layers"] = int(len(means["tokens"]))
  out["images"] = count
  return out


def plot_layer_similarity(path: str, result, title: str = "") -> None:
  """Fig. 1 of App. A.1: one heat map per feature (`layer_similarity`'s result), layers on
  both axes (block 1 first), a shared colour scale and colour bar of the cosine similarity."""
  plt = pyplot()
  matrices = {name: np.asarray(result[name], np.float64) for name in FEATURES}
  low = min(float(m.min()) for m in matrices.values())
  layers = len(matrices["tokens"])
  ticks = np.arange(layers)
  step = max(1, layers // 12)
  fig, axes = plt.subplots(1, 2, figsize=(11, 4.8))
  for ax, name in zip(axes, FEATURES):
    image = ax.imshow(matrices[name], vmin=min(low, 0.0), vmax=1.0, cmap="viridis")
    if layers <= ANNOTATED_LAYERS:  # the values themselves, where the cells are large enough
      for (row, col), value in np.ndenumerate(matrices[name]):
        shade = "black" if value > 0.6 else "white"
        ax.text(col, row, f"{value:.2f}", ha="center", va="center", fontsize=7, color=shade)
    ax.set_title(f"{TITLES[name]}: [CLS] cosine similarity", fontsize=10)
    ax.set_xlabel("layer (block)")
    ax.set_ylabel("layer (block)")
    ax.set_xticks(ticks[::step], [str(t + 1) for t in ticks[::step]])
    ax.set_yticks(ticks[::step], [str(t + 1) for t in ticks[::step]])
    bar = fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    bar.set_label("cosine similarity (mean over images)")
  fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  save_figure(fig, path, dpi=120)
  plt.close(fig)
