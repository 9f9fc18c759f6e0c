r"""The spectral split of the 13-model sweep: per model, or batched across the models.

  python benchmarks/mutual_sweep_split.py                    # B = 16 images per class, CPU
  python benchmarks/mutual_sweep_split.py --images 50 --json F

The foreground split (mutual.foreground) takes the second eigenvector of the Gram matrix of a
class's unit patch rows [N = B h w, D], on its smaller side (min(N, D) squared). Across the
sweep's models the patch grids (7 x 7 to 24 x 24) and feature widths (768 to 3,072) differ, so
one batched eigendecomposition needs every model's rows padded to the largest grid and width,
the padded rows masked to zero: a zero row or column adds zero eigenvalues and leaves the
leading eigenvectors as they were, and every model's Gram matrix is then max-D square.

Timed here, side by side, on the same random features of each model's true shapes (random-weight
models: the split's cost depends on the shapes alone; the shapes come from each registered
architecture's image tower, `jax.eval_shape`, no weights made):
  * per_model: `foreground.checked_split` (the pipeline's split: Gram solver, joint) model after
    model, each at its own shape;
  * batched_padded: one jitted program, vmapped over the 13 models, of the same Gram split on
    rows padded to the largest grid and width (masked), the Gram matrix taken on the D side for
    all (the smaller side at the padded shapes);
  * grouped: models whose Gram matrix has the same size batched together (no padding), the
    groups one after another.
Each variant is compiled first (not timed), then timed `--repeats` times, alternating; the
figures are medians and the ratios medians of per-round ratios. The masks of every variant are
checked against per_model's.
"""

from __future__ import annotations

import collections
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from mutual import foreground
from stori_jax.clip.bundle import CLIPBundle
from stori_jax.models import get_architecture, param_shapes, registry

flags.DEFINE_integer("images", 16, "B, the images of a class (the split is joint over them).")
flags.DEFINE_integer("repeats", 3, "Timed rounds.")
flags.DEFINE_string("json", None, "Also write the figures here.")
FLAGS = flags.FLAGS

_HIGHEST = jax.lax.Precision.HIGHEST


def model_shapes() -> dict[str, tuple[int, int, int]]:
  """{model: (h, w, D)} of the sweep's 13 models: the patch grid and width of the tokens the
  split reads (the tower's feature map), from the architecture alone."""
  shapes = {}
  for name in registry.mutual_knowledge_models():
    config = get_architecture(registry.get(name).arch)
    bundle = CLIPBundle(config=config, params=param_shapes(config))
    size = config.vision.image_size
    images = jax.ShapeDtypeStruct((1, size, size, 3), jnp.float32)
    _, details = jax.eval_shape(
      lambda p, x, b=bundle: b._image_fn(p, x, True),  # pylint: disable=protected-access
      bundle.params,
      images,
    )
    _, h, w, d = details["feature_map"].shape
    shapes[name] = (int(h), int(w), int(d))
  return shapes


def _split_padded(features, mask):
  """The Gram split of one model's padded features [B, H, W, Dmax] (rows outside `mask` bool
  [B, H, W] and columns past the model's width are zero): bool [B, H, W], the sign-fixed
  second eigenvector's positive entries, on the model's patches."""
  flat = features.reshape(-1, features.shape[-1])
  keep = mask.reshape(-1)
  norm = jnp.linalg.norm(flat, axis=1, keepdims=True)
  flat = jnp.where(keep[:, None], flat / jnp.where(keep[:, None], norm, 1.0), 0.0)
  _, vectors = jnp.linalg.eigh(jnp.matmul(flat.T, flat, precision=_HIGHEST))
  u = jnp.matmul(flat, vectors[:, -1 - 1], precision=_HIGHEST)
  positive = jnp.sum((u > 0) & keep) / jnp.sum(keep)
  u = jnp.where((positive > 0.5) & (positive < 1.0), -u, u)
  return ((u > 0) & keep).reshape(mask.shape)


_batched = jax.jit(jax.vmap(_split_padded))


