"""Class embeddings from SToRI-weighted prompts, fast and sharded over devices.

Where the speed comes from (all exact; docs/design.md, section "Where the training speed
comes from"):
- the blocks before the first reweighted one do not depend on the weights:
  their output is computed once per prompt (the prefix cache);
- rows are cut to their bucket's length (causal mask) and the last block
  computes only the EOT row;
- prompts are encoded in chunks under `jax.checkpoint` inside `lax.map`, so the
  backward pass recomputes one chunk at a time: memory is bounded by a chunk,
  whatever the number of prompts;
- prompts are sharded over a 1-D device mesh (axis "prompts", all hosts); each
  device sums its prompts' normalised features per class and a psum gives the
  class embeddings; gradients of a device's log-weights stay on that device.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from stori_jax.clip.bundle import CLIPBundle
from stori_jax.clip.encoding import l2_normalize_jax
from stori_jax.fewshot.prompt_bank import Bucket, PromptBank
from stori_jax.models import CLIP, reweighted_block_indices

AXIS = "prompts"
#: No norm floor in the classifier's normalisations (text features are never zero): under jit
#: a floor moves results by an ulp (see l2_normalize_jax), and trained weights would no longer
#: reproduce earlier runs bit for bit.
NORM_EPS = None


def prompt_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A 1-D mesh over all devices of all hosts (or the given ones)."""
  return Mesh(np.asarray(devices if devices is not None else jax.devices()), (AXIS,))


