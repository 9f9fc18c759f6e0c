"""Flax CLIP vs the PyTorch references (open_clip, transformers) with the same weights."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip(
  "torch", reason="parity tests need the PyTorch references: pip install -e '.[torch]'"
)
open_clip = pytest.importorskip("open_clip", reason="pip install -e '.[torch]' (open_clip_torch)")

import stori_jax  # pylint: disable=wrong-import-position
from stori_jax.plumbing import cli
from stori_jax import parity
from stori_jax.reference import parity_report  # pylint: disable=wrong-import-position
from stori_jax.reference import clip_towers
from stori_jax.models import CLIPConfig, TextConfig, VisionConfig  # pylint: disable=wrong-import-position

# fp32 target of the numerics contract: max |jax - torch| <= 1e-5 * max |torch|.
FP32_REL_TOL = 1e-5


def small_config(activation, mlp_ratio=4, image_size=32, patch=8):
  return CLIPConfig(
    embed_dim=40,
    text=TextConfig(width=64, layers=3, heads=4, activation=activation, mlp_dim=64 * mlp_ratio),
    vision=VisionConfig(
      image_size=image_size,
      patch_size=patch,
      width=48,
      layers=2,
      heads=4,
      activation=activation,
      mlp_dim=48 * mlp_ratio,
    ),
    name=f"small-{activation}",
  )


def assert_parity(report, tol=FP32_REL_TOL):
  for name in ("text_features", "image_features", "logits"):
    assert report[name]["max_rel"] <= tol, (name, report[name])
  for tower in ("text", "vision"):
    for row in report[f"{tower}_blocks"]:
      assert row["max_rel"] <= tol, (tower, row)


@pytest.mark.parametrize("reference", ["transformers", "open_clip"])
@pytest.mark.parametrize("activation", ["quick_gelu", "gelu"])
def test_random_weights_match_reference(reference, activation):
  config = small_config(activation, mlp_ratio=2 if reference == "transformers" else 4)
  model, bundle = parity_report.random_pair(config, reference, seed=1)
  report = parity_report.run_parity(model, bundle, batch=3, seed=2)
  assert_parity(report)
  assert len(report["text_blocks"]) == config.text.layers + 1
  assert len(report["vision_blocks"]) == config.vision.layers + 1


@pytest.mark.parametrize("reference", ["transformers", "open_clip"])
def test_random_pair_is_the_same_for_the_same_seed(reference):
  """The library's own initialisation is seeded too (it drew from torch's global generator, so
  a benchmark's 'same' random model differed from run to run); another seed differs."""
  import jax  # pylint: disable=import-outside-toplevel

  config = small_config("gelu")
  leaves = lambda seed: jax.tree_util.tree_leaves(
    parity_report.random_pair(config, reference, seed)[1].params
  )
  first, again, other = leaves(3), leaves(3), leaves(4)
  for a, b in zip(first, again):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert any(not np.array_equal(np.asarray(a), np.asarray(c)) for a, c in zip(first, other))


def test_parity_would_catch_a_wrong_activation():
  """The tolerance is tight enough to tell QuickGELU from GELU."""
  model, bundle = parity_report.random_pair(small_config("gelu"), "open_clip", seed=1)
  wrong = stori_jax.CLIPBundle(
    config=bundle.config.with_activation("quick_gelu"), params=bundle.params
  )
  report = parity_report.run_parity(model, wrong, batch=2)
  assert report["worst_final_rel"] > 100 * FP32_REL_TOL


def _save_open_clip_state_dict(tmp_path, config, seed=0):
  model = clip_towers.randomize_(clip_towers.build_open_clip(config), seed)
  path = os.path.join(tmp_path, "weights.pt")
  torch.save(model.state_dict(), path)
  return model, path


