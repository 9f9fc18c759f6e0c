"""Visual prompts batched across images and concept methods (issue 19): only the concept regions
present go through the tower, in padded chunks, with the same embeddings as prompting every
concept of one image at a time."""

import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from mutual import paper_config, pipeline, visual_prompts
from stori_jax.plumbing.config_files import ConfigError
from stori_jax.clip.encoding import encode_images_on_device


def _maps(rng, batch, grid, concepts, size):
  maps = rng.integers(-1, concepts, size=(batch, grid, grid))
  return np.repeat(np.repeat(maps, size // grid, 1), size // grid, 2).astype(np.int32)


def _one_image_at_a_time(bundle, images, maps, n_concepts, ellipse):
  """Every concept of one image at a time through the tower (what the pipeline did before)."""
  round_trip = None
  if ellipse == "reference":
    round_trip = (bundle.preprocess_config.mean, bundle.preprocess_config.std)
  prompted, valid = visual_prompts.render_prompts(
    jnp.asarray(images, jnp.float32) / 255.0,
    maps,
    n_concepts,
    ellipse=ellipse,
    round_trip=round_trip,
  )
  size = prompted.shape[3:]
  out = []
  for i in range(len(images)):
    rows = prompted[i].reshape(-1, *size)
    embedded = encode_images_on_device(bundle, rows, batch_size=rows.shape[0])
    out.append(embedded.reshape(n_concepts, 3, -1).mean(axis=1))
  return np.where(np.asarray(valid)[..., None], np.stack(out), 0.0), np.asarray(valid)


@pytest.mark.slow
@pytest.mark.parametrize("ellipse", visual_prompts.ELLIPSES)
def test_batched_regions_equal_one_image_at_a_time(tiny_synthetic, ellipse):
  rng = np.random.default_rng(3)
  size = tiny_synthetic.config.vision.image_size
  images = rng.integers(0, 256, size=(5, size, size, 3), dtype=np.uint8)
  first, second = _maps(rng, 5, 4, 3, size), _maps(rng, 5, 8, 5, size)
  first[0] = -1  # an image without concepts
  # chunk=4 regions per call: several full chunks and a padded last one.
  batched = visual_prompts.concept_embeddings_of_maps(
    tiny_synthetic, images, [first, second], n_concepts=5, ellipse=ellipse, chunk=4
  )
  for maps, (embeddings, valid) in zip([first, second], batched):
    expected, expected_valid = _one_image_at_a_time(tiny_synthetic, images, maps, 5, ellipse)
    np.testing.assert_array_equal(np.asarray(valid), expected_valid)
    np.testing.assert_allclose(np.asarray(embeddings), expected, atol=2e-6)
  assert not np.asarray(batched[0][1])[0].any()


@pytest.mark.slow
@pytest.mark.parametrize("ellipse", visual_prompts.ELLIPSES)
def test_passes_of_a_few_images_equal_the_whole_call(tiny_synthetic, monkeypatch, ellipse):
  """per_pass: the regions of a call go through the tower a few at a time (a loop inside the
  program) with the embeddings of one pass over the whole call; the passes divide the call."""
  passes = []
  original = visual_prompts._region_embeddings

  def recording(*args, **kwargs):
    passes.append((args[5].shape[0], kwargs["regions_per_pass"]))
    return original(*args, **kwargs)

  monkeypatch.setattr(visual_prompts, "_region_embeddings", recording)
  rng = np.random.default_rng(4)
  size = tiny_synthetic.config.vision.image_size
  images = rng.integers(0, 256, size=(4, size, size, 3), dtype=np.uint8)
  maps = [_maps(rng, 4, 4, 5, size), _maps(rng, 4, 8, 5, size)]
  # chunk=4, as the other tests of reference ellipses: their compiled fits serve this one.
  options = dict(n_concepts=5, ellipse=ellipse, chunk=4)
  whole = visual_prompts.concept_embeddings_of_maps(tiny_synthetic, images, maps, **options)
  assert passes and all(per is None for _, per in passes)
  passes.clear()
  few = visual_prompts.concept_embeddings_of_maps(
    tiny_synthetic, images, maps, per_pass=7, **options
  )
  # 7 images hold the prompts of 2 regions; 2 divides every padded call size (multiples of 4):
  # 2 passes a call.
  assert passes and all(size == 4 and per == 2 for size, per in passes)
  for (a, valid_a), (b, valid_b) in zip(whole, few):
    np.testing.assert_array_equal(np.asarray(valid_a), np.asarray(valid_b))
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=2e-6)


def test_features_pass_of_a_few_images_equals_one_pass(tiny_synthetic, monkeypatch):
  from mutual import features

  calls = []
  original = tiny_synthetic.image_details
  monkeypatch.setattr(
    type(tiny_synthetic),
    "image_details",
    lambda self, x: calls.append(len(x)) or original(x),
  )
  size = tiny_synthetic.config.vision.image_size
  x = np.random.default_rng(5).normal(size=(5, size, size, 3)).astype(np.float32)
  whole = features.embeddings_and_patches(tiny_synthetic, x)
  few = features.embeddings_and_patches(tiny_synthetic, x, per_pass=2)
  assert calls == [5, 2, 2, 1]
  for a, b in zip(whole, few):
    assert a.shape == b.shape
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=2e-6)


