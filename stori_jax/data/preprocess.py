"""OpenAI/open_clip image preprocessing, NHWC.

Resize the shorter side to the model's size with PIL bicubic, center crop,
convert to RGB, scale to [0, 1] and normalise with CLIP's mean and std: the
steps (and their order) of open_clip's `image_transform` for OpenAI models, so
the pixels match it exactly.
"""

from __future__ import annotations

import dataclasses
import io
import os
from typing import Sequence, Union

import numpy as np
from PIL import Image

from stori_jax.plumbing import paths
from stori_jax.plumbing.errors import InputError, UserError

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)

ImageLike = Union[str, os.PathLike, Image.Image, np.ndarray]


@dataclasses.dataclass(frozen=True)
class PreprocessConfig:
  image_size: int = 224
  mean: tuple[float, float, float] = OPENAI_MEAN
  std: tuple[float, float, float] = OPENAI_STD


class ImageFileMissingError(UserError, FileNotFoundError):
  """An image path that does not exist."""


# PIL modes whose samples are wider than 8 bits: PIL's own convert("L"/"RGB") clips them at
# 255 (a 16-bit image turns all white, a [0, 1] float image near black), so they are scaled here.
_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N")
_WIDE_MODES = (*_SIXTEEN_BIT_MODES, "I", "F")


def to_8bit(image: Image.Image, where: str = "") -> Image.Image:
  """An image of any PIL mode -> one with 8-bit samples that `convert("RGB")` reads correctly.

  8-bit modes (L, RGB, RGBA, P, 1, CMYK, ...) are returned unchanged. 16-bit integer images
  (I;16*, and I with values in [0, 65535], as older PIL decodes 16-bit PNGs) are scaled by
  255 / 65535 to mode L; float images (F) with values in [0, 1] by 255. The project's one
  decoder: every image reader goes through `to_pil` or this function.

  Raises:
    InputError: a 32-bit integer image with values outside [0, 65535], or a float image with
      NaN, infinite or out-of-[0, 1] values: their scale cannot be known (named by `where`).
  """
  if image.mode not in _WIDE_MODES:
    return image
  name = f"The image {where}" if where else "An image"
  pixels = np.asarray(image)
  if image.mode == "F":
    if pixels.size and not np.isfinite(pixels).all():
      raise InputError(
        f"{name} is a float image (PIL mode F) with NaN or infinite pixels; save it as an "
        "8-bit PNG or JPEG, or replace the non-finite values."
      )
    lo, hi = (float(pixels.min()), float(pixels.max())) if pixels.size else (0.0, 0.0)
    if lo < 0.0 or hi > 1.0:
      raise InputError(
        f"{name} is a float image (PIL mode F) with values in [{lo:g}, {hi:g}]; float images "
        "must hold values in [0, 1] to be scaled to 8 bits. Rescale it to [0, 1], or save it "
        "as an 8-bit PNG or JPEG."
      )
    scaled = np.rint(pixels.astype(np.float64) * 255.0)
  else:
    wide = pixels.astype(np.int64)
    if image.mode == "I" and wide.size and (wide.min() < 0 or wide.max() > 65535):
      raise InputError(
        f"{name} is a 32-bit integer image (PIL mode I) with values in "
        f"[{int(wide.min())}, {int(wide.max())}], outside the 16-bit range [0, 65535], so "
        "its scale is unknown. Save it as an 8- or 16-bit PNG."
      )
    # Round to nearest: 65535 -> 255, 257 * k -> k exactly (8-bit values widened by 257).
    scaled = (wide * 255 + 32767) // 65535
  return Image.fromarray(np.clip(scaled, 0, 255).astype(np.uint8), mode="L")


