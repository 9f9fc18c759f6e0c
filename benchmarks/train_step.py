r"""Seconds per SToRI training step at the paper's setting: this implementation vs PyTorch eager.

  python benchmarks/train_step.py      # ViT-B-16, 160 prompts, 32 images: a few minutes, 2 cores
  python benchmarks/train_step.py --json F --naive      # also the naive JAX step
  python benchmarks/train_step.py --num_classes 100 --prompts_per_class 10 --batch 256 \
      --repeats 10 --cupl_path ../shared/data/cupl/imagenet_prompts_base.json   # GPU, real size
  python benchmarks/train_step.py --memory \
      --cupl_path ../shared/data/cupl/imagenet_prompts_base.json   # 10,000-prompt ViT-L/14 step

(--memory sets XLA_FLAGS=--xla_force_host_platform_device_count=8 itself unless XLA_FLAGS
already names a device count.)

One training step = forward and backward over every weighted prompt, the cross-entropy on a
batch of images, and an Adam update of the per-token log-weights. Two rows, each timed for every
implementation on the same weights, prompts, images and labels, at equal work:

* fresh_views, the paper configs' setting (`config.views = 0`): every step draws a new view of
  each image (RandomResizedCrop at scale (0.08, 1), bicubic, a flip with p = 0.5) from the
  images themselves (random uint8 images of 224-448 px, on the trainer's canvas) and runs the
  frozen image tower on the views, inside the step;
* cached_features, the `config.views = N` approximation: the image features are computed once,
  outside the timed step, and every implementation's step reads them.

Implementations:

1. ours: `WeightedTextClassifier` (prefix cache up to the start block, causal truncation to
   length buckets, EOT-only last block, chunked `jax.checkpoint`, prompts sharded over the
   devices) with the trainer's `make_train_step`; for fresh views with the trainer's own
   `fresh_view_encoder` (`augment.device_views` and the image tower in config.image_dtype,
   compiled into the step), as `trainer.train_method` builds it.
2. PyTorch eager: transformers' `CLIPModel` with the same weights, its text layers called one by
   one with an additive 4-D mask (causal + log w from the start block on, i.e.
   softmax(q k^T / sqrt(d) + mask + log w)), torch.optim.Adam on log-weights [P, 77]; for fresh
   views torchvision's RandomResizedCrop box and bicubic antialiased resize of each uint8 image
   and its flip, then the image tower under torch.no_grad().
3. naive JAX (--naive): every prompt at full context (77 tokens), every text block recomputed
   each step, no chunking; the same image side as ours; jitted, same loss and optimizer.

The class embedding of class c is the normalised mean of the normalised features of its prompts
(no fixed Base prompts here); the loss is the mean cross-entropy of logit_scale * image . class
on normalised image features; Adam with a cosine schedule (optax.adam + cosine_decay_schedule;
torch Adam + CosineAnnealingLR). Before timing, the losses, class embeddings and log-weight
gradients are compared at the same random log-weights on the cached features (the fresh views'
crops are random, so their losses differ by design; `augment.device_views` is checked against
torchvision's transform in tests/test_fewshot_data.py).

Timed rounds alternate: one step of every row's every implementation per round (ours, torch,
..., then the next row), and one fp32 [--matmul]^2 product in JAX and in PyTorch
(benchmarks/machine_rate.py), so drifts in machine load hit all of them. Figures are medians
of rounds; ratios are medians of per-round ratios. Per row and implementation the JSON holds
seconds per step, FLOPs per step counted from the shapes (`expected_flops`: the text blocks'
matmuls, forward, recomputed forward and backward as each runs them; the image tower's forward;
ours' resampling products), XLA's own count (`cost_analysis()` of the compiled step: lax.map
and loop bodies are counted once, so a bucket of several chunks is undercounted), and the
fraction of the machine's measured matmul rate (the faster framework's product, per round).

Prompts: CuPL-like synthetic sentences (the synthetic world's, varied to the requested
count), or the first classes of a real CuPL file with --cupl_path (never copied here).
Weights are random (transformers' init plus noise); speed does not depend on them.

On a GPU, JAX is told not to preallocate GPU memory (so PyTorch can allocate too),
and fp32 matmuls run at full precision in both frameworks (--precision=highest; pass
--precision=default to allow TF32 in both). The naive and PyTorch steps hold every
prompt's activations at 77 tokens at once: on one 80 GB GPU keep prompts to ~1,000
for a ViT-B text tower (the full ImageNet 10,000-prompt step only fits chunked).

--memory compiles (never runs) our train step for a large run (default: 10,000
CuPL-length prompts, a ViT-L/14-size text tower, prompts sharded over 8 devices) from
abstract shapes and prints XLA's memory analysis per device.
"""

from __future__ import annotations

import os
import sys


def _prepare_environment():
  """Before JAX starts: no GPU preallocation; --memory fakes 8 CPU devices unless told."""
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  if not any(a in ("--memory", "--memory=true", "--memory=True") for a in sys.argv[1:]):
    return
  count = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--memory_devices=")), "8")
  xla_flags = os.environ.get("XLA_FLAGS", "")
  if "xla_force_host_platform_device_count" not in xla_flags:
    os.environ["XLA_FLAGS"] = f"{xla_flags} --xla_force_host_platform_device_count={count}".strip()


_prepare_environment()

# The repository root, for `benchmarks.*` when run as a script (which puts only benchmarks/ there).
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

import contextlib
import dataclasses
import json
import time
import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import app, flags
from jax.sharding import NamedSharding, PartitionSpec

from benchmarks.machine_rate import MatmulRate, machine_gflop_per_s
from stori_jax.plumbing import profiling
from stori_jax.clip.bundle import CLIPBundle
from stori_jax.clip.encoding import l2_normalize, l2_normalize_jax
from stori_jax.fewshot import augment
from stori_jax.fewshot import prompts as prompt_lib
from stori_jax.fewshot.prompt_bank import build_prompt_bank
from stori_jax.fewshot.text_classifier import (
  AXIS,
  WeightedTextClassifier,
  cross_entropy_loss,
  prompt_mesh,
)
from stori_jax.fewshot.trainer import (
  fresh_view_encoder,
  init_train_state,
  make_train_step,
  stori_method,
)
from stori_jax.models import (
  CLIP,
  get_architecture,
  init_params,
  param_shapes,
  reweighted_block_indices,
)
from stori_jax.tokenizer import default_tokenizer


