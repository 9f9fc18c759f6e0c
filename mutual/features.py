"""Patch features and image embeddings of a CLIP vision tower, on a patch grid."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from stori_jax.encoding import l2_normalize_jax

FEATURE_KINDS = ("tokens", "keys")


def _check_kind(bundle, kind: str) -> None:
  if kind not in FEATURE_KINDS:
    raise ValueError(f"kind must be one of {FEATURE_KINDS}, got {kind!r}.")
  if kind == "keys" and bundle.config.vision_kind == "convnext":
    raise ValueError(
      "ConvNeXt towers have no attention, so there are no keys: use kind='tokens' "
      "(config.analysis.feature_kind='tokens') for this model."
    )


def _grid_features(details, kind: str) -> jax.Array:
  """image_details' details -> float32 [B, h, w, D] (see patch_features)."""
  if kind == "tokens":
    return details["feature_map"].astype(jnp.float32)
  tokens = details["keys"][:, 1:]
  batch, count, width = tokens.shape
  side = math.isqrt(count)
  if side * side != count:
    raise ValueError(f"{count} patch keys do not form a square grid.")
  return tokens.reshape(batch, side, side, width).astype(jnp.float32)


def patch_features(bundle, images, kind: str = "tokens") -> jax.Array:
  """Per-patch features of the last vision stage, laid out on the spatial grid.

  Args:
    bundle: a stori_jax CLIPBundle (ViT, ModifiedResNet or ConvNeXt image tower).
    images: float32 [B, S, S, 3], normalised (bundle.preprocess output).
    kind: "tokens", the final spatial feature map (ViT: the residual stream after the last
      block, before ln_post; CNNs: the last stage's output before pooling); or "keys", the
      attention keys of the last block (ViT: ln_1 output times the key projection, heads
      concatenated; ResNet: the attention pool's keys). The class / mean token is dropped.

  Returns:
    float32 [B, h, w, D]: ViT h = w = S / patch_size, D the tower width; CNNs the final
    stage's grid and channels.
  """
  _check_kind(bundle, kind)
  _, details = bundle.image_details(images)
  return _grid_features(details, kind)


def embeddings_and_patches(bundle, images, kind: str = "tokens", normalize: bool = True):
  """`image_embeddings` and `patch_features` from one pass of the vision tower.

  Args:
    bundle, images, kind: as patch_features.
    normalize: L2-normalise the embeddings (as image_embeddings).

  Returns:
    (embeddings float32 [B, E], patch features float32 [B, h, w, D]). The patch features are
    patch_features' exactly; the embeddings are image_embeddings' (bitwise for ViT and ResNet
    towers; ConvNeXt's may differ in the last float32 bit, the two passes being compiled
    apart).
  """
  _check_kind(bundle, kind)
  embeddings, details = bundle.image_details(images)
  if normalize:
    embeddings = l2_normalize_jax(embeddings)
  return embeddings, _grid_features(details, kind)


def image_embeddings(bundle, images, normalize: bool = True) -> jax.Array:
  """Images float32 [B, S, S, 3] (normalised) -> embeddings float32 [B, E], L2-normalised
  unless normalize=False."""
  embeddings = bundle.encode_image(images)
  if normalize:
    embeddings = l2_normalize_jax(embeddings)
  return embeddings
