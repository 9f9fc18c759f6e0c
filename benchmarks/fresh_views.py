r"""Fresh views against cached ones on the embedded world: accuracy and time per epoch.

  python benchmarks/fresh_views.py                          # configs/demo.py, seeds 1-3
  python benchmarks/fresh_views.py --augment_scale=0.5,1.0  # crops of 50-100% of the image
  python benchmarks/fresh_views.py --json=fresh_views.json

Runs `stori_jax.fewshot.trainer.run` on configs/demo.py (the tiny CLIP, 12 classes x 16 shots)
per seed twice: `--config.views=0` (a fresh view of every training image at every step, the crop
and flip on the device, the image tower inside the step) and `--config.views=N` (N views per
image encoded once, each step drawing one of them). Time per epoch: the steps after the first
(which compiles), each waited for, per epoch; the run's total (encoding, compile, training,
reports) besides it. The two modes alternate per seed, so drifts in machine load hit both.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # `python benchmarks/fresh_views.py` puts only benchmarks/ on the path
  sys.path.insert(0, ROOT)

import jax  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from stori_jax.fewshot import trainer  # noqa: E402
from stori_jax.plumbing.config_files import load_config  # noqa: E402
from stori_jax.trainloop import loop  # noqa: E402


def define_flags(values: flags.FlagValues = flags.FLAGS) -> None:
  """The command's flags (on `values`: callers that import this module define none)."""
  flags.DEFINE_list("seeds", ["1", "2", "3"], "Seeds of the few-shot sample.", flag_values=values)
  flags.DEFINE_integer(
    "cached_views", 10, "Views per image of the cached mode.", flag_values=values
  )
  flags.DEFINE_list(
    "augment_scale", ["1.0", "1.0"], "Crop area range (the demo's: flips only).", flag_values=values
  )
  flags.DEFINE_integer("epochs", 100, "Epochs of each run (the demo's 100).", flag_values=values)
  flags.DEFINE_string("image_dtype", "float32", "The image tower's dtype.", flag_values=values)
  flags.DEFINE_string("json", None, "Also write the figures here.", flag_values=values)


def timed_run(config, workdir: str) -> dict:
  """trainer.run with its steps timed: {"accuracy", "zero_shot", "epoch_seconds", "seconds"}."""
  times: list[float] = []
  real_loop = loop.train_loop

  def timed_loop(train_step, *args, **kwargs):
    def step(state, batch):
      out = jax.block_until_ready(train_step(state, batch))
      times.append(time.perf_counter())
      return out

    return real_loop(step, *args, **kwargs)

  loop.train_loop = timed_loop
  try:
    start = time.perf_counter()
    metrics = trainer.run(config, workdir)
    seconds = time.perf_counter() - start
  finally:
    loop.train_loop = real_loop
  per_epoch = metrics["steps"] // config.epochs
  return {
    "accuracy": metrics["trained"]["accuracy"],
    "zero_shot": metrics["zero_shot"]["accuracy"],
    "epoch_seconds": float(np.mean(np.diff(times))) * per_epoch,
    "seconds": seconds,
  }


def main(argv, values: flags.FlagValues = flags.FLAGS) -> None:
  del argv
  scale = tuple(float(x) for x in values.augment_scale)
  modes = {"fresh (views=0)": 0, f"cached (views={values.cached_views})": values.cached_views}
  results = {mode: [] for mode in modes}
  for seed in map(int, values.seeds):
    for mode, views in modes.items():
      config = load_config(os.path.join(ROOT, "configs", "demo.py"))
      config.update_from_flattened_dict(
        {
          "seed": seed,
          "views": views,
          "augment_scale": scale,
          "epochs": values.epochs,
          "image_dtype": values.image_dtype,
          "eval_every": 10**6,  # only the final evaluation, outside the timed steps
        }
      )
      with tempfile.TemporaryDirectory() as workdir:
        result = timed_run(config, workdir)
      results[mode].append({"seed": seed, **result})
      print(f"seed {seed} {mode}: {json.dumps(result)}", file=sys.stderr)
  device = jax.devices()[0]
  print(
    f"configs/demo.py, augment_scale {scale}, {values.epochs} epochs, image tower "
    f"{values.image_dtype}, on {device.platform} ({device.device_kind}, {os.cpu_count()} CPUs)\n"
  )
  print(
    "| views | SToRI accuracy, seeds "
    + ", ".join(values.seeds)
    + " | mean | time per epoch | run |"
  )
  print("|---|---|---|---|---|")
  for mode, runs in results.items():
    accuracies = [100 * r["accuracy"] for r in runs]
    print(
      f"| {mode} | {' / '.join(f'{a:.2f}' for a in accuracies)}% | {np.mean(accuracies):.2f}% "
      f"| {1000 * np.mean([r['epoch_seconds'] for r in runs]):.0f} ms "
      f"| {np.mean([r['seconds'] for r in runs]):.0f} s |"
    )
  print(f"\nzero-shot: {100 * results[next(iter(modes))][0]['zero_shot']:.2f}%")
  if values.json:
    with open(values.json, "w") as f:
      json.dump({"augment_scale": scale, "results": results}, f, indent=1)


if __name__ == "__main__":
  define_flags()
  app.run(main)