def test_openai_format_state_dict_infers_architecture(tmp_path):
  config = small_config("quick_gelu")
  model, path = _save_open_clip_state_dict(tmp_path, config)
  bundle = stori_jax.load(path)  # No arch: shapes + OpenAI's QuickGELU.
  # Heads are not visible in the weights: OpenAI's rule is width // 64.
  assert bundle.config.text.width == 64 and bundle.config.text.heads == 1
  assert bundle.config.vision.patch_size == 8 and bundle.config.vision.image_size == 32
  assert bundle.config.text.activation == "quick_gelu"
  # With heads as the reference has them, the numbers match.
  exact = stori_jax.load(path, arch=config)
  assert_parity(parity_report.run_parity(model, exact, batch=2))


def test_openai_jit_archive(tmp_path):
  config = CLIPConfig(
    embed_dim=32,
    text=TextConfig(width=64, layers=2, heads=1, activation="quick_gelu"),
    vision=VisionConfig(
      image_size=32, patch_size=8, width=64, layers=2, heads=1, activation="quick_gelu"
    ),
  )
  model = clip_towers.randomize_(clip_towers.build_open_clip(config), 3)
  images, ids = parity_report.random_inputs(config, 2)
  traced = torch.jit.trace(
    model,
    (torch.from_numpy(images.transpose(0, 3, 1, 2)), torch.from_numpy(ids.astype(np.int64))),
    check_trace=False,
  )
  path = os.path.join(tmp_path, "ViT-tiny.pt")
  torch.jit.save(traced, path)
  bundle = stori_jax.load(path)
  assert bundle.config == config.replace(name="")
  assert_parity(parity_report.run_parity(model, bundle, batch=2))


def test_hf_directory_and_open_clip_directory(tmp_path):
  config = small_config("gelu", mlp_ratio=2)
  model, _ = parity_report.random_pair(config, "transformers", seed=4)
  model.save_pretrained(tmp_path / "hf")  # config.json + model.safetensors
  assert_parity(parity_report.run_parity(model, stori_jax.load(tmp_path / "hf"), batch=2))

  oc_model = clip_towers.randomize_(clip_towers.build_open_clip(config), 5)
  directory = tmp_path / "oc"
  directory.mkdir()
  from safetensors.torch import save_file

  save_file(
    {k: v.contiguous() for k, v in oc_model.state_dict().items()},
    directory / "open_clip_model.safetensors",
  )
  v, t = config.vision, config.text
  import json

  (directory / "open_clip_config.json").write_text(
    json.dumps(
      {
        "model_cfg": {
          "embed_dim": config.embed_dim,
          "vision_cfg": {
            "image_size": v.image_size,
            "layers": v.layers,
            "width": v.width,
            "patch_size": v.patch_size,
            "head_width": v.width // v.heads,
            "mlp_ratio": 2.0,
          },
          "text_cfg": {
            "context_length": t.context_length,
            "vocab_size": t.vocab_size,
            "width": t.width,
            "heads": t.heads,
            "layers": t.layers,
            "mlp_ratio": 2.0,
          },
        },
        "preprocess_cfg": {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]},
      }
    )
  )
  bundle = stori_jax.load(directory)
  assert bundle.preprocess_config.mean == (0.5, 0.5, 0.5)
  assert_parity(parity_report.run_parity(oc_model, bundle, batch=2))


def test_bf16_compute_stays_close_to_fp32():
  model, bundle = parity_report.random_pair(small_config("quick_gelu"), "open_clip", seed=6)
  del model
  images, ids = parity_report.random_inputs(bundle.config, 4, seed=3)
  half = bundle.with_dtype(jnp.bfloat16)
  for fp32, bf16 in (
    (bundle.encode_text(ids), half.encode_text(ids)),
    (bundle.encode_image(images), half.encode_image(images)),
  ):
    assert bf16.dtype == jnp.float32
    cosine = np.sum(np.asarray(fp32) * np.asarray(bf16), -1) / (
      np.linalg.norm(fp32, axis=-1) * np.linalg.norm(bf16, axis=-1)
    )
    assert cosine.min() >= 0.999, cosine


