"""Labelled classification splits, and the K-shot sample of CoOp's protocol.

A `FewShotSplit` holds class names and (image source, label) items for the train, test and
(where the dataset has one) validation sets; every classification reader returns one (CoOp's
folders, TFDS, the synthetic world). An item's source is a path, encoded bytes or a uint8
array (`images.ImageSource`). `sample_k_shot` draws K training items per class as Dassl does
(docs/design.md, section "Few-shot protocol").
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, NamedTuple, Sequence

import numpy as np

from stori_jax.data.files import ClassMismatchError
from stori_jax.plumbing.errors import InputError


class LabeledImage(NamedTuple):
  """One example: `source` (path, encoded bytes or uint8 [H, W, 3]) and its int class label."""

  source: Any
  label: int


@dataclasses.dataclass(frozen=True, eq=False)
class FewShotSplit:
  """A classification dataset in CoOp's protocol.

  Attributes:
    dataset: canonical dataset name ("dtd", "imagenet", "synthetic", ...), see `coop.canonical_name`.
    class_names: one name per label, labels 0..C-1 (tuple: the split is immutable).
    train: the training pool (all of it, or the K-shot sample after `few_shot`).
    test: the evaluation set (ImageNet: its val set, as in CoOp).
    val: CoOp's validation set where the dataset has one, else empty.
  """

  dataset: str
  class_names: tuple[str, ...]
  train: tuple[LabeledImage, ...]
  test: tuple[LabeledImage, ...]
  val: tuple[LabeledImage, ...] = ()

  @property
  def num_classes(self) -> int:
    return len(self.class_names)

  @property
  def train_labels(self) -> np.ndarray:
    """int32 [len(train)]."""
    return np.asarray([item.label for item in self.train], np.int32)

  @property
  def test_labels(self) -> np.ndarray:
    """int32 [len(test)]."""
    return np.asarray([item.label for item in self.test], np.int32)

  def few_shot(self, shots: int, seed: int) -> "FewShotSplit":
    """This split with `train` replaced by `sample_k_shot(train, shots, seed)`."""
    return dataclasses.replace(
      self, train=sample_k_shot(self.train, shots, seed, class_names=self.class_names)
    )


def sample_k_shot(
  train_items: Sequence[LabeledImage],
  shots: int,
  seed: int,
  *,
  class_names: Sequence[str] | None = None,
) -> tuple[LabeledImage, ...]:
  """K items per class, deterministic given `seed`; grouped by class.

  Follows Dassl's `generate_fewshot_dataset`, which CoOp, TaskRes and the paper use: classes are
  visited in order of first appearance in `train_items`, and each contributes
  `random.Random(seed).sample(its items, shots)` from one RNG shared across classes. (Dassl uses
  the global `random` seeded with the run seed; a private RNG gives the same draws without
  touching global state.) `train_items` may be any (source, label) items, e.g. (index, label).

  Raises:
    ValueError: shots < 1, or a class has fewer than `shots` items (ClassMismatchError, an
      InputError: names every such class and its count, including the classes of
      `class_names` with none; CoOp would silently keep fewer there).
  """
  if shots < 1:
    raise InputError(f"shots must be >= 1, got {shots}.")
  by_label: dict[int, list[LabeledImage]] = {}
  for item in train_items:
    item = LabeledImage(*item)
    by_label.setdefault(int(item.label), []).append(item)
  short = {label: len(items) for label, items in by_label.items() if len(items) < shots}
  if class_names is not None:  # a class without any item would silently drop out
    short.update({label: 0 for label in range(len(class_names)) if label not in by_label})
  if short:

    def describe(label):
      name = f"{class_names[label]!r} " if class_names is not None else ""
      return f"class {name}(label {label}) has {short[label]}"

    raise ClassMismatchError(
      f"{shots}-shot sampling needs {shots} training images per class, but "
      + "; ".join(describe(label) for label in sorted(short))
      + "."
    )
  rng = random.Random(seed)
  return tuple(item for items in by_label.values() for item in rng.sample(items, shots))
