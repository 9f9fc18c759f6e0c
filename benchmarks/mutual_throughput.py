r"""Images per second of the mutual-knowledge analysis: this JAX pipeline vs a per-image one.

  python benchmarks/mutual_throughput.py                       # tiny-synthetic's architecture, CPU
  python benchmarks/mutual_throughput.py --arch ViT-B-16 --images 50 --descriptors 4229   # GPU
  python benchmarks/mutual_throughput.py --arch ViT-B-16 --images 16 --timed_classes 3 --crf \
      --json F                                  # host / device split, reference mode, CRF on

Both sides get the same random weights (stori_jax.reference.parity_report.random_pair: an open_clip model and the
converted bundle), the same B images of one class, the same descriptor embeddings (D random
texts encoded by the model's text tower once, outside the timing), class embeddings and settings
(tokens, joint spectral split, PCA and K-means with L = 5, k, relevance mean - 0.02, Sinkhorn,
top 3, u). The per-image side is mutual.reference, which follows the reference code step
by step with its libraries: PyTorch for the towers, the SVD and the 1,000-round Sinkhorn loop;
scikit-learn for PCA and MinMaxScaler; kmeans_pytorch for K-means (from the start the JAX side
draws); OpenCV for connected components, contours, fitEllipse, ellipse drawing, grayscale and
the Gaussian blur; python sets and numpy for the intersection and MI. Images go through it one
by one from the visual prompts on, as there. The dense CRF is off on both sides unless `--crf`
(SimpleCRF, the reference's, builds from source only: without it the per-image side runs with
the CRF off, and `reference_crf` says so). On a machine with an accelerator (JAX's backend is
not the CPU and torch sees CUDA) the per-image side runs there too: the model and its tensors
on CUDA, bf16 under torch.autocast("cuda"), the CPU libraries on host copies as in the
reference. The per-image side runs twice:
  * as written: the reference's get_concept_relevance_with_image encodes the image and the
    scored descriptors' texts again each time it scores them (the relevance filter and
    get_relevance_score, for each image and method: two image rows and |candidates| + |chosen|
    text rows), which is the work of the code this pipeline replaces;
  * at equal work: those scores read the features pass and the encoded bank, as this pipeline
    does, so both sides run about the same tower work and the ratio compares implementations.
The JAX side is timed after one warm-up call on the same images (compilation excluded: the
visual prompts go through the tower in chunks padded to a few sizes that depend on how many
concept regions the images have, and a long run compiles each size once; nothing else is kept
between calls); one timed run each; the figure is the ratio of images per second. `--mode` sets
config.analysis.mode (the ellipse, CRF unary, PCA sign and K-means stages).

One run also prints (and `--json` writes):
  * images/s of this pipeline and of the per-image side in both forms, and the ratios;
  * over `--timed_classes N` classes of new images (B each, generated with seeds other than the
    warm-up class's, outside the clocks) after the warm-up: `host_seconds_per_image`, the CPU
    time of the calling thread (stori_jax.plumbing.profiling: time.thread_time(); device executions run
    on XLA's threads and waiting for them costs the caller none), `device_seconds_per_image`,
    wall minus host (the caller waiting: for the device, for XLA's compiler threads, whose
    seconds are counted apart, or for a core on a busy machine),
    `compiles_after_warmup` and `compile_seconds_after_warmup`, the XLA backend compilations
    counted from jax.monitoring events (0 when every shape the classes meet was compiled by the
    warm-up class), and `timed_classes_images_per_s`;
  * vision-tower passes per image on each side (images through the tower / B): ours as run
    (`jax`: the passes of the prompt calls that hold real regions; inside a call the passes
    past its real regions are skipped), of which real (`jax_real`: not padding) and the rows
    of the compiled call shapes (`jax_compiled_shapes`), and the reference's (as written and
    at equal work); `padding_rows` (run, skipped); the reference's text-tower passes per
    image as written;
  * a per-stage profile of `pipeline.analyze_class` (a second timed run, on the same images,
    with the stage functions wrapped in place and their outputs blocked on; the compilations
    for the FLOP counts are left out): exclusive wall time per stage, calls, FLOPs and bytes
    from XLA's `cost_analysis()` of every jitted function the stage calls (the towers' jitted
    encoder included; the ViT towers are also counted analytically as a check). While-loop
    bodies (K-means' Lloyd steps, Sinkhorn, connected components) are counted once by XLA, so
    those stages' FLOPs are lower bounds; eager glue (normalisation, the class-score product)
    is not counted;
  * `device_calls_per_class`: executions of compiled programs (device calls: jitted functions
    and eager ops) for one steady-state class, counted after everything else
    (stori_jax.plumbing.profiling.device_calls, which turns JAX's C++ dispatch path off for the
    count and reads the programs back from this run's own persistent compilation cache, a
    temporary folder), and `device_calls_by_program`;
  * the machine's dense fp32 matmul rate (a 4096 x 4096 product, best of 3, in JAX and in
    PyTorch, measured in the same run) and the pipeline's achieved FLOP/s as a fraction of it;
    the towers' FLOPs counted by hand over the rows that ran, over the tower stages' time
    (the features pass and the fused render + tower program, timed apart from the reference
    ellipses fitted before it) and over the whole analysis's time; the same for the per-image
    reference at equal work (its towers timed by hooks on model.visual);
  * `tower_isolation`: the tower alone (the jitted image function, embeddings only) at the
    `--isolation` batch sizes (the pipeline's pass size first), its fraction of the matmul
    rate: what XLA:CPU's tower code reaches apart from how the pipeline calls it.

`machine_limit_rows(figures)` turns the JSON into the rows of the README's machine-limit table
(per image: seconds, GFLOP, fraction of the matmul rate, ratio against the per-image reference
at equal work).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # `python benchmarks/mutual_throughput.py` puts only benchmarks/ there
  sys.path.insert(0, ROOT)

import jax
import numpy as np
import torch
from absl import app, flags

import stori_jax
from stori_jax.plumbing import profiling
from mutual import concept_methods, concepts, crf, features, foreground, paper_config, pipeline
from mutual import report
from mutual import reference as torch_reference
from mutual import visual_prompts
from mutual.concept_methods import kmeans as kmeans_method
from mutual.ellipse import contours as ellipse_contours
from mutual.ellipse import pixels as ellipse_pixels
from mutual.ellipse import prompts as ellipse_prompts
from mutual.paper_config import analysis_config
from stori_jax.data import synthetic
from stori_jax.clip.encoding import l2_normalize
from stori_jax.reference.parity_report import random_pair
from benchmarks.machine_rate import matmul_rate  # the machine's rate, shared with train_step


def define_flags(values: flags.FlagValues = flags.FLAGS) -> None:
  """The benchmark's flags, on `values` (importing the module defines none: tests and
  scripts/readme_figures.py import it for machine_limit_rows)."""
  flags.DEFINE_string(
    "arch",
    "",
    "open_clip architecture; empty: the tiny-synthetic model's config.",
    flag_values=values,
  )
  flags.DEFINE_integer("images", 16, "B, the images of the class.", flag_values=values)
  flags.DEFINE_integer(
    "descriptors", 500, "D, the size of the descriptor bank.", flag_values=values
  )
  flags.DEFINE_integer("classes", 100, "C, zero-shot classes.", flag_values=values)
  flags.DEFINE_integer(
    "top_k", 0, "k of the intersection (0: D / 8, at most 500).", flag_values=values
  )
  flags.DEFINE_integer("u", 50, "Language-side descriptors.", flag_values=values)
  flags.DEFINE_string("json", None, "Also write the figures here.", flag_values=values)
  flags.DEFINE_string(
    "mode",
    "",
    "config.analysis.mode (reference / improved); empty: analysis_config's default.",
    flag_values=values,
  )
  flags.DEFINE_enum(
    "compute_dtype",
    "float32",
    ["float32", "bfloat16"],
    "config.analysis.compute_dtype of this pipeline's towers; the per-image side runs under "
    "torch.autocast in the same dtype, and the matmul rate is measured in it.",
    flag_values=values,
  )
  flags.DEFINE_integer(
    "matmul",
    4096,
    "Side of the square fp32 matmul timed for the machine's rate.",
    flag_values=values,
  )
  flags.DEFINE_integer(
    "timed_classes",
    1,
    "Classes of new images (B each, a new seed per class) timed after the warm-up class, for the "
    "host / device split and the compilations after warm-up.",
    flag_values=values,
  )
  flags.DEFINE_bool(
    "device_calls",
    True,
    "Count the device calls (compiled-program executions) of a steady-state class at the end.",
    flag_values=values,
  )
  flags.DEFINE_list(
    "isolation",
    ["6", "48"],
    "Batch sizes at which the tower alone (bundle.image_function, jitted, embeddings only) is "
    "timed beside the matmul rate (tower_isolation in the JSON); empty: not timed.",
    flag_values=values,
  )
  flags.DEFINE_bool(
    "as_written",
    True,
    "Also time the per-image side as the reference's code is written (its scores encode the "
    "image and descriptors again: slow); false: at equal work only.",
    flag_values=values,
  )
  flags.DEFINE_bool(
    "crf",
    False,
    "The dense CRF on both sides (the reference's needs SimpleCRF: else it runs off).",
    flag_values=values,
  )


FLAGS = flags.FLAGS


# ---------------------------------------------------------------------------------------------
# Per-stage profile of pipeline.analyze_class.

#: (module, function, stage name): the functions analyze_class calls through module attributes,
#: timed in place. A stage's time excludes the stages nested in it.
STAGES = (
  (features, "image_embeddings", "tower: image embeddings"),
  (features, "patch_features", "tower: patch features"),
  (features, "embeddings_and_patches", "tower: embeddings + patch features"),
  (foreground, "prominent_patches", "foreground split"),
  (pipeline, "_tower_outputs", "tower outputs: normalise, float32"),
  (pipeline, "_scores", "class scores"),
  (pipeline, "_upsample_mask", "masks: upsample"),
  (pipeline, "_coarse_pixel_maps", "masks: upsample + pixel concept maps"),
  (pipeline, "_pixel_maps", "masks: pixel concept maps"),
  (pipeline, "_reference_uint8", "CRF"),
  (crf, "refine", "CRF"),
  (pipeline, "concept_maps", "concepts (PCA, K-means)"),
  (pipeline, "pixel_concepts", "masks: pixel concept maps"),
  (visual_prompts, "concept_embeddings_of_maps", "visual prompts: regions, tables"),
  (ellipse_prompts, "padded_ellipses", "visual prompts: reference ellipses"),
  (pipeline, "language_stages", "language stages"),
)
#: Jitted functions called from Python inside the stages; their XLA cost counts to the stage
#: (names missing from a module are skipped).
JITTED = (
  (foreground, "checked_split"),
  (foreground, "main_regions"),
  (concepts, "_pca_assign"),
  (concepts, "kmeans"),
  (concepts, "kmeans_pytorch_loop"),
  (kmeans_method, "_kmeans_maps"),
  (crf, "_refine"),
  (visual_prompts, "_region_embeddings"),
  (ellipse_contours, "largest_contours"),
  (ellipse_pixels, "compose_prompts"),
)
#: The vision tower called from Python inside a stage gets its own stage there (the visual
#: prompts' tower runs inside their fused program, whose cost is the stage's).
TOWER_STAGES = {}
#: The name of the stage of the fused render + tower program (timed on its own, its output
#: blocked on: the ellipses and the tables around it are other stages).
FUSED_STAGE = "visual prompts: render + tower (fused)"


def _prompt_rows(args, kwargs) -> dict:
  """Tower rows of one visual_prompts._region_embeddings call: `padded` (3 x the call's regions,
  the shape it is compiled for), `run` (the passes that execute: passes past the call's `real`
  regions are skipped inside the program) and `real` (3 x the regions that are not padding)."""
  variants = len(visual_prompts.VARIANTS)
  chunk, real = int(args[5].shape[0]), int(args[7])
  per_pass = kwargs.get("regions_per_pass")
  run = chunk if per_pass is None else min(chunk, -(-real // per_pass) * per_pass)
  return dict(padded=variants * chunk, run=variants * run, real=variants * real)


#: Jitted stages that run the tower inside: their tower rows, from their arguments.
FUSED_TOWER_ROWS = {"_region_embeddings": _prompt_rows}


class _SameAs:
  """`wrapper`, hashing and comparing equal to `original`."""

  def __init__(self, wrapper, original):
    self.wrapper, self.original = wrapper, original

  def __call__(self, *args, **kwargs):
    return self.wrapper(*args, **kwargs)

  def __hash__(self):
    return hash(self.original)

  def __eq__(self, other):
    return self.original == getattr(other, "original", other)


def _is_traced(args) -> bool:
  return any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(args))


def _signature(args, kwargs):
  def key(x):
    return (tuple(x.shape), str(x.dtype)) if hasattr(x, "shape") else repr(x)

  return repr(jax.tree_util.tree_map(key, (args, kwargs)))


class Profile:
  """Exclusive wall time, calls, XLA FLOPs / bytes and tower rows per stage of a run."""

  def __init__(self):
    self.seconds = collections.defaultdict(float)
    self.calls = collections.Counter()
    self.flops = collections.defaultdict(float)
    self.bytes = collections.defaultdict(float)
    self.tower_rows = collections.Counter()  # rows that run through the tower
    self.real_rows = collections.Counter()  # of which not padding
    self.padded_rows = collections.Counter()  # rows of the compiled shapes (skipped passes too)
    self.analytic_flops = collections.defaultdict(float)
    self.excluded = 0.0  # seconds spent compiling for cost_analysis, out of every stage
    self._stack: list[list] = []  # [name, start, time spent in nested stages]
    self._costs: dict = {}

  def reset(self):
    tables = (self.seconds, self.calls, self.flops, self.bytes, self.tower_rows)
    for table in tables + (self.real_rows, self.padded_rows):
      table.clear()
    self.analytic_flops.clear()

  @contextlib.contextmanager
  def stage(self, name):
    frame = [name, time.perf_counter(), 0.0]
    self._stack.append(frame)
    try:
      yield
    finally:
      self._stack.pop()
      elapsed = time.perf_counter() - frame[1]
      self.seconds[name] += elapsed - frame[2]
      self.calls[name] += 1
      if self._stack:
        self._stack[-1][2] += elapsed

  @property
  def current(self) -> str:
    return self._stack[-1][0] if self._stack else "other"

  def add_cost(self, fn, args, kwargs, scale: float = 1.0):
    """Adds fn's XLA cost_analysis (flops, bytes accessed) for these arguments, times `scale`,
    to the current stage (compiled once per argument signature)."""
    # XLA counts a loop's body once: the cost of passes of a few regions (a loop in the
    # program) is that of the same call in one pass.
    kwargs = dict(kwargs, regions_per_pass=None) if "regions_per_pass" in kwargs else kwargs
    key = (id(fn), _signature(args, kwargs))
    if key not in self._costs:
      start = time.perf_counter()
      cost = fn.lower(*args, **kwargs).compile().cost_analysis()
      cost = cost[0] if isinstance(cost, (list, tuple)) else cost
      self._costs[key] = (float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0)))
      # Compiling for the cost is no stage's time.
      elapsed = time.perf_counter() - start
      self.excluded += elapsed
      if self._stack:
        self._stack[-1][2] += elapsed
    flops, moved = self._costs[key]
    self.flops[self.current] += scale * flops
    self.bytes[self.current] += scale * moved

  def timed(self, name, fn, jitted=False):
    def wrapper(*args, **kwargs):
      if _is_traced((args, kwargs)):
        return fn(*args, **kwargs)
      with self.stage(name):
        if jitted:
          self.add_cost(fn, args, kwargs)
        return jax.block_until_ready(fn(*args, **kwargs))

    return wrapper

  def costed(self, fn, config):
    rows_of = FUSED_TOWER_ROWS.get(getattr(fn, "__name__", ""))
    if rows_of is not None:
      return self.fused(fn, config, rows_of)

    def wrapper(*args, **kwargs):
      if not _is_traced((args, kwargs)):
        self.add_cost(fn, args, kwargs)
      return fn(*args, **kwargs)

    return wrapper

  def fused(self, fn, config, rows_of):
    """A jitted program with the tower inside (FUSED_STAGE): timed on its own with its output
    blocked on; its rows, and its XLA cost scaled to the passes that run (the cost is that of
    the whole call in one pass: skipped passes would count)."""

    def wrapper(*args, **kwargs):
      if _is_traced((args, kwargs)):
        return fn(*args, **kwargs)
      rows = rows_of(args, kwargs)
      with self.stage(FUSED_STAGE):
        self.add_cost(fn, args, kwargs, scale=rows["run"] / rows["padded"])
        self.tower_rows[FUSED_STAGE] += rows["run"]
        self.real_rows[FUSED_STAGE] += rows["real"]
        self.padded_rows[FUSED_STAGE] += rows["padded"]
        self.analytic_flops[FUSED_STAGE] += vit_flops(config, rows["run"])
        return jax.block_until_ready(fn(*args, **kwargs))

    return wrapper

  def tower(self, fn, config):
    """The bundle's jitted image encoder: its rows, XLA cost and analytic ViT count."""

    def wrapper(params, images, return_hidden):
      if _is_traced(images):  # traced into a jitted stage, whose cost and rows are counted
        return fn(params, images, return_hidden)
      name = TOWER_STAGES.get(self.current, self.current)
      with self.stage(name) if name != self.current else contextlib.nullcontext():
        self.add_cost(fn, (params, images, return_hidden), {})
        self.tower_rows[name] += int(images.shape[0])
        self.real_rows[name] += int(images.shape[0])
        self.padded_rows[name] += int(images.shape[0])
        self.analytic_flops[name] += vit_flops(config, int(images.shape[0]))
        return jax.block_until_ready(fn(params, images, return_hidden))

    return wrapper

  @contextlib.contextmanager
  def installed(self, bundle):
    """Wraps the stage functions, the jitted functions and the bundle's image encoder in place
    for the duration."""
    saved = []
    for module, attr, name in STAGES:
      if hasattr(module, attr):
        fn = getattr(module, attr)
        saved.append((module, attr, fn))
        setattr(module, attr, self.timed(name, fn, jitted=hasattr(fn, "lower")))
    for module, attr in JITTED:
      fn = getattr(module, attr, None)
      if not hasattr(fn, "lower"):  # absent, or not a plain jitted function
        continue
      saved.append((module, attr, fn))
      setattr(module, attr, self.costed(fn, bundle.config))
    image_fn = bundle._image_fn
    # A cached_property; the wrapper hashes and compares as the function it wraps, so jitted
    # stages that take the tower as a static argument reuse their compiled programs.
    bundle.__dict__["_image_fn"] = _SameAs(self.tower(image_fn, bundle.config), image_fn)
    try:
      yield self
    finally:
      bundle.__dict__["_image_fn"] = image_fn
      for module, attr, fn in reversed(saved):
        setattr(module, attr, fn)

  def table(self, total_seconds):
    """Rows per stage (largest time first) and an "other" row: the time no stage accounts for."""
    names = sorted(set(self.seconds) | set(self.flops), key=lambda n: -self.seconds.get(n, 0.0))
    rows = []
    for name in names:
      seconds = self.seconds.get(name, 0.0)
      flops = self.flops.get(name, 0.0)
      rows.append(
        dict(
          stage=name,
          seconds=round(seconds, 4),
          share=round(seconds / total_seconds, 4),
          calls=int(self.calls.get(name, 0)),
          gflop=round(flops / 1e9, 4),
          gbytes=round(self.bytes.get(name, 0.0) / 1e9, 4),
          gflop_per_s=round(flops / seconds / 1e9, 2) if seconds > 0 else None,
          tower_rows=int(self.tower_rows.get(name, 0)),
          tower_rows_real=int(self.real_rows.get(name, 0)),
          tower_rows_compiled=int(self.padded_rows.get(name, 0)),
          analytic_gflop=round(self.analytic_flops[name] / 1e9, 4)
          if name in self.analytic_flops
          else None,
        )
      )
    other = total_seconds - sum(self.seconds.values())
    rows.append(
      dict(
        stage="other (unwrapped glue)",
        seconds=round(other, 4),
        share=round(other / total_seconds, 4),
      )
    )
    return rows


