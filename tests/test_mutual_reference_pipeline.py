"""Reference mode against the reference code's own libraries (issue 18): SimpleCRF's lattice CRF
label for label, the stages that follow config.analysis.mode, and (slow) per-image MI and AUC of
mutual.pipeline in reference mode against mutual.reference on the embedded
world."""

import numpy as np
import pytest

from mutual import concept_methods, crf, paper_config, pipeline, visual_prompts, xai
from mutual.protocols import blur
from stori_jax.data import synthetic

TOLERANCE = dict(rtol=1e-5, atol=1e-5)  # float32 MI values are about 5
REQUIRED = 0.95


def _blocky_masks(count, size=64, grid=8, seed=0):
  rng = np.random.default_rng(seed)
  coarse = rng.random((count, grid, grid)) < 0.4
  return np.repeat(np.repeat(coarse, size // grid, axis=1), size // grid, axis=2)


def test_lattice_crf_is_simplecrfs():
  """crf.refine(filter="lattice") gives SimpleCRF's labels (the reference's densecrf call)."""
  dense_crf = pytest.importorskip("denseCRF")
  images = synthetic.generate(6, (0, 0), image_size=64, max_objects=1).images
  masks = _blocky_masks(6)
  got = np.asarray(crf.refine(images, masks, confidence=0.99, filter="lattice"))
  unary = np.eye(2, dtype=np.float32)
  want = np.stack(
    [
      dense_crf.densecrf(im, unary[m.astype(int)], (10.0, 40.0, 13.0, 3.0, 3.0, 5.0)) != 0
      for im, m in zip(images, masks)
    ]
  )
  np.testing.assert_array_equal(got, want)
  exact = np.asarray(crf.refine(images, masks, confidence=0.99))
  assert (exact != want).sum() > 0  # the exact kernels are not the reference's


@pytest.mark.slow
def test_blur_protocol_crf_follows_the_mode(tiny_synthetic, monkeypatch):
  """App. A.3's CRF takes the analysis mode's confidence and filter unless one is set."""
  seen = []
  original = crf.refine

  def spy(images, mask, **kwargs):
    seen.append((kwargs["confidence"], kwargs["filter"], kwargs["round_trip"] is not None))
    return original(images, mask, **{**kwargs, "iterations": 1})

  monkeypatch.setattr(crf, "refine", spy)
  images = synthetic.generate(2, (0, 0), image_size=64, max_objects=1).images
  settings = paper_config.protocols_config().blur
  for mode in ("reference", "improved"):
    analysis = paper_config.analysis_config(mode=mode)
    blur.importance_masks(tiny_synthetic, images, analysis, settings)
  settings.crf.confidence = 0.95
  blur.importance_masks(tiny_synthetic, images, paper_config.analysis_config(), settings)
  assert seen == [(0.99, "lattice", True), (0.9, "exact", False), (0.95, "lattice", True)]


@pytest.mark.slow
def test_region_embeddings_follow_the_ellipse_stage(tiny_synthetic):
  """xai.region_embeddings draws the reference's ellipse when asked, as the analysis does."""
  cls = synthetic.generate(3, (0, 2), image_size=64, max_objects=1)
  maps = np.where(cls.masks >= 0, 0, 1).astype(np.int32)
  maps[:, :8] = -1
  masks = np.asarray(xai.label_masks(maps, 2))
  for ellipse in ("reference", "moments"):
    want, _ = visual_prompts.concept_embeddings(
      tiny_synthetic, cls.images, maps, n_concepts=2, ellipse=ellipse
    )
    got = xai.region_embeddings(tiny_synthetic, cls.images, masks, ellipse=ellipse)
    np.testing.assert_allclose(got, want, atol=1e-4)
  moments = xai.region_embeddings(tiny_synthetic, cls.images, masks)
  assert np.abs(moments - got).max() < 1e-6  # the default stays "moments"
  reference = xai.region_embeddings(tiny_synthetic, cls.images, masks, ellipse="reference")
  assert np.abs(moments - reference).max() > 1e-3


def agreement(ours, theirs, method):
  """bool [B]: identical MI and AUC (float32 tolerance) per image."""
  mine = pipeline.summarise(ours, method)
  return np.isclose(mine["mi"], theirs[method]["mi"], **TOLERANCE) & np.isclose(
    mine["auc"], theirs[method]["auc"], **TOLERANCE
  )


@pytest.mark.slow
def test_reference_mode_agrees_with_the_torch_reference_per_image(tiny_synthetic):
  """The embedded world (12 classes x 16 images, configs/mutual_synthetic.py's data and bank)
  in reference mode, with the reference's joint spectral split and its CRF (SimpleCRF, or off
  on both sides where it is not installed): identical MI and AUC on >= 95% of the images for
  PCA and for K-means."""
  torch_reference = pytest.importorskip("mutual.reference")
  pytest.importorskip("kmeans_pytorch")
  from configs import mutual_synthetic  # pylint: disable=import-outside-toplevel
  from mutual import data  # pylint: disable=import-outside-toplevel

  use_crf = torch_reference.have_crf()
  config = mutual_synthetic.get_config()
  a = config.analysis
  a.mode, a.joint_foreground, a.crf, a.solver = "reference", True, use_crf, "reference"
  bundle = tiny_synthetic
  dataset = data.prepare(config)
  bank = pipeline.encode_config_bank(bundle, config, dataset, progress=False)
  model = torch_reference.open_clip_from_bundle(bundle)
  mean, std = bundle.preprocess_config.mean, bundle.preprocess_config.std
  same = {m: [] for m in pipeline.METHODS}
  for cls in dataset.classes(int(bundle.config.vision.image_size)):
    ours = pipeline.analyze_class(bundle, cls.images, bank, a)
    theirs = torch_reference.analyze_class(
      model,
      cls.images,
      mean,
      std,
      bank.descriptor_embeddings,
      bank.class_embeddings,
      int(a.top_k),
      int(a.u),
      methods=concept_methods.reference_labelers(
        torch_reference, pipeline.METHODS, paper_config.concept_settings(a)
      ),
      joint=True,
      crf=use_crf,
      ellipse_seed=int(a.ellipse_seed),
    )
    for method in same:
      same[method].append(agreement(ours, theirs, method))
  shares = {m: float(np.concatenate(v).mean()) for m, v in same.items()}
  print(f"per-image agreement (CRF {'on' if use_crf else 'off'}): {shares}")
  for method, share in shares.items():
    assert share >= REQUIRED, (method, share)
