"""Table 5's LF-CBM row (Oikarinen et al. 2023), as their code Label-free-CBM builds it
(`train_lf_cbm`): concepts whose top-5 CLIP cosine is too low dropped, a linear projection W_c
of the image embedding trained to match the concepts' CLIP cosines under the cubed-cosine
similarity (`fit_projection`), concepts the projection does not match dropped, the projected
concepts standardised, and a sparse final layer fitted by GLM-SAGA (`glm_saga`, the solver
ported to JAX) with the elastic net. The recipe's settings: `paper_config.LF_CBM_DEFAULTS`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import tqdm

from mutual import paper_config
from mutual.baselines import cache, fitting
from stori_jax.plumbing import finished, jsonio, paths, workdir_layout
from stori_jax.plumbing.config_files import ConfigError
from stori_jax.trainloop import loop
from stori_jax.trainloop.checkpointer import NonFiniteWatch, TrainCheckpointer, nonfinite_code


def cubed_cosine_similarity(clip_scores, activations) -> jax.Array:
  """LF-CBM's match of a concept's activations to its CLIP scores (their
  `cos_similarity_cubed_single`): each column centred over the images, cubed, and the cosine of
  the two columns.

  Args:
    clip_scores: float [N, K], CLIP's image-concept cosines.
    activations: float [N, K], the projection's outputs.

  Returns:
    float32 [K] (NaN for a constant column, as theirs).
  """

  def prepared(x):
    x = x.astype(jnp.float32)
    x = (x - jnp.mean(x, axis=0, keepdims=True)) ** 3
    return x / jnp.linalg.norm(x, axis=0, keepdims=True)

  return jnp.sum(prepared(jnp.asarray(clip_scores)) * prepared(jnp.asarray(activations)), axis=0)


class _Stopped(Exception):
  """Raised by `fit_projection`'s evaluation once the held-out similarity stopped rising: ends
  the training loop early (the steps after the stop change nothing)."""


def _draws(n: int, batch: int, seed: int) -> Callable[[int], np.ndarray]:
  """step -> int [batch], the images of that step: the (step + 1)-th
  `choice(n, batch, replace=False)` of one `np.random.default_rng(seed)`, as train_cbm.py
  draws them one after the other (all images, in order, when batch == n). A function of the
  step, so that a resumed fit sees the same batches: the draws are kept going for the next
  step and redone from the seed for an earlier one."""
  every = np.arange(n)
  rng, drawn, last = None, 0, None

  def draw(step: int) -> np.ndarray:
    nonlocal rng, drawn, last
    if batch == n:
      return every
    if rng is None or step < drawn - 1:
      rng, drawn = np.random.default_rng(seed), 0
    while drawn <= step:
      last, drawn = rng.choice(n, batch, replace=False), drawn + 1
    return last

  return draw


#: Steps between two held-out checks of `fit_projection` (train_cbm.py's).
_CHECK_EVERY = 50


def fit_projection(
  train_x,
  train_clip,
  val_x,
  val_clip,
  *,
  steps: int = 1000,
  learning_rate: float = 1e-3,
  batch_size: int = 50000,
  seed: int = 0,
  progress: bool = True,
  workdir: str | None = None,
) -> tuple[np.ndarray, int, float]:
  """LF-CBM's concept projection W_c, trained as train_cbm.py trains it: no bias, torch's default
  initialisation U(-1/sqrt(E), 1/sqrt(E)), Adam, each step on `batch_size` images drawn without
  replacement (all of them when fewer), maximising the mean cubed-cosine similarity; every 50
  steps (and at the last) the held-out similarity is measured after the step, and the fit stops
  at the first check that does not improve on the best, keeping the best.

  Run by the project's training loop (`stori_jax.trainloop.loop.train_loop`): a NaN or infinity
  stops the fit (`NonFiniteError`), and with a workdir checkpoints in <workdir>/checkpoints
  that a rerun resumes from. The held-out check and the best weights are part of the jitted
  step (and of its checkpoints); once the fit has stopped, the remaining steps change nothing
  and the loop ends at its next evaluation (every 50 steps).

  Args:
    train_x, val_x: float [N, E] / [M, E] backbone features (here the image embeddings).
    train_clip, val_clip: float [N, K] / [M, K] CLIP image-concept cosines.
    progress: unused by the loop (its bar is always shown, as every training's).

  Returns:
    (W_c float32 [E, K], the step of the kept weights, their mean held-out similarity.)
  """
  del progress
  train_x = jnp.asarray(train_x, jnp.float32)
  train_clip = jnp.asarray(train_clip, jnp.float32)
  val_x = jnp.asarray(val_x, jnp.float32)
  val_clip = jnp.asarray(val_clip, jnp.float32)
  n, width = train_x.shape
  steps = int(steps)
  bound = 1.0 / np.sqrt(width)
  weight = jax.random.uniform(
    jax.random.PRNGKey(seed), (width, train_clip.shape[1]), jnp.float32, -bound, bound
  )
  optimizer = optax.adam(learning_rate)

  def loss_fn(w, idx):
    return -jnp.mean(cubed_cosine_similarity(train_clip[idx], train_x[idx] @ w))

  def held_out(w):
    return jnp.mean(cubed_cosine_similarity(val_clip, val_x @ w))

  def train_step(state, idx):
    """state {"weight", "opt_state", "step" int32 [], "best" float32 [], "best_step" int32 [],
    "best_weight", "stopped" bool []}, idx int [B] -> (state, {"nonfinite": int32 []})."""

    def run(state):
      loss, grads = jax.value_and_grad(loss_fn)(state["weight"], idx)
      updates, opt_state = optimizer.update(grads, state["opt_state"], state["weight"])
      weight = optax.apply_updates(state["weight"], updates)
      step = state["step"]
      due = (step % _CHECK_EVERY == 0) | (step == steps - 1)
      similarity = jax.lax.cond(due, held_out, lambda w: jnp.float32(jnp.nan), weight)
      # Their rule: the first check is kept; later, stop as soon as a check does not improve.
      better = due & ((step == 0) | (similarity > state["best"]))
      return {
        "weight": weight,
        "opt_state": opt_state,
        "step": step + 1,
        "best": jnp.where(better, similarity, state["best"]),
        "best_step": jnp.where(better, step, state["best_step"]),
        "best_weight": jnp.where(better, weight, state["best_weight"]),
        "stopped": due & ~better,
      }, nonfinite_code(loss, grads, weight)

    def skip(state):
      return {**state, "step": state["step"] + 1}, jnp.zeros((), jnp.int32)

    state, code = jax.lax.cond(state["stopped"], skip, run, state)
    return state, {"nonfinite": code}

  at_stop = {}

  def stop_when_stopped(state, done):
    """The loop's evaluation: ends it, keeping its state, once the fit has stopped."""
    del done
    if bool(state["stopped"]):
      at_stop["state"] = state
      raise _Stopped
    return {}

  state = {
    "weight": weight,
    "opt_state": optimizer.init(weight),
    "step": jnp.zeros((), jnp.int32),
    "best": jnp.float32(-jnp.inf),
    "best_step": jnp.zeros((), jnp.int32),
    "best_weight": jnp.array(weight),  # its own buffer: the step donates both
    "stopped": jnp.zeros((), bool),
  }
  watch = NonFiniteWatch(
    "LF-CBM's concept projection",
    f"The likely cause is the learning rate ({learning_rate:g}, "
    "config.baselines.lf_cbm.proj_learning_rate; LF-CBM's is 1e-3): lower it.",
  )
  if workdir is None:
    checkpointer, checkpoint_every = fitting.NoCheckpoints(), steps
  else:
    checkpointer = TrainCheckpointer(paths.join(workdir, "checkpoints"), keep=2)
    checkpoint_every = max(1, -(-steps // 10))
  spec = loop.LoopSpec(
    total_steps=steps,
    workdir=workdir or "",
    checkpointer=checkpointer,
    watch=watch,
    log_every=steps,
    checkpoint_every=checkpoint_every,
    eval_every=_CHECK_EVERY,
    prefetch=2,  # the next draws are made while the step runs
    desc="LF-CBM projection",
    postfix=(),
  )
  first_step = 0
  if workdir is not None:
    state, first_step = loop.resume(spec, state, trained=lambda state: state["best_weight"])
  draw = _draws(n, min(int(batch_size), n), seed)
  try:
    state = loop.train_loop(
      jax.jit(train_step, donate_argnums=0),
      state,
      lambda step: jnp.asarray(draw(step)),
      spec,
      first_step=first_step,
      evaluate=stop_when_stopped,
    )
  except _Stopped:
    state = at_stop["state"]
  best = jax.device_get({k: state[k] for k in ("best_weight", "best_step", "best")})
  return np.asarray(best["best_weight"]), int(best["best_step"]), float(best["best"])


@dataclasses.dataclass(frozen=True)
class SagaResult:
  """`glm_saga`'s fit: weight float32 [K, C], bias float32 [C]; objectives float32 [epochs], the
  elastic-net objective after each full epoch; converged: stopped by the tolerance."""

  weight: np.ndarray
  bias: np.ndarray
  objectives: np.ndarray
  converged: bool


def glm_saga(
  x,
  labels,
  num_classes: int,
  *,
  lam: float,
  alpha: float = 0.99,
  step_size: float = 0.1,
  epochs: int = 80,
  batch_size: int = 256,
  tol: float = 1e-4,
  seed: int = 0,
  progress: bool = True,
) -> SagaResult:
  """LF-CBM's sparse final layer: the glm_saga package's proximal SAGA (Wong et al. 2021) in JAX.

  Minimises mean cross-entropy(x W + b) + lam' (alpha |W|_1 + (1 - alpha) / 2 |W|^2), the bias
  unpenalised, with lam' = lam / alpha (glm_saga's path of one lambda when LF-CBM hands it
  `max_reg` = lam). From W = b = 0, each epoch visits a fresh permutation in batches of
  `batch_size` (the last one smaller); a batch's gradient is SAGA's (its examples' new logit
  gradients, minus the ones stored for them, plus the stored average; a table [N, C] holds the
  last logit gradient of every example), then the elastic net's proximal step,
  soft-threshold(W, step lam' alpha) / (1 + step lam' (1 - alpha)). It stops (without that
  update) once an update would move (W, b) by at most `tol` in L2 norm, or after `epochs`.

  Args:
    x: float [N, K] (LF-CBM standardises its concept activations first); labels: int [N].

  Returns:
    SagaResult. The table is on the device: N x C float32 (ImageNet: 5 GB).
  """
  x = np.asarray(x, np.float32)
  n, width = x.shape
  classes = int(num_classes)
  strength = float(lam) / max(0.001, float(alpha))
  threshold = step_size * strength * alpha
  shrink = 1.0 + step_size * strength * (1.0 - alpha)
  # Row n is padding: its features and stored gradient stay 0.
  xs = jnp.concatenate([jnp.asarray(x), jnp.zeros((1, width), jnp.float32)])
  ys = jnp.concatenate([jnp.asarray(labels, jnp.int32), jnp.zeros((1,), jnp.int32)])
  batch = min(int(batch_size), n)
  per_epoch = -(-n // batch)

  def one_batch(carry, idx):
    w, b, table, w_avg, b_avg, stopped, loss_sum = carry
    mask = (idx < n).astype(jnp.float32)
    count = jnp.sum(mask)
    batch_x = xs[idx]
    logits = batch_x @ w + b
    target = jax.nn.one_hot(ys[idx], classes)
    loss = jnp.sum(optax.softmax_cross_entropy(logits, target) * mask)
    new = (jax.nn.softmax(logits) - target) * mask[:, None]
    old = table[idx]
    w_grad, w_old = batch_x.T @ new / count, batch_x.T @ old / count
    b_grad, b_old = jnp.sum(new, axis=0) / count, jnp.sum(old, axis=0) / count
    w_new = w - step_size * (w_grad - w_old + w_avg)
    w_new = jnp.sign(w_new) * jnp.maximum(jnp.abs(w_new) - threshold, 0.0) / shrink
    b_new = b - step_size * (b_grad - b_old + b_avg)
    live = jnp.logical_not(stopped)
    table = table.at[idx].set(jnp.where(live, new, old))
    w_avg = w_avg + jnp.where(live, (w_grad - w_old) * count / n, 0.0)
    b_avg = b_avg + jnp.where(live, (b_grad - b_old) * count / n, 0.0)
    moved = jnp.sqrt(jnp.sum((w_new - w) ** 2) + jnp.sum((b_new - b) ** 2))
    stop = live & (moved <= tol)
    apply = live & jnp.logical_not(stop)
    w, b = jnp.where(apply, w_new, w), jnp.where(apply, b_new, b)
    loss_sum = loss_sum + jnp.where(live, loss, 0.0)
    return (w, b, table, w_avg, b_avg, stopped | stop, loss_sum), None

  @functools.partial(jax.jit, donate_argnums=0)
  def epoch(carry, order):
    carry = (*carry[:-1], jnp.zeros((), jnp.float32))
    carry, _ = jax.lax.scan(one_batch, carry, order)
    w = carry[0]
    penalty = strength * (alpha * jnp.sum(jnp.abs(w)) + 0.5 * (1.0 - alpha) * jnp.sum(w**2))
    return carry, carry[-1] / n + penalty

  carry = (
    jnp.zeros((width, classes), jnp.float32),
    jnp.zeros((classes,), jnp.float32),
    jnp.zeros((n + 1, classes), jnp.float32),
    jnp.zeros((width, classes), jnp.float32),
    jnp.zeros((classes,), jnp.float32),
    jnp.zeros((), bool),
    jnp.zeros((), jnp.float32),
  )
  rng = np.random.default_rng(seed)
  objectives, converged = [], False
  bar = tqdm(range(int(epochs)), desc="LF-CBM final layer (GLM-SAGA)", disable=not progress)
  for _ in bar:
    order = np.full(per_epoch * batch, n, np.int32)
    order[:n] = rng.permutation(n)
    carry, objective = epoch(carry, jnp.asarray(order.reshape(per_epoch, batch)))
    if bool(carry[5]):
      converged = True
      break
    objectives.append(float(objective))
  bar.close()
  return SagaResult(
    np.asarray(carry[0]), np.asarray(carry[1]), np.asarray(objectives, np.float32), converged
  )


@dataclasses.dataclass(frozen=True)
class LabelFreeCBM:
  """A trained LF-CBM: image embedding -> standardised concept activations -> sparse classifier.

  Attributes:
    concepts: int32 [K], the kept descriptors (indices into the bank).
    projection: float32 [E, K], W_c (transposed).
    mean, std: float32 [K], the training activations' mean and standard deviation (ddof 1).
    weight: float32 [K, C], W_g (transposed); bias: float32 [C].
  """

  concepts: np.ndarray
  projection: np.ndarray
  mean: np.ndarray
  std: np.ndarray
  weight: np.ndarray
  bias: np.ndarray

  def concept_activations(self, embeddings) -> np.ndarray:
    """embeddings float [B, E] (unnormalised) -> float32 [B, K]."""
    x = np.asarray(embeddings, np.float32) @ self.projection
    return (x - self.mean) / self.std

  def logits(self, embeddings) -> np.ndarray:
    """embeddings float [B, E] (unnormalised) -> float32 [B, C]."""
    return self.concept_activations(embeddings) @ self.weight + self.bias


def lf_cbm_settings(config) -> dict:
  """config.baselines.lf_cbm over paper_config.LF_CBM_DEFAULTS (a config without the section
  gets the defaults), checked.

  Raises:
    ConfigError naming every bad value.
  """
  settings = dict(paper_config.LF_CBM_DEFAULTS)
  given = config.get("lf_cbm", None)
  if given is not None:
    settings.update(given.to_dict() if hasattr(given, "to_dict") else dict(given))
  unknown = set(settings) - set(paper_config.LF_CBM_DEFAULTS)
  problems = [f"unknown keys {sorted(unknown)}"] if unknown else []
  rules = dict(
    clip_cutoff=(lambda v: -1 <= v < 1, "a cosine in [-1, 1)"),
    interpretability_cutoff=(lambda v: -1 <= v < 1, "a similarity in [-1, 1)"),
    proj_steps=(lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
    proj_batch_size=(lambda v: isinstance(v, int) and v >= 2, "an integer >= 2"),
    proj_learning_rate=(lambda v: v > 0, "> 0"),
    lam=(lambda v: v >= 0, ">= 0"),
    alpha=(lambda v: 0 < v <= 1, "in (0, 1]"),
    step_size=(lambda v: v > 0, "> 0"),
    n_iters=(lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
    saga_batch_size=(lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
    tol=(lambda v: v >= 0, ">= 0"),
    val_fraction=(lambda v: 0 < v < 1, "in (0, 1)"),
  )
  for key, (ok, meaning) in rules.items():
    value = settings.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
      problems.append(f"config.baselines.lf_cbm.{key} must be {meaning}, got {value!r}")
  if problems:
    raise ConfigError(
      "; ".join(problems) + " (LF-CBM's recipe: mutual.paper_config.LF_CBM_DEFAULTS)."
    )
  return settings


def _lf_cbm_unit(workdir: str, inputs: Mapping[str, Any]) -> tuple[finished.Unit, str]:
  """The trained model as a unit of work: <workdir>/lf_cbm.npz, its record in the parent
  folder's finished/ (the baselines' folder: `workdir_layout.baseline_record`); -> (the unit,
  the model file's path relative to the unit's folder)."""
  name = workdir.rstrip("/").replace("\\", "/").rsplit("/", 1)[-1]
  unit = finished.Unit(
    paths.parent(workdir), "LF-CBM", workdir_layout.baseline_record(name), dict(inputs)
  )
  return unit, f"{name}/{workdir_layout.LF_CBM_MODEL}"


def train_lf_cbm(
  cached: cache.CachedFeatures,
  descriptor_embeddings: np.ndarray,
  num_classes: int,
  settings: Mapping[str, Any] | None = None,
  *,
  seed: int = 0,
  progress: bool = True,
  workdir: str | None = None,
) -> tuple[LabelFreeCBM, dict]:
  """Trains Table 5's LF-CBM on the cached image embeddings, following train_cbm.py:

  1. CLIP's concept scores: the cosines of the image embeddings with the descriptors (the same
     CLIP is backbone and concept scorer: Table 5's models all use the analysed CLIP).
  2. Concepts whose mean top-5 score over the training images is <= clip_cutoff are dropped.
  3. W_c (`fit_projection`) on the training images less a held-out `val_fraction` (seeded),
     which steers its early stop; concepts whose held-out cubed-cosine similarity is <=
     interpretability_cutoff are dropped.
  4. The activations of every training image, standardised by their mean and std (ddof 1),
     and the sparse final layer (`glm_saga`).

  Args:
    cached: the training images (their `embeddings` and labels).
    descriptor_embeddings: float [D, E], the bank's unit descriptor embeddings (each
      descriptor in config.analysis.bank_template, as every baseline and the analysis use it).
    settings: `lf_cbm_settings`' keys (default: paper_config.LF_CBM_DEFAULTS).
    workdir: the finished model is kept in <workdir>/lf_cbm.npz and a rerun with the same
      settings and data sizes loads it (`stori_jax.plumbing.finished`: a damaged file is said
      in one line and the model trained again).

  Returns:
    (LabelFreeCBM, record): the record holds descriptors, after_clip_cutoff,
    after_interpretability_cutoff, projection_step, held_out_similarity, saga_epochs,
    converged, objective, nonzero_weights (|w| > 1e-5, their count) and seconds.

  Raises:
    ConfigError: no concept survives a cutoff (names the setting to lower), or fewer than 4
      training images.
  """
  s = {**paper_config.LF_CBM_DEFAULTS, **dict(settings or {})}
  model_unit = model_file = None
  if workdir is not None:
    model_unit, model_file = _lf_cbm_unit(
      workdir,
      dict(
        settings=s,
        seed=int(seed),
        num_classes=int(num_classes),
        images=len(cached),
        descriptors=list(np.shape(descriptor_embeddings)),
      ),
    )
    if finished.check(model_unit) is not None:
      with paths.open(model_unit.path(model_file), "rb") as f, np.load(f) as saved:
        model = LabelFreeCBM(*(saved[f.name] for f in dataclasses.fields(LabelFreeCBM)))
        record = json.loads(str(saved["record"]))
      return model, record
  start = time.perf_counter()
  embeddings = cache.embeddings_of(cached, "LF-CBM")
  n = len(embeddings)
  if n < 4:
    raise ConfigError(
      f"LF-CBM needs at least 4 training images (2 of them held out), got {n}: raise "
      "config.baselines.data.images_per_class."
    )
  unit = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
  text = np.asarray(descriptor_embeddings, np.float32)
  text = text / np.linalg.norm(text, axis=1, keepdims=True)
  scores = unit @ text.T  # [N, D]
  order = np.random.default_rng(seed).permutation(n)
  held = min(n - 2, max(2, int(round(float(s["val_fraction"]) * n))))
  val, train = np.sort(order[:held]), np.sort(order[held:])

  top5 = np.sort(scores[train], axis=0)[-min(5, len(train)) :].mean(axis=0)
  active = np.flatnonzero(top5 > float(s["clip_cutoff"]))
  if not len(active):
    raise ConfigError(
      f"LF-CBM: no descriptor's mean top-5 CLIP cosine exceeds config.baselines.lf_cbm."
      f"clip_cutoff ({s['clip_cutoff']}; the highest is {top5.max():.3f}): lower it."
    )
  projection, best_step, best = fit_projection(
    embeddings[train],
    scores[train][:, active],
    embeddings[val],
    scores[val][:, active],
    steps=int(s["proj_steps"]),
    learning_rate=float(s["proj_learning_rate"]),
    batch_size=int(s["proj_batch_size"]),
    seed=seed,
    progress=progress,
    workdir=workdir,
  )
  similarity = np.asarray(
    cubed_cosine_similarity(scores[val][:, active], embeddings[val] @ projection)
  )
  interpretable = similarity > float(s["interpretability_cutoff"])
  if not interpretable.any():
    raise ConfigError(
      "LF-CBM: no descriptor's projection matches its CLIP scores above config.baselines."
      f"lf_cbm.interpretability_cutoff ({s['interpretability_cutoff']}; the best is "
      f"{np.nanmax(similarity):.3f}): lower it."
    )
  projection = projection[:, interpretable]
  activations = embeddings @ projection
  mean, std = activations.mean(axis=0), activations.std(axis=0, ddof=1)
  saga = glm_saga(
    (activations - mean) / std,
    cached.labels,
    num_classes,
    lam=float(s["lam"]),
    alpha=float(s["alpha"]),
    step_size=float(s["step_size"]),
    epochs=int(s["n_iters"]),
    batch_size=int(s["saga_batch_size"]),
    tol=float(s["tol"]),
    seed=seed,
    progress=progress,
  )
  model = LabelFreeCBM(
    active[interpretable].astype(np.int32),
    projection.astype(np.float32),
    mean.astype(np.float32),
    std.astype(np.float32),
    saga.weight,
    saga.bias,
  )
  record = dict(
    descriptors=int(len(text)),
    after_clip_cutoff=int(len(active)),
    after_interpretability_cutoff=int(interpretable.sum()),
    projection_step=int(best_step),
    held_out_similarity=float(best),
    saga_epochs=int(len(saga.objectives) + (1 if saga.converged else 0)),
    converged=bool(saga.converged),
    objective=float(saga.objectives[-1]) if len(saga.objectives) else float("nan"),
    nonzero_weights=int((np.abs(saga.weight) > 1e-5).sum()),
    seconds=round(time.perf_counter() - start, 3),
  )
  if model_unit is not None:
    paths.makedirs(workdir)
    written = jsonio.write_arrays_atomic(  # whole or absent: a stopped run leaves no half model
      model_unit.path(model_file),
      dict(
        record=np.array(json.dumps(record)),
        **{f.name: getattr(model, f.name) for f in dataclasses.fields(LabelFreeCBM)},
      ),
    )
    finished.finish(model_unit, {model_file: written})
  return model, record
