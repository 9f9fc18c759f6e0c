"""Decoding one image from wherever a dataset keeps it, and sizing it for a model.

An image source is one of
  - a file path (str), for image folders;
  - encoded image bytes (JPEG/PNG, `bytes`), for TFDS, so that a split costs its file size in
    memory rather than its decoded size (Food101's test set: ~1 GB instead of ~20 GB);
  - a uint8 [H, W, 3] array, for the in-memory synthetic world.
Every reader decodes through `open_image`, which goes through `preprocess.to_8bit` (16-bit and
float images scaled to 8 bits, or refused). `check_images` looks at every file of a dataset
before any work, cheaply (the header and the last bytes), and lists every one a run would stop
at.
"""

from __future__ import annotations

import concurrent.futures
import io
import os
import re
from typing import Iterable, Sequence, Union

import numpy as np
from PIL import Image, UnidentifiedImageError

from stori_jax.plumbing import paths
from stori_jax.plumbing.errors import InputError, UserError
from stori_jax.data.preprocess import resize_center_crop, to_8bit, to_pil

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


#: How each format's complete file ends (checked on its last bytes): JPEG's EOI marker, PNG's
#: IEND chunk (length 0, type, CRC).
_ENDINGS = {"JPEG": b"\xff\xd9", "PNG": b"\x00\x00\x00\x00IEND\xaeB`\x82"}
_TAIL = 16
#: The first bytes of each format's files (a file that starts so but does not open is broken,
#: not another kind of file).
_SIGNATURES = (
  ("PNG", b"\x89PNG\r\n\x1a\n"),
  ("JPEG", b"\xff\xd8\xff"),
  ("GIF", b"GIF8"),
  ("BMP", b"BM"),
  ("TIFF", b"II*\x00"),
  ("TIFF", b"MM\x00*"),
  ("WEBP", b"RIFF"),
)


def _tail_complete(kind: str | None, size: int, head: bytes, tail: bytes) -> bool:
  """Whether an encoded image of format `kind` (PIL's name) and `size` bytes, whose first and
  last bytes are `head` and `tail`, is complete, judged without decoding: JPEG and PNG by their
  end marker, WebP by its RIFF size and BMP by its file size field (when set). False for other
  formats (and for files with bytes after the end marker): only a decode can tell."""
  if kind in _ENDINGS:
    return tail.endswith(_ENDINGS[kind])
  if kind == "WEBP" and len(head) >= 8:
    return int.from_bytes(head[4:8], "little") + 8 == size
  if kind == "BMP" and len(head) >= 6:
    return int.from_bytes(head[2:6], "little") == size
  return False


def _bomb_limit() -> str:
  """The pixel count above which PIL refuses to open an image (twice MAX_IMAGE_PIXELS; above
  MAX_IMAGE_PIXELS itself it only warns)."""
  limit = Image.MAX_IMAGE_PIXELS
  return "none" if limit is None else f"{2 * int(limit):,} pixels"


def _bomb_pixels(error: Exception) -> str:
  found = re.search(r"\((\d+) pixels\)", str(error))
  return f"{int(found.group(1)):,} pixels" if found else str(error)


