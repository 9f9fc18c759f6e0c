"""The TFDS reader (stori_jax.data.tfds) against a small stand-in module: the install message,
unknown and unprepared datasets named with the command that prepares them, and a split read in
file order with its images left encoded."""

import sys
import types

import numpy as np
import pytest

from stori_jax.data import tfds
from stori_jax.data.files import DatasetMissingError
from stori_jax.plumbing.errors import UserError


class _SkipDecoding:
  pass


def _stand_in(prepared=True, with_core=True):
  """A module with the few tensorflow_datasets calls the reader makes; `reads` logs them."""
  reads = []

  class NotFound(Exception):
    pass

  class Builder:
    data_dir = "/data/tfds/dtd/3.0.0"
    info = types.SimpleNamespace(
      features={"label": types.SimpleNamespace(names=["banded", "dotted"])}
    )

    def is_prepared(self):
      return prepared

    def as_dataset(self, split, shuffle_files, decoders):
      reads.append((split, shuffle_files, type(decoders["image"])))
      return [{"image": b"png%d" % i, "label": np.int64(i % 2)} for i in range(3)]

  def builder(name, data_dir=None):
    if name != "dtd":
      raise NotFound(f"no {name}")
    return Builder()

  module = types.SimpleNamespace(
    builder=builder, as_numpy=iter, decode=types.SimpleNamespace(SkipDecoding=_SkipDecoding)
  )
  if with_core:
    module.core = types.SimpleNamespace(DatasetNotFoundError=NotFound)
  return module, reads


def test_not_installed_is_a_user_error_with_the_pip_command(monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # the import now fails
  with pytest.raises(tfds.TfdsMissingError) as error:
    tfds.import_tfds("an image folder")
  assert isinstance(error.value, (UserError, ImportError))
  message = str(error.value)
  assert "pip install tensorflow-datasets tensorflow" in message and "an image folder" in message
  assert 'pip install "stori-jax[tfds]"' in message  # setup.py's extra


def test_installed_module_is_returned(monkeypatch):
  module, _ = _stand_in()
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", module)
  assert tfds.import_tfds() is module


def test_unknown_and_unprepared_datasets_say_how_to_prepare_them():
  module, _ = _stand_in()
  with pytest.raises(DatasetMissingError, match="TFDS has no dataset 'nope'"):
    tfds.prepared_builder(module, "nope")
  module, _ = _stand_in(prepared=False)
  with pytest.raises(DatasetMissingError) as error:
    tfds.prepared_builder(module, "dtd", "/data/tfds", alternative="CoOp's folders")
  message = str(error.value)
  assert "`tfds build dtd --data_dir /data/tfds`" in message and "or use CoOp's folders" in message
  # A module without tfds.core (older TFDS, or a stand-in): a builder failure still propagates.
  module, _ = _stand_in(with_core=False)
  with pytest.raises(Exception, match="no nope"):
    tfds.prepared_builder(module, "nope")


def test_a_split_is_read_in_file_order_with_images_encoded():
  module, reads = _stand_in()
  builder = tfds.prepared_builder(module, "dtd")
  assert tfds.label_names(builder) == ["banded", "dotted"]
  examples = list(tfds.encoded_examples(module, builder, "train+test"))
  assert [i for i, _ in examples] == [0, 1, 2]
  assert [e["image"] for _, e in examples] == [b"png0", b"png1", b"png2"]
  assert reads == [("train+test", False, _SkipDecoding)]  # never shuffled, never decoded
