"""OpenAI/open_clip image preprocessing, NHWC.

Resize the shorter side to the model's size with PIL bicubic, center crop,
convert to RGB, scale to [0, 1] and normalise with CLIP's mean and std: the
steps (and their order) of open_clip's `image_transform` for OpenAI models, so
the pixels match it exactly.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Sequence, Union

import numpy as np
from PIL import Image

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)

ImageLike = Union[str, os.PathLike, Image.Image, np.ndarray]


@dataclasses.dataclass(frozen=True)
class PreprocessConfig:
  image_size: int = 224
  mean: tuple[float, float, float] = OPENAI_MEAN
  std: tuple[float, float, float] = OPENAI_STD


def to_pil(image: ImageLike) -> Image.Image:
  """A path, a PIL image or a uint8 HWC array -> PIL image."""
  if isinstance(image, Image.Image):
    return image
  if isinstance(image, np.ndarray):
    if image.dtype != np.uint8 or image.ndim not in (2, 3):
      raise ValueError(
        f"Array images must be uint8 HW or HWC, got {image.dtype} {image.shape}; "
        "pass already-normalised float arrays straight to encode_image instead."
      )
    return Image.fromarray(image)
  if isinstance(image, (str, os.PathLike)):
    if not os.path.isfile(image):
      raise FileNotFoundError(f"Image file {image} does not exist.")
    with Image.open(image) as im:
      im.load()
      return im
  raise TypeError(f"Cannot read an image from {type(image).__name__}.")


def resize_center_crop(image: Image.Image, size: int) -> Image.Image:
  """Bicubic resize of the shorter side to `size`, then a centered size x size crop."""
  width, height = image.size
  if width <= height:
    new_w, new_h = size, int(size * height / width)
  else:
    new_w, new_h = int(size * width / height), size
  if (new_w, new_h) != (width, height):
    image = image.resize((new_w, new_h), Image.BICUBIC)
  top = int(round((new_h - size) / 2.0))
  left = int(round((new_w - size) / 2.0))
  return image.crop((left, top, left + size, top + size))


def normalize(pixels: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
  """uint8 [..., 3] -> float32 (x / 255 - mean) / std."""
  x = pixels.astype(np.float32) / np.float32(255.0)
  return (x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)


def preprocess(
  images: ImageLike | Sequence[ImageLike], config: PreprocessConfig = PreprocessConfig()
) -> np.ndarray:
  """One image -> float32 [S, S, 3]; a list of images -> float32 [B, S, S, 3]."""
  if isinstance(images, (list, tuple)):
    return np.stack([preprocess(im, config) for im in images])
  image = resize_center_crop(to_pil(images), config.image_size).convert("RGB")
  return normalize(np.asarray(image), config.mean, config.std)
