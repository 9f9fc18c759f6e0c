"""Reading prepared TensorFlow Datasets (TFDS): the one importer, builder check and split reader.

TFDS is optional: `import_tfds` imports it or says what to install. Nothing is ever downloaded:
`prepared_builder` refuses a dataset that TFDS does not know or that is not prepared in the data
folder, with the `tfds build` command that prepares it. `encoded_examples` reads a split in file
order with the images left encoded (bytes), so that a split costs its file size in memory; they
are decoded later by `images.open_image`.

The functions take the `tensorflow_datasets` module as an argument, so that a caller (or a test)
can hand them a stand-in with the same few calls.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Any, Iterator

from stori_jax.data.files import DatasetMissingError
from stori_jax.plumbing import paths
from stori_jax.plumbing.errors import UserError


class TfdsMissingError(UserError, ImportError):
  """tensorflow_datasets is not installed; the message says what to install."""


def import_tfds(alternative: str = "") -> ModuleType:
  """The `tensorflow_datasets` module.

  Args:
    alternative: the reader to use instead, for the message ("an image folder (...)").

  Raises:
    TfdsMissingError: it is not installed; the message gives the pip command.
  """
  try:
    return importlib.import_module("tensorflow_datasets")
  except ImportError as error:
    raise TfdsMissingError(
      'Loading a TFDS dataset needs TensorFlow Datasets: `pip install "stori-jax[tfds]"` '
      '(from a clone: `pip install -e ".[tfds]"`; it is `pip install tensorflow-datasets '
      "tensorflow`), then `tfds build <name> --data_dir DIR` once to prepare the dataset"
      + (f". Or use {alternative} instead, which needs neither." if alternative else ".")
    ) from error


def prepared_builder(
  tfds: ModuleType, name: str, data_dir: str | os.PathLike | None = None, *, alternative: str = ""
) -> Any:
  """TFDS's builder of the dataset `name` ("dtd", "imagenet2012", "celeb_a", ...), prepared.

  Args:
    tfds: the module (`import_tfds()`, or a stand-in).
    data_dir: where the dataset was prepared; None: TFDS's default ($TFDS_DATA_DIR or
      ~/tensorflow_datasets).
    alternative: the reader to use instead, for the message.

  Raises:
    DatasetMissingError: TFDS has no such dataset, or it is not prepared in `data_dir`; the
      message gives the `tfds build` command.
  """
  data_dir = None if data_dir is None else os.fspath(data_dir)
  not_found = getattr(getattr(tfds, "core", None), "DatasetNotFoundError", LookupError)
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except not_found as error:
    raise DatasetMissingError(f"TFDS has no dataset {name!r}: {error}") from error
  if not _is_prepared(builder):
    raise DatasetMissingError(
      f"The TFDS dataset {name!r} is not prepared in {builder.data_dir}. Prepare it once with "
      f"`tfds build {name} --data_dir {data_dir or '~/tensorflow_datasets'}` (imagenet2012 "
      "needs ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar from https://image-net.org "
      "in <data_dir>/downloads/manual first)" + (f", or use {alternative}." if alternative else ".")
    )
  return builder


def _is_prepared(builder) -> bool:
  is_prepared = getattr(builder, "is_prepared", None)
  if is_prepared is not None:
    return bool(is_prepared())
  return paths.isdir(os.fspath(builder.data_dir))  # TFDS before is_prepared() existed


def label_names(builder) -> list[str]:
  """The names of the builder's integer "label" feature, by label."""
  return list(builder.info.features["label"].names)


def encoded_examples(tfds: ModuleType, builder, split: str) -> Iterator[tuple[int, dict]]:
  """(record index, example) of `split` ("train", "validation", "train+test", ...) in file
  order, as numpy: example["image"] is the encoded image (bytes), the other features decoded."""
  dataset = builder.as_dataset(
    split=split, shuffle_files=False, decoders={"image": tfds.decode.SkipDecoding()}
  )
  yield from enumerate(tfds.as_numpy(dataset))
