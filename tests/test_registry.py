"""The model registry: entries agree with open_clip; local, cached and offline loading."""

import dataclasses
import os
import re
import subprocess
import sys

import pytest

import stori_jax
from stori_jax.checkpoints import CheckpointError, hub
from stori_jax.models import get_architecture, registry

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
huggingface_hub = pytest.importorskip("huggingface_hub")


def test_the_papers_models_are_registered():
  mutual = registry.mutual_knowledge_models()
  assert len(mutual) == 13
  labels = {registry.get(n).label for n in mutual}
  assert labels == {
    "ViT-B/32",
    "ViT-B/16",
    "ViT-L/14",
    "ViT-L/14@336",
    "RN50",
    "RN101",
    "RN50x4",
    "RN50x16",
    "ViT-B/32-dcp",
    "ViT-B/16-dcp",
    "ViT-B/16-dfn",
    "CNeXt-B1",
    "CNeXt-B2",
  }
  stori = registry.names(registry.STORI)
  assert any(registry.get(n).label.startswith("MetaCLIP ViT-L/14") for n in stori)
  assert registry.find("ViT-B/16-dfn").name == "dfn2b-vit-b-16"
  assert registry.find("nope") is None
  with pytest.raises(ValueError, match="not a registered model"):
    registry.get("nope")


@pytest.mark.parametrize("name", registry.names())
def test_entry_is_consistent(name):
  entry = registry.get(name)
  config = entry.config
  assert config.vision.image_size == entry.image_size
  assert (config.text.activation == "quick_gelu") == entry.quick_gelu
  for accuracy in (entry.imagenet_open_clip, entry.imagenet_paper):
    assert accuracy is None or 50 < accuracy < 90
  assert entry.url().startswith(f"https://huggingface.co/{entry.hf_repo}/resolve/main/")


@pytest.mark.parametrize("name", registry.names())
def test_entry_agrees_with_open_clip(name):
  """Architecture, hub repository, QuickGELU and preprocessing as open_clip has them."""
  open_clip = pytest.importorskip("open_clip")
  from stori_jax.checkpoints.open_clip_config import config_from_open_clip

  entry = registry.get(name)
  model_cfg = open_clip.get_model_config(entry.arch)
  assert config_from_open_clip(model_cfg, entry.arch) == get_architecture(entry.arch)
  base = entry.arch.removesuffix("-quickgelu")
  pretrained = open_clip.get_pretrained_cfg(base, entry.pretrained)
  assert pretrained, f"open_clip has no pretrained tag {entry.pretrained!r} for {base}"
  assert pretrained["hf_hub"].rstrip("/") == entry.hf_repo
  assert bool(pretrained.get("quick_gelu", False)) == entry.quick_gelu
  assert tuple(pretrained["mean"]) == entry.mean and tuple(pretrained["std"]) == entry.std
  assert pretrained["interpolation"] == entry.interpolation
  assert pretrained["resize_mode"] == entry.resize_mode


@pytest.fixture
def offline(monkeypatch, tmp_path):
  """No network and an empty Hugging Face cache; returns an empty models dir."""
  monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
  monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
  monkeypatch.delenv(hub.MODELS_DIR_ENV, raising=False)
  return tmp_path / "models"


@pytest.mark.parametrize("name", registry.names())
def test_offline_load_names_the_file_and_the_place(offline, name):
  entry = registry.get(name)
  with pytest.raises(CheckpointError) as error:
    stori_jax.load(name, models_dir=offline)
  message = str(error.value)
  assert entry.hf_repo in message and "open_clip_pytorch_model.bin" in message
  assert str(offline / name / "open_clip_pytorch_model.bin") in message


def _tiny_entry():
  """A registry entry whose architecture is the small test preset."""
  return dataclasses.replace(
    registry.get("openai-vit-b-32"),
    name="tiny-zoo-test",
    arch="test-tiny",
    image_size=32,
    hf_repo="example/tiny-zoo-test",
  )


def _tiny_state_dict_file(path):
  torch = pytest.importorskip("torch")
  from stori_jax.reference import clip_towers

  model = clip_towers.randomize_(clip_towers.build_open_clip(get_architecture("test-tiny")), 0)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  torch.save(model.state_dict(), path)
  return model


