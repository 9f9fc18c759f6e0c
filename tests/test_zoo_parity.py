"""CNN image towers (ModifiedResNet, timm ConvNeXt) vs open_clip with the same random weights."""

import dataclasses
import json

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip(
  "torch", reason="parity tests need the PyTorch references: pip install -e '.[torch]'"
)
open_clip = pytest.importorskip("open_clip", reason="pip install -e '.[torch]' (open_clip_torch)")
pytest.importorskip("timm", reason="open_clip's ConvNeXt towers need timm: pip install timm")

import stori_jax  # pylint: disable=wrong-import-position
from stori_jax.reference import parity_report  # pylint: disable=wrong-import-position
from stori_jax.reference import clip_towers
from stori_jax.checkpoints import CheckpointError  # pylint: disable=wrong-import-position
from stori_jax.checkpoints.validate import flatten, unflatten  # pylint: disable=wrong-import-position
from stori_jax.models import (  # pylint: disable=wrong-import-position
  CLIPConfig,
  ConvNeXtConfig,
  ResNetConfig,
  TextConfig,
  VisionConfig,
  get_architecture,
  init_params,
)

# The fp32 contract of tests/test_parity.py.
FP32_REL_TOL = 1e-5

TEXT = TextConfig(width=64, layers=2, heads=4, activation="quick_gelu")
RESNET = CLIPConfig(
  embed_dim=40,
  text=TEXT,
  # layer1 has width -> 4 * width channels (a shortcut conv without stride);
  # two blocks in layer2 test the plain shortcut too.
  vision=ResNetConfig(image_size=64, layers=(1, 2, 1, 1), width=16, heads=8),
  name="small-resnet",
)
CONVNEXT = CLIPConfig(
  embed_dim=40,
  text=dataclasses.replace(TEXT, activation="gelu"),
  vision=ConvNeXtConfig(image_size=64, depths=(1, 1, 2, 1), dims=(16, 32, 48, 64)),
  name="small-convnext",
)


def assert_parity(report, tol=FP32_REL_TOL):
  for name in ("text_features", "image_features", "logits"):
    assert report[name]["max_rel"] <= tol, (name, report[name])
  for row in report["vision_blocks"]:
    assert row["max_rel"] <= tol, row


@pytest.fixture(scope="module", params=[RESNET, CONVNEXT], ids=["resnet", "convnext"])
def pair(request):
  return parity_report.random_pair(request.param, seed=1)


def test_random_weights_match_open_clip(pair):
  model, bundle = pair
  report = parity_report.run_parity(model, bundle, batch=3, seed=2)
  assert_parity(report)
  # The stem and four stages are compared one by one.
  assert len(report["vision_blocks"]) == 5
  assert "vision stage 4" in parity_report.format_report(report)


def test_feature_map_is_the_last_stage(pair):
  _, bundle = pair
  images, _ = parity_report.random_inputs(bundle.config, 2)
  features, details = bundle.image_details(images)
  grid, width = bundle.config.vision.grid_size, bundle.config.vision.feature_width
  assert grid == 64 // bundle.config.vision.patch_size == 2
  assert details["feature_map"].shape == (2, grid, grid, width)
  np.testing.assert_array_equal(details["feature_map"], details["hidden_states"][-1])
  np.testing.assert_array_equal(
    details["patch_tokens"], np.asarray(details["feature_map"]).reshape(2, grid * grid, width)
  )
  np.testing.assert_allclose(features, bundle.encode_image(images), rtol=1e-6, atol=1e-6)


def test_resnet_keys_are_the_attention_pool_keys():
  _, bundle = parity_report.random_pair(RESNET, seed=3)
  images, _ = parity_report.random_inputs(RESNET, 2)
  _, details = bundle.image_details(images)
  pool = bundle.params["vision"]["attnpool"]
  tokens = np.asarray(details["patch_tokens"], np.float64)
  x = np.concatenate([tokens.mean(1, keepdims=True), tokens], 1) + pool["positional_embedding"]
  keys = x @ np.asarray(pool["k_proj"]["kernel"]) + pool["k_proj"]["bias"]
  assert details["keys"].shape == (2, 1 + RESNET.vision.grid_size**2, 512)
  np.testing.assert_allclose(details["keys"], keys, rtol=1e-5, atol=1e-5)


def test_parity_would_catch_unused_batch_norm_statistics():
  """Perturbed running statistics matter: ignoring them breaks parity by far."""
  model, bundle = parity_report.random_pair(RESNET, seed=4)
  fresh = {"mean": np.zeros_like, "var": np.ones_like}
  flat = {
    key: fresh[key.rsplit("/", 1)[-1]](value) if key.rsplit("/", 1)[-1] in fresh else value
    for key, value in flatten(bundle.params).items()
  }
  assert sum(key.endswith("/var") for key in flat) == 3 + 3 * 5 + 1 * 4  # Stem, blocks, shortcuts.
  broken = stori_jax.CLIPBundle(config=RESNET, params=unflatten(flat))
  report = parity_report.run_parity(model, broken, batch=2)
  assert report["image_features"]["max_rel"] > 100 * FP32_REL_TOL, report["image_features"]