def test_regions_per_pass_divides_the_call():
  assert visual_prompts._regions_per_pass(12, None) is None
  assert visual_prompts._regions_per_pass(12, 6) == 2  # 6 images: 2 regions of 3 prompts
  assert visual_prompts._regions_per_pass(12, 15) == 4  # 5 regions would not divide 12
  assert visual_prompts._regions_per_pass(12, 1) == 1  # at least one region
  assert visual_prompts._regions_per_pass(4, 300) == 4  # never more than the call


def test_images_per_pass_keeps_a_cpu_pass_in_cache():
  """The device rule (config.analysis.tower_batch = 0): on a CPU, as many images as keep the
  largest activation within CPU_PASS_BYTES; the whole call elsewhere; a setting wins."""
  from types import SimpleNamespace

  from mutual import features
  from stori_jax.models import registry

  def bundle(name, size=None, dtype=jnp.float32):
    config = registry.get(name).config
    vision = config.vision
    if size:
      vision = type(vision)(**{**vision.__dict__, "image_size": size})
    return SimpleNamespace(config=SimpleNamespace(vision=vision), dtype=dtype)

  vit = bundle("openai-vit-b-16")
  # ViT-B/16 at 224 px: 197 tokens x 3,072 MLP units x 4 bytes per image, 6 images in 16 MiB.
  assert features.activation_bytes(vit.config.vision) == 197 * 3072 * 4
  assert features.images_per_pass(vit, platform="cpu") == 6
  assert features.images_per_pass(bundle("openai-vit-b-16", dtype=jnp.bfloat16), 0, "cpu") == 13
  assert features.images_per_pass(bundle("openai-rn50"), platform="cpu") == 5
  assert features.images_per_pass(bundle("laion400m-convnext-base"), platform="cpu") == 2
  assert features.images_per_pass(bundle("openai-vit-b-16", 64), platform="cpu") > 64
  assert features.images_per_pass(vit, platform="gpu") is None
  assert features.images_per_pass(vit, 24, platform="cpu") == 24
  with pytest.raises(ValueError, match="tower_batch must be >= 0"):
    features.images_per_pass(vit, -1)
  with pytest.raises(ConfigError, match="tower_batch must be an integer >= 0"):
    paper_config.check_analysis(paper_config.analysis_config(tower_batch=-2))