def define_flags(values: flags.FlagValues = flags.FLAGS) -> None:
  """The command's flags (on `values`: callers that import this module define none)."""
  flags.DEFINE_string(
    "arch", "ViT-B-16", "Architecture (both towers; the text tower is trained).", flag_values=values
  )
  flags.DEFINE_integer("num_classes", 20, "Classes.", flag_values=values)
  flags.DEFINE_integer("prompts_per_class", 8, "Weighted prompts per class.", flag_values=values)
  flags.DEFINE_integer("batch", 32, "Images per step.", flag_values=values)
  flags.DEFINE_integer(
    "repeats", 5, "Timed rounds (one step of each implementation per round).", flag_values=values
  )
  flags.DEFINE_list(
    "rows",
    list(ROWS),
    "The rows timed: fresh_views (the paper configs' views = 0: crop, flip and image tower in "
    "the step) and cached_features (the image features computed once, outside the step).",
    flag_values=values,
  )
  flags.DEFINE_bool(
    "naive", False, "Also time the naive JAX step (77 tokens, every block).", flag_values=values
  )
  flags.DEFINE_bool(
    "one_pass",
    False,
    "Fresh views: also time ours with the image tower on the whole batch in one pass "
    "(ours_one_pass; ours takes the trainer's views per pass, `fresh_view_passes`).",
    flag_values=values,
  )
  flags.DEFINE_enum(
    "image_dtype",
    "float32",
    ["float32", "bfloat16"],
    "Fresh views: our image tower's compute dtype (config.image_dtype; PyTorch's stays fp32).",
    flag_values=values,
  )
  flags.DEFINE_integer(
    "matmul",
    4096,
    "Side of the square fp32 product timed in each round for the machine's rate (0: none).",
    flag_values=values,
  )
  flags.DEFINE_integer(
    "start_block", None, "First reweighted block (1-indexed); default: half.", flag_values=values
  )
  flags.DEFINE_integer(
    "chunk", 64, "Prompts per device per encoder call (ours).", flag_values=values
  )
  flags.DEFINE_float("lr", 1e-2, "Adam learning rate (paper, ImageNet).", flag_values=values)
  flags.DEFINE_enum(
    "prompt_source",
    "synthetic",
    ["synthetic", "cupl"],
    "Prompt text; cupl needs --cupl_path.",
    flag_values=values,
  )
  flags.DEFINE_string(
    "cupl_path", None, "A CuPL prompt JSON; implies --prompt_source=cupl.", flag_values=values
  )
  flags.DEFINE_bool("skip_torch", False, "Leave out the PyTorch reference.", flag_values=values)
  flags.DEFINE_enum(
    "torch_attention",
    "sdpa",
    ["sdpa", "eager"],
    "transformers attention implementation.",
    flag_values=values,
  )
  flags.DEFINE_enum(
    "precision",
    "highest",
    ["highest", "default"],
    "fp32 matmul precision (both frameworks).",
    flag_values=values,
  )
  flags.DEFINE_integer(
    "seed", 0, "Seed of weights, log-weights, images and labels.", flag_values=values
  )
  flags.DEFINE_string("json", None, "Also write the figures here.", flag_values=values)
  flags.DEFINE_bool(
    "memory", False, "Report the compiled memory of a large train step instead.", flag_values=values
  )
  flags.DEFINE_integer("memory_prompts", 10_000, "--memory: weighted prompts.", flag_values=values)
  flags.DEFINE_integer("memory_classes", 1000, "--memory: classes.", flag_values=values)
  flags.DEFINE_string(
    "memory_arch", "ViT-L-14", "--memory: architecture of the text tower.", flag_values=values
  )
  flags.DEFINE_integer(
    "memory_devices", 8, "--memory: devices the prompts are sharded over.", flag_values=values
  )
  flags.DEFINE_integer("memory_batch", 256, "--memory: images per step.", flag_values=values)
  flags.DEFINE_bool(
    "setup_only",
    False,
    "Time only our set-up and first step, phase by phase (programs, compile seconds), then one "
    "more step; no naive or PyTorch step.",
    flag_values=values,
  )
  flags.DEFINE_bool(
    "compile_ahead",
    True,
    "Ours: compile the train step from shapes while the device computes the prefix cache and "
    "image features (ours_runner); false: each set-up phase blocks, the first call compiles.",
    flag_values=values,
  )
  flags.DEFINE_string(
    "compilation_cache",
    "",
    "A folder for JAX's persistent compilation cache (a second run reads its programs there); "
    "empty: off, so that compile times are measured.",
    flag_values=values,
  )


def options(**overrides) -> types.SimpleNamespace:
  """The flags' defaults as attributes, with `overrides` (for callers that import this module:
  benchmarks/gpu_check.py)."""
  values = flags.FlagValues()
  define_flags(values)
  defaults = {name: values[name].default for name in values}
  unknown = set(overrides) - set(defaults)
  if unknown:
    raise ValueError(f"unknown train_step options: {sorted(unknown)}")
  return types.SimpleNamespace(**{**defaults, **overrides})


CONTEXT = 77
#: The timed rows: the paper configs' fresh view per step, and features cached once.
ROWS = ("fresh_views", "cached_features")

# Prompts -----------------------------------------------------------------------------------

_ADJECTIVES = ("small", "large", "bright", "pale", "old", "shiny", "dark", "soft", "tiny", "wide")


def synthetic_texts(num_classes: int, per_class: int) -> dict[str, list[str]]:
  """CuPL-like sentences: the synthetic world's, with class names varied to reach the count.

  Class c reuses the sentences of synthetic class c mod 12 with its name prefixed by
  adjectives (c // 12 picks them); prompt j >= the class's sentence count adds one more.
  """
  synthetic = prompt_lib.synthetic_prompts()
  names = list(synthetic)
  out = {}
  for c in range(num_classes):
    base = names[c % len(names)]
    variant = c // len(names)
    words = []
    while variant:
      variant, digit = divmod(variant - 1, len(_ADJECTIVES))
      words.append(_ADJECTIVES[digit])
    name = " ".join(words + [base])
    sentences = synthetic[base]
    texts = []
    for j in range(per_class):
      extra, index = divmod(j, len(sentences))
      label = name if not extra else f"{_ADJECTIVES[(extra - 1) % len(_ADJECTIVES)]} {name}"
      texts.append(sentences[index].replace(base, label))
    out[name] = texts
  return out


def cupl_texts(path: str, num_classes: int, per_class: int) -> dict[str, list[str]]:
  """The first num_classes classes of a CuPL file, per_class sentences each (cycled).

  Past the file's classes (ImageNet's has 998 keys: CLIP's list repeats two names), classes
  repeat with a numbered name and the same sentences.
  """
  with open(path, encoding="utf-8") as f:
    data = json.load(f)
  keys = [n for n in data if data[n]]
  out = {}
  for c in range(num_classes):
    repeat, key = divmod(c, len(keys))
    sentences = data[keys[key]]
    out[keys[key] + (f" ({repeat})" if repeat else "")] = [
      sentences[j % len(sentences)] for j in range(per_class)
    ]
  return out


def prompt_texts(opts, num_classes: int, per_class: int) -> tuple[dict[str, list[str]], str]:
  if opts.cupl_path or opts.prompt_source == "cupl":
    if not opts.cupl_path:
      raise SystemExit("--prompt_source=cupl needs --cupl_path=FILE.json (a CuPL prompt file).")
    return cupl_texts(opts.cupl_path, num_classes, per_class), f"CuPL {opts.cupl_path}"
  return synthetic_texts(num_classes, per_class), "synthetic CuPL-like"


def length_stats(tokenizer, bank) -> dict[str, float]:
  ids = tokenizer(list(bank.texts), context_length=CONTEXT, truncate=True)
  lengths = np.argmax(ids == tokenizer.eot_token_id, axis=1) + 1
  rows = sum(b.num_prompts for b in bank.buckets)
  return {
    "median_tokens": float(np.median(lengths)),
    "p99_tokens": float(np.percentile(lengths, 99)),
    "max_tokens": int(lengths.max()),
    "mean_bucket_tokens": float(sum(b.num_prompts * b.length for b in bank.buckets) / rows),
    "buckets": [[b.length, b.num_prompts] for b in bank.buckets],
  }


# Layout between our buckets and the naive [P, 77] rows (bank text order) -------------------


