"""Preprocessing equals open_clip's OpenAI transform, pixel for pixel."""

import numpy as np
import pytest
from PIL import Image

import stori_jax
from stori_jax.preprocess import PreprocessConfig, preprocess, resize_center_crop


def _images():
  rng = np.random.default_rng(0)
  rgb = lambda h, w: Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
  return {
    "landscape": rgb(300, 451),
    "portrait": rgb(517, 233),
    "square": rgb(224, 224),
    "small": rgb(31, 57),
    "odd_crop": rgb(225, 340),
    "gray": Image.fromarray(rng.integers(0, 256, (180, 240), dtype=np.uint8)),
    "rgba": Image.fromarray(rng.integers(0, 256, (200, 260, 4), dtype=np.uint8)),
    "palette": rgb(190, 250).convert("P"),
  }


@pytest.mark.parametrize("size", [224, 336, 64])
def test_matches_open_clip_transform(size):
  open_clip = pytest.importorskip("open_clip", reason="pip install -e '.[torch]' (open_clip_torch)")
  from open_clip.transform import image_transform

  transform = image_transform(size, is_train=False)
  for name, image in _images().items():
    ours = preprocess(image, PreprocessConfig(size))
    theirs = transform(image).numpy().transpose(1, 2, 0)
    assert ours.shape == (size, size, 3) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-6, err_msg=name)
  del open_clip


def test_resize_keeps_the_shorter_side_and_centres_the_crop():
  image = Image.new("RGB", (400, 200))
  image.paste((255, 0, 0), (0, 0, 100, 200))  # A red band on the left quarter.
  out = resize_center_crop(image, 100)
  assert out.size == (100, 100)
  # 400x200 -> 200x100, crop x in [50, 150): the red band (x < 50) is cut away.
  assert np.asarray(out)[:, :, 0].max() < 40


def test_paths_lists_and_bad_inputs(tmp_path):
  path = tmp_path / "im.png"
  _images()["landscape"].save(path)
  batch = preprocess([str(path), _images()["square"]], PreprocessConfig(32))
  assert batch.shape == (2, 32, 32, 3)
  np.testing.assert_array_equal(batch[0], preprocess(_images()["landscape"], PreprocessConfig(32)))
  with pytest.raises(FileNotFoundError, match="does not exist"):
    preprocess(str(tmp_path / "missing.png"))
  with pytest.raises(ValueError, match="uint8"):
    preprocess(np.zeros((10, 10, 3), np.float32))
  assert stori_jax.preprocess is not None
