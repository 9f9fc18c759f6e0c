"""App. A.1 of the mutual-knowledge paper, its Table 1: CorLoc of the prominent region for each
feature facet (tokens, keys, their ensemble) and decomposition (GDC, the spectral split of the
patch affinity that the pipeline uses, or PCA) (`corloc`).

A bounding box is fitted around the most prominent region of an image and the image counts as
localised when that box's IoU with a ground-truth box exceeds 0.5. The ground-truth boxes are
the embedded world's object masks' boxes, or, for real data, PASCAL VOC XML files (ImageNet's
val boxes, ILSVRC2012_bbox_val_v3), mapped through the model's resize and centre crop.

Boxes are (x0, y0, x1, y1) in pixels of the model input, continuous coordinates: pixel column
c spans [c, c + 1), so a region of patch columns c0..c1 on an S-pixel input with g patches a
side spans [c0 * S / g, (c1 + 1) * S / g).
"""

from __future__ import annotations

import functools
import os
import xml.etree.ElementTree as ElementTree
from typing import Any, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mutual import features, foreground, paper_config, pipeline
from mutual.protocols.progress import stage_bar
from mutual.protocols.zero_shot import percent
from stori_jax.plumbing import paths
from stori_jax.plumbing.config_files import ConfigError
from stori_jax.data.files import DatasetMissingError
from stori_jax.clip.encoding import l2_normalize_jax
from stori_jax.plumbing.errors import InputError
from stori_jax.data.preprocess import normalize, resize_crop_geometry

#: The feature facets of App. A.1, in its Table 1's order: the last block's keys, its tokens,
#: and their ensemble (`ensemble_features`).
FACETS = ("keys", "tokens", "ensemble")
#: The decompositions: "gdc", the graph decomposition (the second eigenvector of the affinity
#: of the L2-normalised patch features, mutual.foreground, as the pipeline splits); "pca", the
#: first principal component of the patch features (`pca_split`).
DECOMPOSITIONS = ("gdc", "pca")
FACET_TITLES = {"keys": "Keys", "tokens": "Tokens", "ensemble": "Ensemble"}
DECOMPOSITION_TITLES = {"gdc": "GDC", "pca": "PCA"}
#: Boxes that look at no feature, as the floor a decomposition must clear: the whole image, and
#: the centred box of half the image's side.
TRIVIAL_BOXES = ("whole_image", "centre")
TRIVIAL_TITLES = {"whole_image": "Whole image (trivial box)", "centre": "Centre, half side"}

_HIGHEST = jax.lax.Precision.HIGHEST  # accelerators would otherwise multiply in bf16 / tf32


# ---------------------------------------------------------------------------------------------
# Boxes.