def test_only_present_regions_reach_the_tower(tiny_synthetic, monkeypatch):
  """Every call has the chunk's shape (one compiled program); the regions it holds beyond
  padding are the present ones, never L per image."""
  calls = []
  original = visual_prompts._region_embeddings

  def counting(*args, **kwargs):
    calls.append((args[5].shape[0], int(args[7])))  # (call size, real regions)
    return original(*args, **kwargs)

  monkeypatch.setattr(visual_prompts, "_region_embeddings", counting)
  size = tiny_synthetic.config.vision.image_size
  images = np.zeros((4, size, size, 3), np.uint8)
  maps = np.full((4, size, size), -1, np.int32)
  maps[:, :8, :8] = 0  # one region per image: 4 regions of 4 x 5 concepts
  visual_prompts.concept_embeddings_of_maps(tiny_synthetic, images, [maps], n_concepts=5, chunk=8)
  assert calls == [(8, 4)]
  calls.clear()
  maps[:3, 20:30, 20:30] = 2  # 7 regions
  visual_prompts.concept_embeddings_of_maps(tiny_synthetic, images, [maps], n_concepts=5, chunk=4)
  assert calls == [(4, 4), (4, 3)]


def test_calls_compile_once_whatever_the_region_count(tiny_synthetic):
  """Images with other numbers of concept regions reuse the compiled programs: the fused
  render-and-tower program, the table writes and the final gather."""
  rng = np.random.default_rng(11)
  size = tiny_synthetic.config.vision.image_size
  images = rng.integers(0, 256, size=(3, size, size, 3), dtype=np.uint8)
  programs = (
    visual_prompts._region_embeddings,
    visual_prompts._put_rows,
    visual_prompts._take_rows,
  )
  sizes = []
  for grid, concepts in ((4, 2), (8, 5), (2, 1)):
    maps = _maps(rng, 3, grid, concepts, size)
    visual_prompts.concept_embeddings_of_maps(tiny_synthetic, images, [maps], n_concepts=5)
    sizes.append([p._cache_size() for p in programs])
  assert sizes[0] == sizes[1] == sizes[2], sizes


def test_passes_of_padding_are_skipped(tiny_synthetic):
  """Inside a call, the tower passes holding only padding give zeros (they are skipped); the
  real regions' embeddings do not depend on the passes."""
  rng = np.random.default_rng(2)
  size = tiny_synthetic.config.vision.image_size
  images = rng.integers(0, 256, size=(2, size, size, 3), dtype=np.uint8)
  maps = jnp.asarray(_maps(rng, 2, 4, 5, size))[None]
  pairs = jnp.asarray([[0, b, c] for b in range(2) for c in range(4)], jnp.int32)  # 8 regions
  pixels = jnp.asarray(images, jnp.float32) / 255.0
  mean = jnp.asarray(tiny_synthetic.preprocess_config.mean, jnp.float32)
  std = jnp.asarray(tiny_synthetic.preprocess_config.std, jnp.float32)
  options = dict(
    image_fn=tiny_synthetic.image_function, stroke=1.0, blur_size=11, largest_region=True
  )
  whole = visual_prompts._region_embeddings(
    tiny_synthetic.params, mean, std, pixels, maps, pairs, None, np.int32(8), **options
  )
  passes = visual_prompts._region_embeddings(
    tiny_synthetic.params,
    mean,
    std,
    pixels,
    maps,
    pairs,
    None,
    np.int32(3),
    regions_per_pass=2,
    **options,
  )
  np.testing.assert_allclose(np.asarray(passes)[:4], np.asarray(whole)[:4], atol=2e-6)
  np.testing.assert_array_equal(np.asarray(passes)[4:], 0.0)  # passes 3 and 4: padding only
  assert np.abs(np.asarray(whole)[4:]).sum() > 1.0


