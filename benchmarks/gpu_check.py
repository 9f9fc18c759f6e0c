r"""One GPU check of the project's accelerator paths, in a few minutes, with a budget per part.

On a fresh GPU machine that has jax (CUDA), flax, optax, orbax-checkpoint, chex, absl-py, tqdm,
matplotlib, safetensors, scikit-learn, regex, pillow, opencv-python-headless, transformers, timm,
torch and torchvision but not the project's other packages, from the repository root with the
wheels of .whl/ (ml_collections, ott-jax and its jaxopt / lineax / equinox / jaxtyping /
wadler_lindig, open_clip_torch, ftfy, wcwidth, kmeans-pytorch; `pip download` them as the issue
says, 2.7 MB):

  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD && XLA_PYTHON_CLIENT_PREALLOCATE=false python3 benchmarks/gpu_check.py --json $OUT/gpu_check.json

  python benchmarks/gpu_check.py --smoke --json /tmp/gpu_check.json    # CPU, tiny sizes, ~1 min

Parts, in this order, each with a time budget (--budget_s caps them all: a part starts only
with at least 15 s of it left):
  crf          the reference mode's lattice CRF built on the device (mutual.crf): its lattice
               arrays and refined labels against the host build (numpy) on the accelerator
               itself, then milliseconds per image for a class of B images at 224 px;
  mutual       the mutual-knowledge analysis (`pipeline.analyze_class`): a random ViT-B/16
               (`init_params`), B = 50 synthetic 224-px images per class, D = 4,229 random unit
               descriptor embeddings, C = 1,000 random unit class embeddings, reference mode, CRF
               on, bf16 towers. The first class (its programs compile), then classes of new
               images until the budget: seconds per class, host seconds (the calling thread's CPU
               time) and device seconds (wall - host) per image, XLA compilations and their
               seconds (stori_jax.plumbing.profiling), the ImageNet-val projection: steady seconds per
               image x 50,000 + every compilation second seen, in minutes;
  reference    the per-image reference (`mutual.reference.analyze_class`, torch on CUDA,
               bf16 under autocast, as benchmarks/mutual_throughput.py runs it at equal work;
               SimpleCRF's CRF when it is installed) on a few images of the same class;
  train_ours   the few-shot SToRI train step at ImageNet size (100 classes x 10 CuPL-like
               prompts, 256 images, ViT-B/16; benchmarks/train_step.py's `ours_runner`
               without its agreement check): set-up, prefix cache, image features, the step
               compiled from shapes while the device computes those two, and the first step
               apart, then steps until the budget; on image features computed once
               (train_step's cached_features row). Where JAX's backend is the CPU (a full
               run without a GPU) at `CPU_TRAIN`'s size (160 prompts, 32 images), so that the
               step and the ratio are reported there too; `sizes_for_backend` says which;
  train_torch  the same step in PyTorch eager on the same GPU (`torch_runner`), on the same
               cached image features (computed once by its own image tower): equal work;
  reweight     the weighted / plain text-tower time ratio of ViT-L/14 at batch 256, fp32 and
               bf16 (benchmarks/reweight_overhead.py's `measure`);
  features     fp32 image and text features of a random ViT-B/16 on the default device against
               the same on the CPU (`jax.devices("cpu")`): max |diff| / max |cpu| per tower;
  spectral     the sweep's foreground split per model against batched across models
               (mutual.sweep's config.spectral_across_models; benchmarks/spectral_across_models.py's
               `measure`): 13 models of ViT-B/16's shape, B = 50 images x 196 patches of 768
               per class, both ways interleaved, median seconds and their ratio (last: alone
               with --parts spectral where the default budget runs out first).

Each part runs in a child process (`--part`), killed at its budget (plus 5 s); a part stops its
own loops 5 s before that and writes its figures after each step, so one that overran still
reports what it measured (status "overran"; "error" with the exception; "skipped" when the
overall budget was spent). `--smoke` runs every part at tiny sizes (the tiny-synthetic and
test-tiny configs, a few images, few descriptors) in this process (threads joined with a
timeout), on whatever device JAX has. The JSON holds the device, JAX and torch versions, the
date, the sizes, each part's figures and a summary; a table is printed at the end.

Where the time goes: every part records its XLA compilations so far (`part_compiles`: count,
seconds, and per jitted function's name), its XLA_FLAGS and autotune level; the train and
mutual parts their set-up seconds and compilations, the train part each phase's seconds and
compilations (`phases`: prefix, image, state, step_compile, wait, first_call) as the phase ends, the mutual part
the programs its first class compiles (`compile_programs_first_class`).

GEMM autotuning: the children of --gpu_autotune_parts (crf, train_ours, reweight, features) run
with --xla_gpu_autotune_level=--gpu_autotune_level, 0 by default. XLA then takes cuBLAS's and
cuDNN's heuristic kernels instead of compiling and timing candidates for every distinct GEMM
shape (the lead for the train step's compile time on the H200: seven length buckets, each with
its own forward and backward shapes), which those parts, timing a few steps within a short
budget, cannot earn back; PyTorch eager, their baseline, uses the heuristics too. The mutual
part keeps XLA's default (4): its figure is a projection over 50,000 images.
--gpu_autotune_level=-1 leaves XLA_FLAGS alone for every part; an XLA_FLAGS that sets the level
wins.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback

# The repository root, for `benchmarks.*` when run as a script.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch allocates too

import jax  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from stori_jax.plumbing import paths, profiling  # noqa: E402

#: The figures at ImageNet size, and at smoke size (CPU, about a minute).
FULL = dict(
  arch="ViT-B-16",
  images=50,
  descriptors=4229,
  classes=1000,
  steady_classes=4,
  reference_images=4,
  train_arch="ViT-B-16",
  train_classes=100,
  prompts_per_class=10,
  train_batch=256,
  train_steps=5,
  reweight_arch="ViT-L-14",
  reweight_batch=256,
  reweight_repeats=5,
  feature_images=4,
  feature_texts=8,
  crf_images=4,
  compute_dtype="bfloat16",
  spectral_models=13,
  spectral_images=50,
  spectral_shape=(14, 14, 768),
  spectral_repeats=7,
)
SMOKE = dict(
  arch="tiny-synthetic",
  images=4,
  descriptors=40,
  classes=10,
  steady_classes=1,
  reference_images=2,
  train_arch="test-tiny",
  train_classes=2,
  prompts_per_class=2,
  train_batch=4,
  train_steps=2,
  reweight_arch="test-tiny",
  reweight_batch=4,
  reweight_repeats=2,
  feature_images=2,
  feature_texts=2,
  crf_images=2,
  compute_dtype="bfloat16",
  spectral_models=3,
  spectral_images=2,
  spectral_shape=(3, 3, 16),
  spectral_repeats=2,
)
#: The train parts' sizes where the full check runs on a CPU (JAX's backend is the CPU in the
#: part's process): the ImageNet size's first step takes minutes on 2 cores (1,000 prompts
#: and 256 images never finished it inside the budgets), so a CPU run times a step at
#: benchmarks/train_step.py's default size instead and still reports a step and a ratio.
CPU_TRAIN = dict(train_classes=20, prompts_per_class=8, train_batch=32)
#: Seconds per part (GPU run; the overall --budget_s caps the sum), and at smoke size.
BUDGETS = dict(
  crf=30,
  mutual=120,
  reference=35,
  train_ours=100,
  train_torch=45,
  reweight=60,
  features=50,
  spectral=60,
)
# Smoke: about a minute on a quiet CPU; the budgets leave room for a loaded CI machine (on 2
# cores shared by other jobs the parts took 85, 37, 50, 9, 25 and 19 s).
SMOKE_BUDGETS = dict(
  crf=90,
  mutual=240,
  reference=90,
  train_ours=150,
  train_torch=60,
  reweight=60,
  features=60,
  spectral=60,
)
PARTS = tuple(BUDGETS)
#: A part starts only with this much of the overall budget left; a child is killed this long
#: after its budget; a part's own loops stop this long before it.
MIN_START_S = 15.0
GRACE_S = 5.0
IMAGENET_VAL = 50_000
#: The parts run (in child processes) with --xla_gpu_autotune_level=--gpu_autotune_level: those
#: timing a few repetitions within a short budget, where the autotuner's compile time (it
#: compiles and times candidate kernels for every distinct GEMM and convolution shape: the train
#: step's length buckets alone make dozens) cannot pay off. The mutual part keeps XLA's default:
#: its figure is a projection over 50,000 images, where tuned kernels can.
AUTOTUNE_PARTS = ("crf", "train_ours", "reweight", "features")
AUTOTUNE_FLAG = "--xla_gpu_autotune_level"


def define_flags(values: flags.FlagValues = flags.FLAGS) -> None:
  flags.DEFINE_string("json", None, "Also write the figures here.", flag_values=values)
  flags.DEFINE_bool(
    "smoke", False, "Every part at tiny sizes, in this process.", flag_values=values
  )
  flags.DEFINE_float(
    "budget_s", None, "Overall seconds (default: 360; --smoke: 810).", flag_values=values
  )
  flags.DEFINE_list("parts", list(PARTS), "Parts to run, in this order.", flag_values=values)
  flags.DEFINE_bool(
    "isolate",
    None,
    "Each part in a child process killed at its budget (default: on, off with --smoke).",
    flag_values=values,
  )
  flags.DEFINE_integer(
    "gpu_autotune_level",
    0,
    "XLA's --xla_gpu_autotune_level for the --gpu_autotune_parts (added to their child "
    "processes' XLA_FLAGS, unless XLA_FLAGS sets it already): 0 takes cuBLAS's and cuDNN's "
    "heuristic kernels without compiling and timing candidates (XLA's default, 4, also checks "
    "each candidate's results); -1 leaves XLA's default. Recorded in the JSON.",
    flag_values=values,
  )
  flags.DEFINE_list(
    "gpu_autotune_parts",
    list(AUTOTUNE_PARTS),
    "The parts --gpu_autotune_level applies to (isolated runs only).",
    flag_values=values,
  )
  flags.DEFINE_string("part", None, "Internal: run this one part here.", flag_values=values)
  flags.DEFINE_string("part_out", None, "Internal: the part's figures file.", flag_values=values)
  flags.DEFINE_float("part_budget_s", 60.0, "Internal: the part's seconds.", flag_values=values)


# ---------------------------------------------------------------------------------------------
# Parts: each fills ctx.put(...) as it goes.


class Context:
  """A part's sizes, its deadline (time.time() seconds) and its figures (written to `out` after
  each put when the part runs in a child process)."""

  def __init__(self, sizes: dict, smoke: bool, budget_s: float, out: str | None = None):
    self.sizes, self.smoke, self.out = sizes, smoke, out
    self.deadline = time.time() + budget_s - GRACE_S
    self.record: dict = {}
    self._lock = threading.Lock()
    #: The part's compilations so far (`run`), written with every put: a part killed at its
    #: budget still shows what it compiled, and for how long.
    self.compiles: profiling.Compilations | None = None

  def left(self) -> float:
    return self.deadline - time.time()

  def run(self, name: str) -> None:
    """Runs part `name`, counting its XLA compilations (any thread's) and recording the
    XLA_FLAGS it runs under."""
    self.put(
      xla_flags=os.environ.get("XLA_FLAGS", ""),
      xla_gpu_autotune_level=_autotune_level(os.environ.get("XLA_FLAGS", "")),
    )
    with profiling.compilations() as compiled:
      self.compiles = compiled
      PART_FUNCTIONS[name](self)
    self.put()

  def put(self, **figures) -> None:
    with self._lock:
      self.record.update(_jsonable(figures))
      if self.compiles is not None:
        self.record["part_compiles"] = self.compiles.as_dict(programs=True)
      if self.out:
        with paths.AtomicWrite(self.out) as f:
          f.write(json.dumps(self.record).encode("utf-8"))


def _jsonable(value):
  if isinstance(value, dict):
    return {str(k): _jsonable(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_jsonable(v) for v in value]
  if isinstance(value, (np.integer,)):
    return int(value)
  if isinstance(value, (np.floating, float)):
    return float(value) if math.isfinite(float(value)) else None
  return value


def _autotune_level(xla_flags: str) -> int | None:
  """The --xla_gpu_autotune_level XLA_FLAGS sets (the last one), or None (XLA's default, 4)."""
  level = None
  for flag in xla_flags.split():
    if flag.startswith(AUTOTUNE_FLAG + "="):
      level = int(flag.split("=", 1)[1])
  return level


def _child_xla_flags(name: str, level: int, parts) -> str:
  """The XLA_FLAGS of part `name`'s child: this process's, plus the autotune level for the
  `parts` (level -1, or XLA_FLAGS setting it already: unchanged)."""
  xla_flags = os.environ.get("XLA_FLAGS", "")
  if level < 0 or name not in parts or _autotune_level(xla_flags) is not None:
    return xla_flags
  return f"{xla_flags} {AUTOTUNE_FLAG}={level}".strip()


def _config(name: str):
  """The tiny-synthetic model's config, or an architecture's."""
  if name == "tiny-synthetic":
    import stori_jax  # pylint: disable=import-outside-toplevel

    return stori_jax.load("tiny-synthetic").config
  from stori_jax.checkpoints.open_clip_config import architecture_config  # pylint: disable=import-outside-toplevel

  return architecture_config(name)


def _device() -> str:
  device = jax.devices()[0]
  return f"{device.platform}:{device.device_kind}"


def _unit_rows(rng, count: int, dim: int) -> np.ndarray:
  """float32 [count, dim] random unit rows (normalised in float64)."""
  rows = rng.normal(size=(count, dim))
  return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def _analysis(sizes, crf: bool = True):
  from mutual.paper_config import analysis_config  # pylint: disable=import-outside-toplevel

  # As benchmarks/mutual_throughput.py passes it: k = D / 8 (at most 500), u = 50, the
  # reference's 1,000-round Sinkhorn.
  return analysis_config(
    mode="reference",
    crf=crf,
    top_k=min(500, max(3, sizes["descriptors"] // 8)),
    u=min(50, sizes["descriptors"]),
    solver="reference",
    compute_dtype=sizes["compute_dtype"],
  )


def _class_images(sizes, size: int, index: int) -> np.ndarray:
  """uint8 [B, size, size, 3]: class `index`'s synthetic images (a seed per class)."""
  from stori_jax.data import synthetic  # pylint: disable=import-outside-toplevel

  return synthetic.generate(sizes["images"], (31, 1 + index), image_size=size, max_objects=1).images


def part_mutual(ctx: Context) -> None:
  """First-visit and steady-state seconds per class, host / device split, compilations."""
  from mutual import pipeline  # pylint: disable=import-outside-toplevel
  from stori_jax.clip.bundle import CLIPBundle  # pylint: disable=import-outside-toplevel
  from stori_jax.models import init_params  # pylint: disable=import-outside-toplevel

  sizes = ctx.sizes
  config = _config(sizes["arch"])
  ctx.put(device=_device(), arch=sizes["arch"], images=sizes["images"])
  start = time.perf_counter()
  with profiling.compilations() as compiled:
    params = jax.block_until_ready(init_params(config))
  ctx.put(init_params_seconds=time.perf_counter() - start, setup_compiles=compiled.as_dict())
  bundle = CLIPBundle(config=config, params=params)
  rng = np.random.default_rng(0)
  embed = int(config.embed_dim)
  desc = _unit_rows(rng, sizes["descriptors"], embed)
  classes = _unit_rows(rng, sizes["classes"], embed)
  bank = pipeline.TextBank(
    tuple(f"d{i}" for i in range(len(desc))),
    desc,
    tuple(f"c{i}" for i in range(len(classes))),
    classes,
  )
  analysis = _analysis(sizes)
  size = int(config.vision.image_size)
  ctx.put(
    descriptors=len(desc),
    classes=len(classes),
    mode="reference",
    crf=True,
    compute_dtype=sizes["compute_dtype"],
  )

  def run_class(index):
    images = _class_images(sizes, size, index)  # outside the clocks
    with profiling.compilations() as compiled, profiling.host_clock() as clock:
      out = pipeline.analyze_class(bundle, images, bank, analysis)
      jax.block_until_ready(out["pca"]["curve"])
    return clock, compiled

  clock, compiled = run_class(0)
  first = dict(
    first_visit_seconds=clock.wall_seconds,
    first_visit_host_seconds=clock.host_seconds,
    compiles_first_class=compiled.count,
    compile_seconds_first_class=compiled.seconds,
  )
  # Which programs the first class compiles, and for how long (by jitted function's name).
  ctx.put(compile_programs_first_class=compiled.by_name())
  ctx.put(**first)
  walls, hosts, compiles, compile_seconds = [], [], 0, 0.0
  for index in range(1, 1 + sizes["steady_classes"]):
    # Another class only when one more (at the slowest seen) fits in the part's budget.
    if walls and ctx.left() < 1.2 * max(walls):
      break
    clock, compiled = run_class(index)
    walls.append(clock.wall_seconds)
    hosts.append(clock.host_seconds)
    compiles += compiled.count
    compile_seconds += compiled.seconds
    images = len(walls) * sizes["images"]
    steady = sum(walls) / images
    total_compile = first["compile_seconds_first_class"] + compile_seconds
    ctx.put(
      steady_classes=len(walls),
      steady_seconds_per_class=sum(walls) / len(walls),
      steady_seconds_per_class_each=walls,
      steady_seconds_per_image=steady,
      host_seconds_per_image=sum(hosts) / images,
      device_seconds_per_image=(sum(walls) - sum(hosts)) / images,
      device_seconds_per_image_less_compiles=max(0.0, sum(walls) - sum(hosts) - compile_seconds)
      / images,
      compiles_after_first_class=compiles,
      compile_seconds_after_first_class=compile_seconds,
      compiles=first["compiles_first_class"] + compiles,
      compile_seconds=total_compile,
      projected_imagenet_val_minutes=(steady * IMAGENET_VAL + total_compile) / 60.0,
    )


def part_reference(ctx: Context) -> None:
  """The per-image reference pipeline on the accelerator (torch on CUDA) for a few images."""
  import torch  # pylint: disable=import-outside-toplevel

  from mutual import concept_methods, paper_config, pipeline  # pylint: disable=import-outside-toplevel
  from mutual import reference as mutual_reference  # pylint: disable=import-outside-toplevel
  from stori_jax.reference import clip_towers  # pylint: disable=import-outside-toplevel

  sizes = ctx.sizes
  config = _config(sizes["arch"])
  device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
  crf = mutual_reference.have_crf()
  ctx.put(device=str(device), torch_version=torch.__version__, crf=crf, arch=sizes["arch"])
  model = clip_towers.randomize_(clip_towers.build(config, "open_clip", 0), 0)
  model = model.float().eval().to(device)
  if sizes["compute_dtype"] == "bfloat16":
    # As benchmarks/mutual_throughput.py: the towers under autocast, their outputs float32.
    for name in ("encode_image", "encode_text"):

      def in_bfloat16(*args, _encode=getattr(model, name), **kwargs):
        with torch.autocast(device.type, dtype=torch.bfloat16):
          return _encode(*args, **kwargs).float()

      setattr(model, name, in_bfloat16)
  rng = np.random.default_rng(0)
  embed = int(config.embed_dim)
  desc = _unit_rows(rng, sizes["descriptors"], embed)
  classes = _unit_rows(rng, sizes["classes"], embed)
  analysis = _analysis(sizes)
  size = int(config.vision.image_size)
  images = _class_images(sizes, size, 0)
  mean, std = _preprocess(config)
  labelers = concept_methods.reference_labelers(
    mutual_reference, pipeline.METHODS, paper_config.concept_settings(analysis)
  )

  def run(batch):
    start = time.perf_counter()
    mutual_reference.analyze_class(
      model,
      batch,
      mean,
      std,
      desc,
      classes,
      int(analysis.top_k),
      int(analysis.u),
      methods=labelers,
      crf=crf,
      joint=bool(analysis.joint_foreground),
      device=device,
    )
    if device.type == "cuda":
      torch.cuda.synchronize()
    return time.perf_counter() - start

  ctx.put(warmup_seconds=run(images[:1]))  # CUDA kernels, cuDNN plans
  count = max(1, min(sizes["reference_images"], len(images)))
  seconds = run(images[:count])
  ctx.put(images=count, seconds=seconds, seconds_per_image=seconds / count)


def _preprocess(config):
  """The CLIP normalisation (mean, std) the bundle of `config` uses."""
  from stori_jax.clip.bundle import CLIPBundle  # pylint: disable=import-outside-toplevel

  shapes = {}  # a bundle's preprocess config does not read its params
  preprocess = CLIPBundle(config=config, params=shapes).preprocess_config
  return np.asarray(preprocess.mean, np.float32), np.asarray(preprocess.std, np.float32)


def train_sizes(sizes: dict, smoke: bool, backend: str) -> dict:
  """The train parts' sizes: `sizes`, with CPU_TRAIN's on a CPU backend (not at smoke size)."""
  if smoke or backend != "cpu":
    return sizes
  return {**sizes, **CPU_TRAIN}


def _train_options(ctx: Context, with_torch: bool):
  from benchmarks import train_step  # pylint: disable=import-outside-toplevel

  sizes = train_sizes(ctx.sizes, ctx.smoke, jax.default_backend())
  ctx.put(
    sizes_for_backend={k: sizes[k] for k in ("train_arch", *CPU_TRAIN)},
    # The step reads image features computed once (train_step's cached_features row), on both
    # sides: equal work.
    image_side="cached_features",
  )
  opts = train_step.options(
    arch=sizes["train_arch"],
    num_classes=sizes["train_classes"],
    prompts_per_class=sizes["prompts_per_class"],
    batch=sizes["train_batch"],
    skip_torch=not with_torch,
    # fp32 at full precision in both frameworks (train_step sets it process-wide).
    precision="highest",
    # Eager attention: torch's SDPA kernels refuse the additive 4-D mask's backward on an H200
    # ("LSE is not correctly aligned"), and eager is the baseline the issue names.
    torch_attention="eager",
  )
  return train_step, opts


def _time_steps(ctx: Context, run, steps: int) -> None:
  times = []
  for _ in range(steps):
    if times and ctx.left() < 1.5 * max(times):
      break
    start = time.perf_counter()
    run()
    times.append(time.perf_counter() - start)
    ctx.put(steps=len(times), step_seconds=times, seconds_per_step=float(np.median(times)))


def part_train_ours(ctx: Context) -> None:
  """This implementation's few-shot train step at ImageNet size: set-up (random weights,
  prompts, images), then ours_runner's phases (prefix cache and image features dispatched, the
  state, the step compiled from shapes meanwhile, the wait for the device, the first step),
  each with its seconds and compilations as it ends (an
  H200 run once spent its 100 s before the first step finished), then the timed steps. The
  runner's agreement check (a value_and_grad program of its own) is left out: only the step
  is timed here."""
  train_step, opts = _train_options(ctx, with_torch=False)
  start = time.perf_counter()
  with profiling.compilations() as compiled:
    s = train_step.setup(opts, with_torch=False)
  ctx.put(
    device=_device(),
    arch=opts.arch,
    prompts=len(s.bank.texts),
    batch=opts.batch,
    buckets=[[b.length, b.num_prompts] for b in s.bank.buckets],
    setup_seconds=time.perf_counter() - start,
    setup_compiles=compiled.as_dict(),
  )
  phases = {}

  def on_phase(name, figures):
    phases[name] = figures
    ctx.put(phases=phases)

  ours = train_step.ours_runner(s, check=False, on_phase=on_phase)
  ctx.put(
    first_call_seconds=ours["first_call_s"],
    prefix_cache_seconds=ours["prefix_s"],
    image_features_seconds=ours["image_s"],
    first_call_compiles=ours["phases"]["first_call"]["compiles"]["count"],
  )
  with profiling.compilations() as compiled:
    _time_steps(ctx, ours["run"], ctx.sizes["train_steps"])
  ctx.put(compiles_in_timed_steps=compiled.count)


def part_train_torch(ctx: Context) -> None:
  """The same step in PyTorch eager (on CUDA when there is one)."""
  train_step, opts = _train_options(ctx, with_torch=True)
  start = time.perf_counter()
  s = train_step.setup(opts, with_torch=True)
  ctx.put(
    arch=opts.arch,
    prompts=len(s.bank.texts),
    batch=opts.batch,
    setup_seconds=time.perf_counter() - start,
  )
  reference = train_step.torch_runner(s)
  ctx.put(device=reference["device"], first_call_seconds=reference["first_call_s"])
  _time_steps(ctx, reference["run"], ctx.sizes["train_steps"])


def part_reweight(ctx: Context) -> None:
  """ViT-L/14's weighted / plain text-tower time ratio at batch 256, fp32 then bf16."""
  from benchmarks import reweight_overhead  # pylint: disable=import-outside-toplevel
  from stori_jax.models import init_params  # pylint: disable=import-outside-toplevel

  sizes = ctx.sizes
  config = _config(sizes["reweight_arch"])
  ctx.put(device=_device(), arch=sizes["reweight_arch"], batch=sizes["reweight_batch"])
  start = time.perf_counter()
  params = jax.block_until_ready(init_params(config))
  ctx.put(init_params_seconds=time.perf_counter() - start)
  for dtype in ("float32", "bfloat16"):
    if ctx.left() <= 0:
      break
    result = reweight_overhead.measure(
      config, sizes["reweight_batch"], sizes["reweight_repeats"], dtype, params=params
    )
    ctx.put(
      **{
        dtype: {
          k: result[k]
          for k in (
            "plain_prompts_per_s",
            "weighted_prompts_per_s",
            "time_ratio_weighted_over_plain",
            "compile_s",
          )
        }
      }
    )


def part_features(ctx: Context) -> None:
  """fp32 image and text features on the default device against the CPU."""
  from stori_jax.reference import parity_report  # pylint: disable=import-outside-toplevel
  from stori_jax.clip.bundle import CLIPBundle  # pylint: disable=import-outside-toplevel
  from stori_jax.models import init_params  # pylint: disable=import-outside-toplevel

  sizes = ctx.sizes
  config = _config(sizes["arch"])
  cpu = jax.devices("cpu")[0]
  ctx.put(device=_device(), reference_device=f"{cpu.platform}:{cpu.device_kind}")
  params = jax.device_get(init_params(config))
  images, _ = parity_report.random_inputs(config, sizes["feature_images"], seed=1)
  _, ids = parity_report.random_inputs(config, sizes["feature_texts"], seed=2)
  features = {}
  for name, device in (("device", jax.devices()[0]), ("cpu", cpu)):
    with jax.default_device(device):
      bundle = CLIPBundle(config=config, params=jax.device_put(params, device))
      features[name] = (
        np.asarray(bundle.encode_image(images), np.float64),
        np.asarray(bundle.encode_text(ids), np.float64),
      )
  figures = {}
  for index, tower in enumerate(("image", "text")):
    ours, cpu_features = features["device"][index], features["cpu"][index]
    scale = float(np.max(np.abs(cpu_features)))
    figures[f"{tower}_max_rel_error"] = float(np.max(np.abs(ours - cpu_features))) / scale
  ctx.put(
    arch=sizes["arch"],
    images=len(images),
    texts=len(ids),
    matmul_precision=str(jax.config.jax_default_matmul_precision),
    **figures,
  )


def part_crf(ctx: Context) -> None:
  """The reference mode's lattice CRF on the device: its lattices and labels against the host
  build (numpy, the reference the CPU tests hold to SimpleCRF) on the accelerator itself, and
  its milliseconds per image for a class of B images."""
  from mutual import crf  # pylint: disable=import-outside-toplevel

  sizes = ctx.sizes
  size = 64 if ctx.smoke else 224
  rng = np.random.default_rng(0)
  images = _class_images(dict(sizes, images=sizes["crf_images"]), size, 0)
  images = np.concatenate([images, rng.integers(0, 256, images.shape, dtype=np.uint8)])
  grid = rng.random((len(images), 8, 8)) < 0.4
  masks = np.repeat(np.repeat(grid, size // 8, axis=1), size // 8, axis=2)
  params = crf.CRFParams(5, 10.0, 40.0, 13.0, 3.0, 3.0, 0.99, 1)
  # The lattice arrays, image by image (the products fenced against fused multiply-adds).
  unequal = 0
  for image in images[:4]:
    features = crf._bilateral_features(image, params, np)  # pylint: disable=protected-access
    host = crf.build_lattice(features)
    with jax.enable_x64(True):
      device = jax.jit(crf.device_lattice)(jax.numpy.asarray(features), np.int32(0))
    unequal += sum(not np.array_equal(np.asarray(d), h) for d, h in zip(device, host))
  ctx.put(lattice_arrays_checked=3 * min(4, len(images)), lattice_arrays_unequal=unequal)
  on_device = np.asarray(crf.lattice_refine(images, masks, params))
  from_host = np.asarray(crf.lattice_refine(images, masks, params, on_device=False))
  ctx.put(
    label_images=len(images),
    label_pixels_differing=int((on_device != from_host).sum()),
    label_images_differing=int((on_device != from_host).any(axis=(1, 2)).sum()),
  )
  batch = np.concatenate([images] * -(-sizes["images"] // len(images)))[: sizes["images"]]
  batch_masks = np.concatenate([masks] * -(-sizes["images"] // len(masks)))[: sizes["images"]]
  jax.block_until_ready(crf.lattice_refine(batch, batch_masks, params))  # compiles
  start = time.perf_counter()
  jax.block_until_ready(crf.lattice_refine(batch, batch_masks, params))
  seconds = time.perf_counter() - start
  ctx.put(image_size=size, class_images=len(batch), ms_per_image=1e3 * seconds / len(batch))


def part_spectral(ctx: Context) -> None:
  """The sweep's foreground split of `spectral_models` ViT-B/16-shaped models, per model and
  batched across them, interleaved: median seconds of each and their ratio."""
  from benchmarks import spectral_across_models  # pylint: disable=import-outside-toplevel

  sizes = ctx.sizes
  shape = tuple(sizes["spectral_shape"])
  shapes = {f"model-{m:02d}": shape for m in range(sizes["spectral_models"])}
  ctx.put(device=_device())
  spectral_across_models.measure(
    shapes,
    sizes["spectral_images"],
    sizes["spectral_repeats"],
    time_left=ctx.left,
    put=ctx.put,
  )


PART_FUNCTIONS = dict(
  crf=part_crf,
  mutual=part_mutual,
  reference=part_reference,
  train_ours=part_train_ours,
  train_torch=part_train_torch,
  reweight=part_reweight,
  features=part_features,
  spectral=part_spectral,
)


# ---------------------------------------------------------------------------------------------
# Running the parts.


def _run_thread(name: str, sizes: dict, smoke: bool, budget: float) -> tuple[dict, str]:
  """The part in a thread of this process, joined at its budget (a thread that overran is left
  running: Python can't stop it)."""
  ctx = Context(sizes, smoke, budget)
  errors = []

  def target():
    try:
      ctx.run(name)
    except Exception:  # pylint: disable=broad-except
      errors.append(traceback.format_exc())

  thread = threading.Thread(target=target, name=f"gpu_check:{name}", daemon=True)
  thread.start()
  thread.join(budget + GRACE_S)
  with ctx._lock:  # pylint: disable=protected-access
    record = dict(ctx.record)
  if thread.is_alive():
    return record, "overran"
  if errors:
    record["error"] = errors[0].strip().splitlines()[-1]
    print(errors[0], file=sys.stderr)
    return record, "error"
  return record, "ok"


def _run_child(name: str, smoke: bool, budget: float, xla_flags: str) -> tuple[dict, str]:
  """The part in a child process (with these XLA_FLAGS), killed at its budget; its figures as
  far as it got."""
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "part.json")
    command = [sys.executable, os.path.abspath(__file__), f"--part={name}", f"--part_out={out}"]
    command += [f"--part_budget_s={budget}"] + (["--smoke"] if smoke else [])
    child = subprocess.Popen(command, env=dict(os.environ, XLA_FLAGS=xla_flags))
    try:
      code = child.wait(timeout=budget + GRACE_S)
      status = "ok" if code == 0 else "error"
    except subprocess.TimeoutExpired:
      child.kill()
      child.wait()
      status = "overran"
    record = {}
    if os.path.exists(out):
      with open(out, encoding="utf-8") as f:
        record = json.load(f)
  if status == "overran" and record.pop("complete", False):
    status = "ok"  # every figure was in; the child was still exiting
  record.pop("complete", None)
  if status == "error" and "error" not in record:
    record["error"] = f"exit status {code}"
  return record, status


def run_parts(
  names,
  smoke: bool,
  budget_s: float,
  isolate: bool,
  autotune_level: int = -1,
  autotune_parts=AUTOTUNE_PARTS,
) -> dict:
  """{part: figures with status, seconds, budget_s}, in order, within budget_s overall; isolated
  parts in `autotune_parts` run with --xla_gpu_autotune_level=autotune_level (unless -1)."""
  sizes = SMOKE if smoke else FULL
  budgets = SMOKE_BUDGETS if smoke else BUDGETS
  if not isolate:  # parts set these globals (train_step.setup): put back for the caller
    saved = _global_precisions()
  deadline = time.time() + budget_s
  results = {}
  for name in names:
    left = deadline - time.time()
    if left < MIN_START_S:
      results[name] = dict(status="skipped", reason="the overall budget was spent")
      continue
    budget = min(float(budgets[name]), left)
    print(f"gpu_check: {name} (budget {budget:.0f} s)", flush=True)
    start = time.time()
    if isolate:
      xla_flags = _child_xla_flags(name, autotune_level, autotune_parts)
      record, status = _run_child(name, smoke, budget, xla_flags)
    else:
      record, status = _run_thread(name, sizes, smoke, budget)
    record.update(status=status, seconds=time.time() - start, budget_s=budget)
    results[name] = _jsonable(record)
    print(f"gpu_check: {name} {status} in {record['seconds']:.1f} s", flush=True)
  if not isolate:
    _global_precisions(saved)
  return results


def _global_precisions(saved=None):
  """JAX's and torch's default fp32 matmul precisions; with `saved`, sets them back."""
  try:
    import torch  # pylint: disable=import-outside-toplevel
  except ImportError:
    torch = None
  if saved is None:
    return (
      jax.config.jax_default_matmul_precision,
      None if torch is None else torch.get_float32_matmul_precision(),
    )
  jax.config.update("jax_default_matmul_precision", saved[0])
  if torch is not None and saved[1] is not None:
    torch.set_float32_matmul_precision(saved[1])
  return saved


def summary(parts: dict) -> dict:
  """The headline figures (None where a part did not get there)."""
  mutual, ref = parts.get("mutual", {}), parts.get("reference", {})
  ours, torch_step = parts.get("train_ours", {}), parts.get("train_torch", {})
  reweight, features = parts.get("reweight", {}), parts.get("features", {})
  ours_step, torch_s = ours.get("seconds_per_step"), torch_step.get("seconds_per_step")
  jax_image, ref_image = mutual.get("steady_seconds_per_image"), ref.get("seconds_per_image")
  lattice, spectral = parts.get("crf", {}), parts.get("spectral", {})
  return dict(
    crf_lattice_arrays_unequal=lattice.get("lattice_arrays_unequal"),
    crf_label_pixels_differing=lattice.get("label_pixels_differing"),
    crf_ms_per_image=lattice.get("ms_per_image"),
    mutual_first_visit_seconds=mutual.get("first_visit_seconds"),
    mutual_steady_seconds_per_class=mutual.get("steady_seconds_per_class"),
    mutual_steady_ms_per_image=None if jax_image is None else 1e3 * jax_image,
    mutual_host_ms_per_image=_ms(mutual.get("host_seconds_per_image")),
    mutual_device_ms_per_image=_ms(mutual.get("device_seconds_per_image")),
    mutual_compiles=mutual.get("compiles"),
    mutual_compile_seconds=mutual.get("compile_seconds"),
    mutual_compiles_after_first_class=mutual.get("compiles_after_first_class"),
    mutual_compile_seconds_after_first_class=mutual.get("compile_seconds_after_first_class"),
    projected_imagenet_val_minutes=mutual.get("projected_imagenet_val_minutes"),
    reference_ms_per_image=_ms(ref_image),
    mutual_speedup_over_reference=ref_image / jax_image if ref_image and jax_image else None,
    train_step_ours_seconds=ours_step,
    train_step_ours_setup_seconds=ours.get("setup_seconds"),
    train_step_ours_first_call_seconds=ours.get("first_call_seconds"),
    train_step_ours_first_call_compiles=ours.get("first_call_compiles"),
    train_step_torch_seconds=torch_s,
    train_step_speedup_over_torch=torch_s / ours_step if ours_step and torch_s else None,
    reweight_ratio_fp32=reweight.get("float32", {}).get("time_ratio_weighted_over_plain"),
    reweight_ratio_bf16=reweight.get("bfloat16", {}).get("time_ratio_weighted_over_plain"),
    features_image_max_rel_error=features.get("image_max_rel_error"),
    features_text_max_rel_error=features.get("text_max_rel_error"),
    spectral_per_model_seconds=spectral.get("per_model_seconds"),
    spectral_batched_seconds=spectral.get("batched_seconds"),
    spectral_ratio_batched_over_per_model=spectral.get("ratio_batched_over_per_model"),
    spectral_mask_patches_differing=spectral.get("mask_patches_differing"),
  )


def _ms(seconds):
  return None if seconds is None else 1e3 * seconds


def table(result: dict) -> str:
  """The parts' status and time, then the summary, as text."""
  lines = [
    f"gpu_check on {result['device']} (jax {result['jax_version']}, torch "
    f"{result['torch_version']}), {result['date']}{' [smoke sizes]' if result['smoke'] else ''}",
    f"{'part':12s} {'status':8s} {'seconds':>8s} {'budget':>7s} {'compiles':>8s} "
    f"{'compile s':>9s} {'autotune':>8s}",
  ]
  for name, part in result["parts"].items():
    seconds = part.get("seconds")
    took = "-" if seconds is None else f"{seconds:.1f}"
    budget = part.get("budget_s")
    compiles = part.get("part_compiles", {})
    count, compile_s = compiles.get("count"), compiles.get("seconds")
    level = part.get("xla_gpu_autotune_level")
    lines.append(
      f"{name:12s} {part['status']:8s} {took:>8s} {'-' if budget is None else f'{budget:.0f}':>7s}"
      f" {'-' if count is None else count:>8} {'-' if compile_s is None else f'{compile_s:.1f}':>9}"
      f" {'xla' if level is None else level:>8}" + (f"  {part['error']}" if "error" in part else "")
    )
  lines.append("")
  for key, value in result["summary"].items():
    if isinstance(value, float):
      shown = f"{value:.3g}" if abs(value) < 1e-2 or abs(value) >= 1e4 else f"{value:.3f}"
    else:
      shown = "-" if value is None else str(value)
    lines.append(f"{key:44s} {shown:>12s}")
  return "\n".join(lines)


def _torch_version():
  try:
    import torch  # pylint: disable=import-outside-toplevel
  except ImportError:
    return None
  return torch.__version__


def main(argv, values: flags.FlagValues = flags.FLAGS):
  del argv
  smoke = bool(values.smoke)
  if values.part:  # a child: one part, its figures to --part_out
    ctx = Context(SMOKE if smoke else FULL, smoke, values.part_budget_s, values.part_out)
    try:
      ctx.run(values.part)
    except Exception as error:  # pylint: disable=broad-except
      traceback.print_exc()
      ctx.put(error=f"{type(error).__name__}: {error}")
      sys.exit(1)
    ctx.put(complete=True)
    # The figures are written: skip the runtime's teardown (seconds with a GPU client).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
  unknown = [p for p in values.parts if p not in PART_FUNCTIONS]
  if unknown:
    raise app.UsageError(f"unknown parts {unknown}; known: {', '.join(PARTS)}")
  budget_s = values.budget_s or (810.0 if smoke else 360.0)
  isolate = (not smoke) if values.isolate is None else bool(values.isolate)
  unknown = [p for p in values.gpu_autotune_parts if p not in PART_FUNCTIONS]
  if unknown:
    raise app.UsageError(f"unknown --gpu_autotune_parts {unknown}; known: {', '.join(PARTS)}")
  start = time.time()
  parts = run_parts(
    values.parts,
    smoke,
    budget_s,
    isolate,
    values.gpu_autotune_level,
    tuple(values.gpu_autotune_parts),
  )
  devices = [p["device"] for p in parts.values() if str(p.get("device", "")).count(":")]
  result = dict(
    device=devices[0] if devices else None,
    jax_version=jax.__version__,
    torch_version=_torch_version(),
    date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    smoke=smoke,
    isolated=isolate,
    budget_s=budget_s,
    # What the parts ran under: the autotune setting asked for (applied to isolated parts;
    # each part records its own XLA_FLAGS and level as xla_flags, xla_gpu_autotune_level).
    gpu_autotune_level=values.gpu_autotune_level,
    gpu_autotune_parts=list(values.gpu_autotune_parts) if isolate else [],
    total_seconds=time.time() - start,
    sizes=SMOKE if smoke else FULL,
    summary=summary(parts),
    parts=parts,
  )
  result = _jsonable(result)
  print(table(result), flush=True)
  if values.json:
    os.makedirs(os.path.dirname(os.path.abspath(values.json)), exist_ok=True)
    with open(values.json, "w", encoding="utf-8") as f:
      json.dump(result, f, indent=1)


if __name__ == "__main__":
  define_flags()
  app.run(main)
