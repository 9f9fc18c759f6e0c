"""Reading PyTorch-style state dicts into {name: numpy array}.

safetensors files need no torch; pickles (.bin/.pt/.pth) and OpenAI's JIT
archives need torch, imported only then.
"""

from __future__ import annotations

import os
import zipfile
from typing import Mapping

import numpy as np

from stori_jax.checkpoints.errors import CheckpointError

StateDict = Mapping[str, np.ndarray]


def _import_torch(path: str):
  try:
    import torch  # pylint: disable=import-outside-toplevel
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


def read_state_dict(path: str | os.PathLike) -> dict[str, np.ndarray]:
  """{key: array} from .safetensors, a torch pickle, or a TorchScript archive."""
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise CheckpointError(f"Checkpoint file {path} does not exist.")
  if path.endswith(".safetensors"):
    from safetensors.numpy import load_file  # pylint: disable=import-outside-toplevel

    try:
      return dict(load_file(path))
    except Exception as e:  # safetensors raises its own error types.
      raise CheckpointError(f"Cannot read {path} as safetensors: {e}") from e
  torch = _import_torch(path)
  if is_torchscript(path):
    module = torch.jit.load(path, map_location="cpu")
    state = module.state_dict()
  else:
    state = torch.load(path, map_location="cpu", weights_only=True)
  # Training checkpoints nest the weights ({"state_dict": ...}, DDP "module." prefixes).
  if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
    state = state["state_dict"]
  if not isinstance(state, Mapping):
    raise CheckpointError(f"{path} holds a {type(state).__name__}, not a state dict.")
  if state and all(k.startswith("module.") for k in state):
    state = {k[len("module.") :]: v for k, v in state.items()}
  return {k: _to_numpy(v) for k, v in state.items() if hasattr(v, "detach")}
