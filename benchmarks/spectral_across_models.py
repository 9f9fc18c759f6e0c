r"""The sweep's foreground split (the Gram matrix's eigendecomposition) per model, or batched
across the models that share shapes (`config.spectral_across_models` of mutual.sweep).

  python benchmarks/spectral_across_models.py     # 13 ViT-B/16-shaped models, 50 images, CPU
  python benchmarks/spectral_across_models.py --shapes study --json F   # the 13 study models'
                                                  # own grids and widths, grouped by shape

Both ways run the sweep's own functions on the same patch features of one class of every model:
  * per_model: `pipeline.split_foreground` model after model (what mutual.analyze runs, and
    the sweep with spectral_across_models=False);
  * batched: `mutual.sweep.batched_foreground`, the models of one shape stacked and split as one
    program, a batched (vmapped) eigh of their Gram matrices (spectral_across_models=True).
The features are random with a planted foreground (every patch row a shared direction, plus or
minus a second one, plus noise), so the second eigenvector is well determined, as on real
images, and the SVD fallback (`foreground.checked_split`) stays idle (`gram_fallbacks` counts
the sets that would take it).

Each way is compiled first (not timed), then timed --repeats rounds, interleaved in alternating
order (per_model then batched, then batched then per_model, ...), so a machine shared with other
jobs loads both alike; the figures are medians, the ratio the median of the rounds' ratios
(batched seconds / per-model seconds: above 1, batching is slower). The masks of both ways are
compared (`mask_patches_differing`: 0 expected).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Callable

# The repository root, for `benchmarks.*` when run as a script.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

import jax  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from mutual import foreground, paper_config, pipeline  # noqa: E402
from mutual.sweep.batched import batched_foreground, shape_groups  # noqa: E402

#: ViT-B/16 at 224 px: a 14 x 14 patch grid of 768-wide tokens.
VIT_B16 = (14, 14, 768)


def planted_features(rng: np.random.Generator, images: int, height: int, width: int, depth: int):
  """float32 [images, height, width, depth] patch features with a planted foreground: each row
  a shared direction, plus (foreground, about a third of the patches) or minus a second one,
  plus Gaussian noise, so the Gram matrix's second eigenvector is well separated."""
  shared, split = rng.standard_normal((2, depth)) / np.sqrt(depth)
  sign = np.where(rng.random((images, height, width, 1)) < 0.35, 1.0, -1.0)
  noise = 0.5 * rng.standard_normal((images, height, width, depth)) / np.sqrt(depth)
  return (3.0 * shared + sign * split + noise).astype(np.float32)


def measure(
  shapes: dict[str, tuple[int, int, int]],
  images: int,
  repeats: int,
  seed: int = 0,
  time_left: Callable[[], float] | None = None,
  put: Callable[..., None] | None = None,
) -> dict:
  """Times both ways on one class of every model in `shapes` ({model: (h, w, D)}), `images`
  images each; `repeats` rounds, fewer where `time_left()` (seconds) runs out. `put(**figures)`,
  when given, receives the figures after each round (benchmarks/gpu_check.py's records).

  Returns:
    the figures: sizes, groups, per-round seconds, medians, the ratio, gram_fallbacks,
    mask_patches_differing.
  """
  analysis = paper_config.analysis_config()
  rng = np.random.default_rng(seed)
  names = list(shapes)
  patches = [jax.device_put(planted_features(rng, images, *shapes[name])) for name in names]
  fallbacks = 0
  for features in patches:
    _, ok = foreground.sign_split(features, center=bool(analysis.center_features), joint=True)
    fallbacks += int(not np.all(np.asarray(ok)))

  def per_model():
    return [pipeline.split_foreground(p, analysis) for p in patches]

  def batched():
    return batched_foreground(patches, analysis)

  ways = {"per_model": per_model, "batched": batched}
  start = time.perf_counter()
  masks = {name: jax.block_until_ready(fn()) for name, fn in ways.items()}  # compiles
  differing = sum(
    int(np.sum(np.asarray(a) != np.asarray(b)))
    for a, b in zip(masks["per_model"], masks["batched"])
  )
  figures = dict(
    device=f"{jax.devices()[0].platform}:{jax.devices()[0].device_kind}",
    backend=jax.default_backend(),
    models=len(names),
    images=images,
    shapes={name: list(shapes[name]) for name in names},
    groups=[[names[m] for m in group] for group in shape_groups([shapes[n] for n in names])],
    gram_side={name: min(images * h * w, d) for name, (h, w, d) in shapes.items()},
    gram_fallbacks=fallbacks,
    mask_patches_differing=differing,
    compile_and_first_seconds=time.perf_counter() - start,
    rounds=[],
  )
  order = list(ways)
  for round_index in range(repeats):
    if time_left is not None and time_left() <= 0:
      break
    times = {}
    for name in order if round_index % 2 == 0 else order[::-1]:
      start = time.perf_counter()
      jax.block_until_ready(ways[name]())
      times[name] = time.perf_counter() - start
    figures["rounds"].append(times)
    rounds = figures["rounds"]
    figures.update(
      per_model_seconds=float(np.median([r["per_model"] for r in rounds])),
      batched_seconds=float(np.median([r["batched"] for r in rounds])),
      ratio_batched_over_per_model=float(
        np.median([r["batched"] / r["per_model"] for r in rounds])
      ),
    )
    if put is not None:
      put(**figures)
  return figures


def study_shapes() -> dict[str, tuple[int, int, int]]:
  """{model: (h, w, D)} of the 13 study models at their own input sizes."""
  from benchmarks import mutual_sweep_split  # pylint: disable=import-outside-toplevel

  return mutual_sweep_split.model_shapes()


flags.DEFINE_enum(
  "shapes",
  "vit-b-16",
  ["vit-b-16", "study"],
  "vit-b-16: --models models of ViT-B/16's shape (14 x 14 x 768, one group); study: the 13 "
  "study models' own grids and widths (9 groups).",
)
flags.DEFINE_integer("models", 13, "Models of ViT-B/16's shape (--shapes=vit-b-16).")
flags.DEFINE_integer("images", 50, "B, the images of a class (the split is joint over them).")
flags.DEFINE_integer("repeats", 7, "Timed rounds of each way, interleaved.")
flags.DEFINE_string("json", None, "Also write the figures here.")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  if FLAGS.shapes == "study":
    shapes = study_shapes()
  else:
    shapes = {f"vit-b-16-{m:02d}": VIT_B16 for m in range(FLAGS.models)}
  figures = measure(shapes, FLAGS.images, FLAGS.repeats)
  figures.update(shapes_preset=FLAGS.shapes, cpu_count=os.cpu_count())
  if hasattr(os, "getloadavg"):
    figures["load_average_at_end"] = list(os.getloadavg())
  print(json.dumps(figures, indent=1))
  if FLAGS.json:
    with open(FLAGS.json, "w", encoding="utf-8") as f:
      json.dump(figures, f, indent=1)


if __name__ == "__main__":
  app.run(main)
