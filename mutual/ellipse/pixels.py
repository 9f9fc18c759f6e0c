"""The prompted images' pixels as OpenCV makes them, in uint8.

RGB2GRAY is (9798 R + 19235 G + 3735 B + 2^14) >> 15; the 8-bit GaussianBlur is OpenCV's
bit-exact fixed-point filter (8 fractional bits per tap, mirrored borders); both are exact.
The reference's image reaches uint8 through CLIP's normalisation and back, with truncation
(`reference_uint8`). `compose_prompts` puts the three prompted images together.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np


RED = (255, 0, 0)
# cv2.cvtColor(RGB2GRAY) on uint8: 15-bit fixed-point BT.601 weights summing to 2^15.
GRAY_WEIGHTS = (9798, 19235, 3735)


def gray_u8(image: jax.Array) -> jax.Array:
  """cv2.cvtColor(image, RGB2GRAY) of uint8 [..., 3] -> uint8 [...]."""
  rgb = image.astype(jnp.int32)
  r, g, b = GRAY_WEIGHTS
  return ((rgb[..., 0] * r + rgb[..., 1] * g + rgb[..., 2] * b + (1 << 14)) >> 15).astype(jnp.uint8)


def blur_taps(size: int = 11) -> np.ndarray:
  """OpenCV's 8-bit Gaussian taps for `size` with sigma 0: int [size] summing to 256 (the
  float kernel with sigma 0.15 size + 0.35, rounded to 8 fractional bits with error diffusion;
  sizes up to 9 use OpenCV's fixed binomial tables)."""
  if size < 1 or size % 2 == 0:
    raise ValueError(f"The blur kernel size must be odd and positive, got {size}.")
  fixed = {
    1: [256],
    3: [64, 128, 64],
    5: [16, 64, 96, 64, 16],
    7: [8, 28, 56, 72, 56, 28, 8],
    9: [4, 13, 30, 51, 60, 51, 30, 13, 4],
  }
  if size in fixed:
    return np.asarray(fixed[size], np.int64)
  sigma = 0.15 * size + 0.35
  half = size // 2
  values = [math.exp((x * x) * (-0.125 / (sigma * sigma))) for x in range(1 - size, 0, 2)]
  total = 2 * sum(values) + 1
  taps, carry = [], 0.0
  for value in values:
    scaled = value / total * 256 + carry
    tap = int(np.rint(scaled))
    carry = scaled - tap
    taps.append(tap)
  center = 256 - 2 * sum(taps)
  assert len(taps) == half
  return np.asarray(taps + [center] + taps[::-1], np.int64)


def gaussian_blur_u8(image: jax.Array, size: int = 11) -> jax.Array:
  """cv2.GaussianBlur(image, (size, size), 0) of uint8 [H, W, C] -> uint8 [H, W, C]: the exact
  fixed-point result (taps with 8 fractional bits, mirrored borders, rounded once)."""
  taps = blur_taps(size)
  half = size // 2
  height, width = image.shape[:2]
  padded = jnp.pad(image.astype(jnp.int32), ((half, half), (half, half), (0, 0)), mode="reflect")
  rows = sum(int(taps[i]) * padded[:, i : i + width] for i in range(size))
  total = sum(int(taps[i]) * rows[i : i + height] for i in range(size))
  return ((total + (1 << 15)) >> 16).astype(jnp.uint8)


def reference_uint8_table(mean, std) -> np.ndarray:
  """uint8 [3, 256]: what each 8-bit value of each channel becomes in the reference's round
  trip: ToTensor and Normalize in float32 (CLIP's preprocessing), then show_image in float64
  (x * std + mean, clipped to [0, 1]) and (x * 255).astype(uint8), which truncates."""
  mean64 = np.asarray(mean, np.float64)
  std64 = np.asarray(std, np.float64)
  values = np.arange(256, dtype=np.float32)[:, None] / np.float32(255)
  normalised = (values - mean64.astype(np.float32)) / std64.astype(np.float32)
  back = np.clip(std64 * normalised.astype(np.float64) + mean64, 0, 1) * 255
  return back.astype(np.uint8).T.copy()


def reference_uint8(images: jax.Array, mean, std) -> jax.Array:
  """The reference's uint8 image from uint8 [..., 3] (see reference_uint8_table)."""
  table = jnp.asarray(reference_uint8_table(mean, std))
  return table[jnp.arange(3), images.astype(jnp.int32)]


@functools.partial(jax.jit, static_argnames=("blur_size",))
def compose_prompts(images, stroke, filled, valid, blur_size: int = 11):
  """The three prompted images from uint8 [B, H, W, 3] images and per-concept ellipse pixels
  (stroke, filled bool [B, L, H, W]; valid bool [B, L]): uint8 [B, L, 3, H, W, 3] in
  visual_prompts.VARIANTS order (red ellipse; grayscale outside; blur outside, each with the
  red stroke on top), the plain image where a concept is absent."""
  images = images.astype(jnp.uint8)
  gray = jnp.repeat(gray_u8(images)[..., None], 3, axis=-1)
  blurred = jax.vmap(lambda im: gaussian_blur_u8(im, blur_size))(images)
  red = jnp.asarray(RED, jnp.uint8)
  plain = images[:, None]
  stroke, filled = stroke[..., None], filled[..., None]
  variants = jnp.stack(
    [
      jnp.where(stroke, red, plain),
      jnp.where(stroke, red, jnp.where(filled, plain, gray[:, None])),
      jnp.where(stroke, red, jnp.where(filled, plain, blurred[:, None])),
    ],
    axis=2,
  )
  return jnp.where(valid[:, :, None, None, None, None], variants, plain[:, :, None])