def full_layout(tokenizer, bank):
  """ids int32 [P, 77], trainable bool [P, 77] (the words: 1..EOT-1), class int32 [P]."""
  ids = tokenizer(list(bank.texts), context_length=CONTEXT, truncate=True).astype(np.int32)
  eot = np.argmax(ids == tokenizer.eot_token_id, axis=1)
  positions = np.arange(CONTEXT)[None]
  trainable = (positions >= 1) & (positions < eot[:, None])
  return ids, trainable, np.asarray(bank.text_class, np.int32)


def to_buckets(bank, full: np.ndarray) -> list[np.ndarray]:
  out = []
  for b in bank.buckets:
    part = np.zeros(b.ids.shape, np.float32)
    valid = b.prompt_index >= 0
    part[valid] = full[b.prompt_index[valid], : b.length]
    out.append(part)
  return out


def from_buckets(bank, parts) -> np.ndarray:
  full = np.zeros((len(bank.texts), CONTEXT), np.float32)
  for b, part in zip(bank.buckets, parts):
    valid = b.prompt_index >= 0
    full[b.prompt_index[valid], : b.length] = np.asarray(part)[valid]
  return full


def _schedule(lr: float, total_steps: int):
  return optax.cosine_decay_schedule(lr, total_steps)


# Naive JAX ---------------------------------------------------------------------------------


def make_naive_step(
  model: CLIP, blocks, num_classes: int, logit_scale: float, optimizer, encode=None
):
  """Full 77-token prompts, all blocks; returns grads for checks. The step's `features`: unit
  image features [B, E] (cached), or with `encode` the fresh-view inputs it encodes with the
  step's last argument (as make_train_step's)."""

  def loss_fn(log_w, params, ids, trainable, text_class, image, labels):
    log_w = jnp.where(trainable, log_w, 0.0)
    text = model.apply({"params": params}, ids, log_w, blocks, method=CLIP.encode_text)
    text = l2_normalize_jax(text)
    sums = jax.ops.segment_sum(text, text_class, num_segments=num_classes)
    counts = jax.ops.segment_sum(jnp.ones(len(ids)), text_class, num_segments=num_classes)
    embeddings = l2_normalize_jax(sums / counts[:, None])
    loss, _ = cross_entropy_loss(embeddings, image, labels, logit_scale)
    return loss, embeddings

  @jax.jit
  def step(state, params, ids, trainable, text_class, features, labels, encoder=None):
    if encode is not None:
      features = jax.lax.stop_gradient(encode(encoder, features))
    (loss, embeddings), grads = jax.value_and_grad(loss_fn, has_aux=True)(
      state["params"], params, ids, trainable, text_class, features, labels
    )
    updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
    new = {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state}
    return new, {"loss": loss, "embeddings": embeddings, "grads": grads}

  return step


# PyTorch eager -----------------------------------------------------------------------------


class TorchReference:
  """transformers CLIPModel, text layers called one by one with log w in the additive mask.

  canvas None: the image features of `pixels_nhwc` (float32 [B, S, S, 3], normalised) are
  computed once, by this model's image tower, and every step reads them (cached_features);
  an `augment.ImageCanvas`: every step draws a view of each of its images as torchvision's
  RandomResizedCrop(S, scale, bicubic, antialiased) and a flip with p = 0.5 do, normalises it
  with (mean, std) and runs the image tower on the views under torch.no_grad() (fresh_views).
  """

  def __init__(
    self,
    model,
    ids,
    trainable,
    text_class,
    pixels_nhwc,
    labels,
    num_classes,
    first,
    canvas: augment.ImageCanvas | None = None,
    preprocess=None,
    scale=augment.CROP_SCALE,
  ):
    import torch  # pylint: disable=import-outside-toplevel

    self.torch = torch
    self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    self.model = model.to(self.device).eval()
    for p in self.model.parameters():
      p.requires_grad_(False)
    to = lambda a, dtype=None: torch.from_numpy(np.ascontiguousarray(a)).to(self.device, dtype)
    self.ids = to(ids, torch.int64)
    eot = model.config.text_config.eos_token_id
    self.eot = to(np.argmax(ids == eot, axis=1), torch.int64)
    self.trainable = to(trainable)
    self.text_class = to(text_class, torch.int64)
    self.counts = torch.bincount(self.text_class, minlength=num_classes).float()
    self.labels = to(labels, torch.int64)
    self.num_classes, self.first = num_classes, first
    self.size = pixels_nhwc.shape[1]
    if canvas is None:
      with torch.no_grad():
        self.cached = self.encode_images(to(pixels_nhwc.transpose(0, 3, 1, 2)))
    else:
      self.cached = None
      # Each image alone (uint8 [3, h, w]), as a data loader holds them.
      self.images = [
        to(pixels[:h, :w].transpose(2, 0, 1)) for pixels, (h, w) in zip(canvas.pixels, canvas.sizes)
      ]
      self.mean = to(np.asarray(preprocess.mean, np.float32).reshape(1, 3, 1, 1))
      self.std = to(np.asarray(preprocess.std, np.float32).reshape(1, 3, 1, 1))
      self.scale = tuple(scale)
    length = ids.shape[1]
    causal = torch.full((length, length), torch.finfo(torch.float32).min, device=self.device)
    self.causal = causal.triu(1)[None, None]  # [1, 1, L, L]
    self.logit_scale = float(self.model.logit_scale.exp())
    self.log_weights = torch.zeros(ids.shape, device=self.device, requires_grad=True)

  def make_optimizer(self, total_steps: int, lr: float):
    torch = self.torch
    self.optimizer = torch.optim.Adam([self.log_weights], lr=lr)
    self.scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(self.optimizer, total_steps)

  def encode_images(self, pixels):
    """Unit image features [B, E] of normalised pixels [B, 3, S, S]."""
    vision = self.model.vision_model(pixel_values=pixels).pooler_output
    return self.torch.nn.functional.normalize(self.model.visual_projection(vision), dim=-1)

  def fresh_views(self):
    """One augmented view of every image: float32 [B, 3, S, S], normalised."""
    # pylint: disable=import-outside-toplevel
    from torchvision.transforms import InterpolationMode, RandomResizedCrop
    from torchvision.transforms import functional as tf

    views = []
    for image in self.images:
      top, left, height, width = RandomResizedCrop.get_params(image, self.scale, augment.CROP_RATIO)
      view = tf.resized_crop(
        image,
        top,
        left,
        height,
        width,
        [self.size, self.size],
        InterpolationMode.BICUBIC,
        antialias=True,
      )
      if self.torch.rand(1).item() < 0.5:
        view = tf.hflip(view)
      views.append(view)
    return (self.torch.stack(views).float() / 255.0 - self.mean) / self.std

  def image_features(self):
    if self.cached is not None:
      return self.cached
    with self.torch.no_grad():
      return self.encode_images(self.fresh_views())

  def class_embeddings(self):
    torch, text = self.torch, self.model.text_model
    log_w = torch.where(self.trainable, self.log_weights, 0.0)
    weighted = self.causal + log_w[:, None, None, :]  # [P, 1, L, L]
    hidden = text.embeddings(input_ids=self.ids)
    for index, layer in enumerate(text.encoder.layers):
      hidden = layer(hidden, weighted if index >= self.first else self.causal)
    hidden = text.final_layer_norm(hidden)
    pooled = hidden[torch.arange(hidden.shape[0], device=self.device), self.eot]
    features = torch.nn.functional.normalize(self.model.text_projection(pooled), dim=-1)
    sums = torch.zeros(self.num_classes, features.shape[1], device=self.device)
    sums = sums.index_add(0, self.text_class, features)
    return torch.nn.functional.normalize(sums / self.counts[:, None], dim=-1)

  def step(self, details: bool = False):
    torch = self.torch
    self.optimizer.zero_grad(set_to_none=True)
    image = self.image_features()
    embeddings = self.class_embeddings()
    logits = self.logit_scale * image @ embeddings.T
    loss = torch.nn.functional.cross_entropy(logits, self.labels)
    loss.backward()
    out = None
    if details:
      out = {
        "loss": loss.item(),
        "embeddings": embeddings.detach().cpu().numpy(),
        "grads": self.log_weights.grad.detach().cpu().numpy().copy(),
      }
    self.optimizer.step()
    self.scheduler.step()
    self.sync()
    return out if details else loss

  def sync(self):
    if self.device.type == "cuda":
      self.torch.cuda.synchronize()


