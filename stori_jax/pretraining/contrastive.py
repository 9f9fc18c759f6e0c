"""Contrastive CLIP pretraining on the synthetic world: the first stage of the shipped tiny
CLIP (`python -m stori_jax.pretrain`, configured by configs/tiny_clip_pretrain.py).

Every step draws a fresh batch from the world's generator, seeded by (seed, step), so a run
killed at any point and restarted with the same workdir resumes from its last checkpoint to
exactly the same result. The pieces: the batch recipe with its hard negatives
(`batch_for_step`), the symmetric contrastive loss, AdamW with warm-up and cosine decay, the
jitted train step, a quick zero-shot evaluation, the training curve, and `train`, which runs
them through `training_loop` and exports the model in this project's format.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from tqdm import tqdm

from stori_jax.plumbing import jsonio, paths, run_identity
from stori_jax.clip.bundle import CLIPBundle
from stori_jax.checkpoints import native
from stori_jax.plumbing.config_files import ConfigChecks
from stori_jax.data import synthetic
from stori_jax.clip.encoding import l2_normalize_jax
from stori_jax.models import CLIP, CLIPConfig, VisionConfig, init_params
from stori_jax.plumbing.plotting import pyplot, save_figure
from stori_jax.data.preprocess import OPENAI_MEAN, OPENAI_STD, PreprocessConfig, normalize
from stori_jax.tokenizer import default_tokenizer
from stori_jax.trainloop import loop, metrics_log
from stori_jax.trainloop.checkpointer import NonFiniteWatch, TrainCheckpointer, nonfinite_code
from stori_jax.world_evaluation.metrics import zero_shot_attributes

EXPORT_DTYPES = ("float32", "float16", "bfloat16")


def model_config(config: ml_collections.ConfigDict) -> CLIPConfig:
  return CLIPConfig.from_dict(config.model.to_dict())


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Checks every value for type and range before any work; one ConfigError names them all."""
  checks = ConfigChecks(config)
  checks.integer("seed", minimum=0)
  checks.integer("model.embed_dim", minimum=1)
  for key in ("vocab_size", "context_length", "width", "layers", "heads"):
    checks.integer(f"model.text.{key}", minimum=1)
  for key in ("image_size", "patch_size", "width", "layers", "heads"):
    checks.integer(f"model.vision.{key}", minimum=1)
  if not checks.problems:
    try:
      clip_config = model_config(config)
    except (TypeError, ValueError) as e:
      checks.problem(f"config.model does not describe a CLIP model: {e}")
    else:
      if not isinstance(clip_config.vision, VisionConfig):
        checks.problem("config.model.vision must be a ViT (image_size, patch_size, ...)")
  checks.choice("data.max_objects", (1, 2))
  checks.number("data.two_object_fraction", minimum=0, maximum=1)
  hard = checks.number("data.hard_negative_fraction", minimum=0, maximum=1)
  groups = 0.0  # optional: older configs have no pattern groups
  if "pattern_negative_fraction" in config.data:
    groups = checks.number("data.pattern_negative_fraction", minimum=0, maximum=1)
  if hard is not None and groups is not None and hard + groups > 1:
    checks.problem(
      "config.data.hard_negative_fraction + config.data.pattern_negative_fraction must be at "
      f"most 1, got {hard:g} + {groups:g}"
    )
  context = checks.get("model.text.context_length", None)
  checks.integer("text_length", minimum=2, maximum=context if isinstance(context, int) else None)
  # The contrastive loss needs a negative for every pair: at least two pairs per batch.
  checks.integer("batch_size", minimum=2)
  total = checks.integer("total_steps", minimum=1)
  checks.integer("warmup_steps", minimum=0, maximum=None if total is None else total - 1)
  checks.number("learning_rate", above=0)
  checks.number("end_learning_rate_fraction", minimum=0, maximum=1)
  checks.number("weight_decay", minimum=0)
  b2 = checks.number("adam_b2", above=0)
  if b2 is not None and b2 >= 1:
    checks.problem(f"config.adam_b2 must be below 1, got {b2:g}")
  checks.number("max_logit_scale", minimum=1)
  for key in ("log_every", "checkpoint_every", "keep_checkpoints", "eval_every", "eval_images"):
    checks.integer(key, minimum=1)
  checks.text("export_dir")
  checks.choice("export_dtype", EXPORT_DTYPES)
  checks.raise_if_any()


