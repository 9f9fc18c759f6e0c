"""The three trained baselines of Table 1 (Sammani & Deligiannis 2024, App. D), on cached features.

All three see the same patch features (config.analysis.feature_kind of the analysed model) and
the same descriptor bank as the analysis, and are trained with optax (Adam, learning rate decayed
by a cosine schedule, App. D: batch 64, 1e-4 to 1e-5, q = 512 on ImageNet) in the project's
training loop (`stori_jax.training.loop`: a diverged fit stops, a stopped one resumes from its
checkpoints). Training is deterministic given the seed: batches are drawn from a numpy Generator
and Gumbel noise / DropBlock masks from jax PRNG keys folded with the step.

- MM-CBM (App. D.1): descriptors -> linear -> queries Q [D, q]; patch tokens -> linear ->
  keys = values K [N, q]; cross-attention softmax over the N tokens, softmax(Q K^T / sqrt(q)) K;
  a linear map to one value per descriptor and a sigmoid: the bottleneck U [D]; a linear
  classifier over the classes. Explanation of class p: the descriptors with the largest
  U * w_p, each with its attention map over the tokens as its visual concept.
- MM-ProtoSim (App. D.1): the same with a hard assignment of every token to one descriptor:
  Gumbel-softmax over the D descriptors (straight-through: one-hot forward, relaxed gradient;
  the noise fades linearly to zero over training), and the noise-free argmax at evaluation; the visual concept of a descriptor is the set of
  tokens assigned to it.
- Feature Maps (App. D.2): each channel of the patch features is an activation map; the channels
  with the largest spatial L2 norm are the concepts (the first, which covers the main object, is
  skipped by default: App. D.2 uses it as the object map, "the remaining neurons act as the
  visual concepts"); a map normalised to [0, 1] keeps its values >= 0.9 as the region. A concept
  labeler (a linear layer on the mean of the tokens of a region) is trained with binary
  cross-entropy to predict the class's descriptors from DropBlock-masked feature maps, and
  labels each region with its most likely descriptor.

Choices the paper leaves open: the 1 / sqrt(q) attention scaling; values = keys (App. D says
K = V); the token average (rather than sum) of the hard-assigned values in MM-ProtoSim; how an
attention map becomes a region (min-max normalised, kept above `region_threshold`); the labeler's
architecture and DropBlock's rate and block size. `explain` explains the class given to it: the
evaluation passes CLIP's zero-shot prediction so that every explanation in Table 1 explains the
same decision.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import tqdm

from mutual import features
from stori_jax.preprocess import normalize
from stori_jax.training import loop
from stori_jax.training.checkpointer import NonFiniteWatch, TrainCheckpointer, nonfinite_code

NAMES = ("MM-CBM", "MM-ProtoSim", "Feature Maps")
#: Each baseline's folder under `train_all`'s workdir (its checkpoints).
FOLDERS = {"MM-CBM": "mm_cbm", "MM-ProtoSim": "mm_protosim", "Feature Maps": "feature_maps"}


# ---------------------------------------------------------------------------------------------
# Cached features.


@dataclasses.dataclass(frozen=True)
class CachedFeatures:
  """Patch features of a set of images.

  Attributes:
    tokens: float [N, h, w, C] (float32 or float16: see `cache_features`).
    labels: int32 [N].
  """

  tokens: np.ndarray
  labels: np.ndarray

  def __len__(self) -> int:
    return int(self.labels.shape[0])


def encode_tokens(bundle, images, kind: str = "tokens", batch_size: int = 64) -> np.ndarray:
  """uint8 images [N, S, S, 3] -> float32 patch features [N, h, w, C], in fixed-size chunks
  (padded) so that the tower compiles once."""
  images = np.asarray(images)
  mean, std = bundle.preprocess_config.mean, bundle.preprocess_config.std
  out = []
  for start in range(0, len(images), batch_size):
    part = images[start : start + batch_size]
    real = len(part)
    if real < batch_size and len(images) > batch_size:
      part = np.concatenate([part, np.zeros((batch_size - real, *part.shape[1:]), part.dtype)])
    out.append(np.asarray(features.patch_features(bundle, normalize(part, mean, std), kind))[:real])
  return np.concatenate(out)


def cache_features(
  bundle,
  classes: Iterable,
  kind: str = "tokens",
  batch_size: int = 64,
  dtype=np.float32,
  progress: bool = True,
) -> CachedFeatures:
  """Encodes the training images once (an iterable of mutual.data.ClassImages).

  `dtype=np.float16` halves the memory (ImageNet's ViT-B/16 tokens: 300 KB per image in float32).
  """
  tokens, labels = [], []
  for cls in tqdm(classes, desc="cache features", disable=not progress, dynamic_ncols=True):
    tokens.append(encode_tokens(bundle, cls.images, kind, batch_size).astype(dtype))
    labels.append(np.full(len(cls.images), cls.label, np.int32))
  if not tokens:
    raise ValueError("no training images: the baselines need at least one class with images.")
  return CachedFeatures(np.concatenate(tokens), np.concatenate(labels))


def descriptor_targets(
  class_names: Sequence[str], per_class: Mapping[str, Sequence[str]], bank: Sequence[str]
) -> np.ndarray:
  """float32 [C, D]: 1 where descriptor d is one of class c's descriptors (App. D.2's labels)."""
  index = {d: i for i, d in enumerate(bank)}
  targets = np.zeros((len(class_names), len(bank)), np.float32)
  for c, name in enumerate(class_names):
    for d in per_class.get(name, ()):
      if d in index:
        targets[c, index[d]] = 1.0
  return targets


# ---------------------------------------------------------------------------------------------
# Training loop.


@dataclasses.dataclass(frozen=True)
class TrainResult:
  """params: the trained parameters; losses: float32 [steps], every step's loss (a resumed
  fit's too: they are part of its checkpoints); seconds: the wall time of this call."""

  params: Any
  losses: np.ndarray
  seconds: float