@pytest.mark.slow
@pytest.mark.parametrize(
  "name,reference",
  [
    ("ViT-B-32-quickgelu", "open_clip"),
    ("ViT-B-16", "open_clip"),
    ("ViT-B-32", "transformers"),
    ("ViT-L-14-quickgelu", "open_clip"),
  ],
)
def test_full_size_architectures(name, reference):
  model, bundle = parity_report.random_pair(name, reference, seed=0)
  report = parity_report.run_parity(model, bundle, batch=2)
  assert_parity(report)


@pytest.mark.slow
def test_named_open_clip_model_state_dict(tmp_path):
  """A state dict of open_clip's own create_model, loaded by architecture name."""
  model = open_clip.create_model("ViT-B-32-quickgelu", pretrained=None).eval()
  clip_towers.randomize_(model, 7)
  path = tmp_path / "open_clip_pytorch_model.bin"
  torch.save(model.state_dict(), path)
  bundle = stori_jax.load(path, arch="ViT-B-32-quickgelu")
  assert_parity(parity_report.run_parity(model, bundle, batch=2))


def test_command_prints_its_header_and_passes(tmp_path, run_command):
  """Issue 29: what was compared (architecture, reference, dtype, device) above the table, the
  verdict against the contract as the last line, the JSON among the files written."""
  report = tmp_path / "report.json"
  done = run_command(parity, "--random=test-tiny", f"--json={report}")
  assert done.returncode == 0, done.stderr[-3000:]
  lines = done.stdout.splitlines()
  header = dict(line.split(":", 1) for line in lines[: lines.index("")])
  assert list(header) == ["architecture", "weights", "reference", "dtype", "device", "inputs"]
  assert header["architecture"].strip().startswith("test-tiny (text 4x32")
  assert "open_clip" in header["reference"] and "torch" in header["reference"]
  assert header["dtype"].strip().startswith("float32 compute")
  assert header["device"].strip().startswith("cpu")
  verdict = lines[-1]
  assert verdict.startswith("PASS: worst relative error ") and "tolerance 1e-05" in verdict
  worst = float(verdict.split()[4])
  saved = json.loads(report.read_text())
  assert 0 < worst < FP32_REL_TOL and saved["passed"] is True
  # The worst of every block and output, which the verdict names.
  assert worst == pytest.approx(saved["worst"]["max_rel"], rel=1e-3)
  assert f"({saved['worst']['tensor']})" in verdict
  assert cli.written_paths(done.stdout) == [str(report)]


def test_command_fails_with_exit_status_1(run_command, monkeypatch):
  """A broken layer (QuickGELU weights read as GELU) or a tolerance nothing meets: FAIL, 1."""
  right = parity_report.random_pair

  def broken(arch, reference="open_clip", seed=0):
    model, bundle = right(arch, reference, seed)
    wrong = bundle.config.with_activation("quick_gelu")
    return model, stori_jax.CLIPBundle(config=wrong, params=bundle.params, source=bundle.source)

  monkeypatch.setattr(parity_report, "random_pair", broken)
  done = run_command(parity, "--random=test-tiny", "--batch=2")
  assert done.returncode == 1
  verdict = done.stdout.splitlines()[-1]
  assert verdict.startswith("FAIL: worst relative error ") and "> tolerance 1e-05" in verdict
  assert float(verdict.split()[4]) > 100 * FP32_REL_TOL
  monkeypatch.setattr(parity_report, "random_pair", right)
  monkeypatch.setattr(parity_report, "TOLERANCE", 1e-12)
  done = run_command(parity, "--random=test-tiny", "--batch=2")
  assert done.returncode == 1 and done.stdout.splitlines()[-1].startswith("FAIL: ")
  assert "> tolerance 1e-12" in done.stdout.splitlines()[-1]
