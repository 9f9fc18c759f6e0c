"""The reference mode's lattice CRF on the device (mutual.crf): the lattice built inside the
jitted program equals the host build array for array, and the refined labels equal SimpleCRF's
(the library the reference calls) on many random inputs, with no per-image host work and one
compiled program per image size."""

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mutual import crf
from stori_jax.data import synthetic

PARAMS = crf.CRFParams(5, 10.0, 40.0, 13.0, 3.0, 3.0, 0.99, 1)


def _images(rng, count, size):
  """uint8 [count, size, size, 3]: noise, flat blocks and the synthetic world's objects."""
  noise = rng.integers(0, 256, (count, size, size, 3), dtype=np.uint8)
  blocks = np.repeat(np.repeat(rng.integers(0, 256, (count, 4, 4, 3)), size // 4, 1), size // 4, 2)
  world = synthetic.generate(count, (int(rng.integers(1000)), 0), image_size=size).images
  kind = rng.integers(0, 3, count)
  return np.where(
    kind[:, None, None, None] == 0, noise, np.where(kind[:, None, None, None] == 1, blocks, world)
  ).astype(np.uint8)


def _masks(rng, count, size):
  grid = int(rng.choice([2, 4, 8]))
  coarse = rng.random((count, grid, grid)) < rng.uniform(0.2, 0.8)
  return np.repeat(np.repeat(coarse, size // grid, axis=1), size // grid, axis=2)


def _device_lattice(features):
  with jax.enable_x64(True):
    return jax.jit(crf.device_lattice)(jnp.asarray(features), jnp.zeros((), jnp.int32))


@pytest.mark.parametrize("size", [16, 64])
def test_device_lattice_is_the_host_lattice(size):
  """Offsets, barycentric weights (bit for bit: no fused multiply-add) and neighbours."""
  rng = np.random.default_rng(size)
  for image in _images(rng, 6, size):
    features = crf._bilateral_features(image, PARAMS, np)
    host = crf.build_lattice(features)
    device = _device_lattice(features)
    for name, want, got in zip(crf.Lattice._fields, host, device):
      assert np.asarray(got).dtype == want.dtype, name
      np.testing.assert_array_equal(np.asarray(got), want, err_msg=name)
  # The positions-only (Gaussian kernel) lattice, 2 features.
  xs, ys = crf._pixel_grid(size, size)
  features = np.stack([xs / np.float32(3.0), ys / np.float32(3.0)], axis=1)
  for want, got in zip(crf.build_lattice(features), _device_lattice(features)):
    np.testing.assert_array_equal(np.asarray(got), want)


def test_device_refine_is_simplecrfs_on_random_inputs():
  """crf.refine(filter="lattice"), lattices built on the device, gives SimpleCRF's labels on
  36 random images (noise, flat blocks, objects) and masks at 64 px."""
  dense_crf = pytest.importorskip("denseCRF", reason="SimpleCRF builds from source (make install)")
  rng = np.random.default_rng(7)
  unary = np.eye(2, dtype=np.float32)
  differing, changed = 0, []
  for _ in range(6):
    images, masks = _images(rng, 6, 64), _masks(rng, 6, 64)
    got = np.asarray(crf.refine(images, masks, confidence=0.99, filter="lattice"))
    want = np.stack(
      [
        dense_crf.densecrf(im, unary[m.astype(int)], (10.0, 40.0, 13.0, 3.0, 3.0, 5.0)) != 0
        for im, m in zip(images, masks)
      ]
    )
    differing += int((got != want).sum())
    changed.append(float((got != masks).mean()))
  assert differing == 0
  # The inputs exercise the CRF: it relabels 0.1% to 18% of the pixels per batch (5.6% on
  # average), so equal labels are not equal masks passed through.
  assert np.mean(changed) > 0.02 and max(changed) > 0.1, changed


@pytest.mark.slow
def test_device_refine_equals_host_build_at_224():
  """At the towers' 224 px, the device build and the host build refine to the same labels."""
  rng = np.random.default_rng(3)
  images, masks = _images(rng, 2, 224), _masks(rng, 2, 224)
  device = np.asarray(crf.lattice_refine(images, masks, PARAMS))
  host = np.asarray(crf.lattice_refine(images, masks, PARAMS, on_device=False))
  np.testing.assert_array_equal(device, host)


def test_no_host_work_per_image_and_one_program():
  """New images of the same size reuse the compiled program, and the calling thread spends
  almost no CPU time on them (the lattices are built by the device's program)."""
  rng = np.random.default_rng(5)
  images, masks = _images(rng, 3, 64), _masks(rng, 3, 64)
  jax.block_until_ready(crf.lattice_refine(images, masks, PARAMS))
  compiled = crf._device_lattice_refine._cache_size()
  images, masks = _images(rng, 3, 64), _masks(rng, 3, 64)
  start = time.thread_time()
  jax.block_until_ready(crf.lattice_refine(images, masks, PARAMS))
  device_host = time.thread_time() - start
  assert crf._device_lattice_refine._cache_size() == compiled
  start = time.thread_time()
  jax.block_until_ready(crf.lattice_refine(images, masks, PARAMS, on_device=False))
  host_host = time.thread_time() - start
  # The host build spends its numpy work on this thread; the device build dispatches only.
  assert device_host < 0.25 * host_host, (device_host, host_host)