def vit_flops(config, batch: int) -> float:
  """Analytic FLOPs (2 per multiply-add) of a ViT image tower's forward pass on `batch` images:
  patch embedding, per block QKV / output / MLP projections and the two attention products, the
  final projection. 0 for CNN towers (not counted here)."""
  if not isinstance(config.vision, stori_jax.VisionConfig):
    return 0.0
  v = config.vision
  grid = v.image_size // v.patch_size
  tokens = grid * grid + 1
  width, mlp = v.width, v.mlp_width
  patch = 2 * grid * grid * v.patch_size**2 * 3 * width
  block = 2 * tokens * (4 * width * width + 2 * width * mlp) + 4 * tokens * tokens * width
  return float(batch) * (patch + v.layers * block + 2 * width * config.embed_dim)


def descriptor_tokens(text_config, count: int, rng) -> torch.Tensor:
  """int64 [count, context] token ids of `count` random 4-12 word texts: start token, words,
  end-of-text (the largest id, where open_clip pools), zero padding. A text costs the tower the
  same at any content: every row runs the whole context."""
  context, eot = int(text_config.context_length), int(text_config.eot_token_id)
  tokens = np.zeros((count, context), np.int64)
  for row in tokens:
    n = int(rng.integers(4, 13))
    row[0] = eot - 1
    row[1 : n + 1] = rng.integers(1, eot - 1, size=n)
    row[n + 1] = eot
  return torch.from_numpy(tokens)