def build_weights(config, seed: int, with_torch: bool, attention: str = "sdpa"):
  """(params, torch model or None): the same random weights in both frameworks."""
  if not with_torch:
    return jax.device_get(init_params(config, seed)), None
  from stori_jax.reference import clip_towers  # pylint: disable=import-outside-toplevel
  from stori_jax.checkpoints import hf  # pylint: disable=import-outside-toplevel

  clip_towers._torch().manual_seed(seed)  # pylint: disable=protected-access
  model = clip_towers.randomize_(clip_towers.build_transformers(config), seed)
  model.set_attn_implementation(attention)
  state_dict = clip_towers.state_dict_numpy(model)
  return hf.params_from_state_dict(state_dict, config, "random transformers"), model


# The benchmark -----------------------------------------------------------------------------


def _block_flops(rows: int, length: int, width: int, mlp: int, queries: int | None = None):
  """Matmul FLOPs of one transformer block's forward over rows sequences of `length` tokens.

  queries: query rows per sequence (the EOT-only last block: 1); keys/values use all tokens.
  """
  q = length if queries is None else queries
  keys_values = rows * length * 4 * width * width
  rest = rows * q * (4 * width * width + 4 * width * mlp)  # query, out, MLP
  attention = rows * q * length * 4 * width  # q k^T and p v
  return keys_values + rest + attention


def expected_flops(
  config, bank, blocks, num_prompts: int, batch: int, canvas_shape=None
) -> dict[str, float]:
  """Matmul FLOPs per step (2 per multiply-add), by part. No parameter gradients are taken, so
  a block's backward costs about its forward; ours runs each reweighted block forward twice
  (jax.checkpoint).

  ours: our text side (bucketed prompts from the start block, EOT-only last block), forward,
  recomputed forward and backward; naive_text: every prompt at 77 tokens through every block
  forward, the reweighted ones backward too (the naive JAX and PyTorch text sides); image: the
  image tower's forward on `batch` views (patch embedding, blocks, projection); augment: ours'
  fresh-view resampling of a canvas of `canvas_shape` (B, H, W, 3), two dense products per
  image (across, then down; 0 without a canvas). naive: naive_text + image (the old key)."""
  t, v = config.text, config.vision
  ours = 0.0
  for b in bank.buckets:
    ours += sum(_block_flops(b.num_prompts, b.length, t.width, t.mlp_width) for _ in blocks[:-1])
    ours += _block_flops(b.num_prompts, b.length, t.width, t.mlp_width, queries=1)
  ours *= 3  # forward, recomputed forward, backward
  full = _block_flops(num_prompts, CONTEXT, t.width, t.mlp_width)
  naive_text = full * (t.layers + len(blocks))
  patches = batch * v.grid_size**2 * 2 * 3 * v.patch_size**2 * v.width
  image = patches + v.layers * _block_flops(batch, v.num_tokens, v.width, v.mlp_width)
  image += batch * 2 * v.width * config.embed_dim
  augment_flops = 0.0
  if canvas_shape is not None:
    count, height, width = canvas_shape[:3]
    size = v.image_size
    augment_flops = count * 2.0 * 3 * (size * width * height + size * size * height)
  return {
    "ours": ours,
    "naive_text": naive_text,
    "naive_image": image,
    "image": image,
    "augment": augment_flops,
    "naive": naive_text + image,
  }


def step_flops(flops: dict, row: str, implementation: str) -> dict[str, float]:
  """{part: FLOPs} of one implementation's step in one row (`expected_flops`' parts)."""
  ours = implementation.startswith("ours")
  parts = {"text": flops["ours"] if ours else flops["naive_text"]}
  if row == "fresh_views":
    parts["image_tower"] = flops["image"]
    if implementation != "torch":  # torchvision's resize is a few taps per pixel: not counted
      parts["augment"] = flops["augment"]
  return parts


def xla_flops(compiled) -> float | None:
  """FLOPs of a compiled program by XLA's cost analysis (None where the backend gives none)."""
  try:
    analysis = compiled.cost_analysis()
  except Exception:  # pylint: disable=broad-except
    return None
  if isinstance(analysis, (list, tuple)):
    analysis = analysis[0] if analysis else None
  flops = None if analysis is None else analysis.get("flops")
  return None if flops is None or flops < 0 else float(flops)


def _errors(ours, other) -> dict[str, float]:
  ours, other = np.asarray(ours, np.float64), np.asarray(other, np.float64)
  diff = float(np.max(np.abs(ours - other)))
  scale = float(np.max(np.abs(ours)))
  return {"max_abs": diff, "max_rel": diff / scale if scale else diff}


def _timed(fn) -> float:
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


@dataclasses.dataclass
class Setup:
  """One step's shared inputs: weights, prompts (bucketed and at full context), images, labels.

  pixels: float32 [batch, S, S, 3] normalised images; labels: int32 [batch]; ids int32
  [P, 77], trainable bool [P, 77], text_class int32 [P] (full_layout); check_full: float32
  [P, 77] random log-weights on the words (the agreement check's point); canvas: the batch's
  images for fresh views (`augment.ImageCanvas`: uint8, 224 to 448 px a side, on a canvas of
  twice the model's input side, as `trainer.encode_split` holds a run's)."""

  opts: types.SimpleNamespace
  config: object
  bank: object
  stats: dict
  source: str
  mesh: object
  params: dict
  torch_model: object
  bundle: CLIPBundle
  pixels: np.ndarray
  labels: np.ndarray
  ids: np.ndarray
  trainable: np.ndarray
  text_class: np.ndarray
  check_full: np.ndarray
  blocks: tuple
  canvas: augment.ImageCanvas
  total_steps: int = 1000


