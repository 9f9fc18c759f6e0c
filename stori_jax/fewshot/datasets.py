"""Few-shot datasets in one structure: CoOp image folders, prepared TFDS, the synthetic world.

Every loader returns a `FewShotSplit` (`stori_jax.data.splits`): class names and (image source,
label) items for the train, test and (where the dataset has one) validation sets. A source is a
path, encoded bytes or a uint8 array, opened by `open_image` (`stori_jax.data.images`).

The readers are the data layer's: CoOp's folders and split files (`stori_jax.data.coop`), TFDS
(`stori_jax.data.tfds`), K-shot sampling (`stori_jax.data.splits`); this module assembles them
into the few-shot protocol (docs/design.md, section "Few-shot protocol") and re-exports their
names. A missing dataset, split file or TFDS preparation raises `DatasetMissingError` (a
FileNotFoundError) whose message names what to download, from where, and the full path where
it must go.
"""

from __future__ import annotations

import os
from typing import Mapping, Sequence

from stori_jax.plumbing.config_files import ConfigError
from stori_jax.data import synthetic_tasks
from stori_jax.data.coop import (
  COOP_DATASETS_DOC,
  canonical_name,
  load_coop_split,
  tfds_canonical_name,
  tfds_class_names,
)
from stori_jax.data.files import DatasetMissingError
from stori_jax.data.images import ImageSource, open_image
from stori_jax.data.splits import FewShotSplit, LabeledImage, sample_k_shot
from stori_jax.data.tfds import encoded_examples, import_tfds, label_names, prepared_builder
from stori_jax.plumbing.errors import InputError

# The data layer's names that few-shot code and users reach through this module.
__all__ = [
  "DatasetMissingError",
  "FewShotSplit",
  "ImageSource",
  "LabeledImage",
  "canonical_name",
  "load_coop_split",
  "load_synthetic",
  "load_tfds",
  "open_image",
  "sample_k_shot",
]

_COOP_ALTERNATIVE = f"load_coop_split with CoOp's image folders ({COOP_DATASETS_DOC})"


# ---------------------------------------------------------------------------------------------
# TFDS.


def load_tfds(
  name: str,
  data_dir: str | os.PathLike | None = None,
  *,
  shots: int | None = None,
  seed: int = 1,
  class_names: Sequence[str] | Mapping[str, str] | str | os.PathLike | None = None,
) -> FewShotSplit:
  """A prepared TFDS image-classification dataset ('dtd', 'oxford_flowers102', 'food101',
  'caltech101', 'sun397', 'imagenet2012', ...) as a FewShotSplit of encoded-image items.

  Nothing is downloaded: the dataset must already be prepared in `data_dir` (TFDS's default,
  $TFDS_DATA_DIR or ~/tensorflow_datasets, when None). Splits: train -> "train"; test -> "test",
  or "validation" where there is no "test" (food101, imagenet2012: their official evaluation
  sets); val -> "validation" where "test" exists. These are TFDS's splits, not CoOp's
  split_zhou files, so accuracies are comparable across methods run here but not digit for
  digit with CoOp-protocol tables.

  Class names are CoOp's spelling (`coop.tfds_class_names`: SUN397 and Caltech101 converted,
  Caltech101's two dropped classes dropped and labels renumbered). imagenet2012's labels are
  wnids: pass `class_names` (a path to CoOp's classnames.txt, a {wnid: name} mapping, or one
  name per label).

  Args:
    shots, seed: when given, only a K-shot sample of the train split is read (`sample_k_shot`
      over the labels, read in a first pass without decoding), so that ImageNet's 1.28M
      training images are never held in memory.

  Raises:
    ImportError: tensorflow_datasets is not installed (the message says what to install).
    DatasetMissingError: the dataset is unknown to TFDS or not prepared in `data_dir`.
  """
  tfds = import_tfds("CoOp's image folders with load_coop_split")
  builder = prepared_builder(tfds, name, data_dir, alternative=_COOP_ALTERNATIVE)
  splits = builder.info.splits
  test_split = "test" if "test" in splits else "validation"
  val_split = "validation" if test_split == "test" and "validation" in splits else None
  if "train" not in splits or test_split not in splits:
    raise InputError(
      f"TFDS {name!r} has splits {sorted(splits)}; expected train and test or validation."
    )
  names, relabel = tfds_class_names(name, label_names(builder), class_names)

  def read(split):
    """(record index, encoded bytes, label) in file order; dropped classes skipped."""
    for index, example in encoded_examples(tfds, builder, split):
      label = int(relabel[int(example["label"])])
      if label >= 0:
        yield index, example["image"], label

  if shots is None:
    train = tuple(LabeledImage(bytes(image), label) for _, image, label in read("train"))
  else:
    # Pass 1: labels only (records are read but not decoded); pass 2: the chosen images.
    chosen = sample_k_shot(
      [LabeledImage(index, label) for index, _, label in read("train")],
      shots,
      seed,
      class_names=names,
    )
    wanted = {index for index, _ in chosen}
    by_index = {
      index: LabeledImage(bytes(image), label)
      for index, image, label in read("train")
      if index in wanted
    }
    train = tuple(by_index[index] for index, _ in chosen)  # sample_k_shot's order
  test = tuple(LabeledImage(bytes(image), label) for _, image, label in read(test_split))
  val = (
    tuple(LabeledImage(bytes(image), label) for _, image, label in read(val_split))
    if val_split
    else ()
  )
  return FewShotSplit(tfds_canonical_name(name) or name, names, train, test, val)