def test_load_from_the_models_dir(offline, monkeypatch):
  entry = _tiny_entry()
  monkeypatch.setitem(registry.REGISTRY, entry.name, entry)
  model = _tiny_state_dict_file(offline / entry.name / "open_clip_pytorch_model.bin")
  with pytest.raises(ValueError, match="drop arch"):
    stori_jax.load(entry.name, arch="ViT-B-32", models_dir=offline)
  monkeypatch.setenv(hub.MODELS_DIR_ENV, str(offline))
  bundle = stori_jax.load(entry.name)
  assert bundle.source == entry.name and bundle.config.name == entry.name
  assert bundle.preprocess_config.image_size == 32
  from stori_jax.reference import parity_report

  report = parity_report.run_parity(model, bundle, batch=2)
  assert report["worst_final_rel"] <= 1e-5


def test_found_in_the_hugging_face_cache(offline):
  """A file in the HF cache layout (as huggingface-cli download leaves it) is used."""
  entry = registry.get("openai-rn50")
  commit = "0" * 40
  cache = os.path.join(huggingface_hub.constants.HF_HUB_CACHE, "models--timm--resnet50_clip.openai")
  os.makedirs(os.path.join(cache, "refs"))
  with open(os.path.join(cache, "refs", "main"), "w") as f:
    f.write(commit)
  snapshot = os.path.join(cache, "snapshots", commit)
  os.makedirs(snapshot)
  weights = os.path.join(snapshot, "open_clip_model.safetensors")
  open(weights, "wb").close()
  found = hub.find_local(entry.name, entry.hf_repo, entry.weights_files, offline)
  assert found == (weights, "HF cache")
  assert hub.fetch_weights(entry.name, entry.hf_repo, entry.weights_files, offline) == weights
  # A hand-placed copy wins over the cache.
  local = offline / entry.name / "open_clip_pytorch_model.bin"
  os.makedirs(local.parent)
  local.write_bytes(b"")
  assert hub.find_local(entry.name, entry.hf_repo, entry.weights_files, offline) == (
    str(local),
    "local dir",
  )


def test_listing_cli_shows_status(tmp_path):
  (tmp_path / "openai-rn50").mkdir()
  (tmp_path / "openai-rn50" / "open_clip_pytorch_model.bin").write_bytes(b"")
  env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hf")}
  out = subprocess.run(
    [sys.executable, "-m", "stori_jax.list_models", f"--models_dir={tmp_path}"],
    capture_output=True,
    text=True,
    cwd=REPO,
    env=env,
    check=True,
  ).stdout
  rows = {line.split()[0]: line for line in out.splitlines() if line and not line.startswith(" ")}
  assert "local dir" in rows["openai-rn50"]
  assert rows["openai-rn101"].rstrip().endswith("missing")
  assert re.search(r"openai-rn101 +timm/resnet101_clip\.openai +open_clip_pytorch_model\.bin", out)
  assert all(name in rows for name in registry.names())


def test_openclip_entries_are_cherti_et_als_laion2b_models():
  """SToRI's OpenCLIP (Cherti et al., 2023; Fig. 5): the LAION-2B ViTs with open_clip's tags,
  hub repositories, GELU towers and ImageNet accuracies (docs/openclip_results.csv at the
  commit the module cites); test_entry_agrees_with_open_clip checks them against open_clip."""
  expected = {
    "laion2b-vit-b-16": ("ViT-B-16", "laion2b_s34b_b88k", "CLIP-ViT-B-16-laion2B-s34B-b88K", 70.23),
    "laion2b-vit-l-14": ("ViT-L-14", "laion2b_s32b_b82k", "CLIP-ViT-L-14-laion2B-s32B-b82K", 75.25),
    "laion2b-vit-h-14": ("ViT-H-14", "laion2b_s32b_b79k", "CLIP-ViT-H-14-laion2B-s32B-b79K", 77.96),
  }
  for name, (arch, tag, repo, top1) in expected.items():
    entry = registry.get(name)
    assert (entry.arch, entry.pretrained, entry.hf_repo) == (arch, tag, f"laion/{repo}")
    assert entry.imagenet_open_clip == top1 and entry.imagenet_paper is None
    assert entry.papers == (registry.STORI,) and entry.data.startswith("LAION-2B")
    assert not entry.quick_gelu and entry.image_size == 224
    assert registry.find(entry.label) is entry
  # open_clip's ViT-L/14 LAION-2B tag normalises with Inception's mean / std.
  assert registry.get("laion2b-vit-l-14").mean == registry.get("laion2b-vit-l-14").std == (0.5,) * 3
  assert registry.get("laion2b-vit-b-16").mean == registry.OPENAI_MEAN
  assert set(expected) <= set(registry.names(registry.STORI))
  assert not set(expected) & set(registry.mutual_knowledge_models())
