"""mutual.ellipse, the reference's visual-prompt ellipse, against OpenCV itself.

The reference draws its prompts with OpenCV 4.x; OpenCV 4.13 replaced the line rasteriser, so
the comparisons run against 4.8 - 4.12 (the test extra pins that range). The fits that move
points by cv::theRNG() (a 5-point fit with a round-off determinant, a degenerate least-squares
fit) are 4.12's, compared with cv2.setRNGSeed before the fits, on 4.12 only.
"""

import os
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mutual import visual_prompts
from mutual.ellipse import contours as ellipse_contours
from mutual.ellipse import direct_fit, drawing, least_squares, pixels, prompts, random_replay
from mutual.ellipse import rules as ellipse_rules
from stori_jax.data import synthetic

PIN = "pip install 'opencv-python-headless>=4.8,<4.13'"
RULE_NAMES = {
  getattr(ellipse_rules, name): name
  for name in (
    "FITTED",
    "FEW_POINTS",
    "DIRECT",
    "DIRECT_RETRIED",
    "DIRECT_FALLBACK",
    "DEGENERATE",
    "UNDRAWABLE",
    "UNLISTED",
    "ABSENT",
  )
}


def _need(condition: bool, message: str):
  if condition:
    return
  if os.environ.get("CI", "").lower() in ("true", "1"):
    pytest.fail(message + " (the test extra installs it)")
  pytest.skip(message)


@pytest.fixture(scope="module")
def cv2():
  try:
    import cv2 as module  # pylint: disable=import-outside-toplevel
  except ImportError:
    module = None
  _need(module is not None, f"OpenCV is absent; {PIN}")
  version = tuple(int(part) for part in module.__version__.split(".")[:2])
  _need(
    version < (4, 13),
    f"OpenCV {module.__version__} draws lines unlike the reference's 4.x; {PIN}",
  )
  return module


# ---------------------------------------------------------------------------------------------
# Masks


def _ellipse_union(rng, height, width, count, noise):
  y, x = np.mgrid[:height, :width]
  mask = np.zeros((height, width), bool)
  for _ in range(count):
    cy, cx = rng.uniform(0, height), rng.uniform(0, width)
    ry, rx = rng.uniform(1, height / 3), rng.uniform(1, width / 3)
    theta = rng.uniform(0, np.pi)
    u = (x - cx) * np.cos(theta) + (y - cy) * np.sin(theta)
    v = -(x - cx) * np.sin(theta) + (y - cy) * np.cos(theta)
    mask |= (u / rx) ** 2 + (v / ry) ** 2 <= 1
  return mask ^ (rng.random((height, width)) < noise)