def pattern_groups(
  groups: int, rng: np.random.Generator, seed, image_size: int
) -> synthetic.SyntheticBatch:
  """`groups` x 4 single objects: each group of four shows every pattern once on objects that
  share colour, shape, size, position and background (drawn from `rng`). Every caption names
  the pattern ("plain" included): a caption without it would fit all four images."""
  shared = {
    family: [str(v) for v in np.repeat(rng.choice(values, groups), len(synthetic.PATTERNS))]
    for family, values in (
      ("colour", synthetic.COLOURS),
      ("shape", synthetic.SHAPES),
      ("size", synthetic.SIZES),
      ("position", synthetic.POSITIONS),
      ("background", synthetic.BACKGROUNDS),
    )
  }
  return synthetic.generate_with(
    groups * len(synthetic.PATTERNS),
    seed=seed,
    image_size=image_size,
    pattern=list(synthetic.PATTERNS) * groups,
    always_mention=("pattern",),
    **shared,
  )


def batch_for_step(config, step: int) -> tuple[np.ndarray, np.ndarray]:
  """(images float32 [B, S, S, 3] normalised, ids int32 [B, text_length]) of one step.

  Two groups of single objects make hard negatives, so the contrastive loss cannot lean
  on colour, the easiest cue, alone:
  - config.data.hard_negative_fraction of the batch: colour and pattern from only two
    values each, so most pairs differ in shape, pattern, size or position;
  - config.data.pattern_negative_fraction: groups of four objects, one per pattern, that
    share colour, shape, size, position and background: within a group only the pattern
    tells the captions apart (pattern is the family a tiny ViT learns last, and any other
    shared cue would let the loss ignore it).
  """
  clip_config = model_config(config)
  size = clip_config.vision.image_size
  hard = int(round(config.batch_size * config.data.hard_negative_fraction))
  groups = int(round(config.batch_size * config.data.get("pattern_negative_fraction", 0.0)))
  groups //= len(synthetic.PATTERNS)
  same_kind = groups * len(synthetic.PATTERNS)
  if hard + same_kind > config.batch_size:
    raise ValueError(
      "data.hard_negative_fraction + data.pattern_negative_fraction must be at most 1; "
      "lower one of them."
    )
  batch = synthetic.generate(
    config.batch_size - hard - same_kind,
    seed=(config.seed, step),
    image_size=size,
    max_objects=config.data.max_objects,
    two_object_fraction=config.data.two_object_fraction,
  )
  images, captions = [batch.images], list(batch.captions)
  rng = np.random.default_rng((config.seed, step, 1))
  if hard:
    colours = rng.choice(synthetic.COLOURS, 2, replace=False)
    patterns = rng.choice(synthetic.PATTERNS, 2, replace=False)
    similar = synthetic.generate_with(
      hard,
      seed=(config.seed, step, 2),
      image_size=size,
      colour=list(rng.choice(colours, hard)),
      pattern=list(rng.choice(patterns, hard)),
    )
    images.append(similar.images)
    captions += list(similar.captions)
  if same_kind:
    similar = pattern_groups(groups, rng, seed=(config.seed, step, 3), image_size=size)
    images.append(similar.images)
    captions += list(similar.captions)
  ids = default_tokenizer()(captions, context_length=config.text_length, truncate=False)
  return normalize(np.concatenate(images), OPENAI_MEAN, OPENAI_STD), ids


def contrastive_loss(logits: jax.Array) -> jax.Array:
  """Symmetric InfoNCE over a [B, B] image-text logit matrix (matches on the diagonal)."""
  labels = jnp.arange(logits.shape[0])
  image_to_text = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  text_to_image = optax.softmax_cross_entropy_with_integer_labels(logits.T, labels)
  return (image_to_text.mean() + text_to_image.mean()) / 2