class WeightedTextClassifier:
  """Maps per-prompt log-weights to normalised class embeddings [C, E].

  Class c's embedding is the normalised mean of the normalised features of its
  prompts: the weighted (trainable) ones and the fixed ones (e.g. Base
  templates), as CLIP's prompt ensembling does.
  """

  def __init__(
    self,
    bundle: CLIPBundle,
    bank: PromptBank,
    start_block: int | None = None,
    mesh: Mesh | None = None,
  ):
    self.bundle, self.bank = bundle, bank
    self.mesh = mesh or prompt_mesh()
    self.reweight_blocks = reweighted_block_indices(bundle.config.text, start_block)
    self.first = self.reweight_blocks[0]
    self.num_classes = bank.num_classes
    self._sharded = NamedSharding(self.mesh, PartitionSpec(AXIS))
    self._replicated = NamedSharding(self.mesh, PartitionSpec())
    for bucket in bank.buckets:
      if bucket.num_prompts % (bucket.chunk * self.mesh.size):
        raise ValueError(
          f"A bucket of {bucket.num_prompts} prompts does not split into chunks "
          f"of {bucket.chunk} over {self.mesh.size} devices; build the bank "
          f"with num_shards={self.mesh.size}."
        )
    # Only the text tower's params, replicated on every device (passed as an
    # argument, not closed over: closures would embed them as XLA constants).
    self.params = jax.device_put(
      {"text": bundle.params["text"], "logit_scale": bundle.params["logit_scale"]}, self._replicated
    )
    self.ids = [self._shard(b.ids) for b in bank.buckets]
    self.class_index = [self._shard(b.class_index) for b in bank.buckets]
    self.trainable = [self._shard(b.trainable) for b in bank.buckets]
    self.prefix = [self._prefix(b, ids) for b, ids in zip(bank.buckets, self.ids)]
    self.fixed_sum, self.fixed_count = self._fixed_sums()

  # Classifiers are static arguments of jitted functions: hash by identity.
  __hash__ = object.__hash__

  # Placement ---------------------------------------------------------------------

  def _shard(self, array: np.ndarray) -> jax.Array:
    """Places a host array (identical on every host) sharded over prompts."""
    return jax.make_array_from_callback(array.shape, self._sharded, lambda index: array[index])

  def replicate(self, array: np.ndarray) -> jax.Array:
    """A host array (identical on every host) as a global array replicated on all devices."""
    array = np.asarray(array)
    return jax.make_array_from_callback(array.shape, self._replicated, lambda index: array[index])

  def place_batch(self, array: np.ndarray) -> jax.Array:
    """A batch (a host array, identical on every host) on the mesh: split along its first axis
    when the devices divide it, else replicated."""
    array = np.asarray(array)
    if len(array) % self.mesh.size:
      return self.replicate(array)
    return jax.make_array_from_callback(array.shape, self._sharded, lambda index: array[index])

  def init_log_weights(self) -> list[jax.Array]:
    """All-zero log-weights (w = 1: the zero-shot classifier), sharded, one per bucket."""
    return [self._shard(np.zeros(b.ids.shape, np.float32)) for b in self.bank.buckets]

  # Forward pieces -----------------------------------------------------------------

  def _map_chunks(self, fn, chunk: int, *arrays):
    """fn over consecutive chunks of the local rows (lax.map keeps one chunk live)."""
    rows = arrays[0].shape[0]
    split = [a.reshape(rows // chunk, chunk, *a.shape[1:]) for a in arrays]
    out = jax.lax.map(lambda xs: fn(*xs), tuple(split))
    return out.reshape(rows, *out.shape[2:])

  def _prefix(self, bucket: Bucket, ids: jax.Array) -> jax.Array:
    """Hidden states at the input of the first reweighted block: [P, L, W], sharded."""
    model, first = self.bundle.model, self.first

    def local(params, ids_shard):
      encode = lambda i: model.apply({"params": params}, i, first, method=CLIP.text_prefix)
      return self._map_chunks(encode, bucket.chunk, ids_shard)

    fn = jax.shard_map(
      local,
      mesh=self.mesh,
      in_specs=(PartitionSpec(), PartitionSpec(AXIS)),
      out_specs=PartitionSpec(AXIS),
    )
    return jax.jit(fn)(self.params, ids)

  def _fixed_sums(self):
    """Per-class sum and count of the fixed prompts' normalised features."""
    bank = self.bank
    sums = np.zeros((self.num_classes, self.bundle.config.embed_dim), np.float32)
    counts = np.zeros(self.num_classes, np.float32)
    if len(bank.fixed_ids):
      features = np.asarray(l2_normalize_jax(self.bundle.encode_text(bank.fixed_ids), eps=NORM_EPS))
      np.add.at(sums, bank.fixed_class, features)
      np.add.at(counts, bank.fixed_class, 1.0)
    return (jax.device_put(sums, self._replicated), jax.device_put(counts, self._replicated))

  @property
  def data(self) -> dict[str, Any]:
    """The arrays class_embeddings reads: pass them to jitted functions as an argument.

    (Closing over them would embed them in the program as constants, which multi-host
    JAX forbids and which would copy a large prefix cache into every compilation.)
    """
    return {
      "params": self.params,
      "prefix": self.prefix,
      "ids": self.ids,
      "class_index": self.class_index,
      "trainable": self.trainable,
      "fixed_sum": self.fixed_sum,
      "fixed_count": self.fixed_count,
    }

  def class_embeddings(self, log_weights: Sequence[jax.Array], data: dict[str, Any]) -> jax.Array:
    """log_weights: one float32 [P_b, L_b] per bucket -> normalised float32 [C, E].

    data: `self.data` (see there). Differentiable; call inside jit. Non-trainable
    positions keep weight 1.
    """
    model = self.bundle.model
    first, blocks, num_classes = self.first, self.reweight_blocks, self.num_classes
    sums, counts = data["fixed_sum"], data["fixed_count"]
    for bucket, prefix, ids, class_index, trainable, log_w in zip(
      self.bank.buckets,
      data["prefix"],
      data["ids"],
      data["class_index"],
      data["trainable"],
      log_weights,
    ):

      def local(params, prefix, ids, class_index, trainable, log_w, chunk=bucket.chunk):
        log_w = jnp.where(trainable, log_w, 0.0)
        encode = jax.checkpoint(
          lambda h, i, lw: model.apply(
            {"params": params}, h, i, first, lw, blocks, method=CLIP.encode_text_from
          )
        )
        features = l2_normalize_jax(
          self._map_chunks(encode, chunk, prefix, ids, log_w), eps=NORM_EPS
        )
        valid = class_index >= 0
        features = jnp.where(valid[:, None], features, 0.0)
        segment = jnp.where(valid, class_index, 0)
        bucket_sums = jax.ops.segment_sum(features, segment, num_segments=num_classes)
        bucket_counts = jax.ops.segment_sum(
          valid.astype(jnp.float32), segment, num_segments=num_classes
        )
        return jax.lax.psum(bucket_sums, AXIS), jax.lax.psum(bucket_counts, AXIS)

      spec = PartitionSpec(AXIS)
      bucket_sums, bucket_counts = jax.shard_map(
        local,
        mesh=self.mesh,
        in_specs=(PartitionSpec(),) + (spec,) * 5,
        out_specs=(PartitionSpec(), PartitionSpec()),
      )(data["params"], prefix, ids, class_index, trainable, log_w)
      sums, counts = sums + bucket_sums, counts + bucket_counts
    return l2_normalize_jax(sums / counts[:, None], eps=NORM_EPS)

  def embed(self, log_weights: Sequence[jax.Array]) -> jax.Array:
    """Eager convenience: class_embeddings under jit with self.data passed in."""
    return _jitted_class_embeddings(self, log_weights, self.data)

  @property
  def logit_scale(self) -> float:
    return self.bundle.logit_scale


@functools.partial(jax.jit, static_argnums=0)
def _jitted_class_embeddings(classifier, log_weights, data):
  return classifier.class_embeddings(log_weights, data)


def cross_entropy_loss(
  class_embeddings: jax.Array, image_features: jax.Array, labels: jax.Array, logit_scale: float
) -> tuple[jax.Array, jax.Array]:
  """image_features normalised [B, E], labels int [B] -> (mean CE, accuracy)."""
  logits = logit_scale * image_features @ class_embeddings.T
  log_probs = jax.nn.log_softmax(logits, axis=-1)
  loss = -jnp.mean(jnp.take_along_axis(log_probs, labels[:, None], axis=1))
  accuracy = jnp.mean(jnp.argmax(logits, axis=-1) == labels)
  return loss, accuracy


def to_host(array: jax.Array) -> np.ndarray:
  """The global value of a (possibly sharded, multi-host) array as numpy, on every host."""
  if isinstance(array, jax.Array) and not array.is_fully_addressable:
    return np.asarray(multihost_utils.process_allgather(array, tiled=True))
  return np.asarray(array)


def predict(class_embeddings: Any, image_features: np.ndarray, batch: int = 4096) -> np.ndarray:
  """Argmax class of normalised image features [N, E] -> int [N]."""
  class_embeddings = to_host(class_embeddings)
  return np.concatenate(
    [
      np.argmax(image_features[i : i + batch] @ class_embeddings.T, axis=1)
      for i in range(0, len(image_features), batch)
    ]
  )
