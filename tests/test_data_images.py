"""Decoding an image from any source (stori_jax.data.images): paths, encoded bytes and arrays
give the same pixels, and a broken image is named in the message."""

import io

import numpy as np
import pytest
from PIL import Image

from stori_jax.data import images
from stori_jax.plumbing.errors import InputError
from stori_jax.clip.preprocess import resize_center_crop


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
