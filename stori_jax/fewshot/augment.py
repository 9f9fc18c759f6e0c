"""Train and test image transforms of the few-shot protocol, in PIL and numpy.

Train (CoOp/TaskRes; docs/design.md, section "Few-shot protocol"): RGB, RandomResizedCrop(size,
scale=(0.08, 1), ratio=(3/4, 4/3), bicubic), horizontal flip with p=0.5, then CLIP's normalisation.
The crop box is sampled by the algorithm of torchvision's `RandomResizedCrop.get_params` (10
attempts, then a central crop), with the same draws in the same order, so that fed the same random
numbers it gives the same boxes and pixels (tests/test_fewshot_data.py checks this against
torchvision). Randomness comes from a numpy Generator seeded per (seed, image index, view): every
view is reproducible on its own, whatever order or process computes it.

Test (`eval_view`): `stori_jax.data.preprocess.preprocess` (bicubic resize of the shorter side,
center crop).

Outputs are NHWC float32, normalised with a `PreprocessConfig`'s mean and std.

Fresh views (`config.views = 0`, a new view of every image at every step) are drawn on the
device, inside the train step: `image_canvas` holds the training images as uint8 on one canvas,
`device_views` draws the same transform there (`crop_boxes`: torchvision's box algorithm on JAX
random numbers; `resample_weights`: Pillow's bicubic resampling of the box, antialiased, as
matrices), seeded per (seed, step, image).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image

from stori_jax.fewshot.datasets import ImageSource, open_image
from stori_jax.data.preprocess import PreprocessConfig, normalize, preprocess

#: RandomResizedCrop's defaults, which CoOp and TaskRes keep.
CROP_SCALE = (0.08, 1.0)
CROP_RATIO = (3.0 / 4.0, 4.0 / 3.0)
_CROP_ATTEMPTS = 10


def random_resized_crop_box(
  height: int,
  width: int,
  rng: np.random.Generator,
  scale: tuple[float, float] = CROP_SCALE,
  ratio: tuple[float, float] = CROP_RATIO,
) -> tuple[int, int, int, int]:
  """(top, left, crop_height, crop_width) of a random crop of a height x width image.

  torchvision's `RandomResizedCrop.get_params`: up to 10 attempts of an area fraction
  U(scale) and a log-uniform aspect ratio in `ratio`, accepted if the box fits, then a uniform
  position; otherwise the largest central crop whose aspect ratio is clamped to `ratio`.
  Draw order per attempt: area, log-ratio, then (if accepted) top, left.
  """
  area = height * width
  log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
  for _ in range(_CROP_ATTEMPTS):
    target_area = area * rng.uniform(scale[0], scale[1])
    aspect_ratio = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
    # Python's round (half to even), as torchvision uses.
    crop_w = int(round(math.sqrt(target_area * aspect_ratio)))
    crop_h = int(round(math.sqrt(target_area / aspect_ratio)))
    if 0 < crop_w <= width and 0 < crop_h <= height:
      top = int(rng.integers(0, height - crop_h + 1))
      left = int(rng.integers(0, width - crop_w + 1))
      return top, left, crop_h, crop_w
  in_ratio = width / height
  if in_ratio < min(ratio):
    crop_w = width
    crop_h = int(round(crop_w / min(ratio)))
  elif in_ratio > max(ratio):
    crop_h = height
    crop_w = int(round(crop_h * max(ratio)))
  else:
    crop_w, crop_h = width, height
  return (height - crop_h) // 2, (width - crop_w) // 2, crop_h, crop_w


def train_view(
  image: Image.Image,
  size: int,
  rng: np.random.Generator,
  config: PreprocessConfig | None = None,
  *,
  scale: tuple[float, float] = CROP_SCALE,
  ratio: tuple[float, float] = CROP_RATIO,
  flip_probability: float = 0.5,
) -> np.ndarray:
  """One augmented view of a PIL image: float32 [size, size, 3], normalised.

  RGB conversion first (as Dassl's image reader), crop then bicubic resize to size x size (as
  torchvision's resized_crop on PIL images), then the flip draw `rng.random() < p`.
  """
  config = config or PreprocessConfig(image_size=size)
  image = image.convert("RGB")
  top, left, crop_h, crop_w = random_resized_crop_box(image.height, image.width, rng, scale, ratio)
  view = image.crop((left, top, left + crop_w, top + crop_h)).resize((size, size), Image.BICUBIC)
  if rng.random() < flip_probability:
    view = view.transpose(Image.FLIP_LEFT_RIGHT)
  return normalize(np.asarray(view), config.mean, config.std)


def view_rng(seed: int, image_index: int, view: int) -> np.random.Generator:
  """The Generator of one view: independent streams per (seed, image, view)."""
  return np.random.default_rng((seed, image_index, view))


def augmented_views(
  source: ImageSource,
  size: int,
  n_views: int,
  seed: int,
  image_index: int,
  config: PreprocessConfig | None = None,
  scale: tuple[float, float] = CROP_SCALE,
) -> np.ndarray:
  """`n_views` augmented views of one image: float32 [n_views, size, size, 3] (the cached views
  of `fewshot.trainer.encode_images`).

  Args:
    source: a path, encoded bytes, a uint8 [H, W, 3] array or a PIL image.
    size: output side; must equal config.image_size when a config is given.
    n_views: views to draw (the K cached views per training image).
    seed, image_index: view v uses `view_rng(seed, image_index, v)`, so views are reproducible
      per image and independent of the order images are processed in.
    config: mean and std of the normalisation (default: CLIP's, at `size`).
    scale: the crops' range of areas (`train_view`).
  """
  if config is None:
    config = PreprocessConfig(image_size=size)
  elif config.image_size != size:
    raise ValueError(
      f"size={size} but config.image_size={config.image_size}: train and test "
      "views would differ in size."
    )
  if n_views < 1:
    raise ValueError(f"n_views must be >= 1, got {n_views}.")
  image = open_image(source).convert("RGB")
  return np.stack(
    [
      train_view(image, size, view_rng(seed, image_index, v), config, scale=scale)
      for v in range(n_views)
    ]
  )


# Named eval_*, not test_*: pytest would collect a test_* function imported into a test module.
def eval_view(source: ImageSource, config: PreprocessConfig = PreprocessConfig()) -> np.ndarray:
  """The test transform, `stori_jax.data.preprocess.preprocess`: float32 [S, S, 3]."""
  return preprocess(open_image(source), config)


# Fresh views on the device -------------------------------------------------------------------

#: Fresh views: a training image is kept at most this many times the model's input side (its
#: longer side; a larger image is shrunk once, bicubic, before training). Crops are drawn from
#: that copy: even the smallest (8% of the area) keeps about 0.28 x 2 = 0.57 of the input side
#: in source pixels, which the resize enlarges anyway.
CANVAS_SIDE = 2
HIGHEST = jax.lax.Precision.HIGHEST


@dataclasses.dataclass(frozen=True, eq=False)
class ImageCanvas:
  """The training images of a run whose views are drawn afresh at every step.

  pixels: uint8 [N, H, W, 3], image i at the top left of its slot, the rest zero; H and W are
  the largest height and width of the images. sizes: int32 [N, 2], each image's (height,
  width).
  """

  pixels: np.ndarray
  sizes: np.ndarray

  def __len__(self) -> int:
    return len(self.sizes)


def image_canvas(sources: Sequence[ImageSource], max_side: int) -> ImageCanvas:
  """The images of `sources` (paths, bytes, arrays or PIL images) as RGB uint8 on one canvas;
  an image whose longer side exceeds `max_side` is first shrunk to it (bicubic, aspect kept)."""
  images = []
  for source in sources:
    image = open_image(source).convert("RGB")
    longer = max(image.size)
    if longer > max_side:
      factor = max_side / longer
      image = image.resize(
        (max(1, round(image.width * factor)), max(1, round(image.height * factor))),
        Image.BICUBIC,
      )
    images.append(np.asarray(image, np.uint8))
  sizes = np.asarray([i.shape[:2] for i in images], np.int32).reshape(-1, 2)
  pixels = np.zeros((len(images), *sizes.max(axis=0), 3), np.uint8)
  for slot, image in zip(pixels, images):
    slot[: image.shape[0], : image.shape[1]] = image
  return ImageCanvas(pixels, sizes)


def crop_boxes(
  keys: jax.Array,
  sizes: jax.Array,
  scale: tuple[float, float] = CROP_SCALE,
  ratio: tuple[float, float] = CROP_RATIO,
) -> jax.Array:
  """(top, left, crop_height, crop_width) int32 [B, 4] of a random crop of each image.

  `random_resized_crop_box`'s algorithm, vectorised: the 10 attempts of an area fraction
  U(scale) and a log-uniform aspect ratio are drawn at once and the first box that fits is
  kept, its position uniform; if none fits, the largest central crop whose aspect ratio is
  clamped to `ratio`. keys: [B] typed PRNG keys; sizes: int32 [B, 2] (height, width).
  """

  def one(key, size):
    height, width = size[0].astype(jnp.float32), size[1].astype(jnp.float32)
    k_area, k_ratio, k_top, k_left = jax.random.split(key, 4)
    area = (
      height
      * width
      * jax.random.uniform(k_area, (_CROP_ATTEMPTS,), minval=scale[0], maxval=scale[1])
    )
    log_ratio = jax.random.uniform(
      k_ratio, (_CROP_ATTEMPTS,), minval=math.log(ratio[0]), maxval=math.log(ratio[1])
    )
    aspect = jnp.exp(log_ratio)
    # Round half to even, as Python's round in torchvision.
    crop_w = jnp.round(jnp.sqrt(area * aspect))
    crop_h = jnp.round(jnp.sqrt(area / aspect))
    fits = (crop_w > 0) & (crop_w <= width) & (crop_h > 0) & (crop_h <= height)
    first = jnp.argmax(fits)
    crop_h, crop_w = crop_h[first], crop_w[first]
    top = jnp.floor(jax.random.uniform(k_top) * (height - crop_h + 1))
    left = jnp.floor(jax.random.uniform(k_left) * (width - crop_w + 1))
    # No attempt fits: the central crop, its aspect ratio clamped to `ratio`.
    in_ratio = width / height
    central_w = jnp.where(in_ratio > max(ratio), jnp.round(height * max(ratio)), width)
    central_w = jnp.where(in_ratio < min(ratio), width, central_w)
    central_h = jnp.where(in_ratio < min(ratio), jnp.round(width / min(ratio)), height)
    box = jnp.where(
      jnp.any(fits),
      jnp.stack([top, left, crop_h, crop_w]),
      jnp.stack(
        [
          jnp.floor((height - central_h) / 2),
          jnp.floor((width - central_w) / 2),
          central_h,
          central_w,
        ]
      ),
    )
    return box.astype(jnp.int32)

  return jax.vmap(one)(keys, sizes)


def _bicubic(x: jax.Array, a: float = -0.5) -> jax.Array:
  """Pillow's bicubic kernel (a = -0.5)."""
  x = jnp.abs(x)
  near = ((a + 2) * x - (a + 3)) * x * x + 1
  far = (((x - 5) * x + 8) * x - 4) * a
  return jnp.where(x < 1, near, jnp.where(x < 2, far, 0.0))


def resample_weights(start: jax.Array, length: jax.Array, out_size: int, in_size: int) -> jax.Array:
  """float32 [out_size, in_size]: the rows that resize pixels start..start+length-1 of an axis
  of in_size pixels to out_size, as Pillow's bicubic resize of the cropped image does (its
  precompute_coeffs): each output pixel's kernel widened by the downscale factor (antialias),
  cut to Pillow's support window inside the crop, normalised to sum to 1."""
  length = length.astype(jnp.float32)
  factor = length / out_size
  widen = jnp.maximum(factor, 1.0)
  support = 2.0 * widen
  centre = (jnp.arange(out_size, dtype=jnp.float32) + 0.5) * factor  # in crop coordinates
  pixel = jnp.arange(in_size, dtype=jnp.float32) - start.astype(jnp.float32)
  low = jnp.maximum(jnp.floor(centre - support + 0.5), 0.0)
  high = jnp.minimum(jnp.floor(centre + support + 0.5), length)
  inside = (pixel[None] >= low[:, None]) & (pixel[None] < high[:, None])
  weights = jnp.where(inside, _bicubic((pixel[None] + 0.5 - centre[:, None]) / widen), 0.0)
  return weights / jnp.sum(weights, axis=1, keepdims=True)


def device_views(
  pixels: jax.Array,
  sizes: jax.Array,
  keys: jax.Array,
  size: int,
  mean: Sequence[float],
  std: Sequence[float],
  *,
  scale: tuple[float, float] = CROP_SCALE,
  ratio: tuple[float, float] = CROP_RATIO,
  flip_probability: float = 0.5,
) -> jax.Array:
  """One augmented view of each image, drawn on the device: float32 [B, size, size, 3],
  normalised with mean and std.

  The transform of `train_view`: a box from `crop_boxes`, resized to size x size as Pillow's
  bicubic resize of the crop (`resample_weights`, across then down as Pillow's C code orders
  the passes, each rounded to 8 bits: Pillow's pixels within a level but for a few in 100,000,
  which its fixed-point weights or pass order move by a few levels), a horizontal flip with
  probability flip_probability.

  Args:
    pixels: uint8 [B, H, W, 3], each image at the top left (`ImageCanvas.pixels` rows).
    sizes: int32 [B, 2], each image's (height, width).
    keys: [B] typed PRNG keys, one per image.
  """
  boxes = crop_boxes(keys, sizes, scale, ratio)
  flips = jax.vmap(lambda key: jax.random.uniform(jax.random.fold_in(key, 1)))(keys)
  height, width = pixels.shape[1:3]

  def one(image, box, flip):
    rows = resample_weights(box[0], box[2], size, height)
    cols = resample_weights(box[1], box[3], size, width)
    cols = jnp.where(flip < flip_probability, cols[::-1], cols)
    # Pillow's two passes, each rounded and clipped to 8 bits: across, then down.
    across = jnp.einsum("pw,hwc->hpc", cols, image.astype(jnp.float32), precision=HIGHEST)
    across = jnp.clip(jnp.round(across), 0, 255)
    view = jnp.einsum("oh,hpc->opc", rows, across, precision=HIGHEST)
    return jnp.clip(jnp.round(view), 0, 255)

  views = jax.vmap(one)(pixels, boxes, flips)
  # As preprocess.normalize computes it on the host.
  return (views / 255.0 - jnp.asarray(mean, jnp.float32)) / jnp.asarray(std, jnp.float32)
