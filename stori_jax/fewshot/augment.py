"""Train and test image transforms of the few-shot protocol, in PIL and numpy.

Train (CoOp/TaskRes; docs/design.md, section "Few-shot protocol"): RGB, RandomResizedCrop(size,
scale=(0.08, 1), ratio=(3/4, 4/3), bicubic), horizontal flip with p=0.5, then CLIP's normalisation.
The crop box is sampled by the algorithm of torchvision's `RandomResizedCrop.get_params` (10
attempts, then a central crop), with the same draws in the same order, so that fed the same random
numbers it gives the same boxes and pixels (tests/test_fewshot_data.py checks this against
torchvision). Randomness comes from a numpy Generator seeded per (seed, image index, view): every
view is reproducible on its own, whatever order or process computes it.

Test (`eval_view`): `stori_jax.clip.preprocess.preprocess` (bicubic resize of the shorter side,
center crop).

Outputs are NHWC float32, normalised with a `PreprocessConfig`'s mean and std.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image

from stori_jax.fewshot.datasets import ImageSource, open_image
from stori_jax.clip.preprocess import PreprocessConfig, normalize, preprocess

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
) -> np.ndarray:
  """`n_views` augmented views of one image: float32 [n_views, size, size, 3].

  Args:
    source: a path, encoded bytes, a uint8 [H, W, 3] array or a PIL image.
    size: output side; must equal config.image_size when a config is given.
    n_views: views to draw (the K cached views per training image).
    seed, image_index: view v uses `view_rng(seed, image_index, v)`, so views are reproducible
      per image and independent of the order images are processed in.
    config: mean and std of the normalisation (default: CLIP's, at `size`).
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
    [train_view(image, size, view_rng(seed, image_index, v), config) for v in range(n_views)]
  )


# Named eval_*, not test_*: pytest would collect a test_* function imported into a test module.
def eval_view(source: ImageSource, config: PreprocessConfig = PreprocessConfig()) -> np.ndarray:
  """The test transform, `stori_jax.clip.preprocess.preprocess`: float32 [S, S, 3]."""
  return preprocess(open_image(source), config)


def eval_views(sources, config: PreprocessConfig = PreprocessConfig()) -> np.ndarray:
  """`eval_view` of each source: float32 [N, S, S, 3]."""
  return np.stack([eval_view(source, config) for source in sources])