def make_optimizer(config) -> optax.GradientTransformation:
  if not 0 <= config.warmup_steps < config.total_steps:
    raise ValueError(
      f"warmup_steps ({config.warmup_steps}) must be smaller than total_steps "
      f"({config.total_steps}); lower --config.warmup_steps."
    )
  schedule = optax.warmup_cosine_decay_schedule(
    0.0,
    config.learning_rate,
    config.warmup_steps,
    config.total_steps,
    config.learning_rate * config.end_learning_rate_fraction,
  )
  # As in CLIP: no decay on gains, biases and the temperature (the 0-d and 1-d params).
  decay_mask = lambda params: jax.tree_util.tree_map(lambda p: p.ndim >= 2, params)
  return optax.adamw(schedule, b2=config.adam_b2, weight_decay=config.weight_decay, mask=decay_mask)


def make_train_step(config, model: CLIP, optimizer):
  """The jitted step (state, (images, ids)) -> (state, metrics) over state {"params",
  "opt_state", "step"}, with the batch of `batch_for_step`; donates the state."""
  max_log_scale = float(np.log(config.max_logit_scale))

  def loss_fn(params, images, ids):
    image = model.apply({"params": params}, images, method=CLIP.encode_image)
    text = model.apply({"params": params}, ids, method=CLIP.encode_text)
    # No floor: the shipped model was trained with exactly this rounding (l2_normalize_jax).
    image, text = l2_normalize_jax(image, eps=None), l2_normalize_jax(text, eps=None)
    logits = jnp.exp(params["logit_scale"]) * image @ text.T
    loss = contrastive_loss(logits)
    accuracy = jnp.mean(jnp.argmax(logits, axis=1) == jnp.arange(logits.shape[0]))
    return loss, accuracy

  def train_step(state, batch):
    images, ids = batch
    (loss, accuracy), grads = jax.value_and_grad(loss_fn, has_aux=True)(
      state["params"], images, ids
    )
    updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    # CLIP clamps the temperature so logits stay <= max_logit_scale * cosine.
    params["logit_scale"] = jnp.clip(params["logit_scale"], 0.0, max_log_scale)
    new_state = {"params": params, "opt_state": opt_state, "step": state["step"] + 1}
    return new_state, {
      "loss": loss,
      "batch_accuracy": accuracy,
      "logit_scale": jnp.exp(params["logit_scale"]),
      "nonfinite": nonfinite_code(loss, grads, params),
    }

  return jax.jit(train_step, donate_argnums=0)


def initial_state(config, optimizer) -> dict[str, Any]:
  params = init_params(model_config(config), seed=config.seed)
  return {"params": params, "opt_state": optimizer.init(params), "step": jnp.zeros((), jnp.int32)}


def export_path(config, workdir: str) -> str:
  """Where the trained model is exported: config.export_dir, relative to the workdir unless
  absolute."""
  if os.path.isabs(config.export_dir):
    return config.export_dir
  return os.path.join(workdir, config.export_dir)


def quick_eval(bundle: CLIPBundle, config) -> dict[str, float]:
  """Zero-shot colour / shape / pattern accuracy on fresh images (a progress signal)."""

  result = zero_shot_attributes(
    bundle,
    n_images=config.eval_images,
    seed=(config.seed, 10**9),
    families=("colour", "shape", "pattern"),
  )
  return {f"zero_shot_{family}": value for family, value in result["accuracy"].items()}


def plot_curve(records: list[dict[str, float]], path: str) -> None:
  """training_curve.png: contrastive loss, and the zero-shot accuracy of each family probed."""
  plt = pyplot()
  fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 3.5))
  ax_loss.plot([r["step"] for r in records], [r["loss"] for r in records])
  ax_loss.set(xlabel="step", ylabel="contrastive loss", yscale="log", title="loss")
  families = sorted({k for r in records for k in r if k.startswith("zero_shot_")})
  for key in families:
    probed = [r for r in records if key in r]
    ax_acc.plot([r["step"] for r in probed], [r[key] for r in probed], "o-", label=key[10:])
  ax_acc.set(xlabel="step", ylabel="accuracy", ylim=(0, 1.02), title="zero-shot, held-out images")
  if families:
    ax_acc.legend()
  # The run's folder names which run the curve is of.
  name = os.path.basename(paths.parent(path))
  fig.suptitle(f"Contrastive pretraining of the tiny CLIP ({name})", fontsize=10)
  fig.tight_layout()
  save_figure(fig, path, dpi=110)
  plt.close(fig)


