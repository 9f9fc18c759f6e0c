"""TaskRes (Yu et al., 2023), the paper's few-shot baseline (§4.1.3, Tables 2 and 8): a residual
added to every class's text feature, on TaskRes's own optimiser, registered as the few-shot
method "taskres"."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from stori_jax.clip import encoding
from stori_jax.fewshot import paper_config
from stori_jax.fewshot.methods.registry import FewShotMethod, Method, register
from stori_jax.fewshot.prompt_bank import PromptBank
from stori_jax.fewshot.schedules import taskres_optimizer, taskres_schedule
from stori_jax.plumbing.config_files import ConfigChecks


def taskres_base(bundle, bank: PromptBank, batch_size: int = 256) -> jax.Array:
  """TaskRes's base classifier t_c: per class, the mean of its prompts' *unnormalised* text
  features (the fixed Base prompts, and the CuPL prompts at w = 1 when the bank has them),
  float32 [C, E].

  TaskRes's `_get_base_text_features` (trainers/taskres.py) averages the raw features over the
  templates, adds alpha x_c to that mean and only then normalises: the residual's step is
  measured against the raw feature's norm, not a unit vector's. The paper does not say how
  "Base+CuPL" pools the prompts; this pools every prompt of the class alike, as for Base.
  """
  parts = [(bank.fixed_ids, bank.fixed_class)] if len(bank.fixed_ids) else []
  for bucket in bank.buckets:
    valid = bucket.class_index >= 0
    parts.append((bucket.ids[valid], bucket.class_index[valid]))
  length = max(ids.shape[1] for ids, _ in parts)
  ids = np.concatenate([np.pad(i, ((0, 0), (0, length - i.shape[1]))) for i, _ in parts])
  classes = np.concatenate([c for _, c in parts])
  features = encoding.encode_tokens(bundle, ids, batch_size=batch_size, normalize=False)
  sums = np.zeros((len(bank.class_names), features.shape[1]), np.float64)
  np.add.at(sums, classes, features)
  counts = np.bincount(classes, minlength=len(bank.class_names))
  return jnp.asarray((sums / counts[:, None]).astype(np.float32))


def taskres_method(config, base: jax.Array, total_steps: int, steps_per_epoch: int = 1) -> Method:
  """TaskRes (Yu et al., 2023): classifier normalize(t_c + alpha x_c), x_c trained from 0.

  base: t_c, float32 [C, E]: TaskRes's unnormalised mean of each class's prompt features
  (`taskres_base`; the Base prompts, and the CuPL prompts at w = 1 unless
  config.prompts.use_cupl is False). total_steps: epochs * steps_per_epoch. The optimiser is
  TaskRes's own (`taskres_optimizer`); a config without taskres.warmup_epochs / warmup_lr gets
  TaskRes's (1 epoch at 1e-5).
  """
  alpha = config.taskres.alpha

  def class_embeddings(residual, base):
    emb = base + alpha * residual
    return encoding.l2_normalize_jax(emb, eps=None)  # no floor: the old rounding under jit

  steps_per_epoch = max(int(steps_per_epoch), 1)
  settings = dict(
    epochs=max(total_steps // steps_per_epoch, 1),
    steps_per_epoch=steps_per_epoch,
    warmup_epochs=int(config.taskres.get("warmup_epochs", paper_config.TASKRES_WARMUP_EPOCHS)),
    warmup_lr=float(config.taskres.get("warmup_lr", paper_config.TASKRES_WARMUP_LR)),
  )
  lr = float(config.taskres.lr)
  optimizer = taskres_optimizer(lr, float(config.taskres.weight_decay), **settings)
  return Method(
    "taskres",
    lambda: jnp.zeros_like(base),
    class_embeddings,
    base,
    optimizer,
    schedule=taskres_schedule(lr, **settings),
  )


def _build(config, bundle, classifier, total_steps, steps_per_epoch) -> Method:
  return taskres_method(config, taskres_base(bundle, classifier.bank), total_steps, steps_per_epoch)


def _check(checks: ConfigChecks, selected: bool) -> None:
  """config.taskres: alpha, the learning rate, weight decay and warm-up (checked wherever a
  config holds the block)."""
  del selected
  checks.number("taskres.alpha", minimum=0)
  checks.number("taskres.lr", above=0)
  checks.number("taskres.weight_decay", minimum=0)
  checks.integer("taskres.warmup_epochs", minimum=0)
  checks.number("taskres.warmup_lr", above=0)


def _paper_learning_rate(config) -> float:
  """App. A.1's TaskRes rate, by dataset (`paper_config.fewshot_config`'s taskres.lr)."""
  return float(paper_config.fewshot_config(str(config.data.name), int(config.shots)).taskres.lr)


TASKRES = register(
  FewShotMethod(
    name="taskres",
    label="TaskRes",
    build=_build,
    lr_key="taskres.lr",
    warmup_block=lambda config: "taskres",
    paper_learning_rate=_paper_learning_rate,
    check=_check,
  )
)
