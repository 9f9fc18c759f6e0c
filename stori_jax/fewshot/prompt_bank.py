"""All prompts of a few-shot task, tokenized and grouped into length buckets.

The text mask is causal, so a prompt's EOT feature depends only on its tokens up
to EOT: rows can be cut to the longest prompt of their bucket (CuPL prompts:
median ~21 tokens of 77). Buckets are padded with dummy prompts (class -1) to a
multiple of `chunk * num_shards`, so every device gets equal whole chunks.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

from stori_jax.tokenizer import Tokenizer


@dataclasses.dataclass(frozen=True)
class Bucket:
  """Prompts of similar length. P = padded prompt count, L = bucket length.

  ids: int32 [P, L]; class_index: int32 [P] (-1 for padding rows);
  prompt_index: int32 [P] index into PromptBank.texts (-1 for padding);
  trainable: bool [P, L], True on the tokens whose weight is learned (the words:
  start/end-of-text and padding keep weight 1).
  chunk: prompts encoded together on one device; P is a multiple of chunk * shards.
  """

  ids: np.ndarray
  class_index: np.ndarray
  prompt_index: np.ndarray
  trainable: np.ndarray
  chunk: int

  @property
  def length(self) -> int:
    return self.ids.shape[1]

  @property
  def num_prompts(self) -> int:
    return self.ids.shape[0]


@dataclasses.dataclass(frozen=True)
class PromptBank:
  """Weighted (trainable) prompts in buckets, plus fixed prompts (e.g. Base templates)."""

  class_names: tuple[str, ...]
  texts: tuple[str, ...]  # The trainable prompts, in bank order.
  text_class: np.ndarray  # int32 [num_texts]
  buckets: tuple[Bucket, ...]
  fixed_ids: np.ndarray  # int32 [F, context] prompts without trainable weights
  fixed_class: np.ndarray  # int32 [F]

  @property
  def num_classes(self) -> int:
    return len(self.class_names)


def _round_up(value: int, multiple: int) -> int:
  return -(-value // multiple) * multiple


def build_prompt_bank(
  tokenizer: Tokenizer,
  class_names: Sequence[str],
  prompts: Mapping[str, Sequence[str]],
  fixed_prompts: Mapping[str, Sequence[str]] | None = None,
  context_length: int = 77,
  bucket_multiple: int = 8,
  chunk: int = 64,
  num_shards: int = 1,
) -> PromptBank:
  """Tokenizes `prompts[class]` (trainable) and `fixed_prompts[class]` (not trained).

  Bucket lengths are multiples of `bucket_multiple` (fewer distinct shapes, so
  fewer compilations); each bucket's prompt count is padded to a multiple of
  chunk * num_shards (chunk shrinks for small buckets, keeping padding low).
  Either every class has trainable prompts, or none has (a bank of fixed prompts only, no
  buckets: TaskRes's Base-prompt classifier); every class needs at least one prompt.
  """
  fixed_prompts = fixed_prompts or {}
  texts, text_class = [], []
  fixed_only = not any(prompts.get(name) for name in class_names)
  for c, name in enumerate(class_names):
    if fixed_only and not fixed_prompts.get(name):
      raise ValueError(f"Class {name!r} has no prompts.")
    if fixed_only:
      continue
    if name not in prompts or not prompts[name]:
      raise ValueError(f"Class {name!r} has no trainable prompts (other classes have some).")
    texts += list(prompts[name])
    text_class += [c] * len(prompts[name])
  ids = (
    tokenizer(texts, context_length=context_length, truncate=True)
    if texts
    else np.zeros((0, context_length), np.int32)
  )
  eot = np.argmax(ids == tokenizer.eot_token_id, axis=1)
  lengths = eot + 1
  bucket_of = np.minimum(_round_up_array(lengths, bucket_multiple), context_length)
  buckets = []
  for length in sorted(set(bucket_of.tolist())):
    members = np.flatnonzero(bucket_of == length)
    per_shard_chunk = max(1, min(chunk, _round_up(len(members), num_shards) // num_shards))
    padded = _round_up(len(members), per_shard_chunk * num_shards)
    b_ids = np.zeros((padded, length), np.int32)
    b_ids[: len(members)] = ids[members, :length]
    # Padding rows: SOT EOT, so they are well-formed (and ignored: class -1).
    b_ids[len(members) :, 0] = tokenizer.sot_token_id
    b_ids[len(members) :, 1] = tokenizer.eot_token_id
    class_index = np.full(padded, -1, np.int32)
    class_index[: len(members)] = np.asarray(text_class, np.int32)[members]
    prompt_index = np.full(padded, -1, np.int32)
    prompt_index[: len(members)] = members
    positions = np.arange(length)[None, :]
    trainable = (positions >= 1) & (positions < eot[members][:, None])
    trainable_full = np.zeros((padded, length), bool)
    trainable_full[: len(members)] = trainable
    buckets.append(Bucket(b_ids, class_index, prompt_index, trainable_full, per_shard_chunk))
  fixed_texts, fixed_class = [], []
  for c, name in enumerate(class_names):
    for text in fixed_prompts.get(name, ()):
      fixed_texts.append(text)
      fixed_class.append(c)
  fixed_ids = (
    tokenizer(fixed_texts, context_length=context_length, truncate=True)
    if fixed_texts
    else np.zeros((0, context_length), np.int32)
  )
  return PromptBank(
    tuple(class_names),
    tuple(texts),
    np.asarray(text_class, np.int32),
    tuple(buckets),
    fixed_ids,
    np.asarray(fixed_class, np.int32),
  )


def _round_up_array(values: np.ndarray, multiple: int) -> np.ndarray:
  return -(-values // multiple) * multiple


def gather_token_weights(bank: PromptBank, log_weights: Sequence[np.ndarray]) -> list[np.ndarray]:
  """Per-prompt weights (exp of the bucket log-weights): list of float32 [length_i + ...].

  Returns, in bank order, each prompt's weight row of its bucket length.
  """
  out: list[np.ndarray | None] = [None] * len(bank.texts)
  for bucket, log_w in zip(bank.buckets, log_weights):
    weights = np.exp(np.asarray(log_w, np.float32))
    for row, index in enumerate(bucket.prompt_index):
      if index >= 0:
        out[index] = np.where(bucket.trainable[row], weights[row], 1.0)
  return out
