"""Decoding one image from wherever a dataset keeps it, and sizing it for a model.

An image source is one of
  - a file path (str), for image folders;
  - encoded image bytes (JPEG/PNG, `bytes`), for TFDS, so that a split costs its file size in
    memory rather than its decoded size (Food101's test set: ~1 GB instead of ~20 GB);
  - a uint8 [H, W, 3] array, for the in-memory synthetic world.
Every reader decodes through `open_image`, which goes through `preprocess.to_8bit` (16-bit and
float images scaled to 8 bits, or refused).
"""

from __future__ import annotations

import io
from typing import Union

import numpy as np
from PIL import Image

from stori_jax.plumbing.errors import InputError, UserError
from stori_jax.clip.preprocess import resize_center_crop, to_8bit, to_pil

ImageSource = Union[str, bytes, np.ndarray]


def open_image(source: ImageSource | Image.Image) -> Image.Image:
  """A path, encoded bytes, a uint8 HWC array or a PIL image -> PIL image, 8-bit samples.

  Raises:
    InputError: bytes that do not decode, a wrong array, an unreadable file (named).
    ImageFileMissingError: a path that does not exist.
  """
  if isinstance(source, (bytes, bytearray, memoryview)):
    try:
      with Image.open(io.BytesIO(bytes(source))) as image:
        image.load()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
      raise InputError(
        f"Cannot decode an encoded image ({len(source)} bytes): {type(e).__name__}: {e}."
      ) from None
    return to_8bit(image, f"({len(source)} encoded bytes)")
  return to_pil(source)


def model_input(source: ImageSource, image_size: int, where: str = "") -> np.ndarray:
  """An image file, encoded bytes or array -> uint8 [S, S, 3], S = `image_size`: RGB, the
  shorter side resized to S (bicubic) and centre-cropped, as CLIP's preprocessing.

  Args:
    where: names the image in messages (its path or id); default the source itself.

  Raises:
    InputError: the image cannot be decoded or has no pixels; the message names it.
  """
  try:
    image = open_image(source).convert("RGB")
  except InputError as error:  # already a clear message; add which image when it lacks it
    if where and where not in str(error):
      raise InputError(f"{where}: {error}") from None
    raise
  except UserError:
    raise
  except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
    raise InputError(
      f"Cannot read the image {where or str(source)[:200]}: {type(error).__name__}: {error}. "
      "Replace or remove the file (it may be truncated or not an image)."
    ) from None
  if min(image.size) == 0:
    raise InputError(f"The image {where or source} is empty ({image.size[0]}x{image.size[1]}).")
  return np.asarray(resize_center_crop(image, image_size), np.uint8)


def resize_images(images: np.ndarray, size: int) -> np.ndarray:
  """uint8 [n, S, S, 3] -> uint8 [n, size, size, 3] (bicubic, square images; unchanged when
  S == size)."""
  if images.shape[1] == size:
    return images
  return np.stack([np.asarray(resize_center_crop(to_pil(im), size)) for im in images])
