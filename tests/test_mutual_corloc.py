"""App. A.1's CorLoc (mutual.protocols.localization): boxes and IoU on hand-checked cases, the
VOC reader and the model-input geometry, the refusals before work, and the protocol on the
embedded world (its object masks) and on an image folder with VOC box files."""

import json
import os

import numpy as np
import pytest
from PIL import Image

import stori_jax
from mutual import data, protocols
from mutual.evaluation import runner as evaluation
from mutual.protocols import localization
from stori_jax.plumbing.config_files import ConfigError, load_config
from stori_jax.data.files import DatasetMissingError
from stori_jax.data.images import model_input

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(path="configs/mutual_eval_synthetic.py"):
  return load_config(os.path.join(ROOT, path))


def _voc(path, width, height, boxes):
  """A PASCAL VOC file as ImageNet's val boxes are written (1-based inclusive corners)."""
  objects = "".join(
    f"<object><name>n01</name><bndbox><xmin>{x0}</xmin><ymin>{y0}</ymin><xmax>{x1}</xmax>"
    f"<ymax>{y1}</ymax></bndbox></object>"
    for x0, y0, x1, y1 in boxes
  )
  path.write_text(
    f"<annotation><folder>val</folder><filename>{path.stem}</filename><size><width>{width}"
    f"</width><height>{height}</height><depth>3</depth></size>{objects}</annotation>"
  )


# ---------------------------------------------------------------------------------------------
# Boxes, by hand.


def test_iou_of_hand_checked_boxes():
  a = np.array([0.0, 0.0, 2.0, 2.0])
  # Overlap 1 x 1 of two 2 x 2 boxes: 1 / (4 + 4 - 1).
  assert localization.box_iou(a, [1.0, 1.0, 3.0, 3.0]) == pytest.approx(1 / 7)
  assert localization.box_iou(a, a) == 1.0
  assert localization.box_iou(a, [2.0, 0.0, 4.0, 2.0]) == 0.0  # touching edges
  assert localization.box_iou(a, [0.0, 0.0, 1.0, 2.0]) == 0.5  # half of it
  assert localization.box_iou([np.nan] * 4, a) == 0.0  # no region: never a hit
  # Broadcast: one predicted box against several ground-truth boxes.
  np.testing.assert_allclose(
    localization.box_iou(a[None], [[0, 0, 2, 2], [0, 0, 4, 4], [5, 5, 6, 6]]), [1.0, 0.25, 0.0]
  )


def test_region_boxes_take_the_patch_cells_outer_edges():
  regions = np.zeros((2, 4, 4), bool)
  regions[0, 1:3, 0:2] = True  # rows 1-2, columns 0-1 of a 4 x 4 grid on 32 px: 8-px cells
  regions[0, 3, 3] = True  # the box holds every patch of the region given
  boxes = localization.region_boxes(regions, 32)
  np.testing.assert_array_equal(boxes[0], [0.0, 8.0, 32.0, 32.0])
  assert np.isnan(boxes[1]).all()  # an empty region has no box
  regions[0, 3, 3] = False
  np.testing.assert_array_equal(localization.region_boxes(regions, 32)[0], [0, 8, 16, 24])


def test_mask_boxes_give_one_box_per_object():
  masks = -np.ones((2, 8, 8), np.int8)
  masks[0, 2:4, 1:6] = 0
  masks[0, 6, 7] = 1
  boxes = localization.mask_boxes(masks)
  np.testing.assert_array_equal(boxes[0], [[1, 2, 6, 4], [7, 6, 8, 7]])
  assert boxes[1].shape == (0, 4)  # no object: no box


def test_localised_needs_iou_above_the_threshold_with_any_box():
  truth = [np.array([[0.0, 0.0, 1.0, 1.0], [4.0, 4.0, 6.0, 6.0]]), np.zeros((0, 4))]
  half = np.array([[0.0, 0.0, 2.0, 1.0], [0.0, 0.0, 1.0, 1.0]])  # IoU 0.5 with the first box
  np.testing.assert_array_equal(localization.localised(half, truth), [False, False])
  np.testing.assert_array_equal(localization.localised(half, truth, 0.49), [True, False])
  second = np.array([[4.0, 4.0, 6.0, 6.5], [np.nan] * 4])  # the second box: IoU 4 / 5
  np.testing.assert_array_equal(localization.localised(second, truth), [True, False])
  with pytest.raises(ValueError, match="2 predicted boxes for 1 images"):
    localization.localised(half, truth[:1])