def encode_texts(model, tokens: torch.Tensor, batch: int = 256) -> np.ndarray:
  """float32 [n, E] unit text embeddings of token ids [n, context] (the open_clip model's, on
  the model's device)."""
  device = next(model.parameters()).device
  out = []
  with torch.no_grad():
    for start in range(0, len(tokens), batch):
      rows = tokens[start : start + batch].to(device)
      out.append(torch.nn.functional.normalize(model.encode_text(rows).float(), dim=-1))
  return torch.cat(out).cpu().numpy()


def print_profile(rows, total_seconds):
  head = f"{'stage':36s} {'time s':>8s} {'share':>6s} {'calls':>6s} {'GFLOP':>9s} {'GB':>7s}"
  head += f" {'GFLOP/s':>8s} {'rows':>6s} {'analytic':>9s}"
  print(head)
  for r in rows:
    line = f"{r['stage']:36s} {r['seconds']:8.3f} {100 * r['share']:5.1f}%"
    if "calls" in r:
      rate = "-" if r["gflop_per_s"] is None else f"{r['gflop_per_s']:.1f}"
      analytic = "-" if r["analytic_gflop"] is None else f"{r['analytic_gflop']:.2f}"
      line += f" {r['calls']:6d} {r['gflop']:9.2f} {r['gbytes']:7.2f} {rate:>8s}"
      line += f" {r['tower_rows'] or '-':>6} {analytic:>9s}"
    print(line)
  print(f"{'total':36s} {total_seconds:8.3f}")