class _NoCheckpoints:
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
  *,
  epochs: int,
  batch_size: int = 64,
  learning_rate: float = 1e-4,
  final_learning_rate: float = 1e-5,
  seed: int = 0,
  desc: str = "train",
  progress: bool = True,
  workdir: str | None = None,
  checkpoint_every: int | None = None,
) -> TrainResult:
  """Adam with a cosine decay from learning_rate to final_learning_rate (App. D), run by
  `training.loop.train_loop`: one jitted step that donates its state, no read-back per step,
  a NaN or infinity stops the fit (`NonFiniteError`), and with a workdir checkpoints that a
  rerun resumes from (to the same parameters as a fit never stopped).

  Args:
    loss_fn: (params, batch dict of arrays, key, progress) -> float32 [] loss; key is the
      step's PRNG key (the seed's key folded with the 0-based step), progress the float32
      fraction of training done before the step, in [0, 1).
    params: initial parameters (copied: the caller's arrays are not donated).
    arrays: training arrays with a common leading size N (batches index them).
    epochs: passes over the data; each visits a fresh permutation (incomplete batches dropped).
    seed: seeds the permutations and the per-step PRNG keys.
    desc: the progress bar's label; also names the fit in a divergence message.
    progress: unused by the loop, whose progress bar is always shown (kept for the callers).
    workdir: the fit's folder: checkpoints in <workdir>/checkpoints, resumed from by a fit
      with the same arguments; None: no checkpoint.
    checkpoint_every: steps between checkpoints (default: a tenth of the fit, at least 1).

  Raises:
    ValueError: no training examples.
    NonFiniteError: the loss, the gradients or the weights became NaN or infinite.
  """
  del progress
  n = len(next(iter(arrays.values())))
  if n == 0:
    raise ValueError("no training examples")
  batch = min(int(batch_size), n)
  per_epoch = n // batch
  steps = per_epoch * int(epochs)
  total = max(steps, 1)  # the schedule's length
  schedule = optax.cosine_decay_schedule(
    learning_rate, decay_steps=total, alpha=final_learning_rate / learning_rate
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
    checkpointer, checkpoint_every = _NoCheckpoints(), steps
  else:
    checkpointer = TrainCheckpointer(os.path.join(workdir, "checkpoints"), keep=2)
    checkpoint_every = checkpoint_every or max(1, -(-steps // 10))
    state, first_step = loop.resume(
      checkpointer,
      state,
      watch,
      trained=lambda state: state["params"],
      total_steps=steps,
      workdir=workdir,
    )
  state = loop.train_loop(
    jax.jit(train_step, donate_argnums=0),
    state,
    batch_for_step,
    first_step=first_step,
    total_steps=steps,
    checkpointer=checkpointer,
    watch=watch,
    workdir=workdir or "",
    log_every=steps,  # nothing to log before the end: the losses stay on the device
    checkpoint_every=checkpoint_every,
    prefetch=2,  # the next batches are gathered (and sent) while the step runs
    desc=desc,
    postfix=(),
  )
  losses = np.asarray(jax.device_get(state["losses"]), np.float32)
  return TrainResult(state["params"], losses, time.perf_counter() - start)


# ---------------------------------------------------------------------------------------------
# MM-CBM and MM-ProtoSim.


class MultimodalBottleneck(nn.Module):
  """App. D.1's multimodal concept bottleneck.

  Attributes:
    num_classes: C.
    width: q, the attention width.
    attention: "softmax" (MM-CBM: softmax over the tokens) or "gumbel" (MM-ProtoSim: a hard
      assignment of each token to one descriptor).
    temperature: the Gumbel-softmax temperature.
  """

  num_classes: int
  width: int = 512
  attention: str = "softmax"
  temperature: float = 1.0

  @nn.compact
  def __call__(self, tokens, descriptors, train: bool = False, noise_scale=1.0):
    """tokens float [B, N, C], descriptors float [D, E] -> (logits float32 [B, C], bottleneck U
    float32 [B, D], attention float32 [B, D, N]). noise_scale multiplies the Gumbel noise
    (training only)."""
    # The residual stream's scale varies across channels; normalise each token first.
    tokens = nn.LayerNorm(name="token_norm")(tokens.astype(jnp.float32))
    queries = nn.Dense(self.width, name="query")(descriptors)  # [D, q]
    keys = nn.Dense(self.width, name="key")(tokens)  # [B, N, q], also the values
    scores = jnp.einsum("dq,bnq->bdn", queries, keys) / jnp.sqrt(float(self.width))
    if self.attention == "softmax":
      attention = jax.nn.softmax(scores, axis=-1)
      pooled = jnp.einsum("bdn,bnq->bdq", attention, keys)
    elif self.attention == "gumbel":
      if train:
        scores = scores + noise_scale * jax.random.gumbel(self.make_rng("gumbel"), scores.shape)
      soft = jax.nn.softmax(scores / self.temperature, axis=1)
      hard = jax.nn.one_hot(jnp.argmax(scores, axis=1), scores.shape[1], axis=1)
      attention = hard + soft - jax.lax.stop_gradient(soft)  # straight-through
      pooled = jnp.einsum("bdn,bnq->bdq", attention, keys) / scores.shape[-1]
    else:
      raise ValueError(f"attention must be 'softmax' or 'gumbel', got {self.attention!r}.")
    bottleneck = jax.nn.sigmoid(nn.Dense(1, name="concept")(pooled)[..., 0])
    logits = nn.Dense(self.num_classes, name="classifier")(bottleneck)
    return logits, bottleneck, attention


def _flat(tokens) -> jax.Array:
  tokens = jnp.asarray(tokens)
  return tokens.reshape(tokens.shape[0], -1, tokens.shape[-1])


def train_bottleneck(
  cached: CachedFeatures,
  descriptor_embeddings: np.ndarray,
  num_classes: int,
  *,
  attention: str,
  width: int,
  temperature: float = 1.0,
  epochs: int,
  batch_size: int = 64,
  learning_rate: float = 1e-4,
  final_learning_rate: float = 1e-5,
  seed: int = 0,
  progress: bool = True,
  workdir: str | None = None,
) -> tuple[MultimodalBottleneck, TrainResult]:
  """Trains MM-CBM (attention="softmax") or MM-ProtoSim ("gumbel") with cross-entropy;
  checkpoints in <workdir>/checkpoints when a workdir is given (see `fit`)."""
  model = MultimodalBottleneck(num_classes, width, attention, temperature)
  descriptors = jnp.asarray(descriptor_embeddings, jnp.float32)
  init_key, gumbel_key = jax.random.split(jax.random.PRNGKey(seed))
  params = model.init(
    {"params": init_key, "gumbel": gumbel_key}, _flat(cached.tokens[:1]), descriptors, train=True
  )["params"]

  def loss_fn(params, batch, key, progress):
    # The Gumbel noise fades linearly to zero, so that training ends in the noise-free regime
    # evaluation uses (with full noise throughout, the noise-free argmax assigns the tokens
    # differently from anything seen in training).
    logits, _, _ = model.apply(
      {"params": params},
      _flat(batch["tokens"]),
      descriptors,
      train=True,
      noise_scale=1.0 - progress,
      rngs={"gumbel": key},
    )
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()

  result = fit(
    loss_fn,
    params,
    {"tokens": cached.tokens, "labels": cached.labels},
    epochs=epochs,
    batch_size=batch_size,
    learning_rate=learning_rate,
    final_learning_rate=final_learning_rate,
    seed=seed,
    desc="MM-ProtoSim" if attention == "gumbel" else "MM-CBM",
    progress=progress,
    workdir=workdir,
  )
  return model, result


def _regions(maps: jax.Array, threshold: float) -> jax.Array:
  """Activation maps float [..., h, w] -> bool regions: values >= low + threshold (high - low)
  (min-max normalised >= threshold) and > 0 (a hard map's unassigned tokens stay out)."""
  low = jnp.min(maps, axis=(-2, -1), keepdims=True)
  high = jnp.max(maps, axis=(-2, -1), keepdims=True)
  return (maps >= low + threshold * (high - low)) & (maps > 0)


@functools.partial(jax.jit, static_argnames=("model", "n_concepts", "grid"))
def _explain_bottleneck(model, params, tokens, descriptors, predicted, n_concepts, grid, threshold):
  logits, bottleneck, attention = model.apply({"params": params}, tokens, descriptors)
  weights = params["classifier"]["kernel"]  # [D, C]
  contribution = bottleneck * weights[:, predicted].T  # U^p = U * w_p, [B, D]
  maps = attention.reshape(*attention.shape[:2], *grid)
  regions = _regions(maps, threshold)
  present = jnp.any(regions, axis=(-2, -1))
  _, ids = jax.lax.top_k(jnp.where(present, contribution, -jnp.inf), n_concepts)
  take = jnp.take_along_axis
  chosen = take(regions, ids[..., None, None], axis=1)
  valid = take(present, ids, axis=1)
  return logits, ids.astype(jnp.int32), chosen, valid, take(contribution, ids, axis=1)


def explain_bottleneck(
  model: MultimodalBottleneck,
  params,
  tokens,
  descriptor_embeddings,
  predicted,
  n_concepts: int = 5,
  region_threshold: float = 0.5,
) -> dict[str, np.ndarray]:
  """MM-CBM / MM-ProtoSim explanations of the classes `predicted`.

  Args:
    tokens: float [B, h, w, C] patch features; descriptor_embeddings: float [D, E].
    predicted: int [B], the class to explain.
    n_concepts: L, how many descriptors (largest U * w_p first) to keep.
    region_threshold: a descriptor's attention map, min-max normalised, kept >= this.

  Returns:
    dict: logits float32 [B, C]; ids int32 [B, L] descriptor ids; regions bool [B, L, h, w];
    valid bool [B, L] (False for an empty region); contribution float32 [B, L].
  """
  tokens = np.asarray(tokens)
  grid = tuple(int(s) for s in tokens.shape[1:3])
  out = _explain_bottleneck(
    model,
    params,
    _flat(tokens),
    jnp.asarray(descriptor_embeddings, jnp.float32),
    jnp.asarray(predicted),
    int(n_concepts),
    grid,
    float(region_threshold),
  )
  return dict(zip(("logits", "ids", "regions", "valid", "contribution"), map(np.asarray, out)))


# ---------------------------------------------------------------------------------------------
# Feature Maps.


def dropblock(key, shape: tuple[int, int, int], drop_rate: float, block_size: int) -> jax.Array:
  """DropBlock keep masks (Ghiasi et al. 2018): float32 [B, h, w], 0 on dropped square blocks.

  Block centres are drawn with the rate that drops about `drop_rate` of the patches; an image
  whose every patch is dropped keeps them all (the labeler needs one token to pool).
  """
  batch, height, width = shape
  block = max(1, min(int(block_size), height, width))
  valid = (height - block + 1) * (width - block + 1)
  gamma = drop_rate / block**2 * (height * width) / valid
  centres = jax.random.bernoulli(key, min(gamma, 1.0), shape).astype(jnp.float32)
  # Centres only where the whole block fits.
  lo, hi = block // 2, block - 1 - block // 2
  rows = (jnp.arange(height) >= lo) & (jnp.arange(height) < height - hi)
  cols = (jnp.arange(width) >= lo) & (jnp.arange(width) < width - hi)
  centres = centres * (rows[:, None] & cols[None, :])
  dropped = jax.lax.reduce_window(centres, 0.0, jax.lax.max, (1, block, block), (1, 1, 1), "SAME")
  keep = 1.0 - dropped
  return jnp.where(jnp.sum(keep, axis=(1, 2), keepdims=True) > 0, keep, 1.0)


class ConceptLabeler(nn.Module):
  """App. D.2's concept labeler: the mean of the tokens in a region -> D descriptor logits."""

  num_descriptors: int

  @nn.compact
  def __call__(self, tokens, weights):
    """tokens float [B, N, C], weights float [B, N] (region) -> logits float32 [B, D]."""
    tokens = tokens.astype(jnp.float32)
    pooled = jnp.einsum("bn,bnc->bc", weights, tokens)
    pooled = pooled / jnp.maximum(jnp.sum(weights, axis=1, keepdims=True), 1e-6)
    return nn.Dense(self.num_descriptors, name="labeler")(nn.LayerNorm(name="norm")(pooled))


def train_labeler(
  cached: CachedFeatures,
  targets: np.ndarray,
  *,
  drop_rate: float = 0.5,
  block_size: int = 3,
  epochs: int,
  batch_size: int = 64,
  learning_rate: float = 1e-4,
  final_learning_rate: float = 1e-5,
  seed: int = 0,
  progress: bool = True,
  workdir: str | None = None,
) -> tuple[ConceptLabeler, TrainResult]:
  """Trains the concept labeler with binary cross-entropy against the class's descriptors
  (targets float32 [C, D]) on DropBlock-masked feature maps; checkpoints in
  <workdir>/checkpoints when a workdir is given (see `fit`)."""
  model = ConceptLabeler(int(targets.shape[1]))
  grid = cached.tokens.shape[1:3]
  targets = jnp.asarray(targets, jnp.float32)
  sample = _flat(cached.tokens[:1])
  params = model.init(jax.random.PRNGKey(seed), sample, jnp.ones(sample.shape[:2]))["params"]

  def loss_fn(params, batch, key, progress):
    del progress
    tokens = batch["tokens"]
    keep = dropblock(key, (tokens.shape[0], *grid), drop_rate, block_size)
    logits = model.apply({"params": params}, _flat(tokens), keep.reshape(tokens.shape[0], -1))
    return optax.sigmoid_binary_cross_entropy(logits, targets[batch["labels"]]).mean()

  result = fit(
    loss_fn,
    params,
    {"tokens": cached.tokens, "labels": cached.labels},
    epochs=epochs,
    batch_size=batch_size,
    learning_rate=learning_rate,
    final_learning_rate=final_learning_rate,
    seed=seed,
    desc="Feature Maps labeler",
    progress=progress,
    workdir=workdir,
  )
  return model, result


@functools.partial(jax.jit, static_argnames=("n_concepts", "skip_object"))
def feature_map_concepts(tokens, n_concepts: int = 5, threshold: float = 0.9, skip_object=True):
  """App. D.2's visual concepts: the channels with the largest spatial norm.

  Args:
    tokens: float [B, h, w, C] patch features.
    n_concepts: L channels kept.
    threshold: each channel's map, min-max normalised to [0, 1], keeps its values >= this.
    skip_object: drop the channel with the largest norm (the main object's map, App. D.2).

  Returns:
    (channels int32 [B, L], regions bool [B, L, h, w], valid bool [B, L]: non-empty regions.)
  """
  tokens = jnp.asarray(tokens, jnp.float32)
  norms = jnp.sqrt(jnp.sum(tokens**2, axis=(1, 2)))  # [B, C]
  first = 1 if skip_object else 0
  _, channels = jax.lax.top_k(norms, n_concepts + first)
  channels = channels[:, first:]
  maps = jnp.take_along_axis(tokens, channels[:, None, None, :], axis=3)
  maps = jnp.moveaxis(maps, 3, 1)  # [B, L, h, w]
  low = jnp.min(maps, axis=(2, 3), keepdims=True)
  high = jnp.max(maps, axis=(2, 3), keepdims=True)
  regions = (maps - low) / jnp.maximum(high - low, 1e-12) >= threshold
  regions = regions & (high > low)
  return channels.astype(jnp.int32), regions, jnp.any(regions, axis=(2, 3))


@functools.partial(jax.jit, static_argnames=("model",))
def _label(model, params, tokens, regions):
  batch, n = regions.shape[:2]
  weights = regions.reshape(batch, n, -1).astype(jnp.float32)
  flat = _flat(tokens)
  logits = jax.vmap(lambda w: model.apply({"params": params}, flat, w), in_axes=1, out_axes=1)(
    weights
  )
  return logits


def explain_feature_maps(
  model: ConceptLabeler,
  params,
  tokens,
  n_concepts: int = 5,
  threshold: float = 0.9,
  skip_object: bool = True,
) -> dict[str, np.ndarray]:
  """Feature Maps explanations: channels, their regions and their labels.

  Returns:
    dict: channels int32 [B, L]; ids int32 [B, L] (each region's most likely descriptor);
    regions bool [B, L, h, w]; valid bool [B, L]; label_scores float32 [B, L, D] (logits).
  """
  channels, regions, valid = feature_map_concepts(
    jnp.asarray(tokens), int(n_concepts), float(threshold), bool(skip_object)
  )
  logits = _label(model, params, jnp.asarray(tokens), regions)
  return dict(
    channels=np.asarray(channels),
    ids=np.asarray(jnp.argmax(logits, axis=-1)).astype(np.int32),
    regions=np.asarray(regions),
    valid=np.asarray(valid),
    label_scores=np.asarray(logits),
  )


# ---------------------------------------------------------------------------------------------
# All three.


@dataclasses.dataclass
class Baselines:
  """The trained baselines: models, parameters and training records."""

  cbm: tuple[MultimodalBottleneck, TrainResult]
  protosim: tuple[MultimodalBottleneck, TrainResult]
  labeler: tuple[ConceptLabeler, TrainResult]

  def explain(self, tokens, descriptor_embeddings, predicted, config) -> dict[str, dict]:
    """{baseline name: explanation dict} for B images (config: config.baselines)."""
    n = int(config.n_concepts)
    out = {}
    for name, (model, result) in (("MM-CBM", self.cbm), ("MM-ProtoSim", self.protosim)):
      out[name] = explain_bottleneck(
        model,
        result.params,
        tokens,
        descriptor_embeddings,
        predicted,
        n,
        float(config.region_threshold),
      )
    model, result = self.labeler
    out["Feature Maps"] = explain_feature_maps(
      model,
      result.params,
      tokens,
      n,
      float(config.feature_maps.threshold),
      bool(config.feature_maps.skip_object),
    )
    return out

  def training_summary(self) -> dict[str, dict]:
    """Per baseline: steps, first and last losses (mean of 10 steps), seconds."""
    out = {}
    for name, (_, r) in zip(NAMES, (self.cbm, self.protosim, self.labeler)):
      k = min(10, len(r.losses))
      out[name] = dict(
        steps=int(len(r.losses)),
        first_loss=float(r.losses[:k].mean()) if k else float("nan"),
        last_loss=float(r.losses[-k:].mean()) if k else float("nan"),
        seconds=round(float(r.seconds), 3),
      )
    return out


def train_all(
  cached: CachedFeatures,
  descriptor_embeddings: np.ndarray,
  targets: np.ndarray,
  config,
  progress: bool = True,
  workdir: str | None = None,
) -> Baselines:
  """Trains MM-CBM, MM-ProtoSim and the Feature Maps labeler (config: config.baselines).

  workdir: where each keeps its checkpoints, <workdir>/<FOLDERS[name]>/checkpoints (a rerun
  resumes from them); None: no checkpoint.
  """

  def folder(name):
    return None if workdir is None else os.path.join(workdir, FOLDERS[name])

  t = config.train
  common = dict(
    epochs=int(t.epochs),
    batch_size=int(t.batch_size),
    learning_rate=float(t.learning_rate),
    final_learning_rate=float(t.final_learning_rate),
    seed=int(t.seed),
    progress=progress,
  )
  num_classes = int(targets.shape[0])
  cbm = train_bottleneck(
    cached,
    descriptor_embeddings,
    num_classes,
    attention="softmax",
    width=int(config.width),
    workdir=folder("MM-CBM"),
    **common,
  )
  protosim = train_bottleneck(
    cached,
    descriptor_embeddings,
    num_classes,
    attention="gumbel",
    width=int(config.width),
    temperature=float(config.gumbel_temperature),
    workdir=folder("MM-ProtoSim"),
    **common,
  )
  fm = config.feature_maps
  labeler = train_labeler(
    cached,
    targets,
    drop_rate=float(fm.drop_rate),
    block_size=int(fm.block_size),
    workdir=folder("Feature Maps"),
    **{**common, "epochs": int(fm.get("epochs", t.epochs))},
  )
  return Baselines(cbm, protosim, labeler)
