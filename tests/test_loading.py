"""stori_jax.load / save / convert: formats, round trips and the errors users see."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from safetensors.numpy import save_file

import stori_jax
from stori_jax.checkpoints import CheckpointError, CheckpointMismatchError
from stori_jax.plumbing.errors import NonFiniteError
from stori_jax.models import CLIPConfig, TextConfig, VisionConfig, init_params

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONFIG = CLIPConfig(
  embed_dim=32,
  text=TextConfig(width=64, layers=2, heads=1),
  vision=VisionConfig(image_size=32, patch_size=8, width=64, layers=2, heads=1),
)


def _ids(batch=2, length=77):
  ids = np.zeros((batch, length), np.int32)
  ids[:, 0], ids[:, 1:4], ids[:, 4] = 49406, 320, 49407
  return ids


@pytest.fixture(scope="module")
def bundle():
  return stori_jax.CLIPBundle(config=CONFIG, params=init_params(CONFIG, seed=0))


def _openai_state_dict(params):
  """Our params back in OpenAI key layout (the inverse of checkpoints.openai)."""
  sd = {
    "token_embedding.weight": params["text"]["token_embedding"]["embedding"],
    "positional_embedding": params["text"]["positional_embedding"],
    "text_projection": params["text"]["text_projection"],
    "ln_final.weight": params["text"]["ln_final"]["scale"],
    "ln_final.bias": params["text"]["ln_final"]["bias"],
    "visual.conv1.weight": np.transpose(params["vision"]["conv1"]["kernel"], (3, 2, 0, 1)),
    "visual.class_embedding": params["vision"]["class_embedding"],
    "visual.positional_embedding": params["vision"]["positional_embedding"],
    "visual.proj": params["vision"]["proj"],
    "logit_scale": np.asarray(params["logit_scale"]),
  }
  for ln in ("ln_pre", "ln_post"):
    sd[f"visual.{ln}.weight"] = params["vision"][ln]["scale"]
    sd[f"visual.{ln}.bias"] = params["vision"][ln]["bias"]
  for tower, prefix in (
    ("text", "transformer.resblocks."),
    ("vision", "visual.transformer.resblocks."),
  ):
    for i in range(2):
      block, p = params[tower][f"resblocks_{i}"], f"{prefix}{i}."
      attn = block["attn"]
      sd[p + "attn.in_proj_weight"] = np.concatenate(
        [np.asarray(attn[n]["kernel"]).T for n in ("query", "key", "value")]
      )
      sd[p + "attn.in_proj_bias"] = np.concatenate(
        [attn[n]["bias"] for n in ("query", "key", "value")]
      )
      sd[p + "attn.out_proj.weight"] = np.asarray(attn["out"]["kernel"]).T
      sd[p + "attn.out_proj.bias"] = attn["out"]["bias"]
      for ln in ("ln_1", "ln_2"):
        sd[p + ln + ".weight"], sd[p + ln + ".bias"] = block[ln]["scale"], block[ln]["bias"]
      for fc in ("c_fc", "c_proj"):
        sd[p + f"mlp.{fc}.weight"] = np.asarray(block["mlp"][fc]["kernel"]).T
        sd[p + f"mlp.{fc}.bias"] = block["mlp"][fc]["bias"]
  return {k: np.array(v, np.float32, order="C") for k, v in sd.items()}


@pytest.fixture(scope="module")
def openai_file(tmp_path_factory, bundle):
  path = tmp_path_factory.mktemp("openai") / "model.safetensors"
  save_file(_openai_state_dict(bundle.params), str(path))
  return path


@pytest.mark.slow
def test_safetensors_state_dict_round_trip(openai_file, bundle):
  loaded = stori_jax.load(openai_file, arch=CONFIG)
  for a, b in zip(
    jax.tree_util.tree_leaves(loaded.params), jax.tree_util.tree_leaves(bundle.params)
  ):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(loaded.encode_text(_ids()), bundle.encode_text(_ids()))


@pytest.mark.parametrize("params_format", ["safetensors", "orbax"])
def test_native_round_trip(tmp_path, bundle, params_format):
  directory = stori_jax.save(bundle, tmp_path / "ckpt", params_format=params_format)
  loaded = stori_jax.load(directory)
  assert loaded.config == bundle.config
  images = np.random.default_rng(0).standard_normal((2, 32, 32, 3)).astype(np.float32)
  np.testing.assert_array_equal(loaded.encode_image(images), bundle.encode_image(images))
  np.testing.assert_array_equal(loaded.encode_text(_ids()), bundle.encode_text(_ids()))


def test_mismatched_architecture_names_shapes(openai_file):
  wrong = CONFIG.replace(
    vision=VisionConfig(image_size=32, patch_size=16, width=64, layers=2, heads=1)
  )
  with pytest.raises(CheckpointMismatchError) as e:
    stori_jax.load(openai_file, arch=wrong)
  message = str(e.value)
  assert "vision/conv1/kernel" in message and "(8, 8, 3, 64)" in message
  assert "(16, 16, 3, 64)" in message


def test_missing_and_unexpected_keys_are_named(tmp_path, bundle):
  sd = _openai_state_dict(bundle.params)
  del sd["visual.ln_post.bias"]
  sd["visual.extra_head.weight"] = np.zeros(3, np.float32)
  path = tmp_path / "broken.safetensors"
  save_file(sd, str(path))
  with pytest.raises(CheckpointMismatchError) as e:
    stori_jax.load(path, arch=CONFIG)
  assert e.value.missing == ["visual.ln_post.bias"]
  assert e.value.unexpected == ["visual.extra_head.weight"]
  assert "visual.ln_post.bias" in str(e.value) and "visual.extra_head.weight" in str(e.value)


def test_deeper_architecture_than_checkpoint(openai_file):
  deeper = CONFIG.replace(text=TextConfig(width=64, layers=3, heads=1))
  with pytest.raises(CheckpointMismatchError, match="transformer.resblocks.2.ln_1.weight"):
    stori_jax.load(openai_file, arch=deeper)


def test_bad_inputs_give_sizes(bundle):
  with pytest.raises(ValueError, match=r"\[batch, 32, 32, 3\].*\(2, 64, 64, 3\)"):
    bundle.encode_image(np.zeros((2, 64, 64, 3), np.float32))
  with pytest.raises(ValueError, match="length 78 exceed the model's context length 77"):
    bundle.encode_text(np.full((1, 78), 49407, np.int32))
  no_eot = _ids()
  no_eot[1, 4] = 0
  with pytest.raises(ValueError, match=r"Rows \[1\] have no end-of-text token"):
    bundle.encode_text(no_eot)
  with pytest.raises(ValueError, match="uint8|floats"):
    bundle.encode_image(np.zeros((1, 32, 32, 3), np.uint8))
  with pytest.raises(ValueError, match="must have the shape of the token ids"):
    bundle.encode_text(_ids(), weights=np.ones((2, 5)))
  with pytest.raises(ValueError, match=">= 0"):
    bundle.encode_text(_ids(), weights=-np.ones((2, 77)))


def test_state_dict_with_nan_names_the_file_and_parameter(tmp_path, bundle):
  sd = _openai_state_dict(bundle.params)
  sd["visual.ln_post.weight"][3] = np.inf
  path = tmp_path / "diverged.safetensors"
  save_file(sd, str(path))
  with pytest.raises(NonFiniteError) as e:
    stori_jax.load(path, arch=CONFIG)
  assert str(path) in str(e.value) and "vision/ln_post/scale has 1 NaN or infinite" in str(e.value)


def test_short_sequences_give_the_same_features(bundle):
  """The causal mask makes the EOT output independent of the padding after it."""
  ids = _ids()
  np.testing.assert_allclose(
    bundle.encode_text(ids[:, :5]), bundle.encode_text(ids), rtol=1e-6, atol=1e-6
  )


def test_unknown_source_and_directory_errors(tmp_path):
  with pytest.raises(CheckpointError, match="does not exist"):
    stori_jax.load(tmp_path / "nowhere" / "x.pt")
  with pytest.raises(CheckpointError, match="stori_config.json.*config.json.*open_clip_config"):
    stori_jax.load(tmp_path)


def test_offline_hub_error_names_file_and_destination(tmp_path):
  code = (
    "import stori_jax\n"
    "try:\n  stori_jax.load('openai/clip-vit-base-patch32')\n"
    "except stori_jax.CheckpointError as e:\n  print('ERR', e)\n"
  )
  env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path))
  out = subprocess.run(
    [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=120
  ).stdout
  assert "ERR" in out
  assert "https://huggingface.co/openai/clip-vit-base-patch32/resolve/main/config.json" in out
  assert "stori_jax.load('checkpoints/openai__clip-vit-base-patch32')" in out


@pytest.mark.slow
def test_hf_directory_loads_without_torch(tmp_path):
  """transformers layout written by hand with safetensors; torch imports are blocked."""
  pytest.importorskip("transformers", reason="writes the HF config with transformers")
  torch = pytest.importorskip("torch", reason="builds the HF checkpoint with torch")
  from stori_jax.reference import parity_report

  model, bundle = parity_report.random_pair(CONFIG.with_activation("gelu"), "transformers", seed=0)
  model.save_pretrained(tmp_path)
  del torch
  code = (
    "import sys; sys.modules['torch'] = None\n"
    "import numpy as np, stori_jax\n"
    f"b = stori_jax.load({str(tmp_path)!r})\n"
    "ids = np.zeros((1, 77), np.int32); ids[0, :3] = [49406, 320, 49407]\n"
    "np.save(sys.argv[1], np.asarray(b.encode_text(ids)))\n"
  )
  out = tmp_path / "features.npy"
  subprocess.run([sys.executable, "-c", code, str(out)], check=True, timeout=300)
  ids = np.zeros((1, 77), np.int32)
  ids[0, :3] = [49406, 320, 49407]
  np.testing.assert_allclose(np.load(out), bundle.encode_text(ids), rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_convert_cli_and_parity_cli(tmp_path, openai_file):
  pytest.importorskip("torch", reason="the parity tool runs the PyTorch reference")
  pytest.importorskip("open_clip", reason="the parity tool runs the open_clip reference")
  out = tmp_path / "converted"
  subprocess.run(
    [sys.executable, "-m", "stori_jax.convert", f"--input={openai_file}", f"--output={out}"],
    check=True,
    cwd=REPO,
    timeout=300,
    capture_output=True,
  )
  meta = json.loads((out / "stori_config.json").read_text())
  assert meta["metadata"]["converted_from"] == str(openai_file)
  report_path = tmp_path / "report.json"
  result = subprocess.run(
    [sys.executable, "-m", "stori_jax.parity", f"--source={out}", f"--json={report_path}"],
    check=True,
    cwd=REPO,
    timeout=300,
    capture_output=True,
    text=True,
  )
  assert "text block 2" in result.stdout and "vision block 2" in result.stdout
  report = json.loads(report_path.read_text())
  assert report["worst_final_rel"] < 1e-5


# Issue 26 row 9: non-float weights and broken preprocessing entries are refused at load, named.


def _edit_native(directory, edit):
  path = os.path.join(directory, "stori_config.json")
  with open(path, encoding="utf-8") as f:
    meta = json.load(f)
  edit(meta)
  with open(path, "w", encoding="utf-8") as f:
    json.dump(meta, f)  # allow_nan: a NaN mean is written as the bare token NaN


@pytest.mark.parametrize("dtype", [np.int8, np.bool_])
def test_non_float_weight_tensors_are_refused_with_their_name(tmp_path, bundle, dtype):
  from safetensors.numpy import load_file

  directory = stori_jax.save(bundle, tmp_path / "ckpt")
  path = os.path.join(directory, "params.safetensors")
  flat = load_file(path)
  key = "text/token_embedding/embedding"
  flat[key] = flat[key].astype(dtype)
  save_file(flat, path)
  with pytest.raises(CheckpointError, match=f"{key} as {np.dtype(dtype).name}.*floating point"):
    stori_jax.load(directory)
  # a state-dict file (OpenAI layout) too
  sd = _openai_state_dict(bundle.params)
  sd["visual.proj"] = sd["visual.proj"].astype(dtype)
  save_file(sd, str(tmp_path / "sd.safetensors"))
  with pytest.raises(CheckpointError, match=r"visual\.proj as"):
    stori_jax.load(tmp_path / "sd.safetensors", arch=CONFIG)


@pytest.mark.parametrize(
  "preprocess, match",
  [
    ({"std": [0.0, 0.26, 0.27]}, r"std is \[0.0, 0.26, 0.27\]; every value must be > 0"),
    ({"mean": [float("nan"), 0.45, 0.4]}, r"mean is .*nan.*3 finite numbers"),
    ({"std": [0.26, 0.27]}, r"std is \[0.26, 0.27\]; it must be a list of 3 finite numbers"),
    (
      {"image_size": 224},
      r"image_size is 224, but the model's vision tower takes 32x32 images.*"
      r'"preprocess": \{"image_size": 32\}',
    ),
    ("fast", r'"preprocess" must be a JSON object'),
  ],
)
def test_bad_preprocess_entries_are_refused(tmp_path, bundle, preprocess, match):
  directory = stori_jax.save(bundle, tmp_path / "ckpt")
  _edit_native(
    directory,
    lambda m: (
      m.update(preprocess=preprocess if isinstance(preprocess, str) else m["preprocess"])
      or (m["preprocess"].update(preprocess) if isinstance(preprocess, dict) else None)
    ),
  )
  with pytest.raises(CheckpointError, match=match) as e:
    stori_jax.load(directory)
  assert "stori_config.json" in str(e.value)


def test_default_preprocess_follows_the_model_size(tmp_path, bundle):
  # a 32-px model saved without a preprocess config must not record (or preprocess at) 224
  assert bundle.preprocess_config.image_size == 32
  loaded = stori_jax.load(stori_jax.save(bundle, tmp_path / "ckpt"))
  assert loaded.preprocess_config.image_size == 32
  image = np.zeros((50, 40, 3), np.uint8)
  assert loaded.encode_image(loaded.preprocess(image)[None]).shape == (1, 32)


# Issue 26 row 4: a config that does not fit its weights is refused before any model is built.


@pytest.mark.parametrize(
  "key, value, match",
  [
    ("text", {"layers": 10**9}, r"text.layers is 1000000000; at most 1024 is accepted"),
    ("text", {"layers": 3}, r"text.layers = 3, but the weights .* hold 2 text blocks"),
    ("vision", {"layers": 5}, r"vision.layers = 5, but the weights .* hold 2 vision blocks"),
    ("text", {"context_length": 10**8}, r"text.context_length is 100000000; at most"),
    ("text", {"context_length": 99}, r"text.context_length x text.width = \(99, 64\)"),
  ],
)
def test_config_against_weights_before_building(tmp_path, bundle, monkeypatch, key, value, match):
  from stori_jax.checkpoints import native

  directory = stori_jax.save(bundle, tmp_path / "ckpt")
  _edit_native(directory, lambda m: m["config"][key].update(value))
  # nothing may be built from the edited config before the refusal
  monkeypatch.setattr(native, "param_shapes", lambda config: pytest.fail("built the model"))
  monkeypatch.setattr(native, "check_params", lambda *a: pytest.fail("built the model"))
  with pytest.raises(CheckpointError, match=match) as e:
    stori_jax.load(directory)
  assert "stori_config.json" in str(e.value)
