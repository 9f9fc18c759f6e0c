"""stori_jax.models.tower_kinds: a new image-tower kind is one registration, made here from one
file alone (tests/toy_plugins.py's toy patch-mixer tower, with its own config fields and its own
OpenAI-style state-dict keys), and then loads, encodes and gives mutual knowledge its patch
features like the built-in ViT, ModifiedResNet and ConvNeXt."""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
import pytest
from safetensors.numpy import save_file

import stori_jax
from mutual import features, sweep
from mutual.protocols import layers
from stori_jax.checkpoints import CheckpointError, hf, openai, validate
from stori_jax.models import CLIPConfig, TextConfig, get_architecture, init_params, tower_kinds
from stori_jax.models.random_weights import shrink_config
from stori_jax.plumbing.config_files import ConfigError
from stori_jax.reference import parity_report as comparison
from toy_plugins import TOY_TOWER, ToyConfig  # tests/ is on sys.path

VISION = ToyConfig(image_size=32, patch_size=8, width=16, mixer_layers=2)
# One head: a state dict's heads are read as width // 64 (at least 1).
TEXT = TextConfig(width=32, layers=1, heads=1, activation="quick_gelu")


@pytest.fixture(scope="module", autouse=True)
def toy_kind():
  """The one registration, undone after this file's tests."""
  kind = tower_kinds.register(TOY_TOWER)
  yield kind
  tower_kinds.unregister(kind.name)


@pytest.fixture(scope="module")
def config(toy_kind):
  """A CLIP with the toy image tower (a config is checked by its kind, so after registering)."""
  return CLIPConfig(embed_dim=16, text=TEXT, vision=VISION, name="toy-clip")


@pytest.fixture(scope="module")
def bundle(config):
  return stori_jax.CLIPBundle(config=config, params=init_params(config, seed=0))


def _images(batch=3, seed=0):
  return np.random.default_rng(seed).standard_normal((batch, 32, 32, 3)).astype(np.float32)


def test_the_registration_is_the_kind_everywhere(toy_kind, config):
  assert config.vision_kind == "toy" and tower_kinds.of(VISION) is toy_kind
  assert [k.name for k in tower_kinds.kinds()] == ["vit", "resnet", "convnext", "toy"]
  assert CLIPConfig.from_dict(config.to_dict()) == config
  # The built-in kinds' dicts are still told apart.
  for name, kind in (("ViT-B-32", "vit"), ("RN50", "resnet"), ("convnext_base", "convnext")):
    assert tower_kinds.kind_of_dict(get_architecture(name).to_dict()["vision"]).name == kind
  assert sweep.family(config) == "Toy" and sweep.families()[-1] == "Toy"
  shrunk = shrink_config(config, 2)
  assert shrunk.vision == dataclasses.replace(VISION, width=8) and shrunk.vision_kind == "toy"
  with pytest.raises(ValueError, match="not a multiple"):
    config.replace(vision=ToyConfig(image_size=30))


def test_registry_refuses_duplicates_and_ambiguous_dicts(toy_kind):
  with pytest.raises(ValueError, match="already registered"):
    tower_kinds.register(toy_kind)
  with pytest.raises(ValueError, match="already the config"):
    tower_kinds.register(dataclasses.replace(toy_kind, name="toy2"))
  greedy = dataclasses.replace(
    toy_kind, name="greedy", config=type("Greedy", (), {}), recognises=lambda d: True
  )
  tower_kinds.register(greedy)
  try:
    with pytest.raises(ValueError, match="alike"):
      tower_kinds.kind_of_dict({"mixer_layers": 1})
  finally:
    tower_kinds.unregister("greedy")
  with pytest.raises(ValueError, match="unknown hooks"):
    dataclasses.replace(toy_kind, name="toy3", hooks={"no_such_hook": print})


def test_load_encode_and_mutual_features(bundle, config, tmp_path):
  # Load: this project's format, saved and read back (config from stori_config.json).
  loaded = stori_jax.load(stori_jax.save(bundle, tmp_path / "toy"))
  assert loaded.config == config
  x = _images()
  embeddings = loaded.encode_image(x)
  assert embeddings.shape == (3, 16) and np.isfinite(embeddings).all()
  np.testing.assert_array_equal(embeddings, bundle.encode_image(x))
  _, details = loaded.image_details(x)
  grid, width = VISION.grid_size, VISION.width

  # Mutual knowledge: last-block tokens and keys on the patch grid.
  tokens = features.patch_features(loaded, x, "tokens")
  keys = features.patch_features(loaded, x, "keys")
  assert tokens.shape == keys.shape == (3, grid, grid, width)
  np.testing.assert_array_equal(tokens, details["feature_map"])
  np.testing.assert_array_equal(
    keys, np.asarray(details["keys"])[:, 1:].reshape(3, grid, grid, width)
  )
  both = features.facet_grids(loaded, x, per_pass=2)
  np.testing.assert_array_equal(both["tokens"], tokens)
  np.testing.assert_array_equal(both["keys"], keys)
  normed, patches = features.embeddings_and_patches(loaded, x, "keys", per_pass=2)
  np.testing.assert_allclose(np.linalg.norm(normed, axis=-1), 1.0, rtol=1e-6)
  np.testing.assert_array_equal(patches, keys)
  per_image = grid * grid * width * 4
  assert features.images_per_pass(loaded, 0, "cpu") == features.CPU_PASS_BYTES // per_image

  # No class token in every block: App. A.1's layer similarity is refused by the kind's flag.
  with pytest.raises(ValueError, match="class token"):
    features.class_token_layers(loaded, x)
  with pytest.raises(ConfigError, match="'toy'"):
    layers.check_model(loaded)