@pytest.mark.slow
def test_vit_details_have_a_feature_map_too():
  config = CLIPConfig(
    embed_dim=16,
    text=TextConfig(width=32, layers=1, heads=2),
    vision=VisionConfig(image_size=32, patch_size=8, width=32, layers=2, heads=4),
  )
  bundle = stori_jax.CLIPBundle(config=config, params=init_params(config))
  images = np.random.default_rng(0).standard_normal((2, 32, 32, 3)).astype(np.float32)
  _, details = bundle.image_details(images)
  assert details["feature_map"].shape == (2, 4, 4, 32)
  np.testing.assert_array_equal(
    np.asarray(details["feature_map"]).reshape(2, 16, 32), details["patch_tokens"]
  )


def test_resnet_state_dict_infers_its_architecture(tmp_path):
  """An OpenAI-layout ResNet file loads without a name, like OpenAI's build_model."""
  model = clip_towers.randomize_(clip_towers.build_open_clip(RESNET), 5)
  path = tmp_path / "rn.pt"
  torch.save(model.state_dict(), path)
  bundle = stori_jax.load(path)
  # Text heads are width // 64 (OpenAI's rule); the image tower is fully determined.
  assert bundle.config.vision == RESNET.vision
  assert bundle.config.text.heads == 1
  assert_parity(parity_report.run_parity(model, stori_jax.load(path, arch=RESNET), batch=2))


def test_convnext_state_dict_needs_its_architecture(tmp_path):
  model = clip_towers.randomize_(clip_towers.build_open_clip(CONVNEXT), 6)
  path = tmp_path / "convnext.pt"
  torch.save(model.state_dict(), path)
  with pytest.raises(CheckpointError, match="input size is not stored.*arch='convnext_base'"):
    stori_jax.load(path)
  assert_parity(parity_report.run_parity(model, stori_jax.load(path, arch=CONVNEXT), batch=2))


def test_open_clip_directory_with_a_resnet_config(tmp_path):
  model = clip_towers.randomize_(clip_towers.build_open_clip(RESNET), 7)
  torch.save(model.state_dict(), tmp_path / "open_clip_pytorch_model.bin")
  v, t = RESNET.vision, RESNET.text
  (tmp_path / "open_clip_config.json").write_text(
    json.dumps(
      {
        "model_cfg": {
          "embed_dim": RESNET.embed_dim,
          "quick_gelu": True,
          "vision_cfg": {
            "image_size": v.image_size,
            "layers": list(v.layers),
            "width": v.width,
            "head_width": v.feature_width // v.heads,
            "patch_size": None,
          },
          "text_cfg": {"width": t.width, "heads": t.heads, "layers": t.layers},
        }
      }
    )
  )
  bundle = stori_jax.load(tmp_path)
  assert bundle.config.vision == RESNET.vision
  assert_parity(parity_report.run_parity(model, bundle, batch=2))


def test_converted_checkpoint_round_trip(tmp_path, pair):
  _, bundle = pair
  stori_jax.save(bundle, tmp_path / "converted")
  again = stori_jax.load(tmp_path / "converted")
  assert again.config == bundle.config  # JSON lists come back as tuples.
  flat, flat_again = flatten(bundle.params), flatten(again.params)
  assert flat.keys() == flat_again.keys()
  for key, value in flat.items():
    np.testing.assert_array_equal(value, flat_again[key], err_msg=key)


def test_bf16_compute_stays_close_to_fp32(pair):
  _, bundle = pair
  images, _ = parity_report.random_inputs(bundle.config, 3, seed=1)
  fp32 = np.asarray(bundle.encode_image(images))
  bf16 = np.asarray(bundle.with_dtype(jnp.bfloat16).encode_image(images))
  cosine = np.sum(fp32 * bf16, -1) / (np.linalg.norm(fp32, axis=-1) * np.linalg.norm(bf16, axis=-1))
  assert cosine.min() >= 0.99, cosine


def test_config_validation():
  with pytest.raises(ValueError, match="multiple of 32"):
    CLIPConfig(vision=ResNetConfig(image_size=100))
  with pytest.raises(ValueError, match="not divisible by heads"):
    CLIPConfig(vision=ResNetConfig(width=64, heads=7))
  with pytest.raises(ValueError, match="4 depths and 4 dims"):
    CLIPConfig(vision=ConvNeXtConfig(depths=(1, 1, 1)))
  rn = get_architecture("RN50x4-quickgelu")
  assert rn.text.activation == "quick_gelu" and rn.vision.heads == 40
  assert get_architecture("convnext_base_w").vision.image_size == 256


@pytest.mark.slow
@pytest.mark.parametrize("name", ["RN50-quickgelu", "convnext_base"])
def test_open_clip_named_architectures_at_small_size(tmp_path, name):
  """open_clip's own create_model (real layer counts and widths), at 64 px, loaded by name."""
  model = open_clip.create_model(name, pretrained=None, force_image_size=64).eval()
  clip_towers.randomize_(model, 9)
  path = tmp_path / "open_clip_pytorch_model.bin"
  torch.save(model.state_dict(), path)
  bundle = stori_jax.load(path, arch=get_architecture(name).with_image_size(64))
  assert_parity(parity_report.run_parity(model, bundle, batch=2))
