"""Few-shot training of SToRI token weights (or the TaskRes baseline) on cached features.

The image tower is frozen, so every training image is encoded once, for
`config.views` augmented views; each step draws one view per image. Only the
log-weights of the trainable prompts' tokens are optimised (SToRI), or the
class residuals (TaskRes). Batches are a function of (seed, epoch), and the
state is checkpointed with orbax, so a killed run resumes to the same result.

Trust: every config value is checked before any work (`validate_config`); the workdir
records the run that made it (run.json) and refuses another one (`claim_run`); a NaN or an
infinity in the loss, the gradients or the weights stops the run at that step
(`NonFiniteError`), before it reaches a checkpoint, the history or a result file.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from jax.sharding import NamedSharding, PartitionSpec
from tqdm import tqdm

from stori_jax.clip import encoding
from stori_jax.plumbing import jsonio, multihost, run_identity
from stori_jax.clip.bundle import CLIPBundle, resolve_start_block
from stori_jax.plumbing.config_files import ConfigChecks, ConfigError
from stori_jax.fewshot import (
  augment,
  datasets,
  methods,
  paper_config,
  prompts,
  report,
  world_scoring,
)
from stori_jax.fewshot.prompt_bank import build_prompt_bank
from stori_jax.models import tower_kinds
from stori_jax.fewshot.text_classifier import (
  WeightedTextClassifier,
  cross_entropy_loss,
  predict,
  prompt_mesh,
  to_host,
)
from stori_jax.clip.loading import load
from stori_jax.data.preprocess import PreprocessConfig
from stori_jax.trainloop import loop
from stori_jax.trainloop.checkpointer import NonFiniteWatch, TrainCheckpointer, nonfinite_code

# The rare tokens of the nonsensical-token ablation (paper Table 1, after Ruiz et al.).
RARE_TOKENS = ("sks", "pll", "ucd")
#: SToRI's learning-rate schedules (config.optim.schedule): "taskres", TaskRes's scheme as
#: Dassl steps it (`taskres_schedule`: constant warm-up epochs, then a cosine stepped per epoch;
#: the paper configs, App. A.1: SToRI follows "the training scheme of TaskRes"), or "cosine", a
#: cosine decay stepped per step from the first step, no warm-up (the demo's).
SCHEDULES = ("taskres", "cosine")
DATA_SOURCES = ("synthetic", "coop", "tfds")
#: Above this the paper's Adam learning rates (1e-2 to 0.1) are far exceeded: warned about.
LARGE_LEARNING_RATE = 1.0
#: The image tower's compute dtypes (config.image_dtype).
IMAGE_DTYPES = ("float32", "bfloat16")
#: Config keys besides run_identity.SCHEDULE_KEYS that a resumed run may change: the run's
#: name, not what is computed.
IDENTITY_IGNORED = ("name",)


# Config ------------------------------------------------------------------------------------


#: Sane upper bounds of size-like config values (far above the paper's settings: 1 to 10 views,
#: 64 px synthetic images, 50 test images per class); a value past them is a typo, refused
#: before anything is allocated (a million views once grew memory at 40 MB/s, issue 26 row 4).
MAX_VIEWS = 1000
MAX_SYNTHETIC_IMAGE_SIZE = 1024
MAX_TEST_PER_CLASS = 100_000


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Checks every value for type and range before any work; one ConfigError names them all.

  The text tower's depth is only known once the model is loaded: `bundle.resolve_start_block`
  checks config.start_block then.
  """
  checks = ConfigChecks(config)
  checks.text("name")
  method = _check_method(checks)
  checks.integer("seed", minimum=0)
  checks.integer("shots", minimum=1)
  checks.text("model.source", nonempty=True)
  checks.text("model.arch")
  if "backbone" in config.model:  # the paper configs': whose learning rates apply (App. A.1)
    checks.choice("model.backbone", ("",) + tuple(paper_config.BACKBONES))
  checks.text("data.name", nonempty=True)
  source = checks.choice("data.source", DATA_SOURCES)
  name = checks.get("data.name", None)
  if source is not None and (source == "synthetic") != (name == "synthetic"):
    checks.problem(
      f"config.data.source is {source!r} but config.data.name is {name!r}: the synthetic world "
      f"needs both 'synthetic'"
    )
  if source == "synthetic":
    # Upper bounds before any allocation (issue 26 rows 4 and 10): the world's images are held
    # in memory, and load_synthetic checks their total size against the machine's.
    checks.integer("data.image_size", minimum=8, maximum=MAX_SYNTHETIC_IMAGE_SIZE)
    checks.integer("data.n_test_per_class", minimum=1, maximum=MAX_TEST_PER_CLASS)
  if source == "tfds":
    checks.text("data.tfds_name", nonempty=True)
  checks.text("data.root")
  class_names = checks.get("data.class_names", "")
  if not (
    isinstance(class_names, str)
    or (isinstance(class_names, (tuple, list)) and all(isinstance(c, str) for c in class_names))
  ):
    checks.problem(
      f"config.data.class_names must be a tuple of class names (or '' for all), got {class_names!r}"
    )
  checks.text("prompts.cupl_path")
  checks.integer("prompts.per_class", minimum=0)
  rare_tokens = checks.integer("prompts.rare_tokens", minimum=0)
  use_base = checks.boolean("prompts.use_base")
  use_cupl = checks.boolean("prompts.use_cupl")
  if use_cupl is False:
    # The Base-only classifier (Table 2's "TaskRes / Base"): no CuPL prompt; a method that
    # trains the CuPL prompts says so in its own check.
    if use_base is False:
      checks.problem(
        "config.prompts.use_base and config.prompts.use_cupl are both False: the classes have "
        "no prompts; set one of them True"
      )
    if rare_tokens:
      checks.problem(
        f"config.prompts.rare_tokens = {rare_tokens} appends rare tokens to the CuPL prompts, "
        f"but config.prompts.use_cupl is False; set rare_tokens=0 or use_cupl=True"
      )
  check_training(checks)
  # Every method checks its own block where the config holds it (a config carries the blocks
  # of several methods, so that --config.method switches between them).
  for entry in methods.registered():
    if entry.block in config or entry is method:
      entry.check(checks, entry is method)
  checks.raise_if_any()
  block = method.warmup_block(config)
  if block is not None and config[block].warmup_epochs >= config.epochs:
    logging.warning(
      "config.%s.warmup_epochs = %d covers all %d epochs: %s trains at the warm-up rate %g "
      "throughout and never at config.%s.",
      block,
      config[block].warmup_epochs,
      config.epochs,
      method.label,
      config[block].warmup_lr,
      method.lr_key,
    )
  lr = method.learning_rate(paper_config.resolve_learning_rate(config))
  if lr > LARGE_LEARNING_RATE:
    logging.warning(
      "config.%s = %g is far above the paper's Adam learning rates (1e-2 to 0.1); the run "
      "will stop at the first NaN or infinite step if it diverges.",
      method.lr_key,
      lr,
    )