def _read_image_file(path: str | os.PathLike) -> Image.Image:
  source = path
  if paths.is_remote(path):  # an object (gs://): read whole, then decoded from memory
    try:
      source = io.BytesIO(paths.read_bytes(path))
    except FileNotFoundError:
      raise ImageFileMissingError(f"Image file {path} does not exist.") from None
  elif not os.path.exists(path):
    raise ImageFileMissingError(f"Image file {path} does not exist.")
  elif not os.path.isfile(path):
    raise InputError(f"{path} is not an image file (it is a directory or a device).")
  try:
    with Image.open(source) as im:
      im.load()
  except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
    # PIL says "image file is truncated" or "cannot identify image file" without the name.
    raise InputError(
      f"Cannot read the image {path}: {type(e).__name__}: {e}. The file is truncated, corrupt "
      "or not an image; replace it, or remove it from the input."
    ) from None
  return to_8bit(im, str(path))


def to_pil(image: ImageLike) -> Image.Image:
  """A path, a PIL image or a uint8 HWC array -> PIL image with 8-bit samples (`to_8bit`).

  Raises:
    ImageFileMissingError: a path that does not exist.
    InputError: an unreadable file (named), a wrong array dtype or shape, a 16-bit or float
      image whose scale cannot be known.
  """
  if isinstance(image, Image.Image):
    return to_8bit(image)
  if isinstance(image, np.ndarray):
    if image.dtype != np.uint8 or image.ndim not in (2, 3):
      raise InputError(
        f"Array images must be uint8 HW or HWC, got {image.dtype} {image.shape}; "
        "pass already-normalised float arrays straight to encode_image instead."
      )
    if image.ndim == 3 and image.shape[-1] not in (1, 2, 3, 4):
      raise InputError(f"Array images must be HWC with 1 to 4 channels, got shape {image.shape}.")
    return Image.fromarray(image[..., 0] if image.ndim == 3 and image.shape[-1] == 1 else image)
  if isinstance(image, (str, os.PathLike)):
    return _read_image_file(image)
  raise InputError(f"Cannot read an image from {type(image).__name__}.")


def resize_crop_geometry(width: int, height: int, size: int) -> tuple[int, int, int, int]:
  """Where `resize_center_crop` takes an image of width x height pixels: (new width, new height,
  left, top): the shorter side resized to `size`, then the size x size crop at (left, top) of
  the resized image (a point (x, y) of the image lands at (x * new_w / width - left,
  y * new_h / height - top)).

  Raises:
    InputError: the image has no pixels (a zero width or height).
  """
  if width == 0 or height == 0:
    raise InputError(f"An image of size {width}x{height} has no pixels; it cannot be resized.")
  if width <= height:
    new_w, new_h = size, max(1, int(size * height / width))
  else:
    new_w, new_h = max(1, int(size * width / height)), size
  top = int(round((new_h - size) / 2.0))
  left = int(round((new_w - size) / 2.0))
  return new_w, new_h, left, top


def resize_center_crop(image: Image.Image, size: int) -> Image.Image:
  """Bicubic resize of the shorter side to `size`, then a centered size x size crop.

  Raises:
    InputError: the image has no pixels (a zero width or height).
  """
  width, height = image.size
  new_w, new_h, left, top = resize_crop_geometry(width, height, size)
  if (new_w, new_h) != (width, height):
    image = image.resize((new_w, new_h), Image.BICUBIC)
  return image.crop((left, top, left + size, top + size))


def normalize(pixels: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
  """uint8 [..., 3] -> float32 (x / 255 - mean) / std."""
  x = pixels.astype(np.float32) / np.float32(255.0)
  return (x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)


def preprocess(
  images: ImageLike | Sequence[ImageLike], config: PreprocessConfig = PreprocessConfig()
) -> np.ndarray:
  """One image -> float32 [S, S, 3]; a list of images -> float32 [B, S, S, 3].

  Raises:
    InputError: an empty list, an image without pixels, an unreadable file (named).
  """
  if isinstance(images, (list, tuple)):
    if not images:
      raise InputError("No images to preprocess: the list is empty.")
    return np.stack([preprocess(im, config) for im in images])
  image = resize_center_crop(to_pil(images), config.image_size).convert("RGB")
  return normalize(np.asarray(image), config.mean, config.std)
