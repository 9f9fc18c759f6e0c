"""The three trained baselines of Table 1 (Sammani & Deligiannis 2024, App. D), on cached features.

All three see the same patch features (config.analysis.feature_kind of the analysed model) and
the same descriptor bank as the analysis, and are trained with optax (Adam, learning rate decayed
by a cosine schedule, App. D: batch 64, 1e-4 to 1e-5, q = 512 on ImageNet) in the project's
training loop (`stori_jax.trainloop.loop`: a diverged fit stops, a stopped one resumes from its
checkpoints). Training is deterministic given the seed: batches are drawn from a numpy Generator
and Gumbel noise / DropBlock masks from jax PRNG keys folded with the step.

- MM-CBM (App. D.1): descriptors -> linear -> queries Q [D, q]; patch tokens -> linear ->
  keys = values K [N, q]; cross-attention softmax over the N tokens, softmax(Q K^T / sqrt(q)) K;
  a linear map to one value per descriptor and a sigmoid: the bottleneck U [D]; a linear
  classifier over the classes. Explanation of class p: the descriptors with the largest
  U * w_p, each with its attention map over the tokens as its visual concept.
- MM-ProtoSim (App. D.1): the same with a hard assignment of every token to one descriptor:
  Gumbel-softmax over the D descriptors (straight-through: one-hot forward, relaxed gradient;
  the noise fades linearly to zero over training), and the noise-free argmax at evaluation;
  the visual concept of a descriptor is the set of tokens assigned to it.
- Feature Maps (App. D.2): each channel of the patch features is an activation map; the channels
  with the largest spatial L2 norm are the concepts (the first, which covers the main object, is
  skipped by default: App. D.2 uses it as the object map, "the remaining neurons act as the
  visual concepts"); a map normalised to [0, 1] keeps its values >= 0.9 as the region. A concept
  labeler (a linear layer on the mean of the tokens of a region) is trained with binary
  cross-entropy to predict the class's descriptors from DropBlock-masked feature maps, and
  labels each region with its most likely descriptor.

Table 5's other rows (App. D.1), trained on the image embeddings of the same images:
- Standard: "a MLP to classify images using solely vision features": the tower's image embedding
  (unnormalised) -> LayerNorm -> Dense(q) -> GELU -> Dense(classes), trained as the others.
- LF-CBM (Oikarinen et al. 2023) as its authors' code builds it (`train_lf_cbm`): concepts whose
  top-5 CLIP cosine is too low dropped, a linear projection W_c of the image embedding trained
  to match the concepts' CLIP cosines under the cubed-cosine similarity, concepts the
  projection does not match dropped, the projected concepts standardised, and a sparse final
  layer fitted by GLM-SAGA (`glm_saga`, the solver ported to JAX) with the elastic net.

Choices the paper leaves open: the 1 / sqrt(q) attention scaling; values = keys (App. D says
K = V); the token average (rather than sum) of the hard-assigned values in MM-ProtoSim; how an
attention map becomes a region (min-max normalised, kept above `region_threshold`); the labeler's
architecture and DropBlock's rate and block size; the Standard MLP's input and layers; LF-CBM's
concepts (the descriptor bank D, unfiltered: the MK paper's reading), backbone (the analysed
CLIP's own image embedding) and held-out split (`paper_config.LF_CBM_DEFAULTS`). `explain`
explains the class given to it: the
evaluation passes CLIP's zero-shot prediction so that every explanation in Table 1 explains the
same decision.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import os
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import tqdm

from mutual import features, paper_config
from stori_jax.plumbing import paths
from stori_jax.plumbing.config_files import ConfigError
from stori_jax.clip.preprocess import normalize
from stori_jax.trainloop import loop
from stori_jax.trainloop.checkpointer import NonFiniteWatch, TrainCheckpointer, nonfinite_code

#: Table 1's trained explanations.
NAMES = ("MM-CBM", "MM-ProtoSim", "Feature Maps")
#: Table 5's trained classifiers, in its order.
CLASSIFIERS = ("Standard", "LF-CBM", "MM-CBM", "MM-ProtoSim")
#: `Baselines.classify`'s key for the Feature Maps concept labeler's scores (App. D.2).
LABELER = "Concept labeler"
#: Each baseline's folder under `train_all`'s workdir (its checkpoints).
FOLDERS = {
  "MM-CBM": "mm_cbm",
  "MM-ProtoSim": "mm_protosim",
  "Feature Maps": "feature_maps",
  "Standard": "standard",
  "LF-CBM": "lf_cbm",
}


# ---------------------------------------------------------------------------------------------
# Cached features.


@dataclasses.dataclass(frozen=True)
class CachedFeatures:
  """Patch features of a set of images.

  Attributes:
    tokens: float [N, h, w, C] (float32 or float16: see `cache_features`).
    labels: int32 [N].
    embeddings: float32 [N, E], the tower's image embeddings, unnormalised (the Standard and
      LF-CBM rows' input); None: those two are not trained.
  """

  tokens: np.ndarray
  labels: np.ndarray
  embeddings: np.ndarray | None = None

  def __len__(self) -> int:
    return int(self.labels.shape[0])


def encode_features(
  bundle, images, kind: str = "tokens", batch_size: int = 64
) -> tuple[np.ndarray, np.ndarray]:
  """uint8 images [N, S, S, 3] -> (image embeddings float32 [N, E], unnormalised; patch features
  float32 [N, h, w, C]), from one tower pass, in fixed-size chunks (padded) so that the tower
  compiles once."""
  images = np.asarray(images)
  mean, std = bundle.preprocess_config.mean, bundle.preprocess_config.std
  embeddings, tokens = [], []
  for start in range(0, len(images), batch_size):
    part = images[start : start + batch_size]
    real = len(part)
    if real < batch_size and len(images) > batch_size:
      part = np.concatenate([part, np.zeros((batch_size - real, *part.shape[1:]), part.dtype)])
    e, t = features.embeddings_and_patches(
      bundle, normalize(part, mean, std), kind, normalize=False
    )
    embeddings.append(np.asarray(e, np.float32)[:real])
    tokens.append(np.asarray(t)[:real])
  return np.concatenate(embeddings), np.concatenate(tokens)


def encode_tokens(bundle, images, kind: str = "tokens", batch_size: int = 64) -> np.ndarray:
  """uint8 images [N, S, S, 3] -> float32 patch features [N, h, w, C] (`encode_features`')."""
  return encode_features(bundle, images, kind, batch_size)[1]


def cache_features(
  bundle,
  classes: Iterable,
  kind: str = "tokens",
  batch_size: int = 64,
  dtype=np.float32,
  progress: bool = True,
) -> CachedFeatures:
  """Encodes the training images once (an iterable of mutual.data.ClassImages): their patch
  features and image embeddings (kept in float32: 2 KB per ViT-B/16 image).

  `dtype=np.float16` halves the memory (ImageNet's ViT-B/16 tokens: 300 KB per image in float32).
  """
  tokens, labels, embeddings = [], [], []
  for cls in tqdm(classes, desc="cache features", disable=not progress, dynamic_ncols=True):
    e, t = encode_features(bundle, cls.images, kind, batch_size)
    tokens.append(t.astype(dtype))
    embeddings.append(e)
    labels.append(np.full(len(cls.images), cls.label, np.int32))
  if not tokens:
    raise ValueError("no training images: the baselines need at least one class with images.")
  return CachedFeatures(np.concatenate(tokens), np.concatenate(labels), np.concatenate(embeddings))


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
# Table 5's Standard row.


class StandardMLP(nn.Module):
  """Table 5's Standard row: "a MLP to classify images using solely vision features" (App. D.1).

  The input is the tower's image embedding; the paper gives no layers, so: LayerNorm (the
  unnormalised embedding's scale varies across models), one hidden layer of `hidden` units
  (q) with a GELU, and the classifier.

  Attributes:
    num_classes: C.
    hidden: the hidden width.
  """

  num_classes: int
  hidden: int = 512

  @nn.compact
  def __call__(self, embeddings):
    """embeddings float [B, E] -> logits float32 [B, C]."""
    x = nn.LayerNorm(name="norm")(embeddings.astype(jnp.float32))
    x = nn.gelu(nn.Dense(self.hidden, name="hidden")(x))
    return nn.Dense(self.num_classes, name="classifier")(x)


def _embeddings_of(cached: CachedFeatures, who: str) -> np.ndarray:
  if cached.embeddings is None:
    raise ValueError(f"{who} trains on the image embeddings: cache them (`cache_features` does).")
  return np.asarray(cached.embeddings, np.float32)


def train_standard(
  cached: CachedFeatures,
  num_classes: int,
  *,
  hidden: int,
  epochs: int,
  batch_size: int = 64,
  learning_rate: float = 1e-4,
  final_learning_rate: float = 1e-5,
  seed: int = 0,
  progress: bool = True,
  workdir: str | None = None,
) -> tuple[StandardMLP, TrainResult]:
  """Trains the Standard MLP with cross-entropy on `cached.embeddings`, as the other baselines
  (App. D's Adam and schedule, `fit`); checkpoints in <workdir>/checkpoints."""
  embeddings = _embeddings_of(cached, "The Standard MLP")
  model = StandardMLP(num_classes, hidden)
  params = model.init(jax.random.PRNGKey(seed), jnp.asarray(embeddings[:1]))["params"]

  def loss_fn(params, batch, key, progress):
    del key, progress
    logits = model.apply({"params": params}, batch["embeddings"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()

  result = fit(
    loss_fn,
    params,
    {"embeddings": embeddings, "labels": cached.labels},
    epochs=epochs,
    batch_size=batch_size,
    learning_rate=learning_rate,
    final_learning_rate=final_learning_rate,
    seed=seed,
    desc="Standard",
    progress=progress,
    workdir=workdir,
  )
  return model, result


# ---------------------------------------------------------------------------------------------
# Table 5's LF-CBM row (Oikarinen et al. 2023, as their code Label-free-CBM builds it).


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
) -> tuple[np.ndarray, int, float]:
  """LF-CBM's concept projection W_c, trained as train_cbm.py trains it: no bias, torch's default
  initialisation U(-1/sqrt(E), 1/sqrt(E)), Adam, each step on `batch_size` images drawn without
  replacement (all of them when fewer), maximising the mean cubed-cosine similarity; every 50
  steps (and at the last) the held-out similarity is measured after the step, and the fit stops
  at the first check that does not improve on the best, keeping the best.

  Args:
    train_x, val_x: float [N, E] / [M, E] backbone features (here the image embeddings).
    train_clip, val_clip: float [N, K] / [M, K] CLIP image-concept cosines.

  Returns:
    (W_c float32 [E, K], the step of the kept weights, their mean held-out similarity.)
  """
  train_x = jnp.asarray(train_x, jnp.float32)
  train_clip = jnp.asarray(train_clip, jnp.float32)
  val_x = jnp.asarray(val_x, jnp.float32)
  val_clip = jnp.asarray(val_clip, jnp.float32)
  n, width = train_x.shape
  bound = 1.0 / np.sqrt(width)
  weight = jax.random.uniform(
    jax.random.PRNGKey(seed), (width, train_clip.shape[1]), jnp.float32, -bound, bound
  )
  optimizer = optax.adam(learning_rate)

  @jax.jit
  def step(weight, opt_state, idx):
    def loss_fn(w):
      return -jnp.mean(cubed_cosine_similarity(train_clip[idx], train_x[idx] @ w))

    grads = jax.grad(loss_fn)(weight)
    updates, opt_state = optimizer.update(grads, opt_state, weight)
    return optax.apply_updates(weight, updates), opt_state

  @jax.jit
  def held_out(w):
    return jnp.mean(cubed_cosine_similarity(val_clip, val_x @ w))

  rng = np.random.default_rng(seed)
  batch = min(int(batch_size), n)
  opt_state = optimizer.init(weight)
  best, best_step, best_weight = -np.inf, 0, weight
  every = jnp.arange(n)
  for i in tqdm(range(int(steps)), desc="LF-CBM projection", disable=not progress):
    idx = every if batch == n else jnp.asarray(rng.choice(n, batch, replace=False))
    weight, opt_state = step(weight, opt_state, idx)
    if i % 50 == 0 or i == steps - 1:
      similarity = float(held_out(weight))
      if i == 0 or similarity > best:
        best, best_step, best_weight = similarity, i, weight
      else:  # their rule: stop as soon as the held-out similarity stops rising
        break
  return np.asarray(best_weight), best_step, float(best)


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


def _lf_cbm_path(workdir: str | None) -> str | None:
  return None if workdir is None else os.path.join(workdir, "lf_cbm.npz")


def train_lf_cbm(
  cached: CachedFeatures,
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
    descriptor_embeddings: float [D, E], the bank's unit descriptor embeddings (no template,
      as LF-CBM encodes its concepts).
    settings: `lf_cbm_settings`' keys (default: paper_config.LF_CBM_DEFAULTS).
    workdir: the finished model is kept in <workdir>/lf_cbm.npz and a rerun loads it.

  Returns:
    (LabelFreeCBM, record): the record holds descriptors, after_clip_cutoff,
    after_interpretability_cutoff, projection_step, held_out_similarity, saga_epochs,
    converged, objective, nonzero_weights (|w| > 1e-5, their count) and seconds.

  Raises:
    ConfigError: no concept survives a cutoff (names the setting to lower), or fewer than 4
      training images.
  """
  s = {**paper_config.LF_CBM_DEFAULTS, **dict(settings or {})}
  path = _lf_cbm_path(workdir)
  if path is not None and paths.exists(path):
    with np.load(io.BytesIO(paths.read_bytes(path)) if paths.is_remote(path) else path) as saved:
      model = LabelFreeCBM(*(saved[f.name] for f in dataclasses.fields(LabelFreeCBM)))
      record = json.loads(str(saved["record"]))
    return model, record
  start = time.perf_counter()
  embeddings = _embeddings_of(cached, "LF-CBM")
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
  if path is not None:
    paths.makedirs(workdir, exist_ok=True)
    partial = io.BytesIO() if paths.is_remote(path) else path + ".partial.npz"
    np.savez(
      partial,
      record=json.dumps(record),
      **{f.name: getattr(model, f.name) for f in dataclasses.fields(LabelFreeCBM)},
    )
    if paths.is_remote(path):  # one upload: whole or absent
      paths.write_bytes_atomic(path, partial.getvalue())
    else:
      os.replace(partial, path)  # whole or absent: a stopped run leaves no half model
  return model, record


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


@functools.partial(jax.jit, static_argnames=("model",))
def _apply_logits(model, params, *inputs):
  out = model.apply({"params": params}, *inputs)
  return out[0] if isinstance(out, tuple) else out


@dataclasses.dataclass
class Baselines:
  """The trained baselines: models, parameters and training records (standard and lf_cbm:
  None when the training images came without embeddings)."""

  cbm: tuple[MultimodalBottleneck, TrainResult]
  protosim: tuple[MultimodalBottleneck, TrainResult]
  labeler: tuple[ConceptLabeler, TrainResult]
  standard: tuple[StandardMLP, TrainResult] | None = None
  lf_cbm: tuple[LabelFreeCBM, dict] | None = None

  def classify(self, tokens, embeddings, descriptor_embeddings) -> dict[str, np.ndarray]:
    """Table 5's classifiers and App. D.2's labeler on B images.

    Args:
      tokens: float [B, h, w, C] patch features; embeddings: float [B, E] image embeddings,
        unnormalised (`encode_features`); descriptor_embeddings: float [D, E'].

    Returns:
      {row of CLASSIFIERS that was trained: logits float32 [B, C]; LABELER: the labeler's
      descriptor logits float32 [B, D] on the whole feature map (every token, no DropBlock)}.
    """
    flat = _flat(tokens)
    descriptors = jnp.asarray(descriptor_embeddings, jnp.float32)
    out = {}
    if self.standard is not None:
      model, result = self.standard
      out["Standard"] = _apply_logits(model, result.params, jnp.asarray(embeddings, jnp.float32))
    if self.lf_cbm is not None:
      out["LF-CBM"] = self.lf_cbm[0].logits(embeddings)
    for name, (model, result) in (("MM-CBM", self.cbm), ("MM-ProtoSim", self.protosim)):
      out[name] = _apply_logits(model, result.params, flat, descriptors)
    model, result = self.labeler
    out[LABELER] = _apply_logits(model, result.params, flat, jnp.ones(flat.shape[:2], jnp.float32))
    return {k: np.asarray(v, np.float32) for k, v in out.items()}

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
    """Per baseline: steps, first and last losses (mean of 10 steps), seconds; LF-CBM: its
    training record (`train_lf_cbm`)."""
    out = {}
    trained = [(NAMES[0], self.cbm), (NAMES[1], self.protosim), (NAMES[2], self.labeler)]
    if self.standard is not None:
      trained.append(("Standard", self.standard))
    for name, (_, r) in trained:
      k = min(10, len(r.losses))
      out[name] = dict(
        steps=int(len(r.losses)),
        first_loss=float(r.losses[:k].mean()) if k else float("nan"),
        last_loss=float(r.losses[-k:].mean()) if k else float("nan"),
        seconds=round(float(r.seconds), 3),
      )
    if self.lf_cbm is not None:
      out["LF-CBM"] = dict(self.lf_cbm[1])
    return out


def train_all(
  cached: CachedFeatures,
  descriptor_embeddings: np.ndarray,
  targets: np.ndarray,
  config,
  progress: bool = True,
  workdir: str | None = None,
) -> Baselines:
  """Trains MM-CBM, MM-ProtoSim and the Feature Maps labeler, and, when `cached` holds image
  embeddings, Table 5's Standard MLP (hidden width q) and LF-CBM (config: config.baselines).

  workdir: where each keeps its checkpoints, <workdir>/<FOLDERS[name]>/checkpoints (a rerun
  resumes from them; LF-CBM keeps its finished model, <workdir>/lf_cbm/lf_cbm.npz); None: no
  checkpoint.
  """
  lf_settings = lf_cbm_settings(config)  # refused before any training

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
  if cached.embeddings is None:
    return Baselines(cbm, protosim, labeler)
  standard = train_standard(
    cached, num_classes, hidden=int(config.width), workdir=folder("Standard"), **common
  )
  lf_cbm = train_lf_cbm(
    cached,
    descriptor_embeddings,
    num_classes,
    lf_settings,
    seed=int(t.seed),
    progress=progress,
    workdir=folder("LF-CBM"),
  )
  return Baselines(cbm, protosim, labeler, standard, lf_cbm)