def setup(opts, with_torch: bool) -> Setup:
  """The prompts, weights (the torch model too when with_torch), images and labels of a run.
  Sets the fp32 matmul precision of both frameworks (opts.precision)."""
  if opts.precision == "highest":
    jax.config.update("jax_default_matmul_precision", "highest")
  config = get_architecture(opts.arch)
  if with_torch:
    import torch  # pylint: disable=import-outside-toplevel

    torch.set_float32_matmul_precision("highest" if opts.precision == "highest" else "high")
  rng = np.random.default_rng(opts.seed)
  tokenizer = default_tokenizer()
  texts, source = prompt_texts(opts, opts.num_classes, opts.prompts_per_class)
  mesh = prompt_mesh()
  bank = build_prompt_bank(
    tokenizer, list(texts), texts, None, CONTEXT, chunk=opts.chunk, num_shards=mesh.size
  )
  params, torch_model = build_weights(config, opts.seed, with_torch, opts.torch_attention)
  size = config.vision.image_size
  pixels = rng.standard_normal((opts.batch, size, size, 3), dtype=np.float32)
  labels = rng.integers(0, opts.num_classes, opts.batch).astype(np.int32)
  ids, trainable, text_class = full_layout(tokenizer, bank)
  sides = rng.integers(size, augment.CANVAS_SIDE * size + 1, (opts.batch, 2))
  canvas = augment.image_canvas(
    [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sides],
    augment.CANVAS_SIDE * size,
  )
  # The check point: random log-weights on the words (w in [0.6, 1.6]).
  check_full = np.where(trainable, rng.uniform(-0.5, 0.5, ids.shape), 0.0).astype(np.float32)
  return Setup(
    opts=opts,
    config=config,
    bank=bank,
    stats=length_stats(tokenizer, bank),
    source=source,
    mesh=mesh,
    params=params,
    torch_model=torch_model,
    bundle=CLIPBundle(config=config, params=params),
    pixels=pixels,
    labels=labels,
    ids=ids,
    trainable=trainable,
    text_class=text_class,
    check_full=check_full,
    blocks=tuple(reweighted_block_indices(config.text, opts.start_block)),
    canvas=canvas,
  )


def fresh_config(opts) -> ml_collections.ConfigDict:
  """The config keys `trainer.fresh_view_encoder` reads, as the paper configs set them."""
  return ml_collections.ConfigDict(
    {
      "seed": opts.seed,
      "augment_scale": augment.CROP_SCALE,
      "image_dtype": getattr(opts, "image_dtype", "float32"),
    }
  )


def ours_runner(
  s: Setup,
  check: bool = True,
  on_phase=None,
  compile_ahead: bool = True,
  fresh: bool = False,
  per_pass="device",
) -> dict:
  """This implementation's step, ready to run: run() takes one step (blocked on) and returns its
  metrics; first_call_s (the first step), prefix_s and image_s (the one-time prefix cache and
  image stage, both with their compilation), the step-0 loss; xla_flops (the compiled step's
  cost analysis, with `compile_ahead`); with `check`, check_loss, embeddings float32 [C, E] and
  grads float32 [P, 77] at the check point on the cached features (a value_and_grad program of
  its own, compiled before the first step: leave it out where only the step is timed); phases:
  {phase: {"seconds", "compiles": profiling.Compilations.as_dict(programs=True)}} for prefix,
  image, state, step_compile and wait (with `compile_ahead`), check (with `check`) and
  first_call, each also passed to on_phase(name, figures) as it ends (a caller that may be
  stopped keeps what it got).

  fresh: the paper configs' step (config.views = 0), built as `trainer.train_method` builds it:
  `trainer.fresh_view_encoder` draws a view of each of s.canvas's images on the device and runs
  the image tower inside the step; the image phase places the images (and makes the encoder)
  instead of computing features, and each run() is the next step (its views seeded by it).
  Otherwise the image features of s.pixels are computed once (the image phase) and every step
  reads them; features (float32 [B, E], unit rows, on the host) is returned then. per_pass:
  fresh_view_encoder's views per image-tower pass ("device": the trainer's rule).

  compile_ahead: the set-up that does not depend on the weights' values runs while the device
  computes what does. The prefix cache and the image features are dispatched (JAX runs them
  asynchronously) and the train step is compiled from the arguments' shapes and shardings
  meanwhile (`step_compile`: `.lower(...).compile()`, whose program the first call reuses); the
  `wait` phase is the device time left after that. Without it each phase blocks on its result
  and the first call compiles the step (the set-up as it was)."""
  bundle, bank, opts = s.bundle, s.bank, s.opts
  phases = {}

  @contextlib.contextmanager
  def phase(name):
    start = time.perf_counter()
    with profiling.compilations() as compiled:
      yield
    phases[name] = dict(
      seconds=time.perf_counter() - start, compiles=compiled.as_dict(programs=True)
    )
    if on_phase is not None:
      on_phase(name, phases[name])

  # 1. Ours: the prefix cache (and the image features, unless fresh) are computed once, before
  # the steps.
  with phase("prefix"):
    classifier = WeightedTextClassifier(bundle, bank, opts.start_block, s.mesh)
    if not compile_ahead:
      jax.block_until_ready(classifier.prefix)
  image = encode = encoder = fresh_inputs = None
  with phase("image"):
    if fresh:
      # The trainer's fresh-view encoder and a step's inputs (images, sizes, indices), placed
      # as train_method's batch_for_step places them.
      encode, encoder = fresh_view_encoder(bundle, fresh_config(opts), classifier, per_pass)
      place = classifier.place_batch
      fresh_inputs = (
        place(s.canvas.pixels),
        place(s.canvas.sizes),
        place(np.arange(len(s.canvas), dtype=np.int32)),
      )
      if not compile_ahead:
        jax.block_until_ready((encoder, fresh_inputs))
    else:
      image = bundle.encode_image(s.pixels)
      if not compile_ahead:
        image = jax.block_until_ready(image)
  opt_config = ml_collections.ConfigDict({"optim": {"lr": opts.lr}})
  method = stori_method(opt_config, classifier, s.total_steps)
  train_step = make_train_step(method, bundle.logit_scale, encode)
  check_parts = [classifier._shard(p) for p in to_buckets(bank, s.check_full)]
  replicated = NamedSharding(s.mesh, PartitionSpec())
  labels_d = classifier.replicate(s.labels)
  # Fresh views: the step number seeds the views; a few, placed ahead, cycled.
  step_numbers = [classifier.replicate(np.int32(i)) for i in range(16)] if fresh else []
  with phase("state"):
    # Placed as the step's outputs are: the step compiles once (trainer.init_train_state).
    state = init_train_state(method, check_parts, replicated)
  figures = {"xla_flops": None}
  if compile_ahead:
    with phase("step_compile"):
      # The step's program from shapes and shardings alone (the prefix cache's arrays are still
      # being computed; lowering reads only their shapes); the first call reuses it.
      if fresh:
        lowered = train_step.lower(
          state, method.context, (*fresh_inputs, step_numbers[0]), labels_d, encoder
        )
      else:
        embed = int(s.config.embed_dim)
        lowered = train_step.lower(
          state,
          method.context,
          jax.ShapeDtypeStruct((opts.batch, embed), jnp.float32, sharding=replicated),
          jax.ShapeDtypeStruct((opts.batch,), jnp.int32, sharding=replicated),
        )
      figures["xla_flops"] = xla_flops(lowered.compile())
    with phase("wait"):
      jax.block_until_ready((classifier.prefix, image))
  features_d = None
  if not fresh:
    # Normalised on the host: eager jnp ops would compile a program each.
    figures["features"] = l2_normalize(np.asarray(image))
    features_d = classifier.replicate(figures["features"])
  if check:
    if features_d is None:
      check_features = classifier.replicate(l2_normalize(np.asarray(bundle.encode_image(s.pixels))))
    else:
      check_features = features_d

    def ours_loss(log_w, context, features, labels):
      embeddings = classifier.class_embeddings(log_w, context)
      loss, _ = cross_entropy_loss(embeddings, features, labels, bundle.logit_scale)
      return loss, embeddings

    with phase("check"):
      ours_check = jax.jit(jax.value_and_grad(ours_loss, has_aux=True))
      (check_loss, embeddings), grads = ours_check(
        check_parts, method.context, check_features, labels_d
      )
      figures.update(
        check_loss=float(check_loss),
        embeddings=np.asarray(embeddings),
        grads=from_buckets(bank, [np.asarray(g) for g in grads]),
      )
  taken = 0

  def run():
    nonlocal state, taken
    if fresh:
      inputs = (*fresh_inputs, step_numbers[taken % len(step_numbers)])
      state, metrics = train_step(state, method.context, inputs, labels_d, encoder)
    else:
      state, metrics = train_step(state, method.context, features_d, labels_d)
    taken += 1
    jax.block_until_ready(state)
    return metrics

  with phase("first_call"):
    loss = float(run()["loss"])
  return dict(
    run=run,
    first_call_s=phases["first_call"]["seconds"],
    prefix_s=phases["prefix"]["seconds"],
    image_s=phases["image"]["seconds"],
    loss=loss,
    phases=phases,
    fresh=(encode, encoder, fresh_inputs, step_numbers) if fresh else None,
    **figures,
  )