def _text_state_dict(params, layers_count: int) -> dict:
  """The text tower's params in OpenAI's key layout (the inverse of checkpoints.openai)."""
  text = params["text"]
  sd = {
    "token_embedding.weight": text["token_embedding"]["embedding"],
    "positional_embedding": text["positional_embedding"],
    "text_projection": text["text_projection"],
    "ln_final.weight": text["ln_final"]["scale"],
    "ln_final.bias": text["ln_final"]["bias"],
    "logit_scale": np.asarray(params["logit_scale"]),
  }
  for i in range(layers_count):
    block, p = text[f"resblocks_{i}"], f"transformer.resblocks.{i}."
    attn = block["attn"]
    names = ("query", "key", "value")
    sd[p + "attn.in_proj_weight"] = np.concatenate([np.asarray(attn[n]["kernel"]).T for n in names])
    sd[p + "attn.in_proj_bias"] = np.concatenate([attn[n]["bias"] for n in names])
    sd[p + "attn.out_proj.weight"] = np.asarray(attn["out"]["kernel"]).T
    sd[p + "attn.out_proj.bias"] = attn["out"]["bias"]
    for ln in ("ln_1", "ln_2"):
      sd[p + ln + ".weight"], sd[p + ln + ".bias"] = block[ln]["scale"], block[ln]["bias"]
    for fc in ("c_fc", "c_proj"):
      sd[p + f"mlp.{fc}.weight"] = np.asarray(block["mlp"][fc]["kernel"]).T
      sd[p + f"mlp.{fc}.bias"] = block["mlp"][fc]["bias"]
  return sd


def test_a_state_dict_through_the_kinds_own_hooks(bundle, config, tmp_path):
  params = jax.device_get(bundle.params)
  vision = params["vision"]
  sd = _text_state_dict(params, config.text.layers)
  sd["visual.toy_stem.weight"] = np.transpose(vision["stem"]["kernel"], (3, 2, 0, 1))
  sd["visual.toy_stem.bias"] = vision["stem"]["bias"]
  sd["visual.toy_pos"] = vision["pos"]
  for i in range(VISION.mixer_layers):
    sd[f"visual.toy_mix.{i}.weight"] = np.asarray(vision[f"mix_{i}"]["kernel"]).T
    sd[f"visual.toy_mix.{i}.bias"] = vision[f"mix_{i}"]["bias"]
  sd["visual.toy_proj.weight"] = np.asarray(vision["proj"]["kernel"]).T
  sd["visual.toy_key.weight"] = np.asarray(vision["key"]["kernel"]).T
  path = tmp_path / "toy.safetensors"
  save_file({k: np.array(v, np.float32, order="C") for k, v in sd.items()}, str(path))

  # No arch given: the toy's state_dict_config hook reads the architecture from its keys.
  loaded = stori_jax.load(path)
  assert loaded.config.replace(name="") == config.replace(name="")
  for a, b in zip(jax.tree_util.tree_leaves(loaded.params), jax.tree_util.tree_leaves(params)):
    np.testing.assert_array_equal(a, b)
  x = _images(2, seed=1)
  np.testing.assert_array_equal(loaded.encode_image(x), bundle.encode_image(x))

  # A block count the weights do not hold is named before the model is built.
  more = dataclasses.replace(VISION, mixer_layers=3)
  shapes = {k: v.shape for k, v in validate.flatten(params).items()}
  with pytest.raises(CheckpointError, match="vision.mixer_layers = 3"):
    validate.check_config_fits_weights(config.replace(vision=more), shapes, "weights", "cfg")

  # A conversion the kind does not register is an error naming the kind and the hook.
  with pytest.raises(CheckpointError, match="'toy'.*transformers_params"):
    hf.params_from_state_dict({}, config, "hf weights")
  assert openai.params_from_state_dict(sd, config, "toy")["vision"]["pos"].shape == (4, 4, 16)


def test_parity_labels_and_descriptions_come_from_the_kind(toy_kind, config):
  report = {
    "config": config.to_dict(),
    "text_blocks": [{"block": 0, "max_abs": 0.0, "scale": 1.0, "max_rel": 0.0}],
    "vision_blocks": [{"block": i, "max_abs": 0.0, "scale": 1.0, "max_rel": 0.0} for i in range(3)],
    **{
      n: {"max_abs": 0.0, "scale": 1.0, "max_rel": 0.0}
      for n in ("text_features", "image_features", "logits")
    },
    "worst_final_rel": 0.0,
  }
  table = comparison.format_report(report)
  assert "vision stem" in table and "vision mixer 2" in table
  assert toy_kind.describe(VISION) == "Toy 2x16 patch 8"
  assert math.isclose(features.activation_bytes(VISION), 4 * 16 * 16)
