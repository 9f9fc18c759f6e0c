"""The baselines' training: Adam with a cosine decay from 1e-4 to 1e-5 (App. D: batch 64), run by
the project's training loop (`stori_jax.trainloop.loop`: a diverged fit stops, a stopped one
resumes from its checkpoints). Training is deterministic given the seed: batches are drawn from a
numpy Generator (`epoch_orders`) and the loss gets a jax PRNG key folded with the step.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax

from stori_jax.plumbing import paths
from stori_jax.trainloop import loop
from stori_jax.trainloop.checkpointer import NonFiniteWatch, TrainCheckpointer, nonfinite_code


@dataclasses.dataclass(frozen=True)
class TrainResult:
  """params: the trained parameters; losses: float32 [steps], every step's loss (a resumed
  fit's too: they are part of its checkpoints); seconds: the wall time of this call."""

  params: Any
  losses: np.ndarray
  seconds: float


@dataclasses.dataclass(frozen=True)
class FitSettings:
  """How a baseline is fitted (App. D): `epochs` passes over the examples in batches of
  `batch_size`, Adam with a cosine decay from `learning_rate` to `final_learning_rate`, batches
  and per-step keys drawn from `seed`."""

  epochs: int
  batch_size: int = 64
  learning_rate: float = 1e-4
  final_learning_rate: float = 1e-5
  seed: int = 0

  @classmethod
  def from_config(cls, train) -> FitSettings:
    """From config.baselines.train (keys epochs, batch_size, learning_rate,
    final_learning_rate, seed)."""
    return cls(
      epochs=int(train.epochs),
      batch_size=int(train.batch_size),
      learning_rate=float(train.learning_rate),
      final_learning_rate=float(train.final_learning_rate),
      seed=int(train.seed),
    )


class NoCheckpoints:
  """`train_loop`'s checkpointer for a fit without a workdir: keeps nothing."""

  def save(self, step: int, state: Any) -> None:
    del step, state

  def wait(self) -> None:
    pass

  def close(self) -> None:
    pass


def epoch_orders(n: int, seed: int) -> Callable[[int], np.ndarray]:
  """epoch -> int64 [n], the order in which that epoch visits the examples: the (epoch + 1)-th
  `permutation(n)` of one `np.random.default_rng(seed)`. A function of the epoch, so that a
  resumed fit sees the same batches; the draws are kept going for the next epoch and redone
  from the seed for an earlier one."""
  rng, drawn, order = None, 0, None

  def order_of(epoch: int) -> np.ndarray:
    nonlocal rng, drawn, order
    if rng is None or epoch < drawn - 1:
      rng, drawn = np.random.default_rng(seed), 0
    while drawn <= epoch:
      order, drawn = rng.permutation(n), drawn + 1
    return order

  return order_of