def _hand_made(height=48, width=64):
  """Thin, tiny, holed, nested, tied and border-touching regions."""
  masks = []

  def new():
    masks.append(np.zeros((height, width), bool))
    return masks[-1]

  new()[10, 5:40] = True  # horizontal line
  new()[3:45, 20] = True  # vertical line
  m = new()  # diagonal line
  m[np.arange(30) + 5, np.arange(30) + 10] = True
  m = new()  # a digital line of slope 1/3 (not collinear)
  m[(np.arange(45) // 3) + 10, np.arange(45) + 5] = True
  m = new()  # 1-pixel arc
  t = np.linspace(0, 2.5, 200)
  m[(24 + 18 * np.sin(t)).astype(int), (32 + 25 * np.cos(t)).astype(int)] = True
  new()[20:22, 3:60] = True  # 2-pixel bar
  new()[7, 9] = True  # one pixel
  new()[7, 9:11] = True  # two pixels
  new()[7, 9:12] = True  # three in a row (4 contour points)
  new()[7:9, 9:11] = True  # 2x2 square (4 points)
  m = new()  # L tromino (3 points)
  m[7, 9:11] = m[8, 9] = True
  m = new()  # a five-pixel ring (5 distinct points)
  m[10, 11] = m[11, 10] = m[11, 12] = m[12, 10] = m[12, 12] = True
  m = new()  # annulus with a component inside its hole
  y, x = np.mgrid[:height, :width]
  r = np.hypot(y - 24, x - 30)
  m[(r > 12) & (r < 18)] = True
  m[(r < 4)] = True
  m = new()  # frame with a hole, and a bigger blob elsewhere
  m[5:20, 5:20] = True
  m[8:17, 8:17] = False
  m[25:45, 30:60] = True
  m = new()  # three equal squares: ties
  m[5:10, 5:10] = m[20:25, 40:45] = m[20:25, 2:7] = True
  m = new()  # equal areas, different shapes: ties again
  m[5:9, 5:14] = m[30:39, 40:44] = True
  new()[:, :] = True  # touches every image border
  m = new()  # an X (symmetric diagonals)
  m[np.arange(21) + 10, np.arange(21) + 20] = True
  m[np.arange(21) + 10, 40 - np.arange(21)] = True
  m = new()  # checkerboard patch: many one-pixel components
  m[10:30, 10:30] = (np.add.outer(np.arange(20), np.arange(20)) % 2) == 0
  m = new()  # a comb of 1-pixel teeth: a long contour over many distinct pixels
  m[5, 4:60] = True
  m[5:44, 4:60:2] = True
  new()  # empty
  return np.stack(masks)


# One batch shape per image size, so each jitted stage compiles once for the module.
WORLD = dict(n_images=4, n_concepts=3)
CONCEPTS_224 = dict(batch=2, size=224, grid=14, n_concepts=5)


def _concept_maps(rng, batch, size, grid, n_concepts):
  """Concept maps like the pipeline's: K-means/PCA labels on a patch grid, upsampled, inside a
  CRF-like foreground with irregular edges; -1 is background."""
  coarse = rng.integers(0, n_concepts, (batch, grid, grid))
  rows = np.arange(size) * grid // size
  maps = coarse[:, rows][:, :, rows]
  y, x = np.mgrid[:size, :size]
  out = np.full((batch, size, size), -1, np.int32)
  for i in range(batch):
    angle = np.arctan2(y - size / 2, x - size / 2)
    radius = size * (0.3 + 0.06 * np.sin(angle * rng.integers(2, 6) + rng.uniform(0, 6)))
    inside = np.hypot(y - size / 2 - rng.uniform(-size / 10, size / 10), x - size / 2) < radius
    inside ^= rng.random((size, size)) < 0.01
    out[i] = np.where(inside, maps[i], -1)
  return out


def _world_maps(n_images, n_concepts, seed):
  """Synthetic-world images with concept maps that split each object into patch-grid parts."""
  batch = synthetic.generate(n_images, seed, image_size=64)
  rng = np.random.default_rng(seed)
  coarse = rng.integers(0, n_concepts, (n_images, 8, 8))
  parts = np.repeat(np.repeat(coarse, 8, axis=1), 8, axis=2)
  return batch.images, np.where(batch.masks >= 0, parts, -1).astype(np.int32)


def _opencv_contour(cv2, mask):
  contours, _ = cv2.findContours(mask.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)
  return max(contours, key=cv2.contourArea)[:, 0]


def _is_412(cv2):
  """cv::theRNG()'s paths in fitEllipse are OpenCV 4.12's (4.11 and before differ)."""
  return tuple(int(part) for part in cv2.__version__.split(".")[:2]) == (4, 12)


def _zero_box(contour):
  """mutual.ellipse's rule where the reference raises: a zero-size box at the centroid."""
  center = contour.sum(axis=0).astype(np.float32) / np.float32(len(contour))
  return (float(center[0]), float(center[1])), (0.0, 0.0), 0.0


def _opencv_prompts(cv2, image, box):
  """The three prompted images as the reference builds them, with OpenCV."""
  red = image.copy()
  cv2.ellipse(red, box, (255, 0, 0), 1)
  inside = np.zeros_like(image)
  cv2.ellipse(inside, box, (255, 255, 255), -1)
  gray = np.repeat(cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)[..., None], 3, axis=2)
  gray = np.ascontiguousarray(np.where(inside != 0, image, gray))
  cv2.ellipse(gray, box, (255, 0, 0), 1)
  blur = np.ascontiguousarray(np.where(inside != 0, image, cv2.GaussianBlur(image, (11, 11), 0)))
  cv2.ellipse(blur, box, (255, 0, 0), 1)
  return np.stack([red, gray, blur])


def _collinear(points):
  centred = points - points.mean(axis=0)
  return np.linalg.matrix_rank(centred.astype(np.float64)) < 2


# ---------------------------------------------------------------------------------------------
# Contours and fitEllipse


@pytest.fixture(scope="module")
def masks():
  rng = np.random.default_rng(0)
  blobs = [_ellipse_union(rng, 48, 64, rng.integers(1, 5), 0.03) for _ in range(40)]
  concept = _concept_maps(np.random.default_rng(3), **CONCEPTS_224)
  labels = np.arange(CONCEPTS_224["n_concepts"])
  return {
    "blobs": np.stack(blobs),
    "hand-made": _hand_made(),
    "concepts 224": (concept[:, None] == labels[:, None, None]).reshape(-1, 224, 224),
  }


def _per_group(masks, function):
  """{name: function's dict of arrays over masks[name]}, with one call per mask shape (the
  groups of a shape concatenated: each mask's result is its own, and each program compiles once
  per shape)."""
  names_of = {}
  for name, group in masks.items():
    names_of.setdefault(group.shape[1:], []).append(name)
  out = {}
  for names in names_of.values():
    found = function(jnp.asarray(np.concatenate([masks[name] for name in names])))
    found = {k: np.asarray(v) for k, v in found.items()}
    start = 0
    for name in names:
      end = start + len(masks[name])
      out[name] = {k: v[start:end] for k, v in found.items()}
      start = end
  return out


@pytest.mark.slow
def test_largest_contour_is_opencvs(cv2, masks):
  traced = _per_group(masks, lambda group: ellipse_contours.largest_contours(group, listed=40))
  for name, group in masks.items():
    found = traced[name]
    for i, mask in enumerate(group):
      if not mask.any():
        assert not found["present"][i] and found["n_points"][i] == 0
        continue
      contour = _opencv_contour(cv2, mask)
      points = np.zeros(mask.shape, np.int32)
      np.add.at(points, (contour[:, 1], contour[:, 0]), 1)
      where = f"{name} mask {i}"
      assert tuple(found["start"][i]) == tuple(contour[0]), where
      assert tuple(found["last"][i]) == tuple(contour[-1]), where
      assert found["area"][i] == cv2.contourArea(contour[:, None]), where
      np.testing.assert_array_equal(found["points"][i], points, err_msg=where)
      # The first points in OpenCV's order (fitEllipse's 5-point fit and moved points need it).
      shown = min(len(contour), 40)
      np.testing.assert_array_equal(found["listed"][i][:shown], contour[:shown], err_msg=where)
      assert (found["listed"][i][shown:] == -1).all(), where


@pytest.mark.slow
def test_contours_and_fits_exact_past_their_budgets(masks):
  """Tracing only the listed boundary pixels changes nothing, and chunks with more boundary
  pixels than `capacity` are traced at full size; likewise the fit's row budget."""
  group = jnp.asarray(masks["blobs"][:8])
  full = jax.jit(jax.vmap(ellipse_contours.largest_contour))(group)
  assert int(np.max(np.asarray(jax.vmap(ellipse_contours.boundary_count)(group)))) > 64
  small = ellipse_contours.largest_contours(group, chunk=4, capacity=64)
  listed = ellipse_contours.largest_contours(group, chunk=4, capacity=1000)
  for key in full:
    np.testing.assert_array_equal(np.asarray(small[key]), np.asarray(full[key]), err_msg=key)
    np.testing.assert_array_equal(np.asarray(listed[key]), np.asarray(full[key]), err_msg=key)
  # The hand-made masks after the blobs (both 48 x 64), as _per_group traces them: one program.
  points = ellipse_contours.largest_contours(
    jnp.asarray(np.concatenate([masks["blobs"], masks["hand-made"]]))
  )["points"]
  assert int(np.max(np.sum(np.asarray(points)[40:] > 0, axis=(1, 2)))) > 48 * 64 // 12
  with jax.enable_x64(True):
    every_row = jax.jit(jax.vmap(least_squares._fit_ellipse))(points)  # pylint: disable=protected-access
  for got, want in zip(least_squares.fit_ellipses(points), every_row):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_fit_ellipse_is_opencvs(cv2, masks):
  """concept_ellipses' fits against cv2.fitEllipse, theRNG seeded with 3 before each (as
  concept_ellipses seeds it): the 5-point fits bit for bit, least squares to round-off."""
  fitted = _per_group(masks, lambda group: prompts.concept_ellipses(group, seed=3))
  for name, group in masks.items():
    center, size, angle, rule = (fitted[name][k] for k in ("center", "size", "angle", "rule"))
    for i, mask in enumerate(group):
      where = f"{name} mask {i}"
      if not mask.any():
        assert rule[i] == ellipse_rules.ABSENT, where
        continue
      contour = _opencv_contour(cv2, mask)
      if len(contour) < 5:
        assert rule[i] == ellipse_rules.FEW_POINTS, where
        want = _zero_box(contour)
        np.testing.assert_array_equal(center[i], want[0], err_msg=where)
        assert (size[i] == 0).all() and angle[i] == 0, where
        continue
      if len(contour) == 5:
        assert rule[i] in (
          ellipse_rules.DIRECT,
          ellipse_rules.DIRECT_RETRIED,
          ellipse_rules.DIRECT_FALLBACK,
        ), where
      elif _collinear(contour):
        assert rule[i] == ellipse_rules.DEGENERATE, where
      elif name != "hand-made":  # blobs and concept regions are never degenerate
        assert rule[i] == ellipse_rules.FITTED, where
      if rule[i] != ellipse_rules.FITTED and not _is_412(cv2):
        continue
      cv2.setRNGSeed(3)
      (cx, cy), (w, h), a = cv2.fitEllipse(contour)
      got = np.asarray([*center[i], *size[i], angle[i]], np.float32)
      if rule[i] in (ellipse_rules.DIRECT, ellipse_rules.DIRECT_RETRIED):
        np.testing.assert_array_equal(got, np.float32([cx, cy, w, h, a]), err_msg=where)
        continue
      np.testing.assert_allclose(center[i], [cx, cy], atol=0.5, err_msg=where)
      np.testing.assert_allclose(size[i], [w, h], atol=0.5, err_msg=where)
      if h - w > 0.01 * h:  # not a circle: the angle means something
        assert abs((angle[i] - a + 90) % 180 - 90) < 2, where


def test_five_point_fits_are_opencvs_bit_for_bit(cv2):
  """fitEllipseDirect on random 5-point sets, half of them with a repeated point (the
  ill-conditioned case), theRNG seeded before each fit: the box is OpenCV's to the last bit
  where a direct attempt stands, first or retried on moved points; where both are singular
  (OpenCV's least squares on the 5 points) the drawn ellipse is OpenCV's."""
  _need(_is_412(cv2), "fitEllipse's theRNG paths are OpenCV 4.12's; " + PIN)
  rng = np.random.default_rng(0)
  count, side = 1200, 24
  xy = rng.integers(0, 20, (count, 5, 2)).astype(np.int32)
  xy[1::2, 4] = xy[1::2, 1]
  xy[::7, 3] = xy[::7, 0]
  listed = np.full((count, 8, 2), -1, np.int32)
  listed[:, :5] = xy
  n = np.full(count, 5, np.int32)
  zeros = np.zeros((count, 2), np.float32)
  center, size, angle, rule = map(
    np.asarray,
    direct_fit.ordered_fits(
      zeros,
      zeros,
      np.zeros(count, np.float32),
      np.full(count, ellipse_rules.DIRECT, np.int32),
      listed,
      n,
      np.zeros((count, 4, 2), np.int32),
      np.zeros(count, np.int32),
      np.zeros(count, np.int32),
      random_replay.opencv_rng_words(11, 64),
      np.uint64(0),
    ),
  )
  stroke, filled = map(np.asarray, drawing.ellipse_masks(center, size, angle, side, side))
  seen = {}
  for i in range(count):
    cv2.setRNGSeed(11)
    box = cv2.fitEllipse(xy[i][:, None])
    tally = seen.setdefault(int(rule[i]), [0, 0])
    tally[0] += 1
    if rule[i] == ellipse_rules.UNDRAWABLE:
      assert np.isnan(box[1]).any(), i
      tally[1] += 1
      continue
    want = np.float32([*box[0], *box[1], box[2]])
    got = np.float32([*center[i], *size[i], angle[i]])
    if rule[i] in (ellipse_rules.DIRECT, ellipse_rules.DIRECT_RETRIED):
      np.testing.assert_array_equal(got, want, err_msg=f"set {i}: {xy[i].tolist()}")
      tally[1] += 1
      continue
    assert rule[i] == ellipse_rules.DIRECT_FALLBACK, (i, rule[i])
    drawn = []
    for thickness in (1, -1):
      image = np.zeros((side, side), np.uint8)
      cv2.ellipse(image, box, 255, thickness)
      drawn.append(image > 0)
    tally[1] += bool(np.array_equal(stroke[i], drawn[0]) and np.array_equal(filled[i], drawn[1]))
  print({RULE_NAMES[r]: v for r, v in seen.items()})
  # All three outcomes occur: the sample exercises theRNG's retry and the fallback.
  for outcome in (
    ellipse_rules.DIRECT,
    ellipse_rules.DIRECT_RETRIED,
    ellipse_rules.DIRECT_FALLBACK,
  ):
    assert seen[outcome][0] >= 20, seen
  total, same = seen[ellipse_rules.DIRECT_FALLBACK]
  assert same >= 0.97 * total, seen


# ---------------------------------------------------------------------------------------------
# Drawing and pixels


def test_ellipse_masks_are_cv2_ellipse(cv2):
  rng = np.random.default_rng(1)
  height, width = 48, 64
  n = 96
  center = np.stack([rng.uniform(-20, 84, n), rng.uniform(-20, 68, n)], 1).astype(np.float32)
  size = np.sort(10 ** rng.uniform(-1.5, 2.5, (n, 2)), axis=1).astype(np.float32)
  size[:4] = 0  # the deterministic rules' zero-size ellipse
  size[4:8, 0] = 0  # a segment
  angle = rng.uniform(-400, 400, n).astype(np.float32)
  angle[8:16] = np.round(angle[8:16])  # whole degrees, and half degrees (round to even)
  angle[16:20] = np.round(angle[16:20]) + 0.5
  # What an ill-conditioned fit can return: a centre or angle that is not a number (cvRound
  # makes it INT_MIN: nothing drawn, 352 degrees), axes of millions of pixels or past int's
  # range (clipLine intersects in double).
  center[20], angle[21], size[22], size[23] = np.nan, np.nan, (2.5, 6291758.0), (9.0, 3e9)
  size[24, 1] = np.inf
  stroke, filled = map(np.asarray, drawing.ellipse_masks(center, size, angle, height, width))
  for i in range(n):
    box = (tuple(map(float, center[i])), tuple(map(float, size[i])), float(angle[i]))
    image = np.zeros((height, width), np.uint8)
    cv2.ellipse(image, box, 255, 1)
    np.testing.assert_array_equal(stroke[i], image > 0, err_msg=f"stroke {i}: {box}")
    image[:] = 0
    cv2.ellipse(image, box, 255, -1)
    np.testing.assert_array_equal(filled[i], image > 0, err_msg=f"filled {i}: {box}")


def test_gray_and_blur_are_opencvs(cv2):
  image = np.random.default_rng(2).integers(0, 256, (37, 53, 3), dtype=np.uint8)
  np.testing.assert_array_equal(
    np.asarray(pixels.gray_u8(jnp.asarray(image))), cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)
  )
  for size in (3, 5, 9, 11, 15):
    np.testing.assert_array_equal(
      np.asarray(pixels.gaussian_blur_u8(jnp.asarray(image), size)),
      cv2.GaussianBlur(image, (size, size), 0),
      err_msg=f"size {size}",
    )