def _rate(flops: float, seconds: float):
  """GFLOP/s, rounded; None without time."""
  return round(flops / seconds / 1e9, 2) if seconds else None


def _fraction(flops: float, seconds: float, rate: float):
  """The share of `rate` GFLOP/s that `flops` in `seconds` achieve; None without time."""
  return round(flops / seconds / 1e9 / rate, 4) if seconds and rate else None


def tower_isolation(bundle, batches, rate: float, repeats: int = 2) -> dict:
  """The vision tower alone (the jitted image function the pipeline calls, embeddings only,
  random normalised inputs) at each batch size of `batches`: seconds (best of `repeats`, after
  a compiling call), images/s, analytic GFLOP/s and its fraction of `rate` (GFLOP/s)."""
  fn = jax.jit(bundle.image_function, static_argnums=2)
  size = int(bundle.config.vision.image_size)
  out = {}
  for batch in (int(b) for b in batches):
    x = jax.random.normal(jax.random.PRNGKey(batch), (batch, size, size, 3), jax.numpy.float32)
    jax.block_until_ready(fn(bundle.params, x, False))
    best = np.inf
    for _ in range(repeats):
      start = time.perf_counter()
      jax.block_until_ready(fn(bundle.params, x, False))
      best = min(best, time.perf_counter() - start)
    flops = vit_flops(bundle.config, batch)
    out[str(batch)] = dict(
      seconds=round(best, 4),
      images_per_s=round(batch / best, 3),
      gflop_per_s=_rate(flops, best),
      fraction_of_matmul=_fraction(flops, best, rate),
    )
  return out


