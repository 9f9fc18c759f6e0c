"""The few-shot train step compiles once: `trainer.init_train_state` places the state as the
step's outputs are, in one compiled program (issue 25: the step compiled twice and its eager
optimiser init a program per op and bucket shape)."""

import contextlib
import json
import os
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from stori_jax.plumbing import profiling
from stori_jax.fewshot import trainer
from stori_jax.fewshot.prompt_bank import build_prompt_bank
from stori_jax.fewshot.text_classifier import WeightedTextClassifier


@contextlib.contextmanager
def _uncached():
  """The persistent compilation cache off while a block's compilations are counted (another
  test may have put the same programs in it, which would be read rather than compiled); on
  again after. Only the counted blocks: the bundle, prompt bank and prefix before them are the
  ones other tests compile, and the run's cache serves them."""
  restore = jax.config.jax_enable_compilation_cache and jax.config.jax_compilation_cache_dir
  profiling.use_compilation_cache(False)
  try:
    yield
  finally:
    if restore:
      profiling.use_compilation_cache(True)  # JAX_COMPILATION_CACHE_DIR: the run's folder


TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)


def _compiles_of_three_steps(method_name: str) -> dict:
  """{"state": programs init_train_state compiled, "steps": programs three steps compiled,
  "buckets", "devices", "sharded": whether Adam's moments are sharded as their parameters}."""
  sys.path.insert(0, TESTS)
  import test_fewshot_classifier as tiny  # pylint: disable=import-outside-toplevel

  bundle = tiny._bundle()
  n = jax.device_count()
  bank = build_prompt_bank(
    bundle.tokenizer, tiny.CLASSES, tiny.PROMPTS, tiny.FIXED, chunk=1, num_shards=n
  )
  classifier = WeightedTextClassifier(bundle, bank, start_block=2)
  config = ml_collections.ConfigDict(
    {"optim": {"lr": 1e-2}, "taskres": {"alpha": 0.5, "lr": 1e-3, "weight_decay": 1e-4}}
  )
  if method_name == "stori":
    method = trainer.stori_method(config, classifier, total_steps=10)
  else:
    method = trainer.taskres_method(config, classifier.embed(classifier.init_log_weights()), 10)
  step = trainer.make_train_step(method, bundle.logit_scale)
  rng = np.random.default_rng(0)
  features = classifier.replicate(rng.normal(size=(4, tiny.CONFIG.embed_dim)).astype(np.float32))
  labels = classifier.replicate(np.array([0, 1, 2, 0], np.int32))
  params = method.init()
  replicated = NamedSharding(classifier.mesh, PartitionSpec())
  with _uncached(), profiling.compilations() as state_compiles:
    state = trainer.init_train_state(method, params, replicated)
  with _uncached(), profiling.compilations() as step_compiles:
    for _ in range(3):
      state, metrics = step(state, method.context, features, labels)
    jax.block_until_ready(state)
  assert np.isfinite(float(metrics["loss"]))
  (adam,) = [part for part in state["opt_state"] if hasattr(part, "mu")]
  moments = jax.tree_util.tree_leaves(adam.mu)
  return {
    "state": state_compiles.by_name(),
    "steps": step_compiles.by_name(),
    "buckets": len(bank.buckets),
    "devices": n,
    "sharded": all(
      m.sharding.spec == p.sharding.spec
      for m, p in zip(moments, jax.tree_util.tree_leaves(state["params"]))
    ),
  }


def _assert_compiled_once(result: dict) -> None:
  assert list(result["state"]) == ["jit(<lambda>)"]  # the optimiser's init: one program
  assert result["state"]["jit(<lambda>)"]["count"] == 1
  assert list(result["steps"]) == ["jit(train_step)"]  # three steps, one compilation
  assert result["steps"]["jit(train_step)"]["count"] == 1
  assert result["sharded"]


@pytest.mark.parametrize("method_name", [pytest.param("stori", marks=pytest.mark.slow), "taskres"])
def test_the_step_compiles_once_from_its_initial_state(method_name):
  result = _compiles_of_three_steps(method_name)
  assert result["buckets"] > 1  # several length buckets, still one step program
  _assert_compiled_once(result)


FOUR_DEVICES = """
import json, sys
sys.path.insert(0, {tests!r})
import test_fewshot_train_state as t
print(json.dumps(t._compiles_of_three_steps({method!r})))
"""


@pytest.mark.slow
def test_prompts_sharded_over_four_devices_still_compile_the_step_once():
  """Adam's moments of sharded log-weights sharded as the step's outputs are (a jitted init's
  default placement replicates them, and the second step compiled again)."""
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4")
  out = subprocess.run(
    [sys.executable, "-c", FOUR_DEVICES.format(tests=TESTS, method="stori")],
    env=env,
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.loads(out.stdout.strip().splitlines()[-1])
  assert result["devices"] == 4
  _assert_compiled_once(result)
