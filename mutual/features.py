"""Patch features and image embeddings of a CLIP vision tower, on a patch grid."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from stori_jax.clip.encoding import l2_normalize_jax
from stori_jax.models import tower_kinds

FEATURE_KINDS = ("tokens", "keys")

#: On a CPU, the bytes of a tower pass's largest activation that still run near the matmul rate:
#: past the last-level cache, XLA:CPU's tower slows (ViT-B/16 at 224 px: 5.3 images/s in passes
#: of 6 images, 4.1 in one pass of 72; ModifiedResNet-50: 13.0 in passes of 3, 9.6 in one of 48).
CPU_PASS_BYTES = 16 * 2**20


def activation_bytes(vision, dtype=jnp.float32) -> int:
  """Bytes of one image's largest activation in a vision tower, as its kind counts it (ViT: the
  MLP's hidden layer or the attention scores; ModifiedResNet: the first stage's output, 4 x
  width channels at 1/4 of the input; ConvNeXt: the first stage's MLP, mlp_ratio x dims[0] at
  1/4)."""
  return tower_kinds.of(vision).activation_elements(vision) * jnp.dtype(dtype).itemsize


def images_per_pass(bundle, setting: int = 0, platform: str | None = None) -> int | None:
  """Images per vision-tower pass (config.analysis.tower_batch).

  Args:
    bundle: a CLIPBundle (its vision config and compute dtype size the activations).
    setting: > 0, that many images; 0, the device's rule: on a CPU as many as keep the largest
      activation within CPU_PASS_BYTES (at least 1), elsewhere the whole call (GPUs and TPUs
      run large batches fastest).
    platform: the device platform (default: JAX's default backend).

  Returns:
    int images, or None for the whole call.
  """
  if setting < 0:
    raise ValueError(f"tower_batch must be >= 0 (0: the device's rule), got {setting}.")
  if setting:
    return int(setting)
  if (platform or jax.default_backend()) != "cpu":
    return None
  dtype = getattr(bundle, "dtype", jnp.float32)
  return max(1, CPU_PASS_BYTES // activation_bytes(bundle.config.vision, dtype))


def has_keys(bundle) -> bool:
  """Whether the bundle's image tower has attention keys (not ConvNeXt: it has no attention)."""
  return tower_kinds.get(bundle.config.vision_kind).has_keys


def _check_kind(bundle, kind: str) -> None:
  if kind not in FEATURE_KINDS:
    raise ValueError(f"kind must be one of {FEATURE_KINDS}, got {kind!r}.")
  if kind == "keys" and not has_keys(bundle):
    family = tower_kinds.get(bundle.config.vision_kind).family
    raise ValueError(
      f"{family} towers have no attention, so there are no keys: use kind='tokens' "
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


def embeddings_and_patches(
  bundle, images, kind: str = "tokens", normalize: bool = True, per_pass: int | None = None
):
  """`image_embeddings` and `patch_features` from one pass of the vision tower.

  Args:
    bundle, images, kind: as patch_features.
    normalize: L2-normalise the embeddings (as image_embeddings).
    per_pass: images per tower call (`images_per_pass`); None: all B at once.

  Returns:
    (embeddings float32 [B, E], patch features float32 [B, h, w, D]). The patch features are
    patch_features' exactly; the embeddings are image_embeddings' (bitwise for ViT and ResNet
    towers; ConvNeXt's may differ in the last float32 bit, the two passes being compiled
    apart).
  """
  _check_kind(bundle, kind)
  step = max(1, len(images) if per_pass is None else int(per_pass))
  embeddings, grids = [], []
  for start in range(0, len(images), step):
    part, details = bundle.image_details(images[start : start + step])
    embeddings.append(part)
    grids.append(_grid_features(details, kind))
  embeddings = embeddings[0] if len(embeddings) == 1 else jnp.concatenate(embeddings)
  if normalize:
    embeddings = l2_normalize_jax(embeddings)
  return embeddings, grids[0] if len(grids) == 1 else jnp.concatenate(grids)


def image_embeddings(bundle, images, normalize: bool = True) -> jax.Array:
  """Images float32 [B, S, S, 3] (normalised) -> embeddings float32 [B, E], L2-normalised
  unless normalize=False."""
  embeddings = bundle.encode_image(images)
  if normalize:
    embeddings = l2_normalize_jax(embeddings)
  return embeddings


def facet_grids(
  bundle, images, kinds=FEATURE_KINDS, per_pass: int | None = None
) -> dict[str, jax.Array]:
  """`patch_features` of several kinds from one pass of the vision tower.

  Args:
    bundle, images: as patch_features.
    kinds: names of FEATURE_KINDS ("keys" needs an attention: not ConvNeXt).
    per_pass: images per tower call (`images_per_pass`); None: all B at once.

  Returns:
    {kind: float32 [B, h, w, D]}, each patch_features' exactly.
  """
  for kind in kinds:
    _check_kind(bundle, kind)
  step = max(1, len(images) if per_pass is None else int(per_pass))
  parts: dict[str, list] = {kind: [] for kind in kinds}
  for start in range(0, len(images), step):
    _, details = bundle.image_details(images[start : start + step])
    for kind in kinds:
      parts[kind].append(_grid_features(details, kind))
  return {k: v[0] if len(v) == 1 else jnp.concatenate(v) for k, v in parts.items()}


def class_token_layers(bundle, images, per_pass: int | None = None) -> tuple[jax.Array, jax.Array]:
  """The class token of every block of a ViT tower, as tokens and as keys.

  Args:
    bundle: a CLIPBundle with a ViT image tower (CNN towers have no class token).
    images: float32 [B, S, S, 3], normalised.
    per_pass: images per tower call (`images_per_pass`); None: all B at once.

  Returns:
    (tokens float32 [B, layers, W]: the class token of each block's output, the residual
     stream before ln_post; keys float32 [B, layers, W]: the class token's attention key in
     each block, ln_1's output times the key projection without its bias, as `patch_features`'
     keys). Block 1 first.

  Raises:
    ValueError: the tower has no class token in every block (CNN towers).
  """
  if not tower_kinds.get(bundle.config.vision_kind).class_token_layers:
    raise ValueError(
      f"Only ViT towers have a class token in every layer; this model's image tower is "
      f"{bundle.config.vision_kind!r}."
    )
  step = max(1, len(images) if per_pass is None else int(per_pass))
  tokens, keys = [], []
  for start in range(0, len(images), step):
    _, details = bundle.image_details(images[start : start + step])
    tokens.append(jnp.stack([h[:, 0] for h in details["hidden_states"][1:]], axis=1))
    keys.append(details["class_keys"])
  join = lambda parts: (parts[0] if len(parts) == 1 else jnp.concatenate(parts)).astype(jnp.float32)
  return join(tokens), join(keys)