def naive_runner(s: Setup, ours: dict) -> dict:
  """The naive JAX step at the check point, ready to run: run(details) takes one step; also
  first_call_s, xla_flops, the step-0 loss, embeddings and grads (as ours_runner). Its image
  side is `ours`' (an ours_runner's result): the same fresh-view encoder and inputs, or the same
  cached features."""
  naive_optimizer = optax.adam(_schedule(s.opts.lr, s.total_steps))
  encode, encoder, fresh_inputs, step_numbers = ours["fresh"] or (None, None, None, [])
  naive_step = make_naive_step(
    s.bundle.model, s.blocks, s.opts.num_classes, s.bundle.logit_scale, naive_optimizer, encode
  )
  args = jax.device_put((s.params, s.ids, s.trainable, s.text_class))
  labels = jax.device_put(s.labels)
  features = None if encode else jax.device_put(ours["features"])
  state = {"params": jnp.asarray(s.check_full)}
  state["opt_state"] = naive_optimizer.init(state["params"])
  taken = 0

  def inputs():
    if encode is None:
      return (features, labels)
    return ((*fresh_inputs, step_numbers[taken % len(step_numbers)]), labels, encoder)

  def run(details=False):
    nonlocal state, taken
    state, metrics = naive_step(state, *args, *inputs())
    taken += 1
    jax.block_until_ready(state)
    return metrics if details else None

  compiled = naive_step.lower(state, *args, *inputs()).compile()
  naive = {}
  first_call_s = _timed(lambda: naive.update(run(details=True)))
  # The state made by optax's init is placed otherwise than the step's outputs: the second call
  # compiles again (ours avoids it with init_train_state); here before the timed rounds.
  run()
  return dict(
    run=run,
    first_call_s=first_call_s,
    xla_flops=xla_flops(compiled),
    loss=float(naive["loss"]),
    embeddings=np.asarray(naive["embeddings"]),
    grads=np.asarray(naive["grads"]) * s.trainable,
  )


def torch_runner(s: Setup, fresh: bool = False) -> dict:
  """The PyTorch eager step (on CUDA when there is one) at the check point, ready to run: run()
  takes one step (synchronised); also first_call_s, the step-0 loss, embeddings and grads.
  fresh: a view of each of s.canvas's images drawn and encoded in every step (TorchReference);
  otherwise the image features of s.pixels, computed once."""
  import torch  # pylint: disable=import-outside-toplevel

  reference = TorchReference(
    s.torch_model,
    s.ids,
    s.trainable,
    s.text_class,
    s.pixels,
    s.labels,
    s.opts.num_classes,
    s.blocks[0],
    canvas=s.canvas if fresh else None,
    preprocess=s.bundle.preprocess_config,
  )
  with torch.no_grad():
    reference.log_weights.copy_(torch.from_numpy(s.check_full))
  reference.make_optimizer(s.total_steps, s.opts.lr)
  ref = {}
  first_call_s = _timed(lambda: ref.update(reference.step(details=True)))
  return dict(
    run=reference.step,
    first_call_s=first_call_s,
    loss=ref["loss"],
    embeddings=ref["embeddings"],
    grads=ref["grads"] * s.trainable,
    device=str(reference.device),
  )


ROW_TITLES = {
  "fresh_views": "fresh views (the paper configs' views = 0: crop, flip and image tower in the "
  "step)",
  "cached_features": "cached features (views = N: image features computed once, outside the step)",
}