def box_iou(a, b) -> np.ndarray:
  """Intersection over union of boxes (x0, y0, x1, y1) float [..., 4], broadcast against each
  other; float64 [...]. A NaN box (no region) has IoU 0 with everything."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  width = np.clip(np.minimum(a[..., 2], b[..., 2]) - np.maximum(a[..., 0], b[..., 0]), 0, None)
  height = np.clip(np.minimum(a[..., 3], b[..., 3]) - np.maximum(a[..., 1], b[..., 1]), 0, None)
  inter = width * height
  area = lambda x: (x[..., 2] - x[..., 0]) * (x[..., 3] - x[..., 1])
  union = area(a) + area(b) - inter
  with np.errstate(invalid="ignore", divide="ignore"):
    out = np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)
  return np.nan_to_num(out, nan=0.0)


def region_boxes(regions, size: int) -> np.ndarray:
  """Boxes around patch regions.

  Args:
    regions: bool [B, h, w] on the patch grid.
    size: the model input's side S in pixels.

  Returns:
    float64 [B, 4] (x0, y0, x1, y1) in input pixels, the patch cells' outer edges; NaN rows
    for an empty region.
  """
  regions = np.asarray(regions, bool)
  _, height, width = regions.shape
  out = np.full((len(regions), 4), np.nan)
  for i, region in enumerate(regions):
    rows, cols = np.flatnonzero(region.any(axis=1)), np.flatnonzero(region.any(axis=0))
    if len(rows):
      out[i] = (
        cols[0] * size / width,
        rows[0] * size / height,
        (cols[-1] + 1) * size / width,
        (rows[-1] + 1) * size / height,
      )
  return out


def mask_boxes(masks) -> list[np.ndarray]:
  """The boxes of the embedded world's objects.

  Args:
    masks: int [B, H, W], an object slot per pixel, -1 for background (SyntheticBatch.masks).

  Returns:
    B arrays float64 [n_i, 4], one box per object present (slot order), in pixels.
  """
  out = []
  for mask in np.asarray(masks):
    boxes = []
    for slot in np.unique(mask[mask >= 0]):
      rows, cols = np.nonzero(mask == slot)
      boxes.append((cols.min(), rows.min(), cols.max() + 1, rows.max() + 1))
    out.append(np.asarray(boxes, np.float64).reshape(-1, 4))
  return out


def localised(predicted, truth: Sequence[np.ndarray], threshold: float = 0.5) -> np.ndarray:
  """CorLoc's test per image: the predicted box's IoU with one of the image's ground-truth
  boxes exceeds `threshold` (any box counts, as in CorLoc's usual definition).

  Args:
    predicted: float [B, 4] (NaN rows: no region, never localised).
    truth: B arrays float [n_i, 4] (n_i = 0: never localised).

  Returns:
    bool [B].
  """
  predicted = np.asarray(predicted, np.float64)
  if len(predicted) != len(truth):
    raise ValueError(f"{len(predicted)} predicted boxes for {len(truth)} images")
  return np.array(
    [len(t) > 0 and bool((box_iou(p[None], t) > threshold).any()) for p, t in zip(predicted, truth)]
  )


def read_voc_boxes(path: str) -> tuple[int, int, np.ndarray]:
  """A PASCAL VOC annotation (ImageNet's val box files are in this format).

  The corner fields are VOC's 1-based inclusive pixel indices; a box xmin..xmax covers the
  continuous span [xmin - 1, xmax).

  Returns:
    (image width, image height, boxes float64 [n, 4] (x0, y0, x1, y1) in the image's pixels,
     continuous 0-based coordinates).

  Raises:
    InputError: the file is not such an annotation (the message names the file and field).
  """
  try:
    root = ElementTree.fromstring(paths.read_bytes(path))
  except (ElementTree.ParseError, OSError) as error:
    raise InputError(
      f"Cannot read the box file {path}: {error}. Box files are PASCAL VOC XML (ImageNet's "
      "ILSVRC2012_bbox_val_v3 files)."
    ) from None

  def number(node, field: str) -> float:
    text = node.findtext(field) if node is not None else None
    try:
      return float(text)
    except (TypeError, ValueError):
      raise InputError(
        f"The box file {path} has no number in <{field}> (got {text!r}): it is not a PASCAL "
        "VOC annotation with <size><width>/<height> and <object><bndbox> corners."
      ) from None

  size = root.find("size")
  width, height = int(number(size, "width")), int(number(size, "height"))
  boxes = []
  for box in root.iter("bndbox"):
    x0, y0 = number(box, "xmin") - 1.0, number(box, "ymin") - 1.0
    boxes.append((x0, y0, number(box, "xmax"), number(box, "ymax")))
  return width, height, np.asarray(boxes, np.float64).reshape(-1, 4)


def input_boxes(boxes, width: int, height: int, size: int) -> np.ndarray:
  """Boxes of a width x height image -> the same boxes on the model input (shorter side resized
  to `size`, then the centre crop: stori_jax.data.preprocess.resize_center_crop), clipped to the
  crop; boxes left with no area (outside the crop) are dropped. float64 [n, 4] -> [m, 4]."""
  new_w, new_h, left, top = resize_crop_geometry(width, height, size)
  boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
  scale = np.array([new_w / width, new_h / height] * 2)
  shift = np.array([left, top] * 2, np.float64)
  moved = np.clip(boxes * scale - shift, 0.0, float(size))
  keep = (moved[:, 2] > moved[:, 0]) & (moved[:, 3] > moved[:, 1])
  return moved[keep]


def box_file(boxes_dir: str, image_id: str) -> str | None:
  """The VOC file of an image: <boxes_dir>/<file stem>.xml (ImageNet's layout), else
  <boxes_dir>/<class folder>/<file stem>.xml; None where neither exists.

  Args:
    image_id: the image's id in mutual.data ("<class folder>/<file name>")."""
  folder, name = os.path.split(image_id)
  stem = os.path.splitext(name)[0] + ".xml"
  for path in (os.path.join(boxes_dir, stem), os.path.join(boxes_dir, folder, stem)):
    if paths.isfile(path):
      return path
  return None


def truth_boxes(cls, size: int, boxes_dir: str = "") -> list[np.ndarray]:
  """The ground-truth boxes of one class's images on the model input: its object masks'
  (cls.truth, the embedded world) or its VOC files (under `boxes_dir`). B arrays [n_i, 4]."""
  if cls.truth is not None:
    return mask_boxes(cls.truth.masks)
  if not boxes_dir:
    raise ValueError(f"class {cls.name!r} has no object masks and no box folder was given")
  out = []
  for image_id in cls.ids:
    path = box_file(boxes_dir, image_id)
    if path is None:
      raise DatasetMissingError(f"No box file for the image {image_id} under {boxes_dir}.")
    width, height, boxes = read_voc_boxes(path)
    out.append(input_boxes(boxes, width, height, size))
  return out


def trivial_boxes(size: int) -> dict[str, np.ndarray]:
  """TRIVIAL_BOXES on an S-pixel input: {name: float64 [4]}."""
  quarter = size / 4.0
  return dict(
    whole_image=np.array([0.0, 0.0, size, size]),
    centre=np.array([quarter, quarter, 3 * quarter, 3 * quarter]),
  )


# ---------------------------------------------------------------------------------------------
# Regions.


def ensemble_features(tokens, keys) -> jax.Array:
  """The ensemble facet: each patch's L2-normalised token and L2-normalised key concatenated,
  float32 [B, h, w, D_tokens + D_keys]. Both facets weigh the same: the cosine affinity of
  these rows (once normalised again, as GDC does) is the mean of the two facets' affinities."""
  return jnp.concatenate(
    [l2_normalize_jax(jnp.asarray(tokens, jnp.float32)), l2_normalize_jax(jnp.asarray(keys))],
    axis=-1,
  )


def _smaller_side_positive(scores: jax.Array) -> jax.Array:
  """The sign rule of mutual.foreground: negated when the share of positive scores lies
  strictly between 0.5 and 1, so the positive (prominent) side is the smaller one."""
  positive = jnp.mean(scores > 0)
  return jnp.where((positive > 0.5) & (positive < 1.0), -scores, scores)


def first_component_scores(flat: jax.Array) -> jax.Array:
  """The rows' scores on the first principal component, up to sign: float32 [N] from [N, D].

  From the smaller of the centred rows' two Gram matrices ([N, N] or [D, D], as
  mutual.foreground finds its eigenvector): the top eigenvector u of x x^T is the scores'
  direction; the top eigenvector v of x^T x gives the scores x v.
  """
  x = flat - jnp.mean(flat, axis=0)
  n, d = x.shape
  if n <= d:
    values, vectors = jnp.linalg.eigh(jnp.matmul(x, x.T, precision=_HIGHEST))
    return vectors[:, -1] * jnp.sqrt(jnp.maximum(values[-1], 0.0))
  _, vectors = jnp.linalg.eigh(jnp.matmul(x.T, x, precision=_HIGHEST))
  return jnp.matmul(x, vectors[:, -1], precision=_HIGHEST)


def _pca_one(features: jax.Array) -> jax.Array:
  scores = first_component_scores(features.reshape(-1, features.shape[-1]))
  return (_smaller_side_positive(scores) > 0).reshape(features.shape[:-1])


@functools.partial(jax.jit, static_argnames=("joint",))
def pca_split(features, joint: bool = True) -> jax.Array:
  """PCA's foreground: the sign of the patches' scores on the first principal component of
  their (raw, centred) features, the positive side made the smaller one as the GDC split's.

  Args:
    features: float32 [B, h, w, D].
    joint: one component over all B images' patches (as the pipeline's joint split); False:
      one per image.

  Returns:
    bool [B, h, w].
  """
  features = jnp.asarray(features, jnp.float32)
  if joint:
    return _pca_one(features)
  return jax.vmap(lambda f: _pca_one(f[None])[0])(features)


def prominent_region(
  features, decomposition: str, joint: bool = True, center: bool = False
) -> jax.Array:
  """The most prominent region of each image: the largest 8-connected region of the positive
  side of the split (only the largest: the pipeline's second region is not kept).

  Args:
    features: float32 [B, h, w, D] patch features.
    decomposition: "gdc" (foreground.prominent_patches' split, `center` as its option) or
      "pca" (`pca_split`).
    joint: split all B images together (config.analysis.joint_foreground) or each alone.

  Returns:
    bool [B, h, w].
  """
  if decomposition == "gdc":
    return foreground.prominent_patches(features, keep_second=False, center=center, joint=joint)
  if decomposition == "pca":
    return foreground.main_regions(pca_split(features, joint=joint), keep_second=False)
  raise ValueError(f"decomposition must be one of {DECOMPOSITIONS}, got {decomposition!r}.")


# ---------------------------------------------------------------------------------------------
# Checks before any work.


def _settings(settings):
  return settings if settings is not None else paper_config.protocols_config().corloc


def check_settings(settings) -> None:
  """Raises ConfigError for config.protocols.corloc values that cannot run."""
  facets, decompositions = tuple(settings.facets), tuple(settings.decompositions)
  if not facets or set(facets) - set(FACETS) or len(set(facets)) != len(facets):
    raise ConfigError(
      f"config.protocols.corloc.facets must list some of {FACETS}, each once, got {facets!r}."
    )
  if not decompositions or set(decompositions) - set(DECOMPOSITIONS):
    raise ConfigError(
      "config.protocols.corloc.decompositions must list some of "
      f"{DECOMPOSITIONS}, got {decompositions!r}."
    )
  threshold = settings.iou_threshold
  if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
    raise ConfigError(
      f"config.protocols.corloc.iou_threshold must be a number in [0, 1), got {threshold!r}."
    )
  if not 0 <= threshold < 1:
    raise ConfigError(
      f"config.protocols.corloc.iou_threshold must be in [0, 1) (the paper's: 0.5), got "
      f"{threshold!r}."
    )


def check_inputs(config, dataset) -> None:
  """CorLoc needs ground-truth boxes: the embedded world has them (its object masks); an image
  folder needs config.protocols.corloc.boxes, a folder of PASCAL VOC XML files holding one for
  every image chosen; a TFDS split is refused (its images have no file names to find them by).

  Args:
    config: the evaluation config (data.source, protocols.corloc).
    dataset: config.data's mutual.data.Dataset (its images are not read here).

  Raises:
    ConfigError / DatasetMissingError naming what is missing and how to give it.
  """
  settings = _settings(config.protocols.get("corloc", None))
  check_settings(settings)
  source = config.data.source
  if source == "synthetic":
    return
  leave_out = (
    "or leave 'corloc' out of config.evaluation.protocols (e.g. "
    "--config.evaluation.protocols=table2,layer_similarity,ot_entropy,blur,bank_quality)."
  )
  if source != "folder":
    raise ConfigError(
      f"CorLoc (App. A.1) finds each image's ground-truth box file by the image's file name, "
      f"which config.data.source={source!r} does not give: evaluate an image folder "
      f"(config.data.source='folder') with config.protocols.corloc.boxes, {leave_out}"
    )
  boxes = settings.boxes
  if not boxes:
    raise ConfigError(
      "CorLoc (App. A.1) needs ground-truth boxes for real images: set "
      "--config.protocols.corloc.boxes to a folder of PASCAL VOC XML files named after the "
      "images (ImageNet: ILSVRC2012_bbox_val_v3.tgz from https://image-net.org, extracted: "
      f"<folder>/ILSVRC2012_val_00000001.xml ...), {leave_out}"
    )
  if not paths.isdir(boxes):
    raise DatasetMissingError(
      f"The box folder {paths.absolute(boxes)} (config.protocols.corloc.boxes) does not "
      "exist: extract the PASCAL VOC XML box files there (ImageNet: ILSVRC2012_bbox_val_v3.tgz), "
      f"{leave_out}"
    )
  missing = [
    i
    for cls in dataset.classes(32, read=lambda _: False)  # ids only: no image is read
    for i in cls.ids
    if box_file(boxes, i) is None
  ]
  if missing:
    raise DatasetMissingError(
      f"{len(missing)} evaluation images have no box file in {paths.absolute(boxes)} (e.g. "
      f"{missing[:3]}): each image <class>/<name>.<ext> needs <boxes>/<name>.xml or "
      f"<boxes>/<class>/<name>.xml; add them, {leave_out}"
    )


# ---------------------------------------------------------------------------------------------
# The protocol.


def _kinds(facets: Iterable[str], has_keys: bool) -> tuple[str, ...]:
  needed = set()
  for facet in facets:
    if facet == "ensemble":
      needed |= {"tokens", "keys"}
    else:
      needed.add(facet)
  if not has_keys:
    needed.discard("keys")
  return tuple(k for k in features.FEATURE_KINDS if k in needed)


def corloc(
  bundle, classes: Iterable, analysis, settings=None, *, progress: bool = True
) -> dict[str, Any]:
  """App. A.1's Table 1: CorLoc (%) of the most prominent region per facet and decomposition.

  Per class (the B images of a class are split jointly when config.analysis.joint_foreground
  is set, as the analysis splits them), each facet's patch features are split by each
  decomposition, the largest connected region of the prominent side kept, and a box fitted
  around its patches; an image is localised when that box's IoU with one of its ground-truth
  boxes exceeds settings.iou_threshold. The trivial boxes (TRIVIAL_BOXES) are scored the same
  way. Images with no ground-truth box on the model input (a VOC box outside the centre crop)
  are left out and counted.

  Args:
    bundle: a CLIPBundle (its towers run in config.analysis.compute_dtype).
    classes: iterable of mutual.data.ClassImages (consumed once): the embedded world's carry
      their object masks; others need settings.boxes (see `check_inputs`).
    analysis: config.analysis (joint_foreground, center_features (GDC's option), compute_dtype,
      tower_batch).
    settings: config.protocols.corloc (facets, decompositions, iou_threshold, boxes); None:
      the defaults.

  Returns:
    dict: corloc {facet: {decomposition: percent, None where the tower has no keys}};
    region_fraction {facet: {decomposition: mean share of the patches in the region}};
    trivial {name: percent}; images (scored); images_without_box; joint; iou_threshold;
    boxes ("object masks" or "VOC files").
  """
  s = _settings(settings)
  check_settings(s)
  facets, decompositions = tuple(s.facets), tuple(s.decompositions)
  threshold = float(s.iou_threshold)
  joint = bool(analysis.joint_foreground)
  center = bool(analysis.center_features)
  tower = pipeline.tower_bundle(bundle, analysis)
  has_keys = features.has_keys(tower)
  kinds = _kinds(facets, has_keys)
  per_pass = features.images_per_pass(
    tower, int(paper_config.analysis_value(analysis, "tower_batch"))
  )
  available = [f for f in facets if has_keys or f == "tokens"]
  hits: dict[tuple[str, str], list] = {(f, d): [] for f in available for d in decompositions}
  shares: dict[tuple[str, str], list] = {key: [] for key in hits}
  trivial_hits: dict[str, list] = {name: [] for name in TRIVIAL_BOXES}
  without_box, source = 0, None
  for cls in stage_bar(
    classes, "App. A.1: CorLoc of the prominent region (classes)", show=progress
  ):
    images = np.asarray(cls.images)
    if images.dtype != np.uint8 or images.ndim != 4:
      raise ValueError(f"images must be uint8 [B, S, S, 3], got {images.dtype} {images.shape}")
    size = images.shape[1]
    truth = truth_boxes(cls, size, s.boxes)
    source = "object masks" if cls.truth is not None else "VOC files"
    scored = np.array([len(t) > 0 for t in truth])
    without_box += int((~scored).sum())
    if not scored.any():
      continue
    truth = [t for t, keep in zip(truth, scored) if keep]
    x = normalize(images, tower.preprocess_config.mean, tower.preprocess_config.std)
    grids = features.facet_grids(tower, x, kinds, per_pass=per_pass)
    grids = {k: v.astype(jnp.float32) for k, v in grids.items()}
    if "ensemble" in available:
      grids["ensemble"] = ensemble_features(grids["tokens"], grids["keys"])
    for facet in available:
      for decomposition in decompositions:
        # The split sees every image of the class (a joint split is over all of them).
        region = np.asarray(prominent_region(grids[facet], decomposition, joint, center))[scored]
        boxes = region_boxes(region, size)
        hits[facet, decomposition].append(localised(boxes, truth, threshold))
        shares[facet, decomposition].append(region.reshape(len(region), -1).mean(axis=1))
    for name, box in trivial_boxes(size).items():
      trivial_hits[name].append(localised(np.repeat(box[None], len(truth), 0), truth, threshold))
  if not trivial_hits["whole_image"]:
    raise ValueError(
      "no image with a ground-truth box to score: the class iterator was empty, or every "
      "image's boxes fell outside the model's centre crop"
    )
  rate = lambda parts: percent(np.concatenate(parts).mean())
  return dict(
    corloc={
      f: {d: rate(hits[f, d]) if (f, d) in hits else None for d in decompositions} for f in facets
    },
    region_fraction={
      f: {d: round(float(np.concatenate(shares[f, d]).mean()), 4) for d in decompositions}
      for f in available
    },
    trivial={name: rate(parts) for name, parts in trivial_hits.items()},
    images=int(sum(len(h) for h in trivial_hits["whole_image"])),
    images_without_box=without_box,
    joint=joint,
    iou_threshold=threshold,
    boxes=source,
  )