def test_reference_uint8_is_the_torch_round_trip():
  """CLIP's ToTensor + Normalize in torch, then the reference's show_image and uint8 cast."""
  torch = pytest.importorskip("torch")
  transforms = pytest.importorskip("torchvision.transforms")
  mean, std = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
  values = np.repeat(np.arange(256, dtype=np.uint8)[:, None, None], 3, axis=2)  # [256, 1, 3]
  tensor = transforms.Normalize(mean, std)(transforms.ToTensor()(values))
  x = tensor.numpy().transpose(1, 2, 0)
  want = (np.clip(np.asarray(std) * x + np.asarray(mean), 0, 1) * 255).astype(np.uint8)
  got = np.asarray(pixels.reference_uint8(jnp.asarray(values), mean, std))
  np.testing.assert_array_equal(got, want)
  assert torch.is_tensor(tensor)
  # The truncation loses a grey level on many values (that is the point of reproducing it).
  assert (got[:, 0, 0] != np.arange(256)).sum() > 50


def _agreement(got, want):
  """Share of pixel channels within 1 grey level, and share of exact ones."""
  diff = np.abs(got.astype(np.int32) - want.astype(np.int32))
  return float(np.mean(diff <= 1)), float(np.mean(diff == 0))


def _check_prompts(cv2, images, maps, n_concepts):
  """reference_prompts against the reference's loop run on OpenCV itself, under the protocol
  (random.seed(0) and cv2.setRNGSeed(0) before each image's concepts, visited in colour order):
  pixel-equal, with mutual.ellipse's zero-size box where the reference raises."""
  prompted, valid = map(np.asarray, prompts.reference_prompts(images, maps, n_concepts))
  exact = _is_412(cv2)
  for b in range(len(images)):
    random.seed(0)
    cv2.setRNGSeed(0)
    for c in random_replay.reference_order(n_concepts):
      mask = maps[b] == c
      assert valid[b, c] == mask.any()
      if not mask.any():
        assert (prompted[b, c] == images[b]).all()
        continue
      contour = _opencv_contour(cv2, mask)
      points = contour
      if len(contour) < 5:
        last_x, last_y = (int(v) for v in contour[-1])
        if min(last_x, last_y) < 1:  # randint(0, -1): the reference raises
          box = _zero_box(contour)
        else:
          extra = [
            [random.randint(0, last_x - 1), random.randint(0, last_y - 1)]
            for _ in range(5 - len(contour))
          ]
          points = np.concatenate([contour, np.asarray(extra, np.int32)])
      if len(points) >= 5:
        box = cv2.fitEllipse(points[:, None].astype(np.int32))
        if np.isnan(box[1]).any():
          box = _zero_box(contour)
      want = _opencv_prompts(cv2, images[b], box)
      if exact:
        np.testing.assert_array_equal(prompted[b, c], want, err_msg=f"image {b} concept {c}")
      else:  # before 4.12 fitEllipse's theRNG paths differ: most prompts still agree
        within, _ = _agreement(prompted[b, c], want)
        assert within >= 0.99, (b, c, within)


