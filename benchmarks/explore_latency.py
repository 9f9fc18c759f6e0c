r"""Explorer latency: time from a slider change to the new top k, over a 10,000-image index.

  python benchmarks/explore_latency.py                  # tiny-synthetic and ViT-B-32 text tower
  python benchmarks/explore_latency.py --changes 500 --json latency.json

Per change one word of the prompt gets a new weight (random, on the slider's 0.05 grid);
the time covers what the server does for it: tokenize, encode the text with SToRI, score the
[N, E] index and take the top k (`Explorer.rank`), and also the whole request through the
Flask app (`POST /api/rank`, JSON in and out, in-process test client). Medians over the
changes after one warm-up per token-length bucket (compilation).

* tiny-synthetic: the index holds 10,000 generated synthetic-world images encoded by the
  shipped model (built once; cached under --cache_dir).
* ViT-B-32: random weights (the text tower's cost does not depend on their values) and a
  random unit [10,000, 512] index (the image tower is not on the interactive path).
The goal is under 100 ms per change on a CPU.
"""

from __future__ import annotations

import json
import os
import time

import jax
import numpy as np
from absl import flags

import stori_jax
from stori_jax.plumbing import jsonio
from stori_jax.clip.bundle import CLIPBundle
from stori_jax.checkpoints.open_clip_config import architecture_config
from stori_jax.data import synthetic
from stori_jax.clip.encoding import encode_images, l2_normalize
from stori_jax.explorer.app import create_app
from stori_jax.explorer.ranking import Explorer
from stori_jax.models import init_params

flags.DEFINE_integer("images", 10_000, "Indexed images.")
flags.DEFINE_integer("changes", 200, "Timed weight changes per model.")
flags.DEFINE_integer("k", 12, "Top k.")
flags.DEFINE_list("models", ["tiny-synthetic", "ViT-B-32"], "Models to time.")
flags.DEFINE_string("cache_dir", os.path.join("workdirs", "retrieval_cache"), "Index cache.")
flags.DEFINE_string("json", None, "Also write the figures here.")
FLAGS = flags.FLAGS

PROMPT = "a photo of a red striped circle on the left"


def _tiny_index(bundle, n: int) -> np.ndarray:
  path = os.path.join(FLAGS.cache_dir, f"explore_latency_tiny_{n}.npy")
  if os.path.isfile(path):
    return np.load(path)
  images = synthetic.generate(n, (2024, 9), image_size=bundle.config.vision.image_size).images
  embeddings = encode_images(bundle, images, desc="index images")
  os.makedirs(FLAGS.cache_dir, exist_ok=True)
  np.save(path, embeddings)
  return embeddings


def _random_index(n: int, dim: int) -> np.ndarray:
  x = np.random.default_rng(0).normal(size=(n, dim)).astype(np.float32)
  return l2_normalize(x, axis=1)


def time_changes(explorer: Explorer, changes: int, k: int) -> dict:
  words = [(w["text"], w["weight"]) for w in explorer.parse(PROMPT)]
  rng = np.random.default_rng(1)
  explorer.rank(words, k)  # compile
  client = create_app(explorer).test_client()
  rank_ms, http_ms = [], []
  for _ in range(changes):
    i = int(rng.integers(len(words)))
    words[i] = (words[i][0], float(np.round(rng.uniform(0, 3) / 0.05) * 0.05))
    start = time.perf_counter()
    explorer.rank(words, k)
    rank_ms.append(1000 * (time.perf_counter() - start))
    body = {"words": [{"text": t, "weight": w} for t, w in words], "k": k}
    start = time.perf_counter()
    response = client.post("/api/rank", json=body)
    http_ms.append(1000 * (time.perf_counter() - start))
    assert response.status_code == 200, response.get_json()
  return {
    "rank_ms_median": round(float(np.median(rank_ms)), 2),
    "rank_ms_p90": round(float(np.percentile(rank_ms, 90)), 2),
    "http_ms_median": round(float(np.median(http_ms)), 2),
    "http_ms_p90": round(float(np.percentile(http_ms, 90)), 2),
  }


def main(argv):
  del argv
  results = {
    "images": FLAGS.images,
    "changes": FLAGS.changes,
    "k": FLAGS.k,
    "device": str(jax.devices()[0]),
    "cpus": os.cpu_count(),
    "models": {},
  }
  for name in FLAGS.models:
    if name == "tiny-synthetic":
      bundle = stori_jax.load(name)
      embeddings = _tiny_index(bundle, FLAGS.images)
    else:
      config = architecture_config(name)
      bundle = CLIPBundle(config=config, params=init_params(config), source=f"{name} (random)")
      embeddings = _random_index(FLAGS.images, config.embed_dim)
    explorer = Explorer(bundle, embeddings, [str(i) for i in range(len(embeddings))])
    timing = time_changes(explorer, FLAGS.changes, FLAGS.k)
    results["models"][name] = {
      "text_layers": bundle.config.text.layers,
      "text_width": bundle.config.text.width,
      "embed_dim": bundle.config.embed_dim,
      **timing,
    }
    print(name, results["models"][name], flush=True)
  print(json.dumps(results, indent=1))
  if FLAGS.json:
    jsonio.write_json(FLAGS.json, results, indent=1)  # strict and atomic


if __name__ == "__main__":
  from stori_jax.plumbing.cli import run

  run(main)