def _check_method(checks: ConfigChecks) -> methods.FewShotMethod | None:
  """The config's method: a registered name, or `module:name` of one registered at import."""
  name = checks.get("method", None)
  if isinstance(name, str) and ":" in name:
    try:
      return methods.get(name)
    except ConfigError as error:
      checks.problem(str(error).rstrip("."))
      return None
  name = checks.choice("method", methods.names())
  return None if name is None else methods.get(name)


def check_training(checks: ConfigChecks) -> None:
  """The checks of the training settings that every few-shot config has (`train`'s and the
  pairwise study's; `train_method` reads them): start_block, views, image_dtype, augment_scale,
  batch_size, epochs, optim.log_weight_penalty, optim.schedule (with "taskres" its warm-up),
  chunk and the intervals."""
  checks.integer("start_block", minimum=1, optional=True)
  # 0: a fresh view of every training image at every step; N > 0: N cached views per image.
  checks.integer("views", minimum=0, maximum=MAX_VIEWS)
  if "image_dtype" in checks.config:
    checks.choice("image_dtype", IMAGE_DTYPES)
  scale = checks.numbers("augment_scale", minimum=0, maximum=1, count=2)
  if scale is not None and not 0 < scale[0] <= scale[1]:
    checks.problem(
      f"config.augment_scale must be (low, high) with 0 < low <= high <= 1, got {scale}"
    )
  checks.integer("batch_size", minimum=1)
  checks.integer("epochs", minimum=1)
  optim = checks.get("optim", {})
  if "log_weight_penalty" in optim:
    checks.number("optim.log_weight_penalty", minimum=0)
  if "schedule" in optim and checks.choice("optim.schedule", SCHEDULES) == "taskres":
    checks.integer("optim.warmup_epochs", minimum=0)
    checks.number("optim.warmup_lr", above=0)
  checks.integer("chunk", minimum=1)
  for key in ("log_every", "eval_every", "checkpoint_every"):
    checks.integer(key, minimum=1)


