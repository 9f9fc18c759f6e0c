"""SToRI's Figure 5 across models (stori_jax.retrieval.model_sweep, run by `stori_jax.retrieve`
on a config that names `models`): each model's sweep equals the sweep `retrieve` makes for that
model alone; the config is checked before any work; the paper's models are registered."""

import json
import os

import jax
import numpy as np
import pytest

from stori_jax.clip import loading
from stori_jax.plumbing.config_files import ConfigError, load_config
from stori_jax.models import registry
from stori_jax.retrieval import model_sweep, runner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(argument="smoke", cache_dir=""):
  config = load_config(os.path.join(ROOT, "configs/retrieval_fig5_models.py"), argument)
  config.cache_dir = cache_dir
  return config


def test_the_papers_models_are_registered_stori_models():
  """Figure 5's CLIP ViT-B/16, CLIP ViT-L/14, OpenCLIP and MetaCLIP, in that order."""
  labels = [registry.get(n).label for n in model_sweep.PAPER_MODELS]
  assert labels == [
    "ViT-B/16",
    "ViT-L/14",
    "OpenCLIP ViT-L/14 (LAION-2B)",
    "MetaCLIP ViT-L/14 (2.5B)",
  ]
  assert all(registry.STORI in registry.get(n).papers for n in model_sweep.PAPER_MODELS)
  config = _config("celeba")
  assert config.models == model_sweep.PAPER_MODELS and config.data.source == "celeba"
  assert config.start_block is None  # each model's default: block 7 of 12 for these four
  assert all(registry.get(n).config.text.layers == 12 for n in config.models)
  # The paper's prompt 'a photo of a woman with blond hair, wearing eyeglasses': w / 1 - w.
  prompt = config.data.prompts[config.sweep.tasks[0]]
  names = [a[1] for a in prompt["attributes"]]
  assert names == ["woman", "with blond hair", "wearing eyeglasses"]
  assert tuple(config.sweep.attributes) == (1, 2)
  assert config.sweep.ws[0] == 0.0 and config.sweep.ws[-1] == 1.0 and len(config.sweep.ws) == 11


def test_bad_values_stop_before_any_work(tmp_path):
  config = _config()
  config.models = ("tiny-synthetic", "random:RN-51")
  config.sweep.ws = (0.0, 1.5)
  with pytest.raises(ConfigError) as error:
    model_sweep.run(config, str(tmp_path / "out"))
  message = str(error.value)
  assert "'random:RN-51' is no registered architecture" in message
  assert "config.sweep.ws" in message
  assert not (tmp_path / "out").exists()  # nothing claimed, nothing written


def test_random_instance_is_deterministic_and_offline():
  """The random-weight stand-in of a registered model: its architecture at the rounded input
  size, the entry's mean / std, deterministic per (name, seed), distinct across names."""
  entry = registry.get("laion2b-vit-l-14")
  a = loading.random_instance(entry.name, 64, 16)
  b = loading.random_instance(entry.name, 64, 16)
  assert a.source == "random:laion2b-vit-l-14" and a.config.vision.image_size == 70
  assert a.preprocess_config.mean == entry.mean == (0.5, 0.5, 0.5)
  for x, y in zip(jax.tree_util.tree_leaves(a.params), jax.tree_util.tree_leaves(b.params)):
    np.testing.assert_array_equal(x, y)
  other = loading.random_instance("openai-vit-l-14", 64, 16)  # the same architecture
  first = [jax.tree_util.tree_leaves(x.params)[-1] for x in (a, other)]
  assert first[0].shape == first[1].shape and not np.array_equal(*first)
  assert loading.random_instance("openai-rn50", 0).config.vision.image_size == 224


def _single_model_sweep(config, name, workdir):
  """What `retrieve` gives this model alone: its runner on configs/retrieval_synthetic.py with
  the same data and weights (the Figure 5 sweep is its "stori_pair")."""
  single = load_config(os.path.join(ROOT, "configs/retrieval_synthetic.py"))
  single.data = config.data
  single.sweep.ws = config.sweep.ws
  single.sweep.start_blocks = single.sweep.single_blocks = "none"
  single.methods = ("stori",)
  single.cache_dir = config.cache_dir
  if name.startswith(model_sweep.RANDOM):
    bundle = model_sweep.load_model(name, config)
  else:
    bundle, single.model = None, name
  return runner.run(single, workdir, bundle=bundle)["sweeps"]["stori_pair"]


@pytest.mark.slow
def test_each_models_sweep_equals_its_single_model_run(tmp_path, run_command):
  """configs/retrieval_fig5_models.py:smoke through the command (the tiny CLIP and two random
  instances): one panel, one line and one table row per model, and each model's sweep equal to
  `retrieve`'s for that model alone."""
  cache = tmp_path / "cache"
  done = run_command(
    "stori_jax.retrieve",
    "--config",
    os.path.join(ROOT, "configs/retrieval_fig5_models.py:smoke"),
    f"--config.cache_dir={cache}",
    f"--workdir={tmp_path / 'out'}",
  )
  assert done.returncode == 0, done.stderr[-3000:]
  config = _config(cache_dir=str(cache))
  results = json.loads((tmp_path / "out" / "fig5_models.json").read_text())
  assert results["order"] == list(config.models) and len(config.models) == 3
  for k, name in enumerate(config.models):
    got = results["models"][name]
    want = _single_model_sweep(config, name, str(tmp_path / f"single{k}"))
    assert got["sweep"] == json.loads(json.dumps(want)), name
    assert got["start_block"] == (4 if name == "tiny-synthetic" else 2)
  # The trained tiny CLIP favours the category as w grows; random weights barely move.
  tiny = results["models"]["tiny-synthetic"]
  assert tiny["focus_auc_monotonic"]
  focus = [row[tiny["sweep"]["focus"]] for row in tiny["sweep"]["mean_auc"]]
  assert focus[-1] - focus[0] > 0.1
  table = (tmp_path / "out" / "fig5_models.md").read_text()
  summary = table.split("\n\n")[1].splitlines()[2:]
  assert [line.split(" | ")[0] for line in summary] == [
    "| tiny-synthetic",
    "| ViT-B/16 (random weights)",
    "| OpenCLIP ViT-L/14 (LAION-2B) (random weights)",
  ]
  for name in ("fig5_models.png", "fig5_models_favoured.png"):
    assert (tmp_path / "out" / name).stat().st_size > 20000
    assert str(tmp_path / "out" / name) in done.stdout