# ---------------------------------------------------------------------------------------------
# The synthetic world (the offline stand-in for the datasets above).


def _memory_bytes() -> int | None:
  """The machine's physical memory, or None where the OS does not say."""
  try:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (AttributeError, ValueError, OSError):
    return None


def _check_synthetic_memory(classes: int, shots: int, n_test_per_class: int, size: int) -> None:
  """Refuses a synthetic world whose uint8 images would not fit in half the machine's memory,
  before drawing any (100,000,000 test images per class once grew to 19 GB, then hung).

  Raises:
    ConfigError: with the estimate, the machine's memory and the values to lower.
  """
  images = classes * (int(shots) + int(n_test_per_class))
  estimate = images * int(size) * int(size) * 3
  memory = _memory_bytes()
  limit = memory // 2 if memory else 64 << 30
  if estimate > limit:
    raise ConfigError(
      f"the synthetic world would hold {images:,} images of {size}x{size} px ({classes} "
      f"classes x ({shots} shots + {n_test_per_class} test images)), about "
      f"{estimate / 2**30:,.1f} GiB in memory, more than "
      + (f"half this machine's {memory / 2**30:,.1f} GiB" if memory else "64 GiB")
      + "; lower config.data.n_test_per_class, config.shots or config.data.image_size"
    )


def load_synthetic(
  shots: int,
  seed: int,
  n_test_per_class: int = 50,
  *,
  class_names: Sequence[str] | None = None,
  test_seed: int = 0,
  image_size: int = 64,
) -> FewShotSplit:
  """`synthetic_tasks.fewshot_dataset` as a FewShotSplit, uint8 [H, W, 3] sources.

  class_names: the task's classes, e.g. ("red striped star", "red dotted star"), any
  colour/pattern/shape combination (`synthetic_tasks.class_from_name`); None: the world's 12
  `FEWSHOT_CLASSES`. The train set is already K-shot (the world draws `shots` fresh images per
  class from `seed`), so it needs no `sample_k_shot`; the test set depends on `test_seed` only.
  The classes' CuPL-like prompts are `prompts.synthetic_prompts(class_names)`.
  """
  try:
    classes = synthetic_tasks.resolve_classes(class_names)
  except ValueError as e:
    raise ConfigError(f"config.data.class_names: {e}") from None
  _check_synthetic_memory(len(classes), shots, n_test_per_class, image_size)
  data = synthetic_tasks.fewshot_dataset(
    shots, seed, n_test_per_class, classes=classes, test_seed=test_seed, image_size=image_size
  )

  def items(images, labels):
    return tuple(LabeledImage(image, int(label)) for image, label in zip(images, labels))

  return FewShotSplit(
    "synthetic",
    tuple(data.class_names),
    items(data.train_images, data.train_labels),
    items(data.test_images, data.test_labels),
  )