@pytest.mark.slow
def test_reference_prompts_on_concept_maps_at_224(cv2):
  maps = _concept_maps(np.random.default_rng(3), **CONCEPTS_224)
  images = np.random.default_rng(4).integers(0, 256, (*maps.shape, 3), dtype=np.uint8)
  _check_prompts(cv2, images, maps, CONCEPTS_224["n_concepts"])


@pytest.mark.slow
def test_reference_prompts_on_the_synthetic_world(cv2):
  images, maps = _world_maps(**WORLD, seed=4)
  _check_prompts(cv2, images, maps, WORLD["n_concepts"])


# ---------------------------------------------------------------------------------------------
# visual_prompts' switch


def _to_uint8(unit):
  return np.round(np.asarray(unit) * 255).astype(np.uint8)


@pytest.mark.slow
def test_render_prompts_reference_variant():
  images, maps = _world_maps(**WORLD, seed=5)
  unit = images.astype(np.float32) / 255
  coarse = maps[:, ::8, ::8]  # a patch grid, upsampled nearest inside
  got, valid = visual_prompts.render_prompts(unit, coarse, 3, ellipse="reference")
  upsampled = np.repeat(np.repeat(coarse, 8, axis=1), 8, axis=2)
  want, want_valid = prompts.reference_prompts(images, upsampled, 3)
  np.testing.assert_array_equal(_to_uint8(got), np.asarray(want))
  np.testing.assert_array_equal(np.asarray(valid), np.asarray(want_valid))
  mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
  round_trip, _ = visual_prompts.render_prompts(
    unit, coarse, 3, ellipse="reference", round_trip=(mean, std)
  )
  truncated = np.asarray(pixels.reference_uint8(jnp.asarray(images), mean, std))
  want, _ = prompts.reference_prompts(truncated, upsampled, 3)
  np.testing.assert_array_equal(_to_uint8(round_trip), np.asarray(want))
  default, _ = visual_prompts.render_prompts(unit, coarse, 3)
  moments, _ = visual_prompts.render_prompts(unit, coarse, 3, ellipse="moments")
  np.testing.assert_array_equal(np.asarray(default), np.asarray(moments))
  with pytest.raises(ValueError, match="ellipse must be one of"):
    visual_prompts.render_prompts(unit, coarse, 3, ellipse="opencv")
  with pytest.raises(ValueError, match="thickness must be 1"):
    visual_prompts.render_prompts(unit, coarse, 3, thickness=2.0, ellipse="reference")


@pytest.mark.slow
def test_concept_embeddings_reference_variant(tiny_synthetic):
  bundle = tiny_synthetic
  images, maps = _world_maps(**WORLD, seed=6)
  got, valid = visual_prompts.concept_embeddings(bundle, images, maps, 3, ellipse="reference")
  mean, std = bundle.preprocess_config.mean, bundle.preprocess_config.std
  truncated = np.asarray(pixels.reference_uint8(jnp.asarray(images), mean, std))
  prompted, _ = prompts.reference_prompts(truncated, maps, 3)
  for b in range(len(images)):
    rows = np.asarray(prompted[b]).reshape(-1, 64, 64, 3).astype(np.float32) / 255
    embedded = np.array(bundle.encode_image((rows - np.float32(mean)) / np.float32(std)))
    embedded /= np.linalg.norm(embedded, axis=-1, keepdims=True)
    want = embedded.reshape(3, 3, -1).mean(axis=1)
    for c in range(3):
      if valid[b, c]:
        np.testing.assert_allclose(np.asarray(got[b, c]), want[c], atol=2e-5)
      else:
        assert not np.asarray(got[b, c]).any()
