"""Shared machinery of the PyTorch -> Flax key mappings.

Every rule reads one source key (torch layout), transforms it and writes one
target key (this project's layout). The reader remembers which source keys
were used and which were absent, so a mismatched checkpoint is reported in the
checkpoint's own key names.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

import numpy as np

from stori_jax.checkpoints.errors import CheckpointMismatchError
from stori_jax.checkpoints.validate import check_float_weights, check_params, unflatten
from stori_jax.models import CLIPConfig


def linear_kernel(weight: np.ndarray) -> np.ndarray:
  """torch Linear weight [out, in] -> Flax Dense kernel [in, out]."""
  return np.ascontiguousarray(weight.T)


def conv_kernel(weight: np.ndarray) -> np.ndarray:
  """torch Conv2d weight [out, in, kh, kw] -> Flax Conv kernel [kh, kw, in, out]."""
  return np.ascontiguousarray(weight.transpose(2, 3, 1, 0))


class StateDictReader:
  """Collects target params from a torch-layout state dict."""

  def __init__(
    self, state_dict: Mapping[str, np.ndarray], source: str, ignored: Iterable[str] = ()
  ):
    self.state_dict = state_dict
    self.source = source
    self.ignored = set(ignored)
    self.used: set[str] = set()
    self.absent: set[str] = set()
    self.flat: dict[str, np.ndarray] = {}

  def put(self, target: str, key: str, transform: Callable[[np.ndarray], np.ndarray] = None):
    if key not in self.state_dict:
      self.absent.add(key)
      return
    self.used.add(key)
    check_float_weights({key: self.state_dict[key]}, self.source)
    value = np.asarray(self.state_dict[key], dtype=np.float32)
    self.flat[target] = transform(value) if transform else value

  def put_linear(self, target: str, key: str):
    """A torch Linear `key.weight`/`key.bias` into a Flax Dense `target/kernel`/`target/bias`."""
    self.put(f"{target}/kernel", f"{key}.weight", linear_kernel)
    self.put(f"{target}/bias", f"{key}.bias")

  def put_layer_norm(self, target: str, key: str):
    self.put(f"{target}/scale", f"{key}.weight")
    self.put(f"{target}/bias", f"{key}.bias")

  def put_split(self, targets: tuple[str, ...], key: str, transform=None):
    """A fused tensor (e.g. in_proj_weight [3W, W]) split evenly along axis 0."""
    if key not in self.state_dict:
      self.absent.add(key)
      return
    self.used.add(key)
    check_float_weights({key: self.state_dict[key]}, self.source)
    parts = np.split(np.asarray(self.state_dict[key], dtype=np.float32), len(targets), axis=0)
    for target, part in zip(targets, parts):
      self.flat[target] = transform(part) if transform else part

  def params(self, config: CLIPConfig) -> dict:
    """The nested params; raises CheckpointMismatchError on any mismatch."""
    unexpected = set(self.state_dict) - self.used - self.ignored
    if self.absent or unexpected:
      raise CheckpointMismatchError(self.source, self.absent, unexpected)
    params = unflatten(self.flat)
    check_params(params, config, self.source)
    return params


def block_count(state_dict: Mapping[str, np.ndarray], prefix: str) -> int:
  """Number of blocks `prefix{i}.` present in the state dict."""
  indices = {
    int(k[len(prefix) :].split(".")[0])
    for k in state_dict
    if k.startswith(prefix) and k[len(prefix) :].split(".")[0].isdigit()
  }
  return max(indices) + 1 if indices else 0
