"""Decoding an image from any source (stori_jax.data.images): paths, encoded bytes and arrays
give the same pixels, and a broken image is named in the message."""

import io
import os

import numpy as np
import pytest
from PIL import Image

from stori_jax.data import images
from stori_jax.plumbing.errors import InputError
from stori_jax.data.preprocess import resize_center_crop


def _png(pixels):
  buffer = io.BytesIO()
  Image.fromarray(pixels).save(buffer, format="PNG")
  return buffer.getvalue()


def test_every_source_gives_the_same_model_input(tmp_path):
  pixels = np.random.default_rng(0).integers(0, 256, (12, 20, 3), dtype=np.uint8)
  path = tmp_path / "x.png"
  path.write_bytes(_png(pixels))
  want = np.asarray(resize_center_crop(Image.fromarray(pixels), 8))
  for source in (str(path), _png(pixels), pixels):
    got = images.model_input(source, 8)
    assert got.dtype == np.uint8 and got.shape == (8, 8, 3)
    np.testing.assert_array_equal(got, want)
  assert images.resize_images(pixels[None, :12, :12], 6).shape == (1, 6, 6, 3)


def test_a_broken_image_is_named(tmp_path):
  with pytest.raises(InputError, match=r"cat/1\.png: Cannot decode an encoded image \(7 bytes\)"):
    images.model_input(b"not png", 8, "cat/1.png")
  broken = tmp_path / "broken.png"
  broken.write_bytes(_png(np.zeros((4, 4, 3), np.uint8))[:20])
  with pytest.raises(InputError) as error:
    images.model_input(str(broken), 8, str(broken))
  assert str(broken) in str(error.value)


def _encoded(pixels, format_):
  buffer = io.BytesIO()
  Image.fromarray(pixels).save(buffer, format=format_)
  return buffer.getvalue()


def _png_header_of_size(width, height):
  """A PNG whose header claims width x height pixels (its CRC right), with no pixel data."""
  import struct
  import zlib

  def chunk(kind, body):
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

  ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
  return (
    b"\x89PNG\r\n\x1a\n"
    + chunk(b"IHDR", ihdr)
    + chunk(b"IDAT", zlib.compress(b""))
    + chunk(b"IEND", b"")
  )


def test_check_images_names_every_bad_file_with_its_reason(tmp_path):
  """Issue 36: every image is checked from its header and last bytes (no decode of a complete
  JPEG or PNG), and every bad one is listed in one message, each with its own reason."""
  pixels = np.random.default_rng(0).integers(0, 256, (40, 48, 3), dtype=np.uint8)
  good = {}
  for format_, suffix in (("JPEG", "jpg"), ("PNG", "png"), ("WEBP", "webp"), ("BMP", "bmp")):
    good[suffix] = _encoded(pixels, format_)
    (tmp_path / f"good.{suffix}").write_bytes(good[suffix])
  # A JPEG with bytes after its end marker decodes: decoded here, and passes.
  (tmp_path / "trailing.jpg").write_bytes(good["jpg"] + b"camera metadata")
  bad = {
    "dir.png": None,
    "cut.jpg": good["jpg"][: len(good["jpg"]) // 2],
    "cut.png": good["png"][: len(good["png"]) - 30],
    "cut.webp": good["webp"][: len(good["webp"]) // 2],
    "text.jpg": b"not an image at all",
    "empty.png": b"",
    "bomb.png": _png_header_of_size(20_000, 20_000),
  }
  for name, content in bad.items():
    if content is None:
      (tmp_path / name).mkdir()
    else:
      (tmp_path / name).write_bytes(content)
  os.symlink(tmp_path / "nowhere.png", tmp_path / "link.png")
  names = [f"good.{s}" for s in good] + ["trailing.jpg", *bad, "link.png"]
  sources = [(n, str(tmp_path / n)) for n in names]
  for name, _ in sources[:5]:
    assert images.image_problem(str(tmp_path / name)) is None, name
  with pytest.raises(InputError) as error:
    images.check_images(sources, what="images of the test")
  message = str(error.value)
  assert "\n" not in message and message.startswith("8 of the 13 images of the test")
  for expected in (
    "dir.png: is a directory",
    "cut.jpg: truncated (JPEG",
    "cut.png: truncated (PNG",
    "cut.webp: truncated (WEBP",
    "text.jpg: not an image",
    "empty.png: is empty (0 bytes)",
    "bomb.png: decompression bomb: 400,000,000 pixels",
    "link.png: does not exist (a broken link)",
  ):
    assert expected in message, (expected, message)
  assert "good." not in message and "trailing.jpg" not in message
  # Encoded bytes (a TFDS split) are checked alike; the thread pool gives the same answer.
  assert images.image_problem(good["png"]) is None
  assert images.image_problem(bad["cut.jpg"]).startswith("truncated (JPEG")
  assert images.check_images([(str(i), good["png"]) for i in range(100)]) == 100
  with pytest.raises(InputError, match=r"1 of the 100 images cannot be read.*: 7: truncated \(PNG"):
    images.check_images([(str(i), bad["cut.png"] if i == 7 else good["png"]) for i in range(100)])


def test_check_images_decodes_only_what_its_ending_cannot_vouch_for(tmp_path, monkeypatch):
  """A complete JPEG, PNG, WebP or BMP is judged from its header and last bytes: no decode."""
  pixels = np.random.default_rng(1).integers(0, 256, (16, 16, 3), dtype=np.uint8)
  loads = []
  load = Image.Image.load

  def counting(self):
    loads.append(self.format)
    return load(self)

  monkeypatch.setattr(Image.Image, "load", counting)
  from PIL import ImageFile

  monkeypatch.setattr(ImageFile.ImageFile, "load", counting)
  encoded = {f: _encoded(pixels, f) for f in ("JPEG", "PNG", "WEBP", "BMP", "TIFF")}
  loads.clear()
  for format_ in ("JPEG", "PNG", "WEBP", "BMP"):
    assert images.image_problem(encoded[format_]) is None
  assert loads == []
  assert images.image_problem(encoded["TIFF"]) is None and loads == ["TIFF"]
