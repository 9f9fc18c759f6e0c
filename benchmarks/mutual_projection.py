r"""Projected time of the mutual-knowledge analysis on ImageNet val on an accelerator, from counts.

  python benchmarks/mutual_projection.py                        # the 13 models, H100 figures
  python benchmarks/mutual_projection.py --peak_tflops 459 --bandwidth_tbs 1.64   # a TPU v5p
  python benchmarks/mutual_projection.py --models openai-vit-b-16 --json out.json

A projection, not a measurement: for each model of the study, XLA's cost analysis of its image
tower (a batch of 96 images, as the analysis's tower calls; no weights needed: the program is
lowered from parameter shapes) gives the FLOPs and bytes of one tower pass per image. The analysis puts an image through the tower once for its
features and three times per concept region prompted (`--regions`: L = 5 concepts for each of
PCA and K-means present, 10, an upper bound; the embedded world averages fewer). The other
stages (the Gram-matrix split, the CRF, K-means, the language stages) are under 1% of the FLOPs
at 50 images per class and are left out. Time per pass = max(FLOPs / (efficiency x peak),
bytes / bandwidth); the default device is one H100 SXM (989 TFLOP/s dense bf16, 3.35 TB/s),
at 50% of peak: set --efficiency from a measured run (benchmarks/mutual_throughput.py prints the
towers' fraction of the machine's matmul rate).
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
from absl import app, flags

from stori_jax.models import CLIP, registry
from stori_jax.models.clip import param_shapes

flags.DEFINE_list("models", None, "Registry names (default: the study's 13).")
flags.DEFINE_integer("images", 50_000, "Images analysed (ImageNet val: 50,000).")
flags.DEFINE_integer("regions", 10, "Concept regions prompted per image (3 tower passes each).")
flags.DEFINE_float("peak_tflops", 989.0, "The device's dense bf16 peak, TFLOP/s.")
flags.DEFINE_float("bandwidth_tbs", 3.35, "The device's memory bandwidth, TB/s.")
flags.DEFINE_float("efficiency", 0.5, "The towers' achieved fraction of peak.")
flags.DEFINE_string("device", "one H100 SXM", "The device's name, for the printout.")
flags.DEFINE_string("json", None, "Also write the figures here.")
FLAGS = flags.FLAGS


def tower_cost(name: str, batch: int = 96, dtype=jnp.bfloat16) -> dict[str, float]:
  """FLOPs and bytes per image of the model's image tower in `dtype`, at a batch of `batch`
  images (the analysis's tower calls: 32 regions x 3 prompts): FLOPs from XLA's count of the
  lowered program; bytes from the program XLA:CPU compiles (after fusion; a GPU's fusions
  differ, so a rough figure)."""
  config = registry.get(name).config
  model = CLIP(config, dtype=dtype)
  size = config.vision.image_size
  images = jax.ShapeDtypeStruct((batch, size, size, 3), jnp.float32)

  def encode(params, x):
    return model.apply({"params": params}, x, False, method=CLIP.encode_image)

  lowered = jax.jit(encode).lower(param_shapes(config), images)
  flops = _first(lowered.cost_analysis())["flops"]
  moved = _first(lowered.compile().cost_analysis())["bytes accessed"]
  return dict(image_size=size, gflop=flops / batch / 1e9, gbytes=moved / batch / 1e9)


def _first(cost):
  return cost[0] if isinstance(cost, (list, tuple)) else cost


def project(cost: dict[str, float], images: int, passes: float, peak, bandwidth, efficiency):
  """Seconds for `images` images of `passes` tower passes each."""
  flop_s = cost["gflop"] * 1e9 / (efficiency * peak * 1e12)
  byte_s = cost["gbytes"] * 1e9 / (bandwidth * 1e12)
  return images * passes * max(flop_s, byte_s)


def main(argv):
  del argv
  names = FLAGS.models or registry.mutual_knowledge_models()
  passes = 1 + 3 * FLAGS.regions
  rows = []
  print(
    f"Projection for {FLAGS.images:,} images, {passes} tower passes each, on {FLAGS.device} "
    f"({FLAGS.peak_tflops:g} TFLOP/s, {FLAGS.bandwidth_tbs:g} TB/s) at "
    f"{100 * FLAGS.efficiency:.0f}% of peak:"
  )
  print(
    f"{'model':34s} {'px':>4s} {'GFLOP/pass':>11s} {'GB/pass':>8s} {'PFLOP':>7s} {'minutes':>8s}"
  )
  for name in names:
    cost = tower_cost(name)
    seconds = project(
      cost, FLAGS.images, passes, FLAGS.peak_tflops, FLAGS.bandwidth_tbs, FLAGS.efficiency
    )
    pflop = cost["gflop"] * passes * FLAGS.images / 1e6
    rows.append(dict(model=name, **cost, pflop=pflop, minutes=seconds / 60))
    print(
      f"{name:34s} {cost['image_size']:4d} {cost['gflop']:11.1f} {cost['gbytes']:8.3f} "
      f"{pflop:7.1f} {seconds / 60:8.1f}"
    )
  total = sum(r["minutes"] for r in rows)
  print(f"{'all':34s} {'':4s} {'':11s} {'':8s} {sum(r['pflop'] for r in rows):7.1f} {total:8.1f}")
  if FLAGS.json:
    with open(FLAGS.json, "w", encoding="utf-8") as f:
      json.dump(
        dict(
          flags={
            k: FLAGS[k].value
            for k in ("images", "regions", "peak_tflops", "bandwidth_tbs", "efficiency", "device")
          },
          rows=rows,
          total_minutes=total,
        ),
        f,
        indent=1,
      )


if __name__ == "__main__":
  app.run(main)
