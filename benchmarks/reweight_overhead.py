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

from stori_jax.clip.bundle import CLIPBundle
from stori_jax.checkpoints.open_clip_config import architecture_config
from stori_jax.models import CLIPConfig, init_params


def define_flags(values: flags.FlagValues = flags.FLAGS) -> None:
  """The command's flags (on `values`: callers that import this module define none)."""
  flags.DEFINE_string(
    "arch", "ViT-B-32", "Architecture whose text tower is timed.", flag_values=values
  )
  flags.DEFINE_integer("batch", 16, "Prompts per call.", flag_values=values)
  flags.DEFINE_integer("repeats", 7, "Timed (plain, weighted) pairs.", flag_values=values)
  flags.DEFINE_string("dtype", "float32", "Compute dtype: float32 or bfloat16.", flag_values=values)
  flags.DEFINE_string("json", None, "Also write the figures here.", flag_values=values)


def _timed(fn) -> float:
  start = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - start


def measure(
  arch: str | CLIPConfig, batch: int, repeats: int, dtype: str = "float32", params=None
) -> dict:
  """Prompts per second of the plain and the weighted text tower of `arch` (an open_clip name
  or a CLIPConfig) on `batch` random token rows, and the median time ratio of `repeats`
  alternating pairs. params: the model's (default: init_params(config)); also returns
  init_s (the init's seconds) and compile_s (the first plain and weighted calls)."""
  config = arch if isinstance(arch, CLIPConfig) else architecture_config(arch)
  start = time.perf_counter()
  params = jax.block_until_ready(init_params(config) if params is None else params)
  init_s = time.perf_counter() - start
  bundle = CLIPBundle(config=config, params=params, dtype=dtype)
  rng = np.random.default_rng(0)
  context = config.text.context_length
  ids = rng.integers(1, config.text.eot_token_id - 1, (batch, context)).astype(np.int32)
  ids[:, 0], ids[:, -1] = config.text.eot_token_id - 1, config.text.eot_token_id
  weights = rng.uniform(0.5, 1.5, ids.shape).astype(np.float32)
  plain = lambda: bundle.encode_text(ids)
  weighted = lambda: bundle.encode_text(ids, weights)
  compile_s = _timed(plain) + _timed(weighted)  # Compile both.
  pairs = [(_timed(plain), _timed(weighted)) for _ in range(repeats)]
  plain_s = np.median([p for p, _ in pairs])
  weighted_s = np.median([w for _, w in pairs])
  device = jax.devices()[0]
  return {
    "arch": arch if isinstance(arch, str) else config.name,
    "batch": batch,
    "context": context,
    "dtype": dtype,
    "device": f"{device.platform}:{device.device_kind}",
    "repeats": repeats,
    "plain_prompts_per_s": batch / plain_s,
    "weighted_prompts_per_s": batch / weighted_s,
    "time_ratio_weighted_over_plain": float(np.median([w / p for p, w in pairs])),
    "init_s": init_s,
    "compile_s": compile_s,
  }


def main(argv, values: flags.FlagValues = flags.FLAGS):
  del argv
  result = measure(values.arch, values.batch, values.repeats, values.dtype)
  ratio = result["time_ratio_weighted_over_plain"]
  print(
    f"{values.arch} text tower, batch {values.batch} x {result['context']} tokens, "
    f"{values.dtype}, {result['device']}"
  )
  print(f"  plain    {result['plain_prompts_per_s']:10.1f} prompts/s")
  print(f"  weighted {result['weighted_prompts_per_s']:10.1f} prompts/s")
  print(f"  weighted / plain time ratio: {ratio:.3f} (paper: 1.02)")
  if values.json:
    with open(values.json, "w", encoding="utf-8") as f:
      json.dump(result, f, indent=2)


if __name__ == "__main__":
  define_flags()
  app.run(main)