def loop_spec(config, workdir: str, what: str, **settings) -> loop.LoopSpec:
  """The loop of a training stage of the tiny CLIP (pretraining, weight response) from its
  config: total_steps, keep_checkpoints, log_every and checkpoint_every, a divergence blamed
  on config.learning_rate; `settings`: the rest of `loop.LoopSpec` (eval_every, desc...)."""
  return loop.LoopSpec(
    total_steps=config.total_steps,
    workdir=workdir,
    checkpointer=TrainCheckpointer(os.path.join(workdir, "checkpoints"), config.keep_checkpoints),
    watch=NonFiniteWatch(
      what,
      f"The likely cause is the learning rate (config.learning_rate = "
      f"{config.learning_rate:g}): lower it.",
    ),
    log_every=config.log_every,
    checkpoint_every=config.checkpoint_every,
    **settings,
  )


def train(config, workdir: str, restart: bool = False) -> CLIPBundle:
  """Runs (or resumes) pretraining; returns the trained model as a bundle.

  Args:
    config: a pretraining config (configs/tiny_clip_pretrain.py).
    workdir: the run's folder; one made by the same config resumes from its checkpoint.
    restart: move a workdir made by another config aside (`<workdir>.old-<time>`) instead of
      refusing it.

  Raises:
    ConfigError: a bad config value (before any work).
    WorkdirMismatchError: the workdir holds another run, is a file or is not writable
      (before any work).
    NonFiniteError: the run diverged (NaN or infinity); the last good checkpoint is kept.
  """
  validate_config(config)
  # The config pins everything: the model is initialised from config.seed and the data is
  # generated from (config.seed, step). When it logs, evaluates or saves may change on resume.
  run_identity.claim_run(workdir, {"config": config}, what="pretraining run", restart=restart)
  clip_config = model_config(config)
  model = CLIP(clip_config)
  optimizer = make_optimizer(config)
  train_step = make_train_step(config, model, optimizer)
  spec = loop_spec(
    config,
    workdir,
    "pretraining",
    eval_every=config.eval_every,
    prefetch=2,  # the images are drawn on the host: two steps ahead, on a thread
    desc="pretrain",
    postfix=("loss", "batch_accuracy"),
  )
  state, first_step = loop.resume(
    spec, initial_state(config, optimizer), trained=lambda state: state["params"]
  )
  jsonio.write_text_atomic(
    os.path.join(workdir, "config.json"), config.to_json_best_effort(indent=2)
  )
  metrics_path = os.path.join(workdir, "metrics.jsonl")
  metrics_log.read_records(metrics_path, up_to_step=first_step)  # drop what the resume redoes
  preprocess = PreprocessConfig(clip_config.vision.image_size)

  def evaluate(state, step):
    del step
    return quick_eval(
      CLIPBundle(clip_config, state["params"], preprocess_config=preprocess), config
    )

  def log(record):
    if any(key.startswith("zero_shot_") for key in record):
      tqdm.write(jsonio.dumps_strict(record))  # the evaluations, above the progress bar
    metrics_log.append_record(metrics_path, record)

  state = loop.train_loop(
    train_step,
    state,
    lambda step: batch_for_step(config, step),
    spec,
    first_step=first_step,
    evaluate=evaluate,
    log=log,
  )
  plot_curve(metrics_log.read_records(metrics_path), os.path.join(workdir, "training_curve.png"))
  bundle = CLIPBundle(
    clip_config,
    jax.device_get(state["params"]),
    preprocess_config=preprocess,
    source=paths.absolute(workdir),
  )
  if config.export_dir:
    export = export_path(config, workdir)
    native.save(
      export,
      clip_config,
      bundle.params,
      preprocess,
      metadata={
        "trained_by": "python -m stori_jax.pretrain",
        "pretrain_config": json.loads(config.to_json_best_effort()),
        "steps": config.total_steps,
      },
      params_dtype=config.export_dtype,
    )
    logging.info("Exported the trained model to %s", export)
  return bundle