def test_trivial_boxes_are_the_image_and_its_centre():
  boxes = localization.trivial_boxes(64)
  np.testing.assert_array_equal(boxes["whole_image"], [0, 0, 64, 64])
  np.testing.assert_array_equal(boxes["centre"], [16, 16, 48, 48])


# ---------------------------------------------------------------------------------------------
# VOC files and the model input's geometry.


def test_voc_reader_and_the_resize_crop_geometry(tmp_path):
  path = tmp_path / "ILSVRC2012_val_00000001.xml"
  # Landscape 400 x 300 -> 200 x 150, crop columns 25..175. The second box lies in the cut-off
  # left strip, the third straddles the right edge.
  _voc(path, 400, 300, [(101, 51, 300, 250), (1, 1, 40, 300), (301, 1, 400, 100)])
  width, height, boxes = localization.read_voc_boxes(str(path))
  assert (width, height) == (400, 300)
  np.testing.assert_array_equal(boxes[0], [100, 50, 300, 250])  # 1-based inclusive -> [x0, x1)
  moved = localization.input_boxes(boxes, width, height, 150)
  np.testing.assert_allclose(moved, [[25, 25, 125, 125], [125, 0, 150, 50]])
  # The same geometry as the pixels: a white rectangle drawn at the first box lands there.
  canvas = np.zeros((300, 400, 3), np.uint8)
  canvas[50:250, 100:300] = 255
  shown = model_input(canvas, 150)[..., 0] > 127
  rows, cols = np.nonzero(shown)
  np.testing.assert_allclose([cols.min(), rows.min(), cols.max() + 1, rows.max() + 1], moved[0])


def test_voc_reader_names_the_broken_file(tmp_path):
  bad = tmp_path / "bad.xml"
  bad.write_text("<annotation><size><width>ten</width></size></annotation>")
  with pytest.raises(stori_jax.plumbing.errors.InputError, match="bad.xml.*<width>"):
    localization.read_voc_boxes(str(bad))
  (tmp_path / "not.xml").write_text("not xml <")
  with pytest.raises(stori_jax.plumbing.errors.InputError, match="not.xml"):
    localization.read_voc_boxes(str(tmp_path / "not.xml"))


def test_box_files_are_found_flat_or_per_class(tmp_path):
  _voc(tmp_path / "a.xml", 10, 10, [(1, 1, 5, 5)])
  os.makedirs(tmp_path / "n02")
  _voc(tmp_path / "n02" / "b.xml", 10, 10, [(1, 1, 5, 5)])
  assert localization.box_file(str(tmp_path), "n01/a.JPEG") == str(tmp_path / "a.xml")
  assert localization.box_file(str(tmp_path), "n02/b.png") == str(tmp_path / "n02" / "b.xml")
  assert localization.box_file(str(tmp_path), "n01/c.JPEG") is None


# ---------------------------------------------------------------------------------------------
# Splits on constructed features.


def test_gdc_and_pca_find_a_distinct_object_in_constructed_features():
  rng = np.random.default_rng(0)
  features = np.tile(rng.normal(size=16), (2, 6, 6, 1)) + 0.01 * rng.normal(size=(2, 6, 6, 16))
  # The same kind of "object", 6 patches in each image, on a background shared by both.
  offset = 3.0 * rng.normal(size=16)
  features[0, 1:3, 2:5] += offset
  features[1, 3:6, 0:2] += offset
  features = features.astype(np.float32)
  for decomposition in localization.DECOMPOSITIONS:
    for joint in (True, False):
      region = np.asarray(localization.prominent_region(features, decomposition, joint=joint))
      assert region[0, 1:3, 2:5].all() and region[0].sum() == 6, (decomposition, joint)
      assert region[1, 3:6, 0:2].all() and region[1].sum() == 6, (decomposition, joint)
  with pytest.raises(ValueError, match="decomposition"):
    localization.prominent_region(features, "ica")