def identity(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """What decides a run's results: the resolved config, the contents of the model and prompt
  files it names (`run_identity.content_identity`: editing a file in place is a change), and
  the data folder's absolute path (a relative path depends on the cwd)."""
  return {
    "config": config,
    "model": run_identity.content_identity(config.model.source),
    "data": {
      "root": run_identity.absolute_path(config.data.root),
      "cupl_path": run_identity.content_identity(config.prompts.cupl_path),
    },
  }


def claim_run(config: ml_collections.ConfigDict, workdir: str, restart: bool = False) -> None:
  """Makes `workdir` this run's home, or refuses one made by another config (see
  `run_identity.claim_run`; on several hosts process 0 claims)."""
  run_identity.claim_run(
    workdir, identity(config), what="training run", restart=restart, ignore=IDENTITY_IGNORED
  )


# Data --------------------------------------------------------------------------------------


def load_split(config: ml_collections.ConfigDict) -> datasets.FewShotSplit:
  """The configured dataset with its K-shot training sample."""
  data = config.data
  if data.name == "synthetic":
    return datasets.load_synthetic(
      config.shots,
      config.seed,
      data.n_test_per_class,
      class_names=data.get("class_names") or None,
      image_size=data.image_size,
    )
  if data.source == "tfds":
    return datasets.load_tfds(
      data.tfds_name,
      data.root or None,
      shots=config.shots,
      seed=config.seed,
      class_names=data.get("class_names") or None,
    )
  split = datasets.load_coop_split(data.root, data.name)
  return split.few_shot(config.shots, config.seed)


def encode_images(
  bundle: CLIPBundle,
  sources: Sequence[Any],
  *,
  views: int = 1,
  augment_seed: int | None = None,
  scale=(0.08, 1.0),
  batch_size: int = 256,
  desc: str = "images",
) -> np.ndarray:
  """Normalised image features float32 [N, views, E] (augmented when augment_seed is set).

  sources: N image paths or PIL images; views: augmented views per image (with augment_seed;
  without it, one centre view and the result is [N, 1, E]); batch_size: images per encode call.
  """
  size = bundle.config.vision.image_size
  preprocess = bundle.preprocess_config

  def pixels(index, source):
    if augment_seed is None:
      return augment.eval_view(source, preprocess)[None]
    return augment.augmented_views(
      source, size, views, augment_seed, index, preprocess, scale=scale
    )

  per_image = views if augment_seed is not None else 1
  bar = tqdm(sources, desc=desc, unit="img", leave=False, disable=len(sources) < 64)
  # Streamed: the views of a large training set need not fit in memory at once. Every encode
  # call has batch_size rows (one compiled shape), whatever the number of images.
  chunks = (pixels(index, source) for index, source in enumerate(bar))
  features = encoding.encode_pixels(bundle, chunks, batch_size)
  return features.reshape(len(sources), per_image, -1)


def image_bundle(bundle: CLIPBundle, config) -> CLIPBundle:
  """The bundle the run's image tower computes with: config.image_dtype ("float32" where a
  config has none, or "bfloat16"; params stay float32)."""
  return bundle.with_dtype(jnp.dtype(config.get("image_dtype", "float32")))


def encode_split(bundle: CLIPBundle, split: datasets.FewShotSplit, config):
  """(training inputs, test features float32 [M, E]) of a split's images, the image tower in
  config.image_dtype (`image_bundle`).

  The training inputs: config.views > 0, features float32 [N, config.views, E] of that many
  cached augmented views (`augment_scale`, seeded by config.seed) of every training image;
  config.views = 0, the images themselves (`augment.ImageCanvas`, at most `CANVAS_SIDE` times
  the model's input side), whose views `train_method` draws afresh at every step. The test
  images: one centre view each.
  """
  bundle = image_bundle(bundle, config)
  test = encode_images(bundle, [i.source for i in split.test], desc="test images")[:, 0]
  if config.views == 0:
    side = augment.CANVAS_SIDE * bundle.config.vision.image_size
    return augment.image_canvas([i.source for i in split.train], side), test
  train = encode_images(
    bundle,
    [i.source for i in split.train],
    views=config.views,
    augment_seed=config.seed,
    scale=tuple(config.augment_scale),
    desc="train views",
  )
  return train, test


def _with_rare_tokens(texts: Sequence[str], count: int, seed: int) -> list[str]:
  rng = np.random.default_rng(seed)
  return [t + " " + " ".join(rng.choice(RARE_TOKENS, count)) for t in texts]


def prompt_texts(
  config,
  split: datasets.FewShotSplit,
  bundle: CLIPBundle,
  train_inputs: np.ndarray | augment.ImageCanvas,
  labels: np.ndarray,
):
  """(trainable CuPL prompts {class: [str]}, fixed Base prompts {class: [str]}).

  train_inputs: `encode_split`'s; the prompts most similar to a class's training images
  (config.prompts.per_class) are chosen by the mean of its cached views' features, or with
  fresh views (an ImageCanvas) by that of one centre view of each image.
  With config.prompts.use_cupl False every class's CuPL list is empty (Base prompts only).
  """
  names = split.class_names
  if not config.prompts.get("use_cupl", True):
    # Base prompts only (Table 2's "TaskRes / Base"): no CuPL file is read.
    cupl = [[] for _ in names]
  elif split.dataset == "synthetic":
    cupl = prompts.synthetic_prompts(names)
    cupl = [list(cupl[name]) for name in names]
  else:
    cupl = [
      list(p)
      for p in prompts.load_cupl_prompts(config.prompts.cupl_path, names, dataset=split.dataset)
    ]
  if config.prompts.per_class and any(cupl):
    # ImageNet/SUN397: keep the prompts most similar to the class's training images.
    train_features = train_inputs
    if isinstance(train_inputs, augment.ImageCanvas):
      sources = [i.source for i in split.train]
      train_features = encode_images(image_bundle(bundle, config), sources, desc="train images")
    cupl = [
      select_prompts(
        bundle, texts, train_features[labels == c].mean(axis=(0, 1)), config.prompts.per_class
      )
      for c, texts in enumerate(cupl)
    ]
  if config.prompts.rare_tokens and any(cupl):
    cupl = [
      _with_rare_tokens(texts, config.prompts.rare_tokens, config.seed + c)
      for c, texts in enumerate(cupl)
    ]
  base = (
    prompts.base_prompts(split.dataset, names) if config.prompts.use_base else [()] * len(names)
  )
  return dict(zip(names, cupl)), dict(zip(names, map(list, base)))


def select_prompts(
  bundle: CLIPBundle, texts: Sequence[str], image_mean: np.ndarray, count: int
) -> list[str]:
  """The `count` texts whose normalised features are most similar to image_mean [E]."""
  if len(texts) <= count:
    return list(texts)
  features = np.asarray(bundle.encode_text(bundle.tokenize(list(texts))))
  features = encoding.l2_normalize(features, axis=1)
  order = np.argsort(-(features @ image_mean), kind="stable")[:count]
  return [texts[i] for i in sorted(order)]


# Methods -----------------------------------------------------------------------------------


#: The few-shot methods (`methods.get(config.method)`): the built-ins' functions, which
#: benchmarks and tests build a method with directly.
stori_method = methods.stori.stori_method
log_weight_penalty = methods.stori.log_weight_penalty
taskres_method = methods.taskres.taskres_method
taskres_base = methods.taskres.taskres_base
Method = methods.Method


# Training ----------------------------------------------------------------------------------


def epoch_batches(num_images: int, batch_size: int, seed: int, epoch: int):
  """Index batches of one epoch: a seeded permutation; drop_last unless one batch holds all."""
  order = np.random.default_rng((seed, epoch)).permutation(num_images)
  if num_images <= batch_size:
    return [order]
  return [order[i : i + batch_size] for i in range(0, num_images - batch_size + 1, batch_size)]


def make_train_step(method: Method, logit_scale: float, encode: Callable | None = None):
  """The jitted step (state, context, features [B, E], labels int32 [B]) -> (state, metrics)
  over state {"params", "opt_state", "step"}; donates the state. The metrics: the loss, the
  batch's accuracy and, where the method has a schedule, "lr", the rate of this step.

  encode: None, or (encoder, inputs) -> unit features [B, E], run at the start of the step on
  its `features` argument (then the step's inputs, `fresh_view_encoder`'s) and its fifth
  argument, `encoder` (arrays passed as an argument, not closed over); no gradient flows
  through it.
  """

  def loss_fn(params, context, features, labels):
    embeddings = method.class_embeddings(params, context)
    loss, accuracy = cross_entropy_loss(embeddings, features, labels, logit_scale)
    # The history reports the cross-entropy; the gradient also follows the penalty.
    return loss + method.penalty(params), (loss, accuracy)

  def train_step(state, context, features, labels, encoder=None):
    if encode is not None:
      features = jax.lax.stop_gradient(encode(encoder, features))
    (_, (loss, accuracy)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
      state["params"], context, features, labels
    )
    updates, opt_state = method.optimizer.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    return (
      {"params": params, "opt_state": opt_state, "step": state["step"] + 1},
      {
        "loss": loss,
        "train_accuracy": accuracy,
        **({} if method.schedule is None else {"lr": method.schedule(state["step"])}),
        "nonfinite": nonfinite_code(loss, grads, method.reported(params)),
      },
    )

  return jax.jit(train_step, donate_argnums=0)


def init_train_state(method: Method, params: Any, replicated: jax.sharding.Sharding) -> dict:
  """The state {"params", "opt_state", "step"} of `make_train_step`'s step, placed as the
  step's outputs are, so that its second call reuses the first call's program.

  params: `method.init()` (leaves that are not on a mesh are put on `replicated`, as their
  copies in the step's outputs are);
  replicated: the prompt mesh's replicated sharding. The optimiser's state is built in one
  compiled program whose outputs carry the step's shardings (a copy of the params tree takes
  the params' shardings, counts are replicated): eager `optimizer.init` compiled a small
  program per op and bucket shape (7 for 5 buckets), and its replicated scalars, or a jitted
  init's default placement, made the step compile a second time for its own outputs.
  """

  def place(x):
    if isinstance(getattr(x, "sharding", None), NamedSharding):
      return x
    # The same host value on every process (multi-host safe, as classifier.replicate).
    value = np.asarray(x)
    return jax.make_array_from_callback(value.shape, replicated, lambda index: value[index])

  params = jax.tree_util.tree_map(place, params)
  shapes = jax.eval_shape(method.optimizer.init, params)
  opt_shardings = optax.tree_map_params(
    # Abstractly: optax calls init on a placeholder, whose eager counts would compile.
    lambda placeholder: jax.eval_shape(method.optimizer.init, placeholder),
    lambda _, sharding: sharding,
    shapes,
    jax.tree_util.tree_map(lambda x: x.sharding, params),
    transform_non_params=lambda _: replicated,
  )
  init = jax.jit(
    lambda p: (method.optimizer.init(p), jnp.zeros((), jnp.int32)),
    out_shardings=(opt_shardings, replicated),
  )
  opt_state, step = init(params)
  return {"params": params, "opt_state": opt_state, "step": step}


def accuracy_report(
  class_embeddings, features: np.ndarray, labels: np.ndarray, class_names: Sequence[str]
) -> dict[str, Any]:
  predicted = predict(class_embeddings, features)
  per_class = {
    name: float(np.mean(predicted[labels == c] == c))
    for c, name in enumerate(class_names)
    if np.any(labels == c)
  }
  return {"accuracy": float(np.mean(predicted == labels)), "per_class": per_class}


#: Fresh views on a CPU: the image tower runs on at most as many views per pass as keep its
#: largest activation within this many bytes (6 for ViT-B/16 at 224 px), as the mutual-knowledge
#: analysis sizes its passes: XLA:CPU's tower slows once a pass's activations leave the cache.
CPU_PASS_BYTES = 16 * 2**20


def fresh_view_passes(bundle: CLIPBundle, platform: str | None = None) -> int | None:
  """Views per image-tower pass in the fresh-view step: on a CPU as many as keep the tower's
  largest activation (in the bundle's compute dtype) within CPU_PASS_BYTES, at least 1; None
  elsewhere (the whole batch in one pass: GPUs and TPUs run large batches fastest)."""
  if (platform or jax.default_backend()) != "cpu":
    return None
  vision = bundle.config.vision
  per_view = tower_kinds.of(vision).activation_elements(vision) * jnp.dtype(bundle.dtype).itemsize
  return max(1, CPU_PASS_BYTES // per_view)


def in_passes(tower: Callable, views: jax.Array, per_pass: int | None) -> jax.Array:
  """tower(views) [B, ...] computed `per_pass` views at a time (lax.map over the whole passes,
  then the rest in one call); per_pass None or >= B: one call."""
  count = views.shape[0]
  if per_pass is None or per_pass >= count:
    return tower(views)
  whole = count // per_pass * per_pass
  passes = views[:whole].reshape(count // per_pass, per_pass, *views.shape[1:])
  out = jax.lax.map(tower, passes)
  out = out.reshape(whole, *out.shape[2:])
  if whole < count:
    out = jnp.concatenate([out, tower(views[whole:])])
  return out


def fresh_view_encoder(
  bundle: CLIPBundle,
  config,
  classifier: WeightedTextClassifier,
  per_pass: int | None | str = "device",
) -> tuple[Callable, Any]:
  """(encode, encoder) of `make_train_step` for fresh views (config.views = 0).

  encode(encoder, (pixels, sizes, indices, step)) draws one augmented view of each image of a
  step's batch on the device (`augment.device_views`: config.augment_scale, a flip with p = 0.5,
  seeded by (config.seed, step, image index), so a resumed run draws the same views), runs the
  frozen image tower on them in config.image_dtype (`image_bundle`) and returns their unit
  features [B, E]. encoder: the image tower's params and the seed, replicated on the prompt
  mesh (arguments of the step, never constants of its program). per_pass: views per image-tower
  pass ("device": `fresh_view_passes`' rule; None: the whole batch in one pass); a view's
  features do not depend on the others in its pass.
  """
  images = image_bundle(bundle, config)
  if per_pass == "device":
    per_pass = fresh_view_passes(images)
  tower = images.image_function
  size = images.config.vision.image_size
  mean, std = images.preprocess_config.mean, images.preprocess_config.std
  scale = tuple(float(x) for x in config.augment_scale)

  def encode(encoder, inputs):
    params, seed = encoder
    pixels, sizes, indices, step = inputs
    base = jax.random.fold_in(jax.random.key(seed), step)
    keys = jax.vmap(lambda index: jax.random.fold_in(base, index))(indices)
    views = augment.device_views(pixels, sizes, keys, size, mean, std, scale=scale)
    features = in_passes(lambda v: tower(params, v, False), views, per_pass)
    return encoding.l2_normalize_jax(features)

  # The image tower reads its own params and the logit scale (the text tower's are not sent).
  params = {key: bundle.params[key] for key in ("vision", "logit_scale")}
  encoder = (
    jax.tree_util.tree_map(classifier.replicate, params),
    classifier.replicate(np.uint32(config.seed)),
  )
  return encode, encoder


@dataclasses.dataclass(frozen=True, eq=False)
class TrainedMethod:
  """What `train_method` returns.

  method: the Method trained; steps: the run's steps; zero_shot, trained: `accuracy_report`s
  of the classifier at w = 1 (before training) and after it; weights: SToRI's token weights,
  one row per trainable prompt (`gather_token_weights`), and words: its word weights
  (`report.prompt_word_weights`), both None for TaskRes; history: the logged records.
  """

  method: Method
  steps: int
  zero_shot: dict[str, Any]
  trained: dict[str, Any]
  weights: list[np.ndarray] | None
  words: list[list[tuple[str, float]]] | None
  history: list[dict[str, Any]]


def make_method(
  config, bundle: CLIPBundle, classifier: WeightedTextClassifier, steps_per_epoch: int
) -> Method:
  """The config's method (`config.method`, SToRI where a config has no such key) over
  config.epochs epochs of `steps_per_epoch` steps."""
  total_steps = config.epochs * steps_per_epoch
  return methods.of(config).build(config, bundle, classifier, total_steps, steps_per_epoch)


def train_method(
  config,
  bundle: CLIPBundle,
  classifier: WeightedTextClassifier,
  split: datasets.FewShotSplit,
  train_inputs: np.ndarray | augment.ImageCanvas,
  test_features: np.ndarray,
  workdir: str,
  *,
  is_main: bool = True,
  keep_checkpoints: int = 2,
  desc: str | None = None,
) -> TrainedMethod:
  """Trains the config's method on cached features and a classifier's prompts in `workdir`
  (resumed from its checkpoint when there is one), and writes the few-shot run's files there:
  history.jsonl, training_curve.png and, for SToRI, weights.json and interpretability.html/.png.

  The one training of the few-shot package: `run` (stori_jax.train) and the pairwise study's
  `pairwise_contrast.train_pair` call it.

  Args:
    config: a few-shot config (method, seed, batch_size, epochs, optim / taskres, the
      intervals); a config without `method` trains SToRI.
    bundle, classifier: the model and the classifier over its prompt bank.
    split: the class names and labels of the features.
    train_inputs: `encode_split`'s: cached features float32 [N, V, E], V augmented views per
      training image, each step showing one view per image drawn per (seed, epoch); or the
      images (`augment.ImageCanvas`, config.views = 0), each step drawing a fresh view of each
      on the device and running the image tower in the step (`fresh_view_encoder`).
    test_features: float32 [M, E].
    workdir: the run's folder (its checkpoints/ and files).
    is_main: this process writes the files and says that it resumed (process 0 of several).
    keep_checkpoints: how many checkpoints are kept.
    desc: the progress bar's label (default "train <method>").

  Raises:
    NonFiniteError: the run diverged (NaN or infinity); the last good checkpoint is kept.
  """
  train_labels, test_labels = split.train_labels, split.test_labels
  zero_shot = accuracy_report(
    classifier.embed(classifier.init_log_weights()), test_features, test_labels, split.class_names
  )
  steps_per_epoch = len(epoch_batches(len(train_labels), config.batch_size, config.seed, 0))
  total_steps = config.epochs * steps_per_epoch
  entry = methods.of(config)
  method = make_method(config, bundle, classifier, steps_per_epoch)
  fresh = isinstance(train_inputs, augment.ImageCanvas)
  if fresh:
    encode, encoder = fresh_view_encoder(bundle, config, classifier)
    train_step = make_train_step(method, bundle.logit_scale, encode)
  else:
    encoder, train_step = None, make_train_step(method, bundle.logit_scale)
  embed = jax.jit(method.class_embeddings)
  state = init_train_state(method, method.init(), NamedSharding(classifier.mesh, PartitionSpec()))
  spec = loop.LoopSpec(
    total_steps=total_steps,
    workdir=workdir,
    checkpointer=TrainCheckpointer(os.path.join(workdir, "checkpoints"), keep=keep_checkpoints),
    watch=NonFiniteWatch(
      "training",
      f"The likely cause is the learning rate (config.{entry.lr_key} = "
      f"{entry.learning_rate(config):g}; the paper's are 1e-2 "
      f"to 0.1): lower it.",
    ),
    log_every=config.log_every,
    # Each epoch's first step too: its learning rate ("lr") is in the history whatever
    # log_every is (1-shot DTD or the demo has fewer steps per epoch than log_every).
    log_also=lambda done: (done - 1) % steps_per_epoch == 0,
    checkpoint_every=config.checkpoint_every,
    eval_every=config.eval_every,
    # Fresh views: the next batches' images are gathered (and sent) while the step runs.
    prefetch=2 if fresh else 0,
    desc=desc or f"train {method.name}",
  )
  state, first_step = loop.resume(
    spec, state, trained=lambda state: state["params"], announce=is_main
  )
  history = report.read_history(workdir, first_step) if is_main else []

  @functools.lru_cache(maxsize=1)
  def epoch_plan(epoch):
    """The epoch's index batches, and the cached view each training image shows in it."""
    batches = epoch_batches(len(train_labels), config.batch_size, config.seed, epoch)
    if fresh:
      return batches, None
    views = np.random.default_rng((config.seed, epoch, 1)).integers(
      0, train_inputs.shape[1], len(train_labels)
    )
    return batches, views

  def batch_for_step(step):
    epoch, index = divmod(step, steps_per_epoch)
    batches, views = epoch_plan(epoch)
    index = batches[index]
    labels = classifier.replicate(train_labels[index])
    if fresh:
      # The images, their sizes and indices, and the step: the view's seed (seed, step, image).
      place = classifier.place_batch
      inputs = (
        place(train_inputs.pixels[index]),
        place(train_inputs.sizes[index]),
        place(index.astype(np.int32)),
        classifier.replicate(np.int32(step)),
      )
      return inputs, labels
    return classifier.replicate(train_inputs[index, views[index]]), labels

  def evaluate(state, step):
    del step
    emb = embed(state["params"], method.context)
    return {
      "test_accuracy": accuracy_report(emb, test_features, test_labels, split.class_names)[
        "accuracy"
      ]
    }

  def log(record):
    epoch = (record["step"] - 1) // steps_per_epoch + 1
    record = {"step": record["step"], "epoch": epoch, **record}
    history.append(record)
    if is_main:
      report.append_history(workdir, record)

  state = loop.train_loop(
    # The context is an argument, not a constant of the step: multi-host JAX forbids closing
    # over global arrays.
    lambda state, batch: train_step(state, method.context, *batch, encoder),
    state,
    batch_for_step,
    spec,
    first_step=first_step,
    evaluate=evaluate,
    log=log,
  )

  final = to_host(embed(state["params"], method.context))
  trained = accuracy_report(final, test_features, test_labels, split.class_names)
  weights, words = entry.report(state["params"], bundle, classifier.bank, workdir, is_main)
  if is_main:
    report.plot_history(workdir, history, zero_shot["accuracy"], label=entry.label)
  return TrainedMethod(method, total_steps, zero_shot, trained, weights, words, history)


def run(
  config: ml_collections.ConfigDict,
  workdir: str,
  restart: bool = False,
  report_hooks: Mapping[str, world_scoring.ReportHook] | None = None,
) -> dict[str, Any]:
  """Trains (or resumes) and writes metrics, weights and reports to workdir.

  Args:
    config: a few-shot config (configs/demo.py, `paper_config.fewshot_config`).
    workdir: the run's folder; one made by the same config resumes from its checkpoint.
    restart: move a workdir made by another config aside (`<workdir>.old-<time>`) instead of
      refusing it.
    report_hooks: {dataset name: hook}; the split's dataset's hook scores the trained SToRI
      word weights into metrics.json (`world_scoring.ReportHook`). None:
      `world_scoring.REPORT_HOOKS` (the synthetic world's scores).

  Raises:
    ConfigError: a bad config value (before any work), or optim.lr None (the paper's rule)
      for a model whose backbone family the paper gives no rate for.
    WorkdirMismatchError: the workdir holds another run, is a file or is not writable
      (before any work).
    NonFiniteError: the run diverged (NaN or infinity); the last good checkpoint is kept.
  """

  validate_config(config)
  # optim.lr None: App. A.1's rate for the run's dataset, shots and backbone, filled in before
  # the workdir's identity (which then records the rate used) and the run.
  config = paper_config.resolve_learning_rate(config)
  claim_run(config, workdir, restart)
  started = time.time()
  # On several hosts every process computes the same host-side data; process 0 writes files.
  is_main = jax.process_index() == 0
  split = load_split(config)  # first: a missing dataset is named before a missing model
  bundle = load(config.model.source, arch=config.model.get("arch") or None)
  resolve_start_block(bundle, config.start_block, "config.start_block")
  preprocess = PreprocessConfig(
    bundle.config.vision.image_size, bundle.preprocess_config.mean, bundle.preprocess_config.std
  )
  bundle = dataclasses.replace(bundle, preprocess_config=preprocess)
  train_features, test_features = encode_split(bundle, split, config)
  trainable, fixed = prompt_texts(config, split, bundle, train_features, split.train_labels)
  mesh = prompt_mesh()
  bank = build_prompt_bank(
    bundle.tokenizer,
    split.class_names,
    trainable,
    fixed,
    bundle.config.text.context_length,
    chunk=config.chunk,
    num_shards=mesh.size,
  )
  classifier = WeightedTextClassifier(bundle, bank, config.start_block, mesh)
  # The first cross-process collective follows: line the processes up for it (see multihost).
  multihost.wait_for_all_processes("stori_jax.train: features encoded")

  result = train_method(
    config, bundle, classifier, split, train_features, test_features, workdir, is_main=is_main
  )
  method = result.method
  metrics = {
    "method": method.name,
    "dataset": split.dataset,
    "shots": config.shots,
    "seed": config.seed,
    "num_prompts": len(bank.texts),
    "num_fixed_prompts": len(bank.fixed_ids),
    "num_devices": mesh.size,
    "steps": result.steps,
    "zero_shot": result.zero_shot,
    "trained": result.trained,
    "seconds": time.time() - started,
    "config": json.loads(config.to_json_best_effort()),
  }
  hooks = world_scoring.REPORT_HOOKS if report_hooks is None else report_hooks
  metrics.update(methods.of(config).metrics(result.words, bank, split, hooks))
  if is_main:
    jsonio.write_json(os.path.join(workdir, "metrics.json"), metrics, indent=2)
  return metrics
