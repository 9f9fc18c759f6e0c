"""The fast, sharded weighted-prompt classifier equals naive per-prompt encoding."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stori_jax
from stori_jax.fewshot.prompt_bank import build_prompt_bank, gather_token_weights
from stori_jax.fewshot.text_classifier import WeightedTextClassifier, cross_entropy_loss
from stori_jax.models import CLIP, CLIPConfig, TextConfig, VisionConfig, init_params

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = CLIPConfig(
  embed_dim=24,
  text=TextConfig(width=32, layers=4, heads=4),
  vision=VisionConfig(image_size=16, patch_size=8, width=16, layers=1, heads=2),
)
CLASSES = ("red circle", "blue square", "green star")
PROMPTS = {
  "red circle": [
    "a photo of a red circle",
    "a round shape painted bright red, drawn on a plain background for a children's puzzle book",
    "red circle",
  ],
  "blue square": ["a blue square", "a photo of a small blue square with four equal sides"],
  "green star": [
    "a green star",
    "a lovely green star shape, a simple geometric figure",
    "a star that is green",
    "green",
  ],
}
FIXED = {name: [f"a photo of a {name}."] for name in CLASSES}


def _bundle():
  return stori_jax.CLIPBundle(config=CONFIG, params=init_params(CONFIG, seed=1))


def _random_log_weights(classifier, seed=0):
  rng = np.random.default_rng(seed)
  return [
    jnp.asarray(rng.normal(0, 0.7, b.ids.shape).astype(np.float32)) for b in classifier.bank.buckets
  ]


def naive_class_embeddings(bundle, bank, log_weights, start_block):
  """Every prompt through the whole tower at full context length, one by one."""
  model = CLIP(CONFIG)
  weights = gather_token_weights(bank, log_weights)
  blocks = tuple(range(start_block - 1, CONFIG.text.layers))
  tok = bundle.tokenizer
  encode = jax.jit(
    lambda ids, lw: model.apply({"params": bundle.params}, ids, lw, blocks, method=CLIP.encode_text)
  )
  sums = np.zeros((len(CLASSES), CONFIG.embed_dim))
  counts = np.zeros(len(CLASSES))
  for text, cls, w in zip(bank.texts, bank.text_class, weights):
    ids = tok([text])
    full_w = np.ones(ids.shape, np.float32)
    full_w[0, : len(w)] = w
    f = np.asarray(encode(ids, jnp.log(full_w)))[0]
    sums[cls] += f / np.linalg.norm(f)
    counts[cls] += 1
  fixed = np.asarray(bundle.encode_text(bank.fixed_ids))
  for f, cls in zip(fixed, bank.fixed_class):
    sums[cls] += f / np.linalg.norm(f)
    counts[cls] += 1
  emb = sums / counts[:, None]
  return emb / np.linalg.norm(emb, axis=1, keepdims=True)


@pytest.mark.slow
@pytest.mark.parametrize("chunk,start_block", [(2, 3), (64, 1), (1, 4)])
def test_matches_naive_encoding(chunk, start_block):
  bundle = _bundle()
  bank = build_prompt_bank(bundle.tokenizer, CLASSES, PROMPTS, FIXED, chunk=chunk)
  assert len(bank.buckets) >= 2  # Prompts of different lengths land in different buckets.
  classifier = WeightedTextClassifier(bundle, bank, start_block=start_block)
  log_w = _random_log_weights(classifier)
  ours = np.asarray(classifier.embed(log_w))
  naive = naive_class_embeddings(bundle, bank, log_w, start_block)
  np.testing.assert_allclose(ours, naive, atol=2e-6)


@pytest.mark.slow
def test_zero_log_weights_are_the_zero_shot_classifier():
  bundle = _bundle()
  bank = build_prompt_bank(bundle.tokenizer, CLASSES, PROMPTS, FIXED, chunk=2)
  classifier = WeightedTextClassifier(bundle, bank)
  ours = np.asarray(classifier.embed(classifier.init_log_weights()))
  texts = [t for c in CLASSES for t in PROMPTS[c] + FIXED[c]]
  labels = np.array([i for i, c in enumerate(CLASSES) for _ in PROMPTS[c] + FIXED[c]])
  plain = np.array(bundle.encode_text(bundle.tokenize(texts)))
  plain /= np.linalg.norm(plain, axis=1, keepdims=True)
  emb = np.stack([plain[labels == i].mean(0) for i in range(len(CLASSES))])
  np.testing.assert_allclose(ours, emb / np.linalg.norm(emb, axis=1, keepdims=True), atol=2e-6)


@pytest.mark.slow
def test_gradients_equal_naive_autodiff():
  bundle = _bundle()
  bank = build_prompt_bank(bundle.tokenizer, CLASSES, PROMPTS, FIXED, chunk=2)
  classifier = WeightedTextClassifier(bundle, bank, start_block=2)
  rng = np.random.default_rng(0)
  images = rng.normal(size=(5, CONFIG.embed_dim)).astype(np.float32)
  images /= np.linalg.norm(images, axis=1, keepdims=True)
  labels = jnp.array([0, 1, 2, 0, 2])
  log_w = _random_log_weights(classifier, seed=1)

  def loss(lw):
    return cross_entropy_loss(classifier.class_embeddings(lw, data), images, labels, 50.0)[0]

  data = classifier.data
  grads = jax.jit(jax.grad(loss))(log_w)
  # Naive: the same loss from a direct per-bucket forward without cache/chunks/EOT trick.
  model = CLIP(CONFIG)
  blocks = tuple(range(1, CONFIG.text.layers))

  def naive_loss(lw):
    sums = jnp.asarray(classifier.fixed_sum)
    counts = jnp.asarray(classifier.fixed_count)
    for bucket, w in zip(bank.buckets, lw):
      w = jnp.where(bucket.trainable, w, 0.0)
      f = model.apply({"params": bundle.params}, bucket.ids, w, blocks, method=CLIP.encode_text)
      f = f / jnp.linalg.norm(f, axis=1, keepdims=True)
      valid = bucket.class_index >= 0
      f = jnp.where(valid[:, None], f, 0)
      sums = sums + jax.ops.segment_sum(f, np.maximum(bucket.class_index, 0), len(CLASSES))
      counts = counts + jax.ops.segment_sum(
        valid.astype(jnp.float32), np.maximum(bucket.class_index, 0), len(CLASSES)
      )
    emb = sums / counts[:, None]
    emb = emb / jnp.linalg.norm(emb, axis=1, keepdims=True)
    return cross_entropy_loss(emb, images, labels, 50.0)[0]

  naive = jax.jit(jax.grad(naive_loss))(log_w)  # eager, its ops compiled one by one: 466 programs
  for g, n, bucket in zip(grads, naive, bank.buckets):
    np.testing.assert_allclose(np.asarray(g), np.asarray(n), atol=1e-6)
    assert np.all(np.asarray(g)[~bucket.trainable] == 0)
    assert np.abs(np.asarray(g)[bucket.trainable]).max() > 0


EIGHT_DEVICES = """
import os, sys, json, numpy as np, jax
sys.path.insert(0, {tests!r})
import test_fewshot_classifier as t
from stori_jax.fewshot.prompt_bank import build_prompt_bank
from stori_jax.fewshot.text_classifier import WeightedTextClassifier
bundle = t._bundle()
n = jax.device_count()
bank = build_prompt_bank(bundle.tokenizer, t.CLASSES, t.PROMPTS, t.FIXED, chunk=1, num_shards=n)
clf = WeightedTextClassifier(bundle, bank, start_block=2)
lw = [jax.device_put(w, s.sharding) for w, s in zip(t._random_log_weights(clf), clf.init_log_weights())]
emb = np.asarray(clf.embed(lw))
naive = t.naive_class_embeddings(bundle, bank, lw, 2)
print(json.dumps({{"devices": n, "max_diff": float(np.abs(emb - naive).max()),
                   "shards": len(lw[0].sharding.device_set)}}))
"""


@pytest.mark.slow
def test_eight_devices_give_the_same_embeddings():
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
  out = subprocess.run(
    [sys.executable, "-c", EIGHT_DEVICES.format(tests=os.path.dirname(__file__))],
    env=env,
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  import json

  result = json.loads(out.stdout.strip().splitlines()[-1])
  assert result["devices"] == 8 and result["shards"] == 8
  assert result["max_diff"] < 2e-6