def test_equal_regions_of_two_maps_are_prompted_once(tiny_synthetic, monkeypatch):
  """A region with the same pixels in both maps (whatever its concept number) goes through the
  tower once, and both maps get its embedding; a region of another image is not shared."""
  rows = []
  original = visual_prompts._region_embeddings

  def counting(*args, **kwargs):
    rows.append(int(args[7]))  # the call's real regions
    return original(*args, **kwargs)

  monkeypatch.setattr(visual_prompts, "_region_embeddings", counting)
  rng = np.random.default_rng(5)
  size = tiny_synthetic.config.vision.image_size
  images = rng.integers(0, 256, size=(2, size, size, 3), dtype=np.uint8)
  first = np.full((2, size, size), -1, np.int32)
  first[:, :10, :10] = 0
  first[:, 20:, 20:] = 1
  second = np.full((2, size, size), -1, np.int32)
  second[:, :10, :10] = 3  # the same pixels as first's concept 0, in both images
  second[:, 20:, 25:] = 1  # not first's concept 1
  pairs = np.argwhere(visual_prompts.region_presence(np.stack([first, second]), 5))
  unique, copies = visual_prompts.distinct_regions(np.stack([first, second]), pairs)
  assert len(pairs) == 8 and len(unique) == 6
  np.testing.assert_array_equal(unique[copies][:, 1], pairs[:, 1])  # never across images
  (a, valid_a), (b, valid_b) = visual_prompts.concept_embeddings_of_maps(
    tiny_synthetic, images, [first, second], n_concepts=5
  )
  assert sum(rows) == 6  # 6 distinct regions
  np.testing.assert_array_equal(np.asarray(a)[:, 0], np.asarray(b)[:, 3])
  assert np.asarray(valid_a)[:, [0, 1]].all() and np.asarray(valid_b)[:, [1, 3]].all()
  assert np.abs(np.asarray(a)[:, 1] - np.asarray(b)[:, 1]).max() > 1e-3
  # Each map's own call gives the same embeddings.
  ((alone, _),) = visual_prompts.concept_embeddings_of_maps(
    tiny_synthetic, images, [second], n_concepts=5
  )
  np.testing.assert_allclose(np.asarray(alone), np.asarray(b), atol=2e-6)


def test_equal_reference_prompts_of_two_maps_go_through_the_tower_once(tiny_synthetic, monkeypatch):
  """ellipse="reference": regions of two maps are fitted apart (their ellipses may depend on
  each map's random draws), and those whose fitted prompts are equal (same image, stroke and
  filled pixels) go through the tower once; both maps get the embeddings each map's own call
  gives."""
  rows = []
  original = visual_prompts._region_embeddings

  def counting(*args, **kwargs):
    rows.append(int(args[7]))  # the call's real regions
    return original(*args, **kwargs)

  monkeypatch.setattr(visual_prompts, "_region_embeddings", counting)
  rng = np.random.default_rng(6)
  size = tiny_synthetic.config.vision.image_size
  images = rng.integers(0, 256, size=(2, size, size, 3), dtype=np.uint8)
  first = np.full((2, size, size), -1, np.int32)
  first[:, 2:14, 3:15] = 0  # large regions: 5-point-plus contours, fits without random draws
  first[:, 18:, 16:] = 1
  second = np.full((2, size, size), -1, np.int32)
  second[:, 2:14, 3:15] = 2  # first's concept 0 again, in both images
  second[:, 18:, 20:] = 1  # not first's concept 1
  options = dict(n_concepts=5, ellipse="reference", chunk=4)
  (a, valid_a), (b, valid_b) = visual_prompts.concept_embeddings_of_maps(
    tiny_synthetic, images, [first, second], **options
  )
  assert sum(rows) == 6  # 8 regions, 2 of them equal to another's prompts
  np.testing.assert_array_equal(np.asarray(a)[:, 0], np.asarray(b)[:, 2])
  assert np.asarray(valid_a)[:, [0, 1]].all() and np.asarray(valid_b)[:, [1, 2]].all()
  assert np.abs(np.asarray(a)[:, 1] - np.asarray(b)[:, 1]).max() > 1e-3
  for maps, (together, valid) in ((first, (a, valid_a)), (second, (b, valid_b))):
    ((alone, alone_valid),) = visual_prompts.concept_embeddings_of_maps(
      tiny_synthetic, images, [maps], **options
    )
    np.testing.assert_array_equal(np.asarray(alone_valid), np.asarray(valid))
    np.testing.assert_allclose(np.asarray(alone), np.asarray(together), atol=2e-6)


