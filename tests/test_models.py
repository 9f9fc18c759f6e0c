"""Model-level outputs the analyses read: hidden states, patch tokens, attention keys; configs."""

import jax.numpy as jnp
import numpy as np
import pytest

import stori_jax
from stori_jax.models import CLIPConfig, TextConfig, VisionConfig, get_architecture, init_params

CONFIG = CLIPConfig(
  embed_dim=16,
  text=TextConfig(width=32, layers=2, heads=2),
  vision=VisionConfig(image_size=32, patch_size=8, width=32, layers=3, heads=4),
)


def test_image_details_expose_patch_tokens_and_keys():
  params = init_params(CONFIG, seed=0)
  # A nonzero key bias (initialised to zero), so that leaving it out shows.
  attn = params["vision"][f"resblocks_{CONFIG.vision.layers - 1}"]["attn"]
  attn["key"]["bias"] = np.random.default_rng(1).standard_normal(attn["key"]["bias"].shape)
  bundle = stori_jax.CLIPBundle(config=CONFIG, params=params)
  images = np.random.default_rng(0).standard_normal((2, 32, 32, 3)).astype(np.float32)
  features, details = bundle.image_details(images)
  np.testing.assert_allclose(features, bundle.encode_image(images), atol=1e-6)
  hidden = details["hidden_states"]
  assert len(hidden) == CONFIG.vision.layers + 1 and hidden[0].shape == (2, 17, 32)
  np.testing.assert_array_equal(details["patch_tokens"], hidden[-1][:, 1:])
  # keys = ln_1(input of the last block) @ W_k, without the key bias (the mutual-knowledge
  # reference's keys: ln_1's output times the key rows of in_proj_weight; issue 18).
  block = bundle.params["vision"][f"resblocks_{CONFIG.vision.layers - 1}"]
  x = np.asarray(hidden[-2], np.float64)
  ln = block["ln_1"]
  normed = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
  normed = normed * ln["scale"] + ln["bias"]
  keys = normed @ block["attn"]["key"]["kernel"]
  np.testing.assert_allclose(details["keys"], keys, atol=1e-5)


def test_architecture_presets_and_validation():
  b32 = get_architecture("ViT-B/32")
  assert b32.vision.patch_size == 32 and b32.text.activation == "quick_gelu"
  assert get_architecture("ViT-L-14-336").vision.image_size == 336
  assert get_architecture("ViT-B-16").text.activation == "gelu"
  with pytest.raises(ValueError, match="Unknown architecture 'ViT-X-1'"):
    get_architecture("ViT-X-1")
  with pytest.raises(ValueError, match="not divisible by heads"):
    CLIPConfig(text=TextConfig(width=30, heads=4))
  with pytest.raises(ValueError, match="not a multiple of patch_size"):
    CLIPConfig(vision=VisionConfig(image_size=30, patch_size=8))
  with pytest.raises(ValueError, match="Unknown activation"):
    CLIPConfig(text=TextConfig(activation="relu"))
  assert CLIPConfig.from_dict(CONFIG.to_dict()) == CONFIG


def test_bf16_bundle_returns_fp32_features():
  bundle = stori_jax.CLIPBundle(config=CONFIG, params=init_params(CONFIG, seed=0))
  ids = np.zeros((1, 77), np.int32)
  ids[0, :3] = [49406, 320, 49407]
  assert bundle.with_dtype(jnp.bfloat16).encode_text(ids).dtype == jnp.float32


def test_bf16_products_accumulate_in_fp32_and_round_once():
  """A bf16 Dense multiplies bf16 operands into an fp32 product rounded once to bf16 (XLA:CPU
  runs that form at about twice its rate for bf16 -> bf16 products); fp32 is a plain dot."""
  import jax  # pylint: disable=import-outside-toplevel

  from stori_jax.models.transformer import dense  # pylint: disable=import-outside-toplevel

  x = np.random.default_rng(0).normal(size=(4, 64)).astype(np.float32)
  for dtype, products in ((jnp.bfloat16, "float32"), (jnp.float32, None)):
    layer = dense(16, dtype)
    params = layer.init(jax.random.PRNGKey(0), x)
    eqns = jax.make_jaxpr(layer.apply)(params, x).jaxpr.eqns
    dots = [e for e in eqns if e.primitive.name == "dot_general"]
    assert len(dots) == 1
    preferred = dots[0].params["preferred_element_type"]
    if products:
      assert jnp.dtype(preferred).name == products
    else:  # fp32 operands: nn.Dense's own product
      assert preferred is None or jnp.dtype(preferred) == jnp.float32
    if products:
      out = layer.apply(params, x)
      kernel = params["params"]["kernel"].astype(dtype).astype(jnp.float32)
      expected = (jnp.asarray(x).astype(dtype).astype(jnp.float32) @ kernel).astype(dtype)
      expected = expected + params["params"]["bias"].astype(dtype)
      assert out.dtype == dtype
      np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(expected, np.float32))