@pytest.mark.parametrize("shape", [(12, 30), (40, 6)])  # the [N, N] and the [D, D] Gram
def test_first_component_scores_are_the_svds_up_to_sign(shape):
  rng = np.random.default_rng(2)
  flat = (rng.normal(size=shape) * np.linspace(3, 0.1, shape[1]) + 5.0).astype(np.float32)
  centred = flat.astype(np.float64) - flat.mean(axis=0)
  u, s, _ = np.linalg.svd(centred, full_matrices=False)
  expected = u[:, 0] * s[0]
  scores = np.asarray(localization.first_component_scores(flat), np.float64)
  sign = np.sign(scores @ expected)
  np.testing.assert_allclose(sign * scores, expected, rtol=1e-3, atol=1e-3 * s[0])


def test_ensemble_rows_average_the_two_affinities():
  rng = np.random.default_rng(1)
  tokens = rng.normal(size=(1, 2, 2, 6)).astype(np.float32)
  keys = rng.normal(size=(1, 2, 2, 4)).astype(np.float32)
  both = np.asarray(localization.ensemble_features(tokens, keys)).reshape(4, -1)
  unit = lambda x: (x / np.linalg.norm(x, axis=-1, keepdims=True)).reshape(4, -1)
  expected = (unit(tokens) @ unit(tokens).T + unit(keys) @ unit(keys).T) / 2
  rows = both / np.linalg.norm(both, axis=-1, keepdims=True)
  np.testing.assert_allclose(rows @ rows.T, expected, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# Refusals before work.


def test_settings_are_checked():
  settings = _config().protocols.corloc
  localization.check_settings(settings)
  for key, value, match in (
    ("facets", ("tokens", "values"), "facets"),
    ("facets", (), "facets"),
    ("decompositions", ("svd",), "decompositions"),
    ("iou_threshold", 1.5, r"\[0, 1\)"),
  ):
    bad = settings.copy_and_resolve_references()
    bad[key] = value
    with pytest.raises(ConfigError, match=match):
      localization.check_settings(bad)


def _folder_config(tmp_path, boxes=""):
  """configs/mutual_eval_imagenet.py on a 2-class image folder (64-px PNGs of the embedded
  world, written losslessly) with the tiny model; returns (config, the images' truth)."""
  names = list(data.synthetic_descriptors())[:2]
  truths = {}
  for key, label in (("n01", 0), ("n02", 7)):
    cls = next(data.synthetic_classes(3, seed=4, classes=(label,)))
    os.makedirs(tmp_path / "val" / key)
    for i, image in enumerate(cls.images):
      Image.fromarray(image).save(tmp_path / "val" / key / f"img_{key}_{i}.png")
    truths[key] = cls
  path = tmp_path / "descriptors.json"
  path.write_text(json.dumps({n: data.synthetic_descriptors()[n] for n in names}))
  (tmp_path / "classnames.txt").write_text(f"n01 {names[0]}\nn02 {names[1]}\n")
  config = _config("configs/mutual_eval_imagenet.py")
  config.model.source = config.model.name = "tiny-synthetic"
  config.data.root = str(tmp_path / "val")
  config.data.descriptors = str(path)
  config.data.classnames = str(tmp_path / "classnames.txt")
  config.baselines.enabled = False
  config.protocols.corloc.boxes = boxes
  return config, truths


def _write_boxes(folder, truths):
  os.makedirs(folder, exist_ok=True)
  for key, cls in truths.items():
    for i, boxes in enumerate(localization.mask_boxes(cls.truth.masks)):
      # Back to VOC's 1-based inclusive corners.
      corners = [(int(x0) + 1, int(y0) + 1, int(x1), int(y1)) for x0, y0, x1, y1 in boxes]
      _voc(folder / f"img_{key}_{i}.xml", 64, 64, corners)


def test_real_data_without_boxes_is_refused_before_work(tmp_path):
  config, truths = _folder_config(tmp_path)
  out = tmp_path / "out"
  with pytest.raises(ConfigError, match="corloc.boxes.*ILSVRC2012_bbox_val_v3"):
    evaluation.run(config, str(out), progress=False)
  assert not out.exists()  # refused before the workdir was claimed
  config.protocols.corloc.boxes = str(tmp_path / "boxes")
  with pytest.raises(DatasetMissingError, match="does not exist"):
    evaluation.run(config, str(out), progress=False)
  _write_boxes(tmp_path / "boxes", truths)
  os.remove(tmp_path / "boxes" / "img_n02_1.xml")
  with pytest.raises(DatasetMissingError, match=r"1 evaluation images .*img_n02_1"):
    evaluation.run(config, str(out), progress=False)
  assert not out.exists()
  config.data.source = "tfds"
  with pytest.raises(ConfigError, match="file name"):
    localization.check_inputs(config, None)


# ---------------------------------------------------------------------------------------------
# The protocol.


@pytest.fixture(scope="module")
def bundle():
  return stori_jax.load("tiny-synthetic")


def test_corloc_from_voc_files_equals_corloc_from_the_masks(tmp_path, bundle):
  """The folder path (PNG images and VOC box files written from the embedded world's masks)
  scores exactly as the masks of the same images."""
  config, truths = _folder_config(tmp_path, boxes=str(tmp_path / "boxes"))
  _write_boxes(tmp_path / "boxes", truths)
  dataset = data.prepare(config)
  localization.check_inputs(config, dataset)
  settings = config.protocols.corloc
  from_files = protocols.corloc(
    bundle, dataset.classes(64), config.analysis, settings, progress=False
  )
  from_masks = protocols.corloc(bundle, truths.values(), config.analysis, settings, progress=False)
  assert from_files["boxes"] == "VOC files" and from_masks["boxes"] == "object masks"
  assert from_files["images"] == 6 and from_files["images_without_box"] == 0
  for key in ("corloc", "region_fraction", "trivial"):
    assert from_files[key] == from_masks[key], key


@pytest.mark.slow
def test_corloc_on_the_embedded_world(bundle):
  """configs/mutual_eval_synthetic.py (12 classes x 16 images, per-image splits). Measured:
  CorLoc (%) keys GDC 5.2 / PCA 72.9, tokens GDC 21.4 / PCA 75.0, ensemble GDC 13.0 / PCA
  78.6; whole image 0.0, centre box 14.1. The objects cover 2-13% of the image, so the whole
  image never reaches IoU 0.5; on this tiny model PCA localises them far better than GDC (the
  opposite of the paper's ViT-B/16), whose region is too large (about a quarter of the grid)."""
  config = _config()
  dataset = data.prepare(config)
  result = protocols.corloc(
    bundle, dataset.classes(64), config.analysis, config.protocols.corloc, progress=False
  )
  c = result["corloc"]
  assert result["images"] == 192 and result["boxes"] == "object masks"
  assert result["trivial"]["whole_image"] == 0.0
  # GDC's tokens, the pipeline's split, well above the trivial boxes (measured 21.4 vs 0.0).
  assert c["tokens"]["gdc"] >= result["trivial"]["whole_image"] + 10
  # PCA localises most objects (measured 73-79 on every facet) and beats the centre box.
  for facet in localization.FACETS:
    assert c[facet]["pca"] >= 50, facet
    assert c[facet]["pca"] >= result["trivial"]["centre"] + 30, facet
  # Regions on the 8 x 8 grid: the positive side, never everything.
  for facet, by in result["region_fraction"].items():
    assert all(0 < share < 0.5 for share in by.values()), facet
  table = protocols.markdown("corloc", {"tiny-synthetic": result})
  rows = [line.split("|")[1].strip() for line in table.splitlines()[2:]]
  assert rows[:6] == [
    "Keys (GDC)",
    "Keys (PCA)",
    "Tokens (GDC)",
    "Tokens (PCA)",
    "Ensemble (GDC)",
    "Ensemble (PCA)",
  ]  # App. A.1's Table 1 order
  assert f"| Tokens (GDC) | {c['tokens']['gdc']:.1f} |" in table