def machine_limit_rows(figures: dict) -> list[dict]:
  """Rows of the README's machine-limit table for the analysis, from this benchmark's JSON
  (`figures`, as --json writes it): one row per side, per image.

  Each row: what (str), seconds per image, GFLOP per image (the vision towers counted by hand,
  the rows that ran: 99%+ of the analysis's FLOPs), fraction of the measured matmul rate (the
  towers' FLOPs over the whole analysis's time, so glue, rendering and ellipses count against
  it), towers_fraction (the same FLOPs over the tower stages' time alone) and ratio (the
  per-image reference's seconds at equal work over this side's; 1.0 for the reference).
  Empty when the JSON predates these fields.
  """
  achieved, images = figures.get("achieved", {}), figures["images"]
  if "towers_analytic_gflop" not in achieved:
    return []
  reference_seconds = achieved["reference_equal_work_seconds"]
  ours = dict(
    what=f"MK analysis per image, this pipeline ({figures['compute_dtype']} towers)",
    seconds=round(achieved["jax_seconds"] / images, 3),
    gflop=round(achieved["towers_analytic_gflop"] / images, 1),
    fraction=achieved["jax_fraction_of_matmul"],
    towers_fraction=achieved["towers_analytic_fraction_of_matmul"],
    ratio=round(reference_seconds / achieved["jax_seconds"], 2),
  )
  reference = dict(
    what="MK analysis per image, per-image reference at equal work (PyTorch)",
    seconds=round(reference_seconds / images, 3),
    gflop=round(achieved["reference_equal_work_towers_gflop"] / images, 1),
    fraction=achieved["reference_equal_work_fraction_of_matmul"],
    towers_fraction=achieved["reference_equal_work_towers_fraction_of_matmul"],
    ratio=1.0,
  )
  return [ours, reference]


