"""Preprocessing equals open_clip's OpenAI transform, pixel for pixel."""

import numpy as np
import pytest
from PIL import Image

import stori_jax
from stori_jax.data.preprocess import PreprocessConfig, preprocess, resize_center_crop


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
  assert stori_jax.data.preprocess is not None


# Issue 26 row 5: 16-bit and float images are scaled to 8 bits by one decoder (`to_8bit`),
# shared by preprocess / bundle.preprocess, the mutual and few-shot readers and the explorer.


def _wide_images(tmp_path):
  """{name: (path, expected uint8 HW)} for 16-bit PNG / TIFF and float TIFF files."""
  rng = np.random.default_rng(1)
  sixteen = rng.integers(0, 65536, (40, 60), dtype=np.uint16)
  sixteen[0, :4] = (0, 257, 65535, 128)  # exact k * 257 -> k; 128 / 257 rounds to 0
  floats = rng.random((40, 60)).astype(np.float32)
  floats[0, :3] = (0.0, 1.0, 0.5)
  out = {}
  for name, array, ext, expected in [
    ("png16", sixteen, "png", np.rint(sixteen / 257.0)),
    ("tif16", sixteen, "tif", np.rint(sixteen / 257.0)),
    ("tiff_float", floats, "tif", np.rint(floats.astype(np.float64) * 255.0)),
  ]:
    path = tmp_path / f"{name}.{ext}"
    Image.fromarray(array).save(path)
    out[name] = (str(path), expected.astype(np.uint8))
  return out


def test_wide_images_are_scaled_to_8_bits(tmp_path):
  from stori_jax.data.preprocess import to_pil

  modes = {"png16": "I;16", "tif16": "I;16", "tiff_float": "F"}
  for name, (path, expected) in _wide_images(tmp_path).items():
    with Image.open(path) as raw:
      assert raw.mode == modes[name]  # PIL really wrote and reads the wide mode
    decoded = to_pil(path)
    assert decoded.mode == "L", name
    np.testing.assert_array_equal(np.asarray(decoded), expected, err_msg=name)
    np.testing.assert_array_equal(np.asarray(decoded.convert("RGB"))[..., 1], expected)
    assert np.asarray(to_pil(Image.open(path))).tolist() == expected.tolist()
    # preprocess (and so bundle.preprocess) sees the same pixels as the 8-bit image
    config = PreprocessConfig(32)
    np.testing.assert_array_equal(
      preprocess(path, config), preprocess(Image.fromarray(expected), config)
    )


def test_older_pil_int32_sixteen_bit_images_are_scaled():
  from stori_jax.data.preprocess import to_8bit

  image = Image.fromarray(np.array([[0, 257, 65535, 30000]], np.int32))
  assert image.mode == "I"
  assert np.asarray(to_8bit(image)).tolist() == [[0, 1, 255, 117]]


def test_every_reader_shares_the_decoder(tmp_path):
  from mutual.data import _as_model_input
  from stori_jax.explorer.folder import _file_loader
  from stori_jax.fewshot.datasets import open_image

  wide = _wide_images(tmp_path)
  paths = [path for path, _ in wide.values()]
  expected = [
    np.asarray(resize_center_crop(Image.fromarray(e).convert("RGB"), 16)) for _, e in wide.values()
  ]
  np.testing.assert_array_equal(_file_loader(paths)(np.arange(len(paths)), 16), np.stack(expected))
  for path, want in zip(paths, expected):
    np.testing.assert_array_equal(_as_model_input(path, 16, path), want)
    with open(path, "rb") as f:
      from_bytes = open_image(f.read())
    np.testing.assert_array_equal(
      np.asarray(resize_center_crop(from_bytes.convert("RGB"), 16)), want
    )


@pytest.mark.parametrize(
  "array, match",
  [
    (np.array([[0.0, 2.5]], np.float32), r"values in \[0, 2.5\].*must hold values in \[0, 1\]"),
    (np.array([[0.0, np.nan]], np.float32), "NaN or infinite"),
    (np.array([[-1, 70000]], np.int32), r"outside the 16-bit range"),
  ],
)
def test_wide_images_of_unknown_scale_are_refused(tmp_path, array, match):
  from stori_jax.plumbing.errors import InputError
  from stori_jax.explorer.folder import _image_problem

  path = str(tmp_path / "odd.tif")
  Image.fromarray(array).save(path)
  with pytest.raises(InputError, match=match) as info:
    preprocess(path)
  assert path in str(info.value)
  assert "PIL mode" in (_image_problem(path) or "")  # the explorer skips it, named