def benchmark(opts):
  with_torch = not opts.skip_torch
  unknown = [r for r in opts.rows if r not in ROWS]
  if unknown or not opts.rows:
    raise SystemExit(f"--rows: {opts.rows} is not a list of {', '.join(ROWS)}.")
  rows = [r for r in ROWS if r in opts.rows]
  s = setup(opts, with_torch)
  config, bank, stats = s.config, s.bank, s.stats
  mesh = s.mesh
  device = jax.devices()[0]
  print(
    f"{opts.arch}: {len(bank.texts)} prompts ({opts.num_classes} classes x "
    f"{opts.prompts_per_class}, {s.source}; tokens median {stats['median_tokens']:.0f}, p99 "
    f"{stats['p99_tokens']:.0f}, max {stats['max_tokens']}, mean bucket length "
    f"{stats['mean_bucket_tokens']:.1f}), {opts.batch} images/step (fresh views from a canvas "
    f"of {s.canvas.pixels.shape[1]}x{s.canvas.pixels.shape[2]}), {device.platform}:"
    f"{device.device_kind} x {mesh.size}, fp32 matmul precision {opts.precision}, rows "
    f"{', '.join(rows)}",
    flush=True,
  )
  # {row: {implementation: runner}}; the agreement check runs on the cached features.
  implementations = {}
  for row in rows:
    fresh = row == "fresh_views"
    ours = ours_runner(s, check=not fresh, fresh=fresh)
    implementations[row] = {"ours": ours}
    if fresh and opts.one_pass:
      implementations[row]["ours_one_pass"] = ours_runner(s, check=False, fresh=True, per_pass=None)
    if opts.naive:
      implementations[row]["naive_jax"] = naive_runner(s, ours)
    if with_torch:
      implementations[row]["torch"] = torch_runner(s, fresh=fresh)
  check_row = "cached_features" if "cached_features" in rows else None
  checks, losses, agree = {}, {}, None
  if check_row:
    ours = implementations[check_row]["ours"]
    losses = {name: impl["loss"] for name, impl in implementations[check_row].items()}
    checks = {
      name: {
        "loss": abs(losses[name] - ours["check_loss"]),
        "class_embeddings": _errors(ours["embeddings"], impl["embeddings"]),
        "grads": _errors(ours["grads"], impl["grads"]),
      }
      for name, impl in implementations[check_row].items()
      if name != "ours"
    }
    print(
      f"check at random log-weights (step 0, cached features): loss ours "
      f"{ours['check_loss']:.6f} (train step: {losses['ours']:.6f})",
      flush=True,
    )
    worst = 0.0
    for name, check in checks.items():
      print(
        f"  {name:<10} loss {losses[name]:.6f}  |dloss| {check['loss']:.2e}  class embeddings "
        f"max |diff| {check['class_embeddings']['max_abs']:.2e}  grads max rel "
        f"{check['grads']['max_rel']:.2e}"
      )
      worst = max(worst, check["loss"], check["class_embeddings"]["max_abs"])
    agree = worst < 1e-4
    print(f"  agreement within 1e-4 (loss and class embeddings): {'yes' if agree else 'NO'}")

  import_torch = with_torch and opts.matmul
  if import_torch:
    import torch  # pylint: disable=import-outside-toplevel

    torch_device = "cuda" if torch.cuda.is_available() else "cpu"
  rate = (
    MatmulRate(opts.matmul, "float32", torch_device if import_torch else None)
    if opts.matmul
    else None
  )
  # Timed rounds: one step of each row's each implementation per round, alternating, and the
  # machine's matmul rate in the same round.
  # Compilations during the timed rounds: none once each step has run (JAX's dispatch cache
  # may add an entry for the outputs' equivalent shardings, which compiles nothing).
  with profiling.compilations() as timed_compiles:
    rounds = []
    for _ in range(opts.repeats):
      timed = {
        row: {name: _timed(impl["run"]) for name, impl in impls.items()}
        for row, impls in implementations.items()
      }
      if rate is not None:
        timed["matmul"] = rate.measure(1)
      rounds.append(timed)
      shown = {f"{row}/{n}": round(t, 2) for row in implementations for n, t in timed[row].items()}
      print(f"round {len(rounds)}: seconds {shown}", flush=True)
  if timed_compiles.count:
    print(
      f"WARNING: {timed_compiles.count} programs compiled during the timed rounds "
      f"({', '.join(timed_compiles.by_name())}); the figures include them."
    )
  flops = expected_flops(config, bank, s.blocks, len(bank.texts), opts.batch, s.canvas.pixels.shape)
  machine = None
  if rate is not None:
    per_round = [machine_gflop_per_s(r["matmul"]) for r in rounds]
    machine = {
      "side": opts.matmul,
      "dtype": "float32",
      "rounds": [r["matmul"] for r in rounds],
      "gflop_per_s": float(np.median(per_round)),
      "what": "the faster framework's [side]^2 fp32 product in each round, median of rounds",
    }
  table = {}
  for row, impls in implementations.items():
    figures = {}
    for name, impl in impls.items():
      times = [r[row][name] for r in rounds]
      parts = step_flops(flops, row, name)
      total = sum(parts.values())
      median = float(np.median(times))
      figures[name] = {
        "seconds_per_step": median,
        "rounds_s": times,
        "first_call_s": impl["first_call_s"],
        "gflop_per_step": total / 1e9,
        "gflop_parts": {k: v / 1e9 for k, v in parts.items()},
        "xla_gflop_per_step": None if impl.get("xla_flops") is None else impl["xla_flops"] / 1e9,
        "gflop_per_s": total / median / 1e9,
        # Per round: the step's FLOP/s over the machine's rate in the same round.
        "fraction_of_matmul_rate": None
        if rate is None
        else float(
          np.median([total / r[row][name] / 1e9 / machine_gflop_per_s(r["matmul"]) for r in rounds])
        ),
      }
    ratios = {
      f"{name}_over_ours": float(np.median([r[row][name] / r[row]["ours"] for r in rounds]))
      for name in impls
      if name != "ours"
    }
    table[row] = {"what": ROW_TITLES[row], "implementations": figures, "ratios": ratios}
  ours_phases = {row: implementations[row]["ours"]["phases"] for row in rows}
  result = {
    "arch": opts.arch,
    "device": f"{device.platform}:{device.device_kind}",
    "num_devices": mesh.size,
    "num_classes": opts.num_classes,
    "prompts_per_class": opts.prompts_per_class,
    "num_prompts": len(bank.texts),
    "prompt_source": s.source,
    "token_lengths": stats,
    "batch": opts.batch,
    "canvas": list(s.canvas.pixels.shape),
    "image_dtype": opts.image_dtype,
    "start_block": s.blocks[0] + 1,
    "chunk": opts.chunk,
    "precision": opts.precision,
    "torch_attention": opts.torch_attention if with_torch else None,
    "repeats": opts.repeats,
    "rows": table,
    "matmul": machine,
    "expected_matmul_flops": flops,
    "compiles_in_timed_rounds": timed_compiles.count,
    # Seconds and XLA compilations of ours by phase (the step: one program), with names.
    "ours_phases": ours_phases,
    "step0_losses": losses,
    "checks_vs_ours": checks,
    "agree_1e-4": agree,
  }
  rate_text = "" if machine is None else f" of the {machine['gflop_per_s']:.1f} GFLOP/s matmul"
  for row, figures in table.items():
    print(f"{figures['what']}:")
    for name, f in figures["implementations"].items():
      xla = f["xla_gflop_per_step"]
      share = f["fraction_of_matmul_rate"]
      print(
        f"  {name:<10} {f['seconds_per_step']:8.3f} s/step  {f['gflop_per_step']:8.1f} GFLOP "
        f"(XLA: {'-' if xla is None else f'{xla:.1f}'})  {f['gflop_per_s']:7.1f} GFLOP/s"
        + ("" if share is None else f" = {100 * share:.1f}%{rate_text}")
      )
    for name, ratio in figures["ratios"].items():
      print(f"  {name}: {ratio:.2f} (median of per-round time ratios)")
  return result


# --memory ----------------------------------------------------------------------------------


class _ShapeOnlyClassifier(WeightedTextClassifier):
  """The classifier's program without its arrays: `data` holds ShapeDtypeStructs."""

  def __init__(self, bundle, bank, start_block, mesh):  # pylint: disable=super-init-not-called
    self.bundle, self.bank, self.mesh = bundle, bank, mesh
    self.reweight_blocks = reweighted_block_indices(bundle.config.text, start_block)
    self.first = self.reweight_blocks[0]
    self.num_classes = bank.num_classes
    self._sharded = NamedSharding(mesh, PartitionSpec(AXIS))
    self._replicated = NamedSharding(mesh, PartitionSpec())

  def sharded(self, shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=self._sharded)

  def replicated(self, shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=self._replicated)

  def init_log_weights(self):
    return [self.sharded(b.ids.shape) for b in self.bank.buckets]

  @property
  def data(self):
    shapes = self.bundle.params
    width, embed = self.bundle.config.text.width, self.bundle.config.embed_dim
    params = {"text": shapes["text"], "logit_scale": shapes["logit_scale"]}
    params = jax.tree.map(lambda s: self.replicated(s.shape, s.dtype), params)
    buckets = self.bank.buckets
    return {
      "params": params,
      "prefix": [self.sharded((b.num_prompts, b.length, width)) for b in buckets],
      "ids": [self.sharded(b.ids.shape, jnp.int32) for b in buckets],
      "class_index": [self.sharded(b.class_index.shape, jnp.int32) for b in buckets],
      "trainable": [self.sharded(b.trainable.shape, jnp.bool_) for b in buckets],
      "fixed_sum": self.replicated((self.num_classes, embed)),
      "fixed_count": self.replicated((self.num_classes,)),
    }


