"""App. A.3 of the mutual-knowledge paper: zero-shot accuracy after blurring the non-prominent
regions of the nearest-neighbour importance map, then of its largest component, then after the
CRF (`blur_accuracy`)."""

from __future__ import annotations

import functools
from typing import Any, Iterable

import jax
import jax.numpy as jnp
import numpy as np
from mutual import crf, features, foreground, paper_config, visual_prompts
from mutual.protocols.progress import stage_bar
from mutual.protocols.zero_shot import percent, topk_hits
from stori_jax.data.preprocess import normalize


@functools.partial(jax.jit, static_argnames=("blur_size",))
def blur_outside(images: jax.Array, keep: jax.Array, blur_size: int = 11) -> jax.Array:
  """Blurs every pixel outside `keep`.

  Args:
    images: float32 [B, H, W, 3]; keep: bool [B, H, W] (the prominent pixels, left sharp).
    blur_size: side of the Gaussian kernel (sigma by OpenCV's rule, as visual_prompts.blur).

  Returns:
    float32 [B, H, W, 3].
  """
  blurred = jax.vmap(lambda im: visual_prompts.gaussian_blur(im, blur_size))(images)
  return jnp.where(keep[..., None], images, blurred)


def importance_masks(bundle, images: np.ndarray, analysis, settings) -> dict[str, np.ndarray]:
  """The three pixel masks of App. A.3 for one set of images (split jointly as the analysis).

  Returns:
    dict of bool [B, S, S]: "nn" the sign split of the Fiedler vector upsampled nearest;
    "fcc" its main connected region(s) upsampled nearest; "crf" that refined by the dense CRF
    (where the CRF empties an image, its "fcc" mask, as in pipeline.analyze_class).
  """
  x = normalize(images, bundle.preprocess_config.mean, bundle.preprocess_config.std)
  patch = features.patch_features(bundle, x, kind=analysis.feature_kind)
  raw = foreground.prominent_patches(
    patch,
    largest_only=False,
    center=bool(analysis.center_features),
    joint=bool(analysis.joint_foreground),
  )
  fcc = foreground.main_regions(
    raw, min_second=int(settings.min_second), keep_second=bool(settings.keep_second)
  )
  size = images.shape[1]
  nn_up = foreground.upsample_mask(raw, size)
  fcc_up = foreground.upsample_mask(fcc, size)
  c = settings.crf
  # The CRF follows config.analysis.mode where its confidence is left at None (the reference's
  # 0.99 and lattice filter on its uint8 image, or the improved 0.9 and exact filter).
  stages = paper_config.analysis_stages(analysis)
  confidence = c.get("confidence", None)
  confidence = stages["crf_confidence"] if confidence is None else float(confidence)
  lattice = stages["crf_filter"] == "lattice"
  refined = crf.refine(
    images,
    fcc_up,
    iterations=int(c.iterations),
    bilateral_weight=float(c.bilateral_weight),
    spatial_sigma=float(c.spatial_sigma),
    rgb_sigma=float(c.rgb_sigma),
    gaussian_weight=float(c.gaussian_weight),
    gaussian_sigma=float(c.gaussian_sigma),
    confidence=confidence,
    filter=stages["crf_filter"],
    round_trip=(bundle.preprocess_config.mean, bundle.preprocess_config.std) if lattice else None,
  )
  refined = jnp.where(jnp.any(refined, axis=(1, 2), keepdims=True), refined, fcc_up)
  return dict(nn=np.asarray(nn_up), fcc=np.asarray(fcc_up), crf=np.asarray(refined))


def _embed_pixels(bundle, pixels: jax.Array) -> np.ndarray:
  mean = jnp.asarray(bundle.preprocess_config.mean, jnp.float32)
  std = jnp.asarray(bundle.preprocess_config.std, jnp.float32)
  return np.asarray(features.image_embeddings(bundle, (pixels - mean) / std), np.float32)


def blur_accuracy(
  bundle,
  classes: Iterable,
  class_embeddings,
  analysis,
  settings=None,
  *,
  progress: bool = True,
) -> dict[str, Any]:
  """App. A.3: zero-shot accuracy with the non-prominent regions blurred.

  Per class (the B images of a class are split jointly, as the analysis does), the prominent
  patches are the positive side of the Fiedler vector; everything outside is blurred by an
  11 x 11 Gaussian and the images classified again with `class_embeddings`, for three masks:
  the sign split upsampled nearest ("NN Interp."), its largest connected region (plus the
  second when it has >= min_second patches, as the pipeline keeps; "+FCC"), and that refined by
  the CRF ("+CRF"). Blurring is done in float on [0, 1] pixels (the reference's OpenCV blur of
  uint8 rounds); the features are analysis.feature_kind.

  Args:
    bundle: a CLIPBundle.
    classes: iterable of mutual.data.ClassImages (consumed once).
    class_embeddings: float32 [C, E] unit class embeddings (bank.class_embeddings).
    analysis: config.analysis (feature_kind, joint_foreground, center_features; its mode sets
      the CRF's confidence, unless settings.crf.confidence is set, and its filter).
    settings: config.protocols.blur (blur_size, keep_second, min_second, crf.*); None: defaults.

  Returns:
    dict: base, nn, fcc, crf {top1, top5}; delta (crf top1 - nn top1); kept {nn, fcc, crf: mean
    fraction of pixels left sharp}; images. Accuracies in percent.
  """
  s = settings if settings is not None else paper_config.protocols_config().blur
  variants = ("base", "nn", "fcc", "crf")
  hits: dict[str, list] = {v: [] for v in variants}
  kept: dict[str, list] = {v: [] for v in variants[1:]}
  w = np.asarray(class_embeddings, np.float32)
  for cls in stage_bar(classes, "App. A.3: blur non-prominent regions (classes)", show=progress):
    images = np.asarray(cls.images)
    if images.dtype != np.uint8 or images.ndim != 4:
      raise ValueError(f"images must be uint8 [B, S, S, 3], got {images.dtype} {images.shape}")
    labels = np.full(len(images), cls.label, np.int32)
    masks = importance_masks(bundle, images, analysis, s)
    pixels = jnp.asarray(images, jnp.float32) / 255.0
    hits["base"].append(topk_hits(_embed_pixels(bundle, pixels), labels, w))
    for name, mask in masks.items():
      blurred = blur_outside(pixels, jnp.asarray(mask), int(s.blur_size))
      hits[name].append(topk_hits(_embed_pixels(bundle, blurred), labels, w))
      kept[name].append(mask.reshape(len(mask), -1).mean(axis=1))
  if not hits["base"]:
    raise ValueError("no image to evaluate: the class iterator was empty")
  out: dict[str, Any] = {}
  for v in variants:
    h = np.concatenate(hits[v])
    out[v] = dict(top1=percent(h[:, 0].mean()), top5=percent(h[:, 1].mean()))
  out["delta"] = round(out["crf"]["top1"] - out["nn"]["top1"], 4)
  out["kept"] = {v: round(float(np.concatenate(k).mean()), 4) for v, k in kept.items()}
  out["images"] = int(sum(len(h) for h in hits["base"]))
  return out
