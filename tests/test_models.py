"""Model-level outputs the analyses read: hidden states, patch tokens, attention keys; configs."""

import jax.numpy as jnp
import numpy as np
import pytest

import stori_jax
from stori_jax.models import CLIPConfig, TextConfig, VisionConfig, get_architecture, init_params
from stori_jax.models import ConvNeXtConfig, ResNetConfig

CONFIG = CLIPConfig(
  embed_dim=16,
  text=TextConfig(width=32, layers=2, heads=2),
  vision=VisionConfig(image_size=32, patch_size=8, width=32, layers=3, heads=4),
)


@pytest.mark.slow
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


# Random init (issue 25): op by op on the CPU, each random initialiser one compiled program per
# shape (stori_jax.models.initializers), instead of jitting flax's whole init.
SMALL_RESNET = CLIPConfig(
  embed_dim=40,
  text=TextConfig(width=64, layers=1, heads=4),
  vision=ResNetConfig(image_size=64, layers=(1, 2, 1, 1), width=16, heads=8),
)
SMALL_CONVNEXT = CLIPConfig(
  embed_dim=40,
  text=TextConfig(width=64, layers=1, heads=4),
  vision=ConvNeXtConfig(image_size=64, depths=(1, 1, 2, 1), dims=(16, 32, 48, 64)),
)


def jitted_flax_init(config, seed):
  """The former init_params: flax's whole init jitted on the default device."""
  import jax  # pylint: disable=import-outside-toplevel

  from stori_jax.models import CLIP  # pylint: disable=import-outside-toplevel

  size = config.vision.image_size
  images = jnp.zeros((1, size, size, 3), jnp.float32)
  ids = jnp.zeros((1, config.text.context_length), jnp.int32)
  return jax.jit(CLIP(config).init)(jax.random.PRNGKey(seed), images, ids)["params"]


@pytest.mark.slow
@pytest.mark.parametrize(
  "config", [CONFIG, SMALL_RESNET, SMALL_CONVNEXT], ids=["vit", "resnet", "convnext"]
)
def test_init_params_equal_the_jitted_flax_init_bit_for_bit(config):
  import jax  # pylint: disable=import-outside-toplevel

  params = init_params(config, seed=3)
  expected = jitted_flax_init(config, seed=3)
  assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(expected)
  for (path, value), want in zip(
    jax.tree_util.tree_leaves_with_path(params), jax.tree_util.tree_leaves(expected)
  ):
    name = jax.tree_util.keystr(path)
    # jax arrays on the default device, uncommitted, as the jitted init's outputs were.
    assert isinstance(value, jax.Array) and value.devices() == {jax.devices()[0]}, name
    assert not value.committed, name
    assert value.dtype == want.dtype == jnp.float32, name
    np.testing.assert_array_equal(np.asarray(value), np.asarray(want), err_msg=name)


TWO_DEVICES = """
import jax, numpy as np
from stori_jax.models import CLIPConfig, TextConfig, VisionConfig, init_params
config = CLIPConfig(
  embed_dim=16,
  text=TextConfig(width=32, layers=1, heads=2),
  vision=VisionConfig(image_size=32, patch_size=8, width=32, layers=1, heads=4),
)
first, second = jax.devices()
reference = init_params(config, seed=1)
with jax.default_device(second):  # the default device is not the CPU that computes the init
  params = init_params(config, seed=1)
leaves = jax.tree_util.tree_leaves(params)
assert all(leaf.devices() == {second} and not leaf.committed for leaf in leaves)
for leaf, want in zip(leaves, jax.tree_util.tree_leaves(reference)):
  np.testing.assert_array_equal(np.asarray(leaf), np.asarray(want))
print("ok", len(leaves))
"""


@pytest.mark.slow
def test_init_params_land_on_another_default_device():
  """With the default device elsewhere (an accelerator; here a second CPU device) the params are
  computed on the first CPU and moved there, uncommitted, with the same values."""
  import os  # pylint: disable=import-outside-toplevel
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel

  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = subprocess.run(
    [sys.executable, "-c", TWO_DEVICES],
    env=env,
    cwd=repo,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.strip().splitlines()[-1].startswith("ok ")