def _pad(features: np.ndarray, height: int, width: int, depth: int):
  b, h, w, d = features.shape
  out = np.zeros((b, height, width, depth), np.float32)
  out[:, :h, :w, :d] = features
  mask = np.zeros((b, height, width), bool)
  mask[:, :h, :w] = True
  return out, mask


def main(argv):
  del argv
  shapes = model_shapes()
  rng = np.random.default_rng(0)
  batch = FLAGS.images
  features = {
    name: rng.standard_normal((batch, h, w, d)).astype(np.float32)
    for name, (h, w, d) in shapes.items()
  }
  on_device = {name: jax.device_put(f) for name, f in features.items()}
  height = max(h for h, _, _ in shapes.values())
  width = max(w for _, w, _ in shapes.values())
  depth = max(d for _, _, d in shapes.values())
  padded = [_pad(features[name], height, width, depth) for name in shapes]
  stacked = jax.device_put((np.stack([p[0] for p in padded]), np.stack([p[1] for p in padded])))
  gram_side = {name: min(batch * h * w, d) for name, (h, w, d) in shapes.items()}
  # Groups without padding: same grid and width (the same program), batched.
  groups = collections.defaultdict(list)
  for name, shape in shapes.items():
    groups[shape].append(name)
  grouped_inputs = [
    jax.device_put(np.stack([features[n] for n in names])) for names in groups.values()
  ]
  grouped_fn = jax.jit(
    jax.vmap(lambda f: foreground.sign_split(f, center=False, joint=True, solver="gram")[0])
  )

  def per_model():
    return {
      name: foreground.checked_split(f, center=False, joint=True, solver="gram")
      for name, f in on_device.items()
    }

  def batched():
    return _batched(*stacked)

  def grouped():
    return [grouped_fn(x) for x in grouped_inputs]

  variants = {"per_model": per_model, "batched_padded": batched, "grouped": grouped}
  results = {name: jax.block_until_ready(fn()) for name, fn in variants.items()}  # compiles
  # Agreement with the pipeline's split (the padded split has no SVD fallback: images whose
  # Gram split is ill-determined may differ; counted).
  reference = {name: np.asarray(mask) for name, mask in results["per_model"].items()}
  differing = {}
  batched_masks = np.asarray(results["batched_padded"])
  for index, (name, (h, w, _)) in enumerate(shapes.items()):
    differing.setdefault("batched_padded", 0)
    differing["batched_padded"] += int(np.sum(batched_masks[index, :, :h, :w] != reference[name]))
  differing["grouped"] = 0
  for names, masks in zip(groups.values(), results["grouped"]):
    for name, mask in zip(names, np.asarray(masks)):
      differing["grouped"] += int(np.sum(mask != reference[name]))
  rounds = []
  for _ in range(FLAGS.repeats):
    times = {}
    for name, fn in variants.items():
      start = time.perf_counter()
      jax.block_until_ready(fn())
      times[name] = time.perf_counter() - start
    rounds.append(times)
  median = {name: float(np.median([r[name] for r in rounds])) for name in variants}
  ratio = {
    name: float(np.median([r[name] / r["per_model"] for r in rounds]))
    for name in variants
    if name != "per_model"
  }
  eigh_cubes = {
    "per_model": float(sum(n**3 for n in gram_side.values())),
    "batched_padded": float(len(shapes) * depth**3),
  }
  figures = dict(
    device=str(jax.devices()[0]),
    images=batch,
    models={
      name: dict(grid=[h, w], width=d, gram_side=gram_side[name])
      for name, (h, w, d) in shapes.items()
    },
    padded_shape=[height, width, depth],
    groups=[names for names in groups.values()],
    seconds=median,
    rounds=rounds,
    ratio_to_per_model=ratio,
    eigh_size_cubed=eigh_cubes,
    eigh_work_ratio_padded=eigh_cubes["batched_padded"] / eigh_cubes["per_model"],
    mask_patches_differing_from_per_model=differing,
  )
  print(json.dumps(figures, indent=1))
  if FLAGS.json:
    with open(FLAGS.json, "w", encoding="utf-8") as f:
      json.dump(figures, f, indent=1)


if __name__ == "__main__":
  app.run(main)
