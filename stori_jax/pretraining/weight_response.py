"""Weight-response training: teaches a CLIP text tower to respond to SToRI's token weights at
its reweighted blocks, the way the paper reports for real CLIP (Sec. 4.2, Fig. 5, Table 3).

Real CLIP learns this from 400M captions; a 64-wide tower trained on the synthetic world
does not: it folds each word into the words after it in its first blocks, so reweighting
blocks 4-6 of 6 moves retrieval by thousandths (measured: dAP 0.000 at w = 1.5, and weight 0
on "red" leaves the top 16 images 96% red). This stage fine-tunes the text tower alone (the
image tower and the temperature stay as they are) against the frozen tower it starts from
(the teacher t), on captions of the world with one attribute word c_k given weight w:

* keep: student(c) = t(c), so plain prompts, zero-shot accuracy and retrieval do not move;
* respond: student(c, w on word k, blocks b..L) = normalise(t(c \\ k) + w (t(c) - t(c \\ k))),
  i.e. weight 0 is the caption without the word, weight 1 the caption, and other weights
  scale the word's contribution, what a user who writes "(red:1.5)" asks for. `c \\ k` is the
  caption with the word deleted.

Both terms are 1 - cosine of unit features. This goes beyond the papers (neither trains the
text tower); it gives the embedded world a model on which the method's effects are visible.
Batches are a function of (seed, step) and the state is checkpointed with orbax: a killed run
resumes to the same result. The exported model stores `text.default_start_block`.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from stori_jax.plumbing import paths, run_identity
from stori_jax.trainloop import loop, metrics_log
from stori_jax.clip.bundle import CLIPBundle, resolve_start_block
from stori_jax.trainloop.checkpointer import nonfinite_code
from stori_jax.checkpoints import native
from stori_jax.plumbing.config_files import ConfigChecks
from stori_jax.data import synthetic
from stori_jax.clip.encoding import l2_normalize_jax
from stori_jax.clip.loading import ASSETS_DIR, load, named_checkpoints
from stori_jax.models import CLIP, reweighted_block_indices
from stori_jax.pretraining.contrastive import export_path, loop_spec
from stori_jax.tokenizer import default_tokenizer
from stori_jax.tokenizer.weighted import tokenize_weighted

#: Words whose weight is trained: every attribute word of the world.
ATTRIBUTE_WORDS = tuple(sorted({w for ws in synthetic.ATTRIBUTE_WORDS.values() for w in ws}))
_WORD_RE = re.compile(r"\b(" + "|".join(ATTRIBUTE_WORDS) + r")\b")
#: Config keys besides run_identity.SCHEDULE_KEYS that do not change the trained weights: the
#: default start block written into the exported config (the export is rewritten at the end of
#: every run, so a finished run re-run with another value only re-exports).
IDENTITY_IGNORED = ("default_start_block",)


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Checks every value for type and range before any work; one ConfigError names them all."""
  checks = ConfigChecks(config)
  checks.text("stage", nonempty=True)
  checks.text("init_from", nonempty=True)
  checks.integer("seed", minimum=0)
  checks.integer("start_block", minimum=1)
  checks.integer("default_start_block", minimum=1)
  checks.numbers("weights", minimum=0, maximum=4)
  checks.integer("captions", minimum=1)
  checks.number("template_fraction", minimum=0, maximum=1)
  checks.integer("text_length", minimum=8)
  checks.integer("batch_size", minimum=1)
  total = checks.integer("total_steps", minimum=1)
  checks.integer("warmup_steps", minimum=0, maximum=None if total is None else total - 1)
  checks.number("learning_rate", above=0)
  checks.number("end_learning_rate_fraction", minimum=0, maximum=1)
  for key in ("log_every", "checkpoint_every", "keep_checkpoints"):
    checks.integer(key, minimum=1)
  checks.text("export_dir", nonempty=True)
  checks.choice("export_dtype", ("float32", "float16", "bfloat16"))
  checks.raise_if_any()


def caption_pool(config) -> list[str]:
  """The captions trained on: the world's captions, and a `template_fraction` share of
  "a photo of a {colour} {pattern} {shape}" prompts (the form users and the retrieval
  protocol write)."""
  n_templates = int(round(config.captions * config.template_fraction))
  captions = list(synthetic.random_captions(config.captions - n_templates, (config.seed, 0)))
  rng = np.random.default_rng((config.seed, 1))
  for _ in range(n_templates):
    words = [rng.choice(v) for v in (synthetic.COLOURS, synthetic.PATTERNS, synthetic.SHAPES)]
    article = "an" if words[0][0] in "aeiou" else "a"
    captions.append(f"a photo of {article} {' '.join(words)}")
  return captions


def batch_for_step(config, pool: list[str], step: int) -> dict[str, np.ndarray]:
  """One step's batch: for `batch_size` captions of the pool, one attribute word each with a
  weight from `config.weights`.

  Returns:
    {"ids": int32 [B, T] the captions, "log_weights": float32 [B, T] (-inf at weight 0),
     "ids_without": int32 [B, T] the captions without the word, "weights": float32 [B]}.
  """
  rng = np.random.default_rng((config.seed, 2, step))
  choices = np.asarray(config.weights, np.float32)
  weighted, without, weights = [], [], []
  for index in rng.integers(0, len(pool), config.batch_size):
    caption = pool[index]
    words = list(_WORD_RE.finditer(caption))
    word = words[rng.integers(len(words))]
    weight = float(choices[rng.integers(len(choices))])
    weighted.append(f"{caption[: word.start()]}({word.group(0)}:{weight:g}){caption[word.end() :]}")
    without.append(" ".join((caption[: word.start()] + caption[word.end() :]).split()))
    weights.append(weight)
  tokenizer = default_tokenizer()
  ids, token_weights = tokenize_weighted(tokenizer, weighted, context_length=config.text_length)
  with np.errstate(divide="ignore"):  # log 0 = -inf excludes the token
    log_weights = np.log(token_weights).astype(np.float32)
  return {
    "ids": ids,
    "log_weights": log_weights,
    "ids_without": tokenizer(without, context_length=config.text_length),
    "weights": np.asarray(weights, np.float32),
  }