def image_problem(source: str | bytes) -> str | None:
  """Why reading the image `source` (a file path or encoded bytes) would fail, found without
  decoding it: None for an image that reads. One of "does not exist", "is a directory", "is not
  a regular file", "is empty (0 bytes)", "not an image (...)", "decompression bomb: N pixels
  (...)", "has no pixels (WxH)", "truncated (...)", "corrupt (...)".

  The header gives the format and size (`PIL.Image.open` decodes no pixel data); PIL's
  decompression-bomb limit is checked on that size, as the decode would check it. A JPEG or
  PNG is complete when it ends with its end marker, a WebP or BMP when its header's size field
  says its length; any other file, or one with bytes after the marker, is decoded once here.
  """
  if isinstance(source, (bytes, bytearray, memoryview)):
    data = bytes(source)
    size, head, tail, opener = len(data), data[:_TAIL], data[-_TAIL:], lambda: io.BytesIO(data)
  elif paths.is_remote(source):  # an object: its head and tail only, as for a local file
    path = os.fspath(source)
    if not paths.exists(path):
      return "does not exist"
    if paths.isdir(path):
      return "is a directory"
    try:
      size = paths.size(path)
      with paths.open(path, "rb") as f:
        head = f.read(_TAIL)
        f.seek(max(0, size - _TAIL))
        tail = f.read(_TAIL)
    except OSError as error:
      return f"cannot be read ({error.strerror or error})"
    opener = lambda: io.BytesIO(paths.read_bytes(path))  # noqa: E731
  else:
    path = os.fspath(source)
    if not os.path.lexists(path):
      return "does not exist"
    if os.path.isdir(path):
      return "is a directory"
    if not os.path.isfile(path):
      return "does not exist (a broken link)" if os.path.islink(path) else "is not a regular file"
    try:
      size = os.path.getsize(path)
      with open(path, "rb") as f:
        head = f.read(_TAIL)
        f.seek(max(0, size - _TAIL))
        tail = f.read(_TAIL)
    except OSError as error:
      return f"cannot be read ({error.strerror or error})"
    opener = lambda: path  # noqa: E731
  if size == 0:
    return "is empty (0 bytes)"
  if head[:4] == b"RIFF" and head[8:12] == b"WEBP":  # PIL decodes a WebP as it opens it
    declared = int.from_bytes(head[4:8], "little") + 8
    if declared > size:
      return f"truncated (WEBP of {size:,} bytes, its header says {declared:,})"
  try:
    with Image.open(opener()) as image:
      kind, (width, height) = image.format, image.size
      if width == 0 or height == 0:
        return f"has no pixels ({width}x{height})"
      if _tail_complete(kind, size, head, tail):
        return None
      try:  # only a decode can tell: a format without a checked ending, or bytes after it
        image.load()
      except (OSError, SyntaxError, ValueError, EOFError) as error:
        what = (
          "truncated" if "truncated" in str(error) or isinstance(error, EOFError) else "corrupt"
        )
        return f"{what} ({kind} of {size:,} bytes: {error})"
  except Image.DecompressionBombError as error:  # raised by open, from the header's size
    return f"decompression bomb: {_bomb_pixels(error)} (PIL's limit: {_bomb_limit()})"
  except UnidentifiedImageError:
    kind = next((k for k, magic in _SIGNATURES if head.startswith(magic)), None)
    if kind is not None:  # an image's signature, but no header PIL can read after it
      return f"truncated or corrupt ({kind} of {size:,} bytes whose header cannot be read)"
    return f"not an image ({size:,} bytes PIL cannot identify)"
  except (OSError, SyntaxError, ValueError, EOFError) as error:
    return f"truncated or corrupt header ({type(error).__name__}: {error})"
  return None


def check_images(
  sources: Iterable[tuple[str, str | bytes]], what: str = "images", workers: int = 16
) -> int:
  """Checks every image before any work (`image_problem`: the header and the last bytes, no
  decode) and lists every one that would stop a run; returns how many were checked.

  Args:
    sources: (name for messages, file path or encoded bytes) per image.
    what: the images, for the message ("the image folder /data/val").
    workers: threads reading the files (the check waits on the disk more than on the CPU).

  Raises:
    InputError: one paragraph naming every bad image with its reason, and the fix.
  """
  items: Sequence[tuple[str, str | bytes]] = list(sources)
  if workers > 1 and len(items) > 64:
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="image-check") as pool:
      problems = list(pool.map(lambda item: image_problem(item[1]), items, chunksize=64))
  else:
    problems = [image_problem(source) for _, source in items]
  bad = [(name, why) for (name, _), why in zip(items, problems) if why is not None]
  if bad:
    listed = "; ".join(f"{name}: {why}" for name, why in bad)
    raise InputError(
      f"{len(bad)} of the {len(items)} {what} cannot be read, so nothing was done (every "
      f"image is checked before the model loads): {listed}. Replace or remove these files (a "
      "folder among the images: move it out of the class folder), then run the same command "
      "again."
    )
  return len(items)
