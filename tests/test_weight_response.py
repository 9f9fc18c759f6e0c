"""Weight-response training (stori_jax.pretraining.weight_response): its batches, its config checks,
a short deterministic and resumable run, and the shipped tiny CLIP it made."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from safetensors.numpy import load_file

from stori_jax.pretraining import weight_response
from stori_jax.plumbing.config_files import ConfigError, load_config
from stori_jax.clip.loading import ASSETS_DIR
from stori_jax.models import (
  CLIP,
  CLIPConfig,
  TextConfig,
  VisionConfig,
  init_params,
  reweighted_block_indices,
)
from stori_jax.tokenizer import default_tokenizer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_FILE = os.path.join(REPO, "configs", "tiny_clip_weight_response.py")


def small_config(**changes):
  config = load_config(CONFIG_FILE)
  config.update(
    dict(
      captions=300,
      batch_size=8,
      total_steps=4,
      warmup_steps=1,
      log_every=1,
      checkpoint_every=2,
      export_dtype="float32",
      **changes,
    )
  )
  return config


def test_batches_weight_one_attribute_word_and_drop_it_from_the_target():
  config = small_config()
  pool = weight_response.caption_pool(config)
  assert len(pool) == 300 and sum(p.startswith("a photo of a") for p in pool) >= 100
  batch = weight_response.batch_for_step(config, pool, 3)
  again = weight_response.batch_for_step(config, pool, 3)
  for key in batch:
    np.testing.assert_array_equal(batch[key], again[key])  # a function of (seed, step)
  tokenizer = default_tokenizer()
  for row in range(config.batch_size):
    ids, without = batch["ids"][row], batch["ids_without"][row]
    weighted = np.flatnonzero(batch["log_weights"][row] != 0)
    if batch["weights"][row] == 1.0:
      continue
    # The weighted tokens are the word's; the target caption is the caption without them.
    assert len(weighted) >= 1
    kept = [t for i, t in enumerate(ids) if t and i not in set(weighted)]
    assert kept == [t for t in without if t]
    word = tokenizer.decode([int(ids[i]) for i in weighted]).strip()
    assert word in weight_response.ATTRIBUTE_WORDS
  assert set(batch["weights"]) <= set(config.weights)


def test_bad_values_are_refused_before_any_work(tmp_path):
  with pytest.raises(ConfigError, match="weights") as error:
    weight_response.train(small_config(weights=(-1.0,)), str(tmp_path / "w"))
  assert not (tmp_path / "w").exists()
  with pytest.raises(ConfigError, match="blocks 1..6"):
    weight_response.train(small_config(start_block=9), str(tmp_path / "w"))
  del error


@pytest.mark.slow
def test_the_step_donates_its_state():
  tiny = CLIPConfig(
    embed_dim=16,
    text=TextConfig(context_length=64, width=16, layers=2, heads=2),
    vision=VisionConfig(image_size=32, patch_size=16, width=16, layers=1, heads=2),
  )
  teacher = init_params(tiny, seed=0)
  config = small_config()
  config.batch_size = 2
  optimizer = optax.adam(1e-3)
  step = weight_response.make_train_step(
    config, CLIP(tiny), teacher, reweighted_block_indices(2, 2), optimizer
  )
  text = jax.tree_util.tree_map(jnp.copy, teacher["text"])
  state = {"text": text, "opt_state": optimizer.init(text), "step": jnp.zeros((), jnp.int32)}
  batch = weight_response.batch_for_step(config, weight_response.caption_pool(config), 0)
  new_state, _ = step(state, batch)
  first = lambda tree: jax.tree_util.tree_leaves(tree)[0]
  assert first(state["text"]).is_deleted() and not first(new_state["text"]).is_deleted()
  assert not first(teacher["text"]).is_deleted()  # the teacher is a constant of the step


@pytest.mark.slow
def test_short_run_is_deterministic_and_resumes_to_the_same_weights(tmp_path):
  config = small_config()
  first = weight_response.train(config, str(tmp_path / "a"))
  records = [json.loads(line) for line in open(tmp_path / "a" / "metrics.jsonl")]
  assert [r["step"] for r in records] == [1, 2, 3, 4]
  assert records[0]["keep"] < 1e-6  # the student starts as the teacher
  assert all(np.isfinite(r["loss"]) for r in records)
  # A run killed after its step-2 checkpoint: resuming redoes steps 3-4 the same way.
  shutil.copytree(tmp_path / "a", tmp_path / "b")
  shutil.rmtree(tmp_path / "b" / "checkpoints" / "4")
  shutil.rmtree(tmp_path / "b" / "export")
  weight_response.train(config, str(tmp_path / "b"))
  a = load_file(str(tmp_path / "a" / "export" / "params.safetensors"))
  b = load_file(str(tmp_path / "b" / "export" / "params.safetensors"))
  assert a.keys() == b.keys()
  for key in a:
    np.testing.assert_array_equal(a[key], b[key])
  # Only the text tower trains; the export stores the configured default start block.
  base = load_file(os.path.join(ASSETS_DIR, "tiny-synthetic-base", "params.safetensors"))
  assert all(
    np.array_equal(a[k], base[k].astype(np.float32)) for k in a if not k.startswith("text")
  )
  assert any(
    not np.array_equal(a[k], base[k].astype(np.float32)) for k in a if k.startswith("text")
  )
  assert first.config.text.default_start_block == config.default_start_block


def test_shipped_checkpoint_was_made_by_the_weight_response_config():
  """tiny-synthetic echoes the config of its last stage (and of its pretraining, which made
  tiny-synthetic-base): `python -m stori_jax.pretrain` with each reproduces it."""
  with open(os.path.join(ASSETS_DIR, "tiny-synthetic", "stori_config.json"), encoding="utf-8") as f:
    shipped = json.load(f)
  with open(
    os.path.join(ASSETS_DIR, "tiny-synthetic-base", "stori_config.json"), encoding="utf-8"
  ) as f:
    base = json.load(f)
  config = json.loads(load_config(CONFIG_FILE).to_json_best_effort())
  assert shipped["metadata"]["weight_response_config"] == config
  assert shipped["metadata"]["pretrain_config"] == base["metadata"]["pretrain_config"]
  assert shipped["config"]["text"]["default_start_block"] == config["default_start_block"]
  assert {k: v for k, v in shipped["config"]["vision"].items()} == base["config"]["vision"]