# ---------------------------------------------------------------------------------------------


def main(argv):
  del argv
  # A persistent compilation cache of this run alone: the device-call count at the end drops
  # JAX's in-memory caches and reads the programs back from it instead of compiling them again.
  cache_dir = tempfile.mkdtemp(prefix="mutual_throughput_cache_")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = cache_dir
  profiling.use_compilation_cache(True)
  try:
    _main()
  finally:
    shutil.rmtree(cache_dir, ignore_errors=True)


def _main():
  if FLAGS.arch:
    arch = FLAGS.arch
  else:
    arch = stori_jax.load("tiny-synthetic").config
  model, bundle = random_pair(arch)
  model = model.eval()
  # The per-image side on the accelerator when there is one (JAX's and torch's both).
  accelerated = jax.default_backend() != "cpu" and torch.cuda.is_available()
  torch_device = torch.device("cuda" if accelerated else "cpu")
  model = model.to(torch_device)
  size = int(bundle.config.vision.image_size)
  embed = int(bundle.config.embed_dim)
  rng = np.random.default_rng(0)
  # The descriptors are texts (random words) encoded by the model's own text tower, so that the
  # reference side as written, which encodes them again per image, computes the same scores.
  desc_tokens = descriptor_tokens(bundle.config.text, FLAGS.descriptors, rng)
  desc = encode_texts(model, desc_tokens)
  # Normalised in float64, as drawn, then stored as float32.
  classes = l2_normalize(rng.normal(size=(FLAGS.classes, embed)), dtype=np.float64)
  classes = classes.astype(np.float32)
  bank = pipeline.TextBank(
    tuple(f"d{i}" for i in range(len(desc))),
    desc,
    tuple(f"c{i}" for i in range(len(classes))),
    classes,
  )
  k = FLAGS.top_k or min(500, max(3, FLAGS.descriptors // 8))
  modes = dict(mode=FLAGS.mode) if FLAGS.mode else {}
  analysis = analysis_config(
    crf=FLAGS.crf,
    top_k=k,
    u=min(FLAGS.u, FLAGS.descriptors),
    solver="reference",
    compute_dtype=FLAGS.compute_dtype,
    **modes,
  )
  timed = synthetic.generate(FLAGS.images, (31, 1), image_size=size, max_objects=1).images
  mean = np.asarray(bundle.preprocess_config.mean, np.float32)
  std = np.asarray(bundle.preprocess_config.std, np.float32)

  def run_jax(images):
    out = pipeline.analyze_class(bundle, images, bank, analysis)
    jax.block_until_ready(out["pca"]["curve"])
    return out

  with profiling.compilations() as warmup:
    run_jax(timed)
  steady_images = []
  start = time.perf_counter()
  plain = run_jax(timed)
  jax_seconds = time.perf_counter() - start
  # Classes of new images after the warm-up class: the caller's thread time (host) apart from
  # the time it waits for the device, and what compiles (a new image count of concept regions
  # can ask for new padded chunk shapes). Images are generated outside the clocks.
  clock = profiling.HostClock()
  compiled = profiling.Compilations()
  for index in range(FLAGS.timed_classes):
    images = synthetic.generate(FLAGS.images, (31, 2 + index), image_size=size, max_objects=1)
    steady_images.append(images.images)
    with profiling.compilations() as class_compiles, clock.split():
      run_jax(images.images)
    compiled.count += class_compiles.count
    compiled.seconds += class_compiles.seconds
  timed_images = max(1, FLAGS.timed_classes * FLAGS.images)
  torch.set_num_threads(max(1, torch.get_num_threads()))

  if FLAGS.compute_dtype == "bfloat16":
    # The towers under autocast, their outputs float32: the language stages stay float32 on
    # both sides.
    for name in ("encode_image", "encode_text"):

      def in_bfloat16(*args, _encode=getattr(model, name), **kwargs):
        with torch.autocast(torch_device.type, dtype=torch.bfloat16):
          return _encode(*args, **kwargs).float()

      setattr(model, name, in_bfloat16)

  reference_crf = FLAGS.crf and torch_reference.have_crf()
  if FLAGS.crf and not reference_crf:
    print("SimpleCRF is not installed: the per-image side runs with the CRF off.")

  def run_reference(tokens):
    """Seconds, image-tower rows, text-tower rows and seconds in the image tower of the
    per-image side."""
    rows, tower = [], [0.0, 0.0]  # [seconds, start of the call in progress]
    sync = torch.cuda.synchronize if accelerated else (lambda: None)

    def before(module, inputs):
      rows.append(int(inputs[0].shape[0]))
      sync()
      tower[1] = time.perf_counter()

    def after(module, inputs, output):
      sync()
      tower[0] += time.perf_counter() - tower[1]

    hooks = (
      model.visual.register_forward_pre_hook(before),
      model.visual.register_forward_hook(after),
    )
    start = time.perf_counter()
    out = torch_reference.analyze_class(
      model,
      timed,
      mean,
      std,
      desc,
      classes,
      k,
      analysis.u,
      methods=concept_methods.reference_labelers(
        torch_reference, pipeline.METHODS, paper_config.concept_settings(analysis)
      ),
      crf=reference_crf,
      joint=bool(analysis.joint_foreground),
      desc_tokens=tokens,
      device=torch_device,
    )
    if accelerated:
      torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    for hook in hooks:
      hook.remove()
    return seconds, sum(rows), out["stats"].get("reencoded_text_rows", 0), tower[0]

  # As written: the image and the scored descriptors encoded again for each image score. At
  # equal work: both read from the features pass and the encoded bank, as this pipeline does.
  ref_seconds, ref_rows, ref_text_rows = None, None, None
  if FLAGS.as_written:
    ref_seconds, ref_rows, ref_text_rows, _ = run_reference(desc_tokens)
  equal_seconds, equal_rows, _, equal_tower_seconds = run_reference(None)

  # The profile: the timed call again with the stages wrapped (outputs blocked on per stage);
  # the compilations for cost_analysis are timed apart and left out.
  profile = Profile()
  with profile.installed(pipeline.tower_bundle(bundle, analysis)):
    start = time.perf_counter()
    profiled = run_jax(timed)
    profiled_seconds = time.perf_counter() - start - profile.excluded
  for method in pipeline.METHODS:  # the wrappers change no output
    np.testing.assert_array_equal(profiled[method]["curve"], plain[method]["curve"])
  stages = profile.table(profiled_seconds)
  device_calls, device_calls_by_program = None, None
  if FLAGS.device_calls:
    # Steady state: a class's calls after another class has run in the same block (the first
    # one reads its programs back from the cache). Counting slows dispatch: nothing is timed.
    with profiling.device_calls() as calls:
      run_jax(timed)
      first, first_names = calls.count, dict(calls.names)
      run_jax(steady_images[0] if steady_images else timed)
    device_calls = calls.count - first
    device_calls_by_program = {
      name: count - first_names.get(name, 0)
      for name, count in calls.by_name().items()
      if count - first_names.get(name, 0)
    }
  machine = matmul_rate(FLAGS.matmul, FLAGS.compute_dtype, device=torch_device)
  rate = max(machine["jax_gflop_per_s"], machine["torch_gflop_per_s"])
  flops = sum(profile.flops.values())
  tower_names = [n for n in profile.tower_rows]
  tower_flops = sum(profile.flops[n] for n in tower_names)
  tower_seconds = sum(profile.seconds[n] for n in tower_names)
  # The towers' own FLOPs, counted by hand over the rows that ran (the fused stage's XLA count
  # includes the rendering).
  tower_analytic = sum(profile.analytic_flops[n] for n in tower_names)
  achieved = flops / profiled_seconds / 1e9
  rows_run = sum(profile.tower_rows.values())
  rows_real = sum(profile.real_rows.values())
  rows_compiled = sum(profile.padded_rows.values())
  reference_tower_flops = vit_flops(bundle.config, equal_rows)
  isolation = (
    tower_isolation(pipeline.tower_bundle(bundle, analysis), FLAGS.isolation, rate)
    if FLAGS.isolation
    else None
  )
  figures = dict(
    arch=arch if isinstance(arch, str) else "tiny-synthetic config",
    device=str(jax.devices()[0]),
    images=FLAGS.images,
    descriptors=FLAGS.descriptors,
    top_k=k,
    mode=analysis.get("mode", ""),
    compute_dtype=FLAGS.compute_dtype,
    # Images per vision-tower pass (config.analysis.tower_batch's device rule); None: whole calls.
    images_per_pass=features.images_per_pass(
      pipeline.tower_bundle(bundle, analysis), int(analysis.get("tower_batch", 0))
    ),
    crf=bool(FLAGS.crf),
    reference_crf=bool(reference_crf),
    reference_device=str(torch_device),
    jax_images_per_s=round(FLAGS.images / jax_seconds, 3),
    # Over the timed classes of new images (compilations included where they happen).
    timed_classes=FLAGS.timed_classes,
    timed_classes_images_per_s=round(timed_images / clock.wall_seconds, 3)
    if clock.wall_seconds
    else None,
    host_seconds_per_image=round(clock.host_seconds / timed_images, 5),
    device_seconds_per_image=round(clock.device_seconds / timed_images, 5),
    # The warm-up class's compilations: how many, their seconds, and per program (jitted
    # function's name; an eager op outside jit compiles one named after the op).
    compiles_warmup=int(warmup.count),
    # Programs the warm-up class read from this run's own cache folder (compiled earlier in
    # the run by another jitted function with the same program).
    programs_from_cache_warmup=int(warmup.from_cache),
    compile_seconds_warmup=round(warmup.seconds, 3),
    compile_programs_warmup=warmup.by_name(),
    compiles_after_warmup=int(compiled.count),
    compile_seconds_after_warmup=round(compiled.seconds, 3),
    device_calls_per_class=device_calls,
    device_calls_by_program=device_calls_by_program,
    reference_images_per_s=round(FLAGS.images / ref_seconds, 3) if ref_seconds else None,
    speedup=round(ref_seconds / jax_seconds, 2) if ref_seconds else None,
    reference_equal_work_images_per_s=round(FLAGS.images / equal_seconds, 3),
    speedup_at_equal_work=round(equal_seconds / jax_seconds, 2),
    # Images through the vision tower per image: ours as run (the passes of the prompt calls
    # that hold real regions), of which real (not padding), and the rows of the compiled call
    # shapes (the skipped passes too); the reference as written and at equal work.
    tower_passes_per_image=dict(
      jax=round(rows_run / FLAGS.images, 2),
      jax_real=round(rows_real / FLAGS.images, 2),
      jax_compiled_shapes=round(rows_compiled / FLAGS.images, 2),
      reference=round(ref_rows / FLAGS.images, 2) if ref_rows is not None else None,
      reference_equal_work=round(equal_rows / FLAGS.images, 2),
    ),
    padding_rows=dict(run=int(rows_run - rows_real), skipped=int(rows_compiled - rows_run)),
    reference_text_passes_per_image=round(ref_text_rows / FLAGS.images, 2)
    if ref_text_rows is not None
    else None,
    profile=dict(
      seconds=round(profiled_seconds, 3),
      stages=stages,
      flops_source="XLA cost_analysis of the jitted functions per stage (towers included); "
      "analytic_gflop: the ViT towers counted by hand",
    ),
    matmul=machine,
    achieved=dict(
      pipeline_gflop_per_s=round(achieved, 2),
      pipeline_fraction_of_matmul=round(achieved / rate, 4),
      towers_gflop_per_s=round(tower_flops / tower_seconds / 1e9, 2) if tower_seconds else None,
      towers_fraction_of_matmul=round(tower_flops / tower_seconds / 1e9 / rate, 4)
      if tower_seconds
      else None,
      tower_share_of_flops=round(tower_flops / flops, 4) if flops else None,
      # The towers counted by hand (rows run) over the tower stages' time: the features pass
      # and the fused visual-prompt program (its rendering included in the time).
      towers_analytic_gflop=round(tower_analytic / 1e9, 3),
      towers_seconds=round(tower_seconds, 3),
      towers_analytic_gflop_per_s=_rate(tower_analytic, tower_seconds),
      towers_analytic_fraction_of_matmul=_fraction(tower_analytic, tower_seconds, rate),
      # The per-image reference at equal work, its towers timed by hooks on model.visual.
      reference_equal_work_towers_gflop=round(reference_tower_flops / 1e9, 3),
      reference_equal_work_towers_seconds=round(equal_tower_seconds, 3),
      reference_equal_work_towers_gflop_per_s=_rate(reference_tower_flops, equal_tower_seconds),
      reference_equal_work_towers_fraction_of_matmul=_fraction(
        reference_tower_flops, equal_tower_seconds, rate
      ),
      reference_equal_work_seconds=round(equal_seconds, 3),
      reference_equal_work_fraction_of_matmul=_fraction(reference_tower_flops, equal_seconds, rate),
      jax_seconds=round(jax_seconds, 3),
      jax_fraction_of_matmul=_fraction(tower_analytic, jax_seconds, rate),
    ),
    tower_isolation=isolation,
  )
  print_profile(stages, profiled_seconds)
  hidden = ("profile", "compile_programs_warmup", "device_calls_by_program")
  shown = {k: v for k, v in figures.items() if k not in hidden}
  print(json.dumps(shown, indent=1))
  if FLAGS.json:
    report.write_json(FLAGS.json, figures)


if __name__ == "__main__":
  define_flags()
  app.run(main)