def test_chunk_starts():
  assert visual_prompts._chunk_starts(0, 32) == []
  assert visual_prompts._chunk_starts(22, 32) == [0]
  assert visual_prompts._chunk_starts(65, 32) == [0, 32, 64]


def test_compute_dtype_setting(tiny_synthetic):
  analysis = paper_config.analysis_config(compute_dtype="bfloat16")
  bf16 = pipeline.tower_bundle(tiny_synthetic, analysis)
  assert jnp.dtype(bf16.dtype) == jnp.bfloat16 and bf16.params is tiny_synthetic.params
  # One bf16 bundle per bundle: a class at a time reuses its compiled towers.
  assert pipeline.tower_bundle(tiny_synthetic, analysis) is bf16
  assert pipeline.tower_bundle(tiny_synthetic, paper_config.analysis_config()) is tiny_synthetic
  # Bad values stop before any work (mutual.run_flags.claim_workdir checks them first).
  with pytest.raises(ConfigError, match="compute_dtype must be one of"):
    paper_config.check_analysis(paper_config.analysis_config(compute_dtype="fp8"))
  with pytest.raises(ConfigError, match="prompt_chunk must be an integer >= 1"):
    paper_config.check_analysis(paper_config.analysis_config(prompt_chunk=0))


SHARDED_SCRIPT = """
import jax, numpy as np
import stori_jax
from mutual import visual_prompts
assert jax.device_count() == 8
bundle = stori_jax.load("tiny-synthetic")
size = bundle.config.vision.image_size
rng = np.random.default_rng(5)
images = rng.integers(0, 256, size=(3, size, size, 3), dtype=np.uint8)
maps = np.repeat(np.repeat(rng.integers(-1, 5, size=(3, 4, 4)), size // 4, 1), size // 4, 2)
for ellipse in visual_prompts.ELLIPSES:
  one = visual_prompts.concept_embeddings_of_maps(
    bundle, images, [maps], ellipse=ellipse, devices=jax.devices()[:1])[0]
  eight = visual_prompts.concept_embeddings_of_maps(bundle, images, [maps], ellipse=ellipse)[0]
  assert len(eight[0].sharding.device_set) >= 1
  np.testing.assert_array_equal(np.asarray(one[1]), np.asarray(eight[1]))
  np.testing.assert_allclose(np.asarray(one[0]), np.asarray(eight[0]), atol=2e-6)
print("ok")
"""


@pytest.mark.slow
def test_regions_sharded_over_eight_devices_equal_one(tmp_path):
  """Sharding the regions of a tower call over devices changes nothing (a subprocess: the
  device count is fixed when JAX starts)."""
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
  script = tmp_path / "sharded.py"
  script.write_text(SHARDED_SCRIPT)
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  done = subprocess.run(
    [sys.executable, str(script)],
    cwd=repo,
    env=dict(env, PYTHONPATH=repo),
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_bad_compute_dtype_is_one_paragraph_before_any_work(tmp_path, run_command):
  done = run_command(
    "mutual.analyze",
    "--config=configs/mutual_synthetic.py:smoke",
    "--config.analysis.compute_dtype=fp16",
    f"--workdir={tmp_path / 'run'}",
  )
  assert done.returncode == 2 and "compute_dtype must be one of" in done.stderr
  assert "Traceback" not in done.stderr and not (tmp_path / "run").exists()