def _unit_features(x: jax.Array) -> jax.Array:
  # No floor: the shipped model was trained with exactly this rounding (see l2_normalize_jax).
  return l2_normalize_jax(x, eps=None)


def make_train_step(config, model: CLIP, teacher: dict, blocks: tuple[int, ...], optimizer):
  """The jitted step over state {"text": params, "opt_state", "step"}; donates the state."""

  def encode(params, ids, log_weights=None):
    return _unit_features(
      model.apply(
        {"params": params},
        ids,
        log_weights,
        blocks if log_weights is not None else (),
        method=CLIP.encode_text,
      )
    )

  def loss_fn(text_params, batch):
    student = {**teacher, "text": text_params}
    full, without = encode(teacher, batch["ids"]), encode(teacher, batch["ids_without"])
    target = _unit_features(without + batch["weights"][:, None] * (full - without))
    keep = jnp.mean(1 - jnp.sum(encode(student, batch["ids"]) * full, -1))
    respond = jnp.mean(
      1 - jnp.sum(encode(student, batch["ids"], batch["log_weights"]) * target, -1)
    )
    return keep + respond, {"keep": keep, "respond": respond}

  def train_step(state, batch):
    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["text"], batch)
    updates, opt_state = optimizer.update(grads, state["opt_state"], state["text"])
    text = optax.apply_updates(state["text"], updates)
    metrics = {**metrics, "loss": loss, "nonfinite": nonfinite_code(loss, grads, text)}
    return {"text": text, "opt_state": opt_state, "step": state["step"] + 1}, metrics

  return jax.jit(train_step, donate_argnums=0)


def train(config, workdir: str, restart: bool = False):
  """Runs (or resumes) weight-response training; returns the trained model as a bundle.

  Raises ConfigError / WorkdirMismatchError before any work, NonFiniteError on divergence
  (the last good checkpoint kept), as `stori_jax.pretraining.contrastive.train` does.
  """
  validate_config(config)
  base = load(config.init_from)
  layers = base.config.text.layers
  for key in ("start_block", "default_start_block"):
    resolve_start_block(base, config[key], f"config.{key}")
  run_identity.claim_run(
    workdir,
    {"config": config, "init_from": base.source, "init_config": base.config.to_dict()},
    what="weight-response run",
    restart=restart,
    ignore=IDENTITY_IGNORED,
  )
  teacher = jax.tree_util.tree_map(lambda p: jnp.asarray(p, jnp.float32), base.params)
  model = CLIP(base.config)
  blocks = reweighted_block_indices(layers, config.start_block)
  schedule = optax.warmup_cosine_decay_schedule(
    0.0,
    config.learning_rate,
    config.warmup_steps,
    config.total_steps,
    config.learning_rate * config.end_learning_rate_fraction,
  )
  optimizer = optax.adam(schedule)
  train_step = make_train_step(config, model, teacher, blocks, optimizer)
  spec = loop_spec(
    config, workdir, "weight-response training", desc="weight response", postfix=("keep", "respond")
  )
  text = jax.tree_util.tree_map(jnp.copy, teacher["text"])
  state = {"text": text, "opt_state": optimizer.init(text), "step": jnp.zeros((), jnp.int32)}
  state, first_step = loop.resume(spec, state, trained=lambda state: state["text"])
  metrics_path = os.path.join(workdir, "metrics.jsonl")
  metrics_log.read_records(metrics_path, up_to_step=first_step)  # drop what the resume redoes
  pool = caption_pool(config)
  state = loop.train_loop(
    train_step,
    state,
    lambda step: batch_for_step(config, pool, step),
    spec,
    first_step=first_step,
    log=lambda record: metrics_log.append_record(metrics_path, record),
  )
  params = jax.device_get({**teacher, "text": state["text"]})
  clip_config = base.config.replace(
    text=dataclasses.replace(base.config.text, default_start_block=int(config.default_start_block))
  )
  bundle = CLIPBundle(
    clip_config, params, preprocess_config=base.preprocess_config, source=paths.absolute(workdir)
  )
  export = export_path(config, workdir)
  metadata = _base_metadata(config.init_from)
  metadata.update(
    trained_by="python -m stori_jax.pretrain (weight-response stage)",
    weight_response_config=run_identity.to_jsonable(config),
  )
  native.save(
    export,
    clip_config,
    params,
    base.preprocess_config,
    metadata=metadata,
    params_dtype=config.export_dtype,
  )
  return bundle


def _base_metadata(source: str) -> dict[str, Any]:
  """The metadata of a checkpoint in this project's format (e.g. its pretraining config),
  carried over to the model trained from it; empty for other formats."""
  directory = os.path.join(ASSETS_DIR, source) if source in named_checkpoints() else source
  return native.read_metadata(directory) if native.is_native_dir(directory) else {}
