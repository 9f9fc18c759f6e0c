"""The few-shot methods' learning rates and TaskRes's optimiser: TaskRes's scheme as Dassl
steps it (a constant warm-up epoch, then a cosine stepped once per epoch), which the paper
configs train SToRI on too, and the demo's per-step cosine."""

from __future__ import annotations

import jax.numpy as jnp
import optax

from stori_jax.fewshot import paper_config


def cosine_schedule(lr: float, total_steps: int) -> optax.Schedule:
  """lr decayed to 0 by a cosine over total_steps, stepped every step (the demo's)."""
  return optax.cosine_decay_schedule(lr, max(total_steps, 1))


def taskres_schedule(
  lr: float,
  epochs: int,
  steps_per_epoch: int,
  warmup_epochs: int = paper_config.TASKRES_WARMUP_EPOCHS,
  warmup_lr: float = paper_config.TASKRES_WARMUP_LR,
) -> optax.Schedule:
  """TaskRes's learning rate as Dassl schedules it: step (int32 []) -> lr (float32 []).

  Dassl steps its scheduler once per epoch (after the epoch's last batch), so the rate is
  constant within an epoch: `warmup_lr` for the first `warmup_epochs` epochs (Dassl's
  ConstantWarmupScheduler), then CosineAnnealingLR(T_max=epochs) started afresh at the end of
  the warm-up (WARMUP_RECOUNT), lr * (1 + cos(pi * (e - warmup_epochs) / epochs)) / 2 in epoch e.
  T_max counts the warm-up epochs too, as Dassl's MAX_EPOCH does, so the rate never reaches 0.
  """
  per_epoch = max(int(steps_per_epoch), 1)

  def cosine(step):
    # join_schedules passes the steps since the warm-up's end: whole epochs since then.
    return lr * 0.5 * (1.0 + jnp.cos(jnp.pi * (step // per_epoch) / epochs))

  if warmup_epochs <= 0:
    return cosine
  return optax.join_schedules(
    [optax.constant_schedule(warmup_lr), cosine], boundaries=[warmup_epochs * per_epoch]
  )


def taskres_optimizer(
  lr: float,
  weight_decay: float,
  epochs: int,
  steps_per_epoch: int,
  warmup_epochs: int = paper_config.TASKRES_WARMUP_EPOCHS,
  warmup_lr: float = paper_config.TASKRES_WARMUP_LR,
) -> optax.GradientTransformation:
  """TaskRes's optimiser, Dassl's "adam": torch.optim.Adam(lr, weight_decay) on
  `taskres_schedule`.

  torch's Adam adds weight_decay * param to the gradient before the moment estimates (L2
  regularisation, unlike AdamW's decoupled decay), hence add_decayed_weights before
  scale_by_adam. Betas (0.9, 0.999) and eps 1e-8 are torch's and Dassl's defaults.
  """
  schedule = taskres_schedule(lr, epochs, steps_per_epoch, warmup_epochs, warmup_lr)
  return optax.chain(
    optax.add_decayed_weights(weight_decay),
    optax.scale_by_adam(b1=0.9, b2=0.999, eps=1e-8),
    optax.scale_by_learning_rate(schedule),
  )


def stori_schedule(config, total_steps: int) -> optax.Schedule:
  """SToRI's learning rate, step -> lr, by config.optim.schedule (`SCHEDULES`; a config without
  it: "cosine").

  "taskres": `taskres_schedule` over config.epochs epochs of total_steps / epochs steps, with
  config.optim.warmup_epochs constant epochs at config.optim.warmup_lr (the paper configs: 1 at
  1e-5, TaskRes's). "cosine": config.optim.lr decayed to 0 by a cosine over total_steps, stepped
  every step (configs/demo.py).
  """
  optim = config.optim
  if optim.get("schedule", "cosine") == "taskres":
    epochs = int(config.epochs)
    return taskres_schedule(
      float(optim.lr),
      epochs,
      total_steps // epochs,
      int(optim.warmup_epochs),
      float(optim.warmup_lr),
    )
  return cosine_schedule(optim.lr, total_steps)
