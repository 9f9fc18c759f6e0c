"""stori_jax.clip.encoding: batched encoders (padding and packing change no row) and normalisation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

import stori_jax
from stori_jax.clip import encoding
from stori_jax.data import synthetic
from stori_jax.fewshot import augment, trainer
from stori_jax.data.preprocess import normalize
from stori_jax.retrieval import protocol


@pytest.fixture(scope="module")
def bundle():
  return stori_jax.load("tiny-synthetic")  # shipped in stori_jax/assets


@pytest.fixture(scope="module")
def images():
  return synthetic.generate(20, (3, 3), image_size=64).images


def _reference(bundle, pixels):
  """Unit rows of one unpadded encode call: what every batching must reproduce."""
  features = np.asarray(bundle.encode_image(pixels), np.float64)
  return features / np.linalg.norm(features, axis=1, keepdims=True)


# ---------------------------------------------------------------------------------------------
# Normalisation.


def test_l2_normalize_unit_rows_zero_rows_and_dtypes():
  x = np.array([[3.0, 4.0], [0.0, 0.0], [1e-30, 0.0]])
  out = encoding.l2_normalize(x)
  assert out.dtype == np.float32
  np.testing.assert_allclose(out[0], [0.6, 0.8], rtol=1e-7)
  np.testing.assert_array_equal(out[1], [0.0, 0.0])  # a zero row stays zero, not NaN
  assert np.all(np.isfinite(out))
  assert encoding.l2_normalize(x, dtype=np.float64).dtype == np.float64
  np.testing.assert_allclose(np.linalg.norm(encoding.l2_normalize(x.T, axis=0)[:, 0]), 1.0)
  # Bit-identical to the plain division wherever the norm exceeds eps.
  rows = np.random.default_rng(0).normal(size=(5, 7)).astype(np.float32)
  np.testing.assert_array_equal(
    encoding.l2_normalize(rows), rows / np.linalg.norm(rows, axis=-1, keepdims=True)
  )


def test_l2_normalize_jax_values_gradients_and_dtype():
  x = jnp.asarray(np.random.default_rng(1).normal(size=(4, 6)).astype(np.float32))

  def plain(x):
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)

  np.testing.assert_array_equal(encoding.l2_normalize_jax(x), plain(x))
  w = jnp.arange(24, dtype=jnp.float32).reshape(4, 6)
  ours = jax.grad(lambda x: jnp.sum(w * encoding.l2_normalize_jax(x)))(x)
  np.testing.assert_array_equal(ours, jax.grad(lambda x: jnp.sum(w * plain(x)))(x))
  # eps=None compiles to exactly the unfloored expression (the few-shot classifier's).
  np.testing.assert_array_equal(
    jax.jit(lambda x: encoding.l2_normalize_jax(x, eps=None))(x), jax.jit(plain)(x)
  )
  assert encoding.l2_normalize_jax(x.astype(jnp.bfloat16)).dtype == jnp.bfloat16
  zero = jnp.zeros((2, 3))
  np.testing.assert_array_equal(encoding.l2_normalize_jax(zero), zero)  # not NaN


# ---------------------------------------------------------------------------------------------
# Batched encoders.


def test_encoders_batch_exactly(bundle, images):
  # 20 images in batches of 16 (the second one padded) agree with two unpadded batches.
  padded = encoding.encode_images(bundle, images, batch_size=16)
  np.testing.assert_allclose(
    padded[:16], encoding.encode_images(bundle, images[:16], 16), atol=1e-5
  )
  np.testing.assert_allclose(padded[4:], encoding.encode_images(bundle, images[4:], 16), atol=1e-5)
  np.testing.assert_allclose(np.linalg.norm(padded, axis=1), 1.0, atol=1e-5)
  # Texts cut to 16 tokens and padded to 16 rows equal the full-length encoding.
  prompts = ["a (red:1.5) circle", "a photo of a blue dotted (square:0.5)", "a plain star"] * 3
  weighted = encoding.encode_texts(bundle, prompts, weighted=True, batch_size=16)
  ids, weights = bundle.tokenize(prompts, with_weights=True)
  reference = np.array(bundle.encode_text(ids, weights))
  reference /= np.linalg.norm(reference, axis=1, keepdims=True)
  np.testing.assert_allclose(weighted, reference, atol=1e-5)
  assert encoding.batch_rows(9, 256) == 16 and encoding.batch_rows(300, 256) == 256
  assert encoding.batch_rows(3, 256) == 8 and encoding.batch_rows(5, 4) == 4


def test_encode_pixels_packs_chunks_of_any_size(bundle, images):
  pixels = normalize(images, bundle.preprocess_config.mean, bundle.preprocess_config.std)
  reference = _reference(bundle, pixels)
  # Chunks smaller and larger than a batch, and empty ones, packed into batches of 8 rows.
  bounds = [0, 3, 3, 14, 15, 20]
  chunks = [pixels[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
  packed = encoding.encode_pixels(bundle, iter(chunks), batch_size=8)
  assert packed.shape == reference.shape and packed.dtype == np.float32
  np.testing.assert_allclose(packed, reference, atol=1e-6)
  with pytest.raises(ValueError, match="no images"):
    encoding.encode_pixels(bundle, iter([pixels[:0]]))


def test_fewshot_encode_images_padding_changes_no_row(bundle, images):
  # The few-shot encoder pads its last batch by repeating a row (formerly with zero images) and
  # packs views across batches (formerly whole images per batch): every row still equals the
  # unbatched encoding to float32 rounding.
  sources = [Image.fromarray(image) for image in images[:7]]
  eval_views = trainer.encode_images(bundle, sources, batch_size=4)
  assert eval_views.shape == (7, 1, bundle.config.embed_dim)
  pixels = np.stack([augment.eval_view(s, bundle.preprocess_config) for s in sources])
  np.testing.assert_allclose(eval_views[:, 0], _reference(bundle, pixels), atol=1e-6)
  augmented = trainer.encode_images(bundle, sources, views=3, augment_seed=5, batch_size=8)
  assert augmented.shape == (7, 3, bundle.config.embed_dim)
  size = bundle.config.vision.image_size
  pixels = np.stack(
    [
      augment.train_view(s, size, augment.view_rng(5, i, v), bundle.preprocess_config)
      for i, s in enumerate(sources)
      for v in range(3)
    ]
  )
  np.testing.assert_allclose(augmented.reshape(21, -1), _reference(bundle, pixels), atol=1e-6)


def test_encode_images_on_device_matches_host_encoder(bundle, images):
  host = encoding.encode_images(bundle, images, batch_size=8, desc=None)
  device = encoding.encode_images_on_device(bundle, images.astype(np.float32) / 255.0, 8)
  assert isinstance(device, jax.Array) and device.shape == host.shape
  np.testing.assert_allclose(np.asarray(device), host, atol=1e-6)
  with pytest.raises(ValueError, match="no images"):
    encoding.encode_images_on_device(bundle, np.zeros((0, 64, 64, 3), np.float32))


class _RecordingBundle:
  """Records how encode_text is called; returns the sum of token weights as one feature."""

  def __init__(self, bundle):
    self.inner, self.calls = bundle, []

  def tokenize(self, texts, with_weights=False):
    return self.inner.tokenize(texts, with_weights=with_weights)

  def encode_text(self, ids, weights=None, **blocks):
    self.calls.append((None if weights is None else np.asarray(weights).shape, blocks))
    return np.ones((len(ids), 2), np.float32)


def test_unit_weights_plain_for_texts_but_kept_for_tokens(bundle):
  prompts = ["a red circle", "a blue square"]
  stub = _RecordingBundle(bundle)
  encoding.encode_texts(stub, prompts, weighted=True, method="prompt_weighting", desc=None)
  assert stub.calls == [(None, {})]  # all weights 1: the plain encoder
  stub.calls.clear()
  # The retrieval protocol encodes its w = 1 reference with its method's weighted encoder.
  protocol.encode_prompts(stub, prompts, protocol.Setting("prompt_weighting", start_block=2))
  assert stub.calls == [((8, 16), {"start_block": 2, "method": "prompt_weighting"})]
  stub.calls.clear()
  protocol.encode_prompts(stub, prompts, protocol.Setting(start_block=3, stop_block=4))
  assert stub.calls[0][1] == {"start_block": 3, "stop_block": 4, "method": "stori"}