def _tree_bytes(tree, devices: int) -> float:
  """Bytes per device of a tree of ShapeDtypeStructs (sharded leaves split over devices)."""
  total = 0.0
  for leaf in jax.tree.leaves(tree):
    size = float(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize
    sharded = leaf.sharding is not None and leaf.sharding.spec != PartitionSpec()
    total += size / devices if sharded else size
  return total


def memory(opts):
  config = get_architecture(opts.memory_arch)
  all_devices = jax.devices()
  count = min(opts.memory_devices, len(all_devices))
  mesh = prompt_mesh(all_devices[:count])
  per_class = -(-opts.memory_prompts // opts.memory_classes)
  texts, source = prompt_texts(opts, opts.memory_classes, per_class)
  tokenizer = default_tokenizer()
  bank = build_prompt_bank(
    tokenizer, list(texts), texts, None, CONTEXT, chunk=opts.chunk, num_shards=count
  )
  stats = length_stats(tokenizer, bank)
  bundle = CLIPBundle(config=config, params=param_shapes(config))
  classifier = _ShapeOnlyClassifier(bundle, bank, opts.start_block, mesh)
  method = stori_method(
    ml_collections.ConfigDict({"optim": {"lr": opts.lr}}), classifier, total_steps=1000
  )
  train_step = make_train_step(method, logit_scale=100.0)
  log_weights = classifier.init_log_weights()
  opt_state = jax.eval_shape(method.optimizer.init, log_weights)
  opt_state = jax.tree.map(
    lambda s: (
      classifier.sharded(s.shape, s.dtype) if s.ndim else classifier.replicated((), s.dtype)
    ),
    opt_state,
  )
  state = {
    "params": log_weights,
    "opt_state": opt_state,
    "step": classifier.replicated((), jnp.int32),
  }
  features = classifier.replicated((opts.memory_batch, config.embed_dim))
  labels = classifier.replicated((opts.memory_batch,), jnp.int32)
  device = all_devices[0]
  print(
    f"--memory: our train step for {len(bank.texts)} prompts ({opts.memory_classes} classes x "
    f"{per_class}, {source}; tokens median {stats['median_tokens']:.0f}, p99 "
    f"{stats['p99_tokens']:.0f}, max {stats['max_tokens']}; {len(bank.buckets)} buckets, mean "
    f"length {stats['mean_bucket_tokens']:.1f}), {opts.memory_arch} text tower (width "
    f"{config.text.width}, {config.text.layers} blocks), chunk {opts.chunk}, "
    f"{opts.memory_batch} images/step, sharded over {count} {device.platform} devices",
    flush=True,
  )
  start = time.perf_counter()
  lowered = train_step.lower(state, method.context, features, labels)
  compiled = lowered.compile()
  compile_s = time.perf_counter() - start
  analysis = compiled.memory_analysis()
  gb = 1e9
  figures = {
    name: getattr(analysis, f"{name}_size_in_bytes") / gb
    for name in ("argument", "output", "temp", "alias", "generated_code")
  }
  figures["peak_estimate"] = (
    figures["argument"] + figures["output"] + figures["temp"] - figures["alias"]
  )
  # jit drops inputs the program never reads (the token embedding and the blocks before the
  # start block: the prefix cache replaces them), but a run keeps them on the device.
  inputs = (state, method.context, features, labels)
  parts = {
    "all_inputs": _tree_bytes(inputs, count) / gb,
    "text_params": _tree_bytes(method.context["params"], count) / gb,
    "prefix_cache": _tree_bytes(method.context["prefix"], count) / gb,
    "log_weights_and_adam": _tree_bytes(state, count) / gb,
  }
  figures["resident_peak_estimate"] = (
    parts["all_inputs"] + figures["output"] + figures["temp"] - figures["alias"]
  )
  print(
    "What was measured: XLA's buffer assignment (compiled.memory_analysis()) of the compiled, "
    f"never executed, train step on {device.platform}, lowered from abstract argument shapes "
    "with their shardings. Per device, GB:"
  )
  print(f"  arguments the program reads {figures['argument']:8.3f}")
  print(f"  outputs (new state)         {figures['output']:8.3f}")
  print(f"  temporaries                 {figures['temp']:8.3f}")
  print(f"  aliased (donated)           {figures['alias']:8.3f}")
  print(
    f"  program peak                {figures['peak_estimate']:8.3f}  (args + out + temp - alias)"
  )
  print(
    f"  resident peak               {figures['resident_peak_estimate']:8.3f}  (every input array, "
    "used or not, + out + temp - alias)"
  )
  print(
    "  inputs: text params (replicated) {text_params:.3f}, prefix cache (sharded) "
    "{prefix_cache:.3f}, log-weights + Adam moments {log_weights_and_adam:.3f}, all "
    "{all_inputs:.3f}".format(**parts)
  )
  print(f"  (compile {compile_s:.1f} s; other backends fuse differently, so their figures differ)")
  return {
    "mode": "memory",
    "measured": "compiled.memory_analysis() of the jitted train step, not executed",
    "arch": opts.memory_arch,
    "num_prompts": len(bank.texts),
    "num_classes": opts.memory_classes,
    "prompt_source": source,
    "token_lengths": stats,
    "chunk": opts.chunk,
    "batch": opts.memory_batch,
    "devices": count,
    "platform": device.platform,
    "gb_per_device": figures,
    "inputs_gb_per_device": parts,
    "compile_s": compile_s,
  }


def setup_only(opts) -> dict:
  """Our set-up at this size, phase by phase: set-up (weights, prompts, images), then
  ours_runner's phases and one more step. Reports seconds and XLA programs (compiled or read
  from the persistent cache) per phase, and what of it does not depend on the weights."""
  start = time.perf_counter()
  with profiling.compilations() as compiled:
    s = setup(opts, with_torch=False)
  setup_s = time.perf_counter() - start
  device = jax.devices()[0]
  print(
    f"{opts.arch}: {len(s.bank.texts)} prompts, {opts.batch} images/step, {device.platform} x "
    f"{s.mesh.size}, compile_ahead={opts.compile_ahead}, persistent cache "
    f"{opts.compilation_cache or 'off'}",
    flush=True,
  )
  rows = {"setup": dict(seconds=setup_s, compiles=compiled.as_dict(programs=True))}

  def show(name, figures):
    rows[name] = figures
    c = figures["compiles"]
    print(
      f"  {name:<13} {figures['seconds']:8.2f} s  programs compiled {c['count']:3d} "
      f"({c['seconds']:6.2f} s), from cache {c['from_cache']:3d} ({c['cache_seconds']:5.2f} s)",
      flush=True,
    )

  show("setup", rows["setup"])
  ours = ours_runner(s, check=False, on_phase=show, compile_ahead=opts.compile_ahead)
  start = time.perf_counter()
  ours["run"]()
  step_s = time.perf_counter() - start
  total = sum(r["seconds"] for r in rows.values())
  programs = sum(r["compiles"]["count"] + r["compiles"]["from_cache"] for r in rows.values())
  compile_s = sum(r["compiles"]["seconds"] for r in rows.values())
  print(
    f"  set-up to the end of the first step: {total:.1f} s, {programs} programs, "
    f"{compile_s:.1f} s compiling; a later step {step_s:.2f} s"
  )
  return dict(
    mode="setup_only",
    arch=opts.arch,
    num_prompts=len(s.bank.texts),
    batch=opts.batch,
    buckets=[[b.length, b.num_prompts] for b in s.bank.buckets],
    device=f"{device.platform}:{device.device_kind}",
    compile_ahead=opts.compile_ahead,
    compilation_cache=bool(opts.compilation_cache),
    phases=rows,
    total_seconds=total,
    programs=programs,
    compile_seconds=compile_s,
    later_step_seconds=step_s,
  )


def main(argv, values: flags.FlagValues = flags.FLAGS):
  del argv
  opts = types.SimpleNamespace(**{name: values[name].value for name in values})
  if opts.compilation_cache:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = opts.compilation_cache
  profiling.use_compilation_cache(bool(opts.compilation_cache))
  if opts.memory:
    result = memory(opts)
  elif opts.setup_only:
    result = setup_only(opts)
  else:
    result = benchmark(opts)
  if opts.json:
    with open(opts.json, "w", encoding="utf-8") as f:
      json.dump(result, f, indent=2)


if __name__ == "__main__":
  define_flags()
  app.run(main)
