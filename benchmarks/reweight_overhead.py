r"""Throughput of SToRI-weighted vs plain text encoding, side by side in one run.

  python benchmarks/reweight_overhead.py                       # ViT-B-32 text tower, CPU-sized
  python benchmarks/reweight_overhead.py --arch ViT-L-14 --batch 256 --repeats 20   # GPU/TPU

Same random weights, same token batch and shapes; the weighted run reweights
the paper's default blocks (second half). Calls alternate (plain, weighted,
plain, ...) so drifts in machine load hit both; the ratio is the median of
per-pair ratios. The paper (App. C.5, RTX A5000) reports 1.02.
"""

from __future__ import annotations

import json
import time

import jax
import numpy as np
from absl import app, flags

from stori_jax.bundle import CLIPBundle
from stori_jax.checkpoints.open_clip_config import architecture_config
from stori_jax.models import init_params

flags.DEFINE_string("arch", "ViT-B-32", "Architecture whose text tower is timed.")
flags.DEFINE_integer("batch", 16, "Prompts per call.")
flags.DEFINE_integer("repeats", 7, "Timed (plain, weighted) pairs.")
flags.DEFINE_string("dtype", "float32", "Compute dtype: float32 or bfloat16.")
flags.DEFINE_string("json", None, "Also write the figures here.")
FLAGS = flags.FLAGS


def _timed(fn) -> float:
  start = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - start


def main(argv):
  del argv
  config = architecture_config(FLAGS.arch)
  bundle = CLIPBundle(config=config, params=init_params(config), dtype=FLAGS.dtype)
  rng = np.random.default_rng(0)
  context = config.text.context_length
  ids = rng.integers(1, 49000, (FLAGS.batch, context)).astype(np.int32)
  ids[:, 0], ids[:, -1] = 49406, 49407
  weights = rng.uniform(0.5, 1.5, ids.shape).astype(np.float32)
  plain = lambda: bundle.encode_text(ids)
  weighted = lambda: bundle.encode_text(ids, weights)
  _timed(plain), _timed(weighted)  # Compile both.
  pairs = [(_timed(plain), _timed(weighted)) for _ in range(FLAGS.repeats)]
  plain_s = np.median([p for p, _ in pairs])
  weighted_s = np.median([w for _, w in pairs])
  ratio = float(np.median([w / p for p, w in pairs]))
  device = jax.devices()[0]
  result = {
    "arch": FLAGS.arch,
    "batch": FLAGS.batch,
    "context": context,
    "dtype": FLAGS.dtype,
    "device": f"{device.platform}:{device.device_kind}",
    "repeats": FLAGS.repeats,
    "plain_prompts_per_s": FLAGS.batch / plain_s,
    "weighted_prompts_per_s": FLAGS.batch / weighted_s,
    "time_ratio_weighted_over_plain": ratio,
  }
  print(
    f"{FLAGS.arch} text tower, batch {FLAGS.batch} x {context} tokens, {FLAGS.dtype}, "
    f"{result['device']}"
  )
  print(f"  plain    {result['plain_prompts_per_s']:10.1f} prompts/s")
  print(f"  weighted {result['weighted_prompts_per_s']:10.1f} prompts/s")
  print(f"  weighted / plain time ratio: {ratio:.3f} (paper: 1.02)")
  if FLAGS.json:
    with open(FLAGS.json, "w", encoding="utf-8") as f:
      json.dump(result, f, indent=2)


if __name__ == "__main__":
  app.run(main)
