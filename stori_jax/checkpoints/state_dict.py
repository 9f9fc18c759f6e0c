"""Reading PyTorch-style state dicts into {name: numpy array}.

safetensors files need no torch; pickles (.bin/.pt/.pth) and OpenAI's JIT
archives need torch, imported only then.
"""

from __future__ import annotations

import os
import zipfile
from typing import Mapping

import numpy as np
from safetensors.numpy import load_file

from stori_jax.checkpoints.errors import CheckpointError

StateDict = Mapping[str, np.ndarray]


def _import_torch(path: str):
  try:
    import torch  # optional: the torch extra
  except ImportError as e:
    raise CheckpointError(
      f"Reading {path} needs PyTorch (it is a torch pickle). Install it with "
      "`pip install stori-jax[torch]`, or convert the file to safetensors elsewhere."
    ) from e
  return torch


def _to_numpy(tensor) -> np.ndarray:
  # bf16 has no numpy dtype in torch's .numpy(); widen it to fp32.
  if str(tensor.dtype) == "torch.bfloat16":
    tensor = tensor.float()
  return tensor.detach().cpu().numpy()


def is_torchscript(path: str) -> bool:
  """OpenAI's released .pt files are TorchScript archives (a zip with constants.pkl)."""
  if not zipfile.is_zipfile(path):
    return False
  with zipfile.ZipFile(path) as archive:
    return any(name.endswith("constants.pkl") for name in archive.namelist())


def check_checkpoint_file(path: str) -> None:
  """Raises CheckpointError unless `path` is a non-empty regular file (named in the message)."""
  if not os.path.exists(path):
    raise CheckpointError(f"Checkpoint file {path} does not exist.")
  if not os.path.isfile(path):
    kind = "a directory" if os.path.isdir(path) else "not a regular file (a device, pipe or socket)"
    raise CheckpointError(
      f"{path} exists but is {kind}, so it is not a checkpoint. Pass a checkpoint file "
      "(.safetensors, .bin, .pt) or a checkpoint directory."
    )
  if os.path.getsize(path) == 0:
    raise CheckpointError(
      f"Checkpoint file {path} is empty (0 bytes): the download or copy was cut short. "
      "Fetch or copy it again."
    )


def _looks_like_text(path: str) -> str | None:
  """A short description when the file starts like text (an HTML error page, a pointer file)."""
  with open(path, "rb") as f:
    head = f.read(512)
  if b"\0" in head:
    return None
  try:
    text = head.decode("utf-8")
  except UnicodeDecodeError:
    return None
  first = text.strip().splitlines()[0][:80] if text.strip() else ""
  if first.lower().startswith(("<!doctype html", "<html")):
    return "an HTML page (a failed download saved under the checkpoint's name?)"
  if first.startswith("version https://git-lfs"):
    return "a Git LFS pointer, not the weights (run `git lfs pull`)"
  return f"a text file (it starts with {first!r})"


def _unreadable(path: str, kind: str, error: Exception) -> CheckpointError:
  text = _looks_like_text(path)
  what = f"it is {text}" if text else "it is truncated or not a checkpoint"
  return CheckpointError(
    f"Cannot read {path} as {kind} ({type(error).__name__}: {str(error)[:200]}): {what}. "
    "Fetch or copy the file again, or pass the right path."
  )


def read_state_dict(path: str | os.PathLike) -> dict[str, np.ndarray]:
  """{key: array} from .safetensors, a torch pickle, or a TorchScript archive.

  Raises:
    CheckpointError: naming the path and what is wrong (missing, not a file, empty,
      truncated, text instead of weights, not a state dict).
  """
  path = os.fspath(path)
  check_checkpoint_file(path)
  if path.endswith(".safetensors"):
    try:
      return dict(load_file(path))
    except Exception as e:  # safetensors raises its own error types.
      raise _unreadable(path, "safetensors", e) from None
  torch = _import_torch(path)
  try:
    if is_torchscript(path):
      module = torch.jit.load(path, map_location="cpu")
      state = module.state_dict()
    else:
      state = torch.load(path, map_location="cpu", weights_only=True)
  except Exception as e:  # EOFError, UnpicklingError, IndexError, RuntimeError, zipfile errors
    raise _unreadable(path, "a PyTorch checkpoint", e) from None
  # Training checkpoints nest the weights ({"state_dict": ...}, DDP "module." prefixes).
  if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
    state = state["state_dict"]
  if not isinstance(state, Mapping):
    raise CheckpointError(f"{path} holds a {type(state).__name__}, not a state dict.")
  if state and all(k.startswith("module.") for k in state):
    state = {k[len("module.") :]: v for k, v in state.items()}
  arrays = {k: _to_numpy(v) for k, v in state.items() if hasattr(v, "detach")}
  if not arrays:
    raise CheckpointError(f"{path} holds no tensors; it is not a model's state dict.")
  return arrays