def fit(
  loss_fn: Callable,
  params,
  arrays: Mapping[str, np.ndarray],
  settings: FitSettings,
  *,
  desc: str = "train",
  workdir: str | None = None,
  checkpoint_every: int | None = None,
) -> TrainResult:
  """Adam with a cosine decay from learning_rate to final_learning_rate (App. D), run by
  `trainloop.loop.train_loop`: one jitted step that donates its state, no read-back per step,
  a NaN or infinity stops the fit (`NonFiniteError`), and with a workdir checkpoints that a
  rerun resumes from (to the same parameters as a fit never stopped).

  Args:
    loss_fn: (params, batch dict of arrays, key, progress) -> float32 [] loss; key is the
      step's PRNG key (the seed's key folded with the 0-based step), progress the float32
      fraction of training done before the step, in [0, 1).
    params: initial parameters (copied: the caller's arrays are not donated).
    arrays: training arrays with a common leading size N (batches index them).
    settings: epochs (each visits a fresh permutation; incomplete batches dropped), batch
      size, the two learning rates, and the seed of the permutations and per-step PRNG keys.
    desc: the progress bar's label; also names the fit in a divergence message.
    workdir: the fit's folder: checkpoints in <workdir>/checkpoints, resumed from by a fit
      with the same arguments; None: no checkpoint.
    checkpoint_every: steps between checkpoints (default: a tenth of the fit, at least 1).

  Raises:
    ValueError: no training examples.
    NonFiniteError: the loss, the gradients or the weights became NaN or infinite.
  """
  n = len(next(iter(arrays.values())))
  if n == 0:
    raise ValueError("no training examples")
  batch = min(int(settings.batch_size), n)
  per_epoch = n // batch
  steps = per_epoch * int(settings.epochs)
  total = max(steps, 1)  # the schedule's length
  learning_rate, seed = settings.learning_rate, settings.seed
  schedule = optax.cosine_decay_schedule(
    learning_rate, decay_steps=total, alpha=settings.final_learning_rate / learning_rate
  )
  optimizer = optax.adam(schedule)

  def train_step(state, batch):
    """state {"params", "opt_state", "step" int32 [], "losses" float32 [steps]}, batch
    (arrays of B examples, progress float32 []) -> (state, {"nonfinite": int32 []})."""
    chunk, done = batch
    # The seed's key made in the step: a key array closed over would be read back to the host
    # as a constant when the step compiles.
    key = jax.random.fold_in(jax.random.PRNGKey(seed), state["step"])
    loss, grads = jax.value_and_grad(loss_fn)(state["params"], chunk, key, done)
    updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    return (
      {
        "params": params,
        "opt_state": opt_state,
        "step": state["step"] + 1,
        # Kept on the device (and in the checkpoints): read once, after the last step.
        "losses": state["losses"].at[state["step"]].set(loss),
      },
      {"nonfinite": nonfinite_code(loss, grads, params)},
    )

  order_of = epoch_orders(n, seed)

  def batch_for_step(step):
    epoch, b = divmod(step, per_epoch)
    idx = order_of(epoch)[b * batch : (b + 1) * batch]
    # progress in float64 then float32, as the fit has always computed it.
    return {k: jnp.asarray(v[idx]) for k, v in arrays.items()}, jnp.float32(step / total)

  params = jax.tree_util.tree_map(jnp.array, params)
  state = {
    "params": params,
    "opt_state": optimizer.init(params),
    "step": jnp.zeros((), jnp.int32),
    "losses": jnp.zeros((steps,), jnp.float32),
  }
  start = time.perf_counter()
  if steps == 0:
    return TrainResult(state["params"], np.zeros(0, np.float32), time.perf_counter() - start)
  watch = NonFiniteWatch(
    f"{desc} training",
    f"The likely cause is the learning rate ({learning_rate:g}, "
    "config.baselines.train.learning_rate; App. D's is 1e-4): lower it.",
  )
  first_step = 0
  if workdir is None:
    checkpointer, checkpoint_every = NoCheckpoints(), steps
  else:
    checkpointer = TrainCheckpointer(paths.join(workdir, "checkpoints"), keep=2)
    checkpoint_every = checkpoint_every or max(1, -(-steps // 10))
  spec = loop.LoopSpec(
    total_steps=steps,
    workdir=workdir or "",
    checkpointer=checkpointer,
    watch=watch,
    log_every=steps,  # nothing to log before the end: the losses stay on the device
    checkpoint_every=checkpoint_every,
    prefetch=2,  # the next batches are gathered (and sent) while the step runs
    desc=desc,
    postfix=(),
  )
  if workdir is not None:
    state, first_step = loop.resume(spec, state, trained=lambda state: state["params"])
  state = loop.train_loop(
    jax.jit(train_step, donate_argnums=0), state, batch_for_step, spec, first_step=first_step
  )
  losses = np.asarray(jax.device_get(state["losses"]), np.float32)
  return TrainResult(state["params"], losses, time.perf_counter() - start)
