"""This project's checkpoint format: a directory with stori_config.json and the params.
The params are a flat safetensors file (keys like `text/resblocks_0/attn/query/kernel`)
or an orbax PyTree checkpoint in `params/`; the JSON holds the architecture,
the preprocessing and free-form metadata (where the weights came from).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

import jax
import ml_dtypes
import numpy as np
import safetensors.numpy
from safetensors.numpy import load_file, save_file

from stori_jax.plumbing import jsonio, paths
from stori_jax.checkpoints.errors import CheckpointError
from stori_jax.checkpoints.validate import (
  check_float_weights,
  check_config_fits_weights,
  check_params,
  config_from_dict,
  flatten,
  preprocess_from_dict,
  unflatten,
)
from stori_jax.data.files import read_json
from stori_jax.models import CLIPConfig, param_shapes
from stori_jax.data.preprocess import PreprocessConfig

CONFIG_FILE = "stori_config.json"
SAFETENSORS_FILE = "params.safetensors"
ORBAX_DIR = "params"
FORMAT_VERSION = 1


def is_native_dir(path: str | os.PathLike) -> bool:
  return paths.isfile(os.path.join(path, CONFIG_FILE))


def save(
  directory: str | os.PathLike,
  config: CLIPConfig,
  params: Mapping[str, Any],
  preprocess_config: PreprocessConfig | None = None,
  params_format: str = "safetensors",
  metadata: Mapping[str, Any] | None = None,
  params_dtype: str = "float32",
) -> str:
  """Writes a converted checkpoint; returns the directory.

  params_dtype "float16"/"bfloat16" halves the file (safetensors only); loading
  always returns float32 params. preprocess_config defaults to OpenAI's at the model's size.
  """
  if preprocess_config is None:
    preprocess_config = PreprocessConfig(config.vision.image_size)
  directory = paths.absolute(directory)
  paths.makedirs(directory, exist_ok=True)
  check_params(params, config, "params to save")
  if params_format == "safetensors":
    dtype = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[
      params_dtype
    ]
    # np.array (not ascontiguousarray) keeps 0-d params 0-d.
    flat = {k: np.array(v, dtype, order="C") for k, v in flatten(params).items()}
    # Whole or absent (a kill mid-write keeps the old file); safetensors writes by path, to the
    # writer's temporary file, so the params are never serialised into memory as well.
    with paths.AtomicWrite(paths.join(directory, SAFETENSORS_FILE)) as f:
      save_file(flat, f.name)
  elif params_format == "orbax":
    if params_dtype != "float32":
      raise ValueError(
        "orbax checkpoints are written in float32; use safetensors for "
        f"params_dtype={params_dtype!r}."
      )
    import orbax.checkpoint as ocp  # lazy: a slow import that only the orbax format needs

    target = os.path.join(directory, ORBAX_DIR)
    ocp.PyTreeCheckpointer().save(target, params, force=True)
  else:
    raise ValueError(f"params_format must be 'safetensors' or 'orbax', got {params_format!r}.")
  meta = {
    "format_version": FORMAT_VERSION,
    "params_format": params_format,
    "params_dtype": params_dtype,
    "config": config.to_dict(),
    "preprocess": dataclasses.asdict(preprocess_config),
    "metadata": dict(metadata or {}),
  }
  # Strict and atomic: a kill mid-write never leaves a half config next to good params.
  jsonio.write_json(os.path.join(directory, CONFIG_FILE), meta, indent=2)
  return directory


def _read_params_safetensors(path: str) -> dict[str, np.ndarray]:
  if not paths.isfile(path):
    raise CheckpointError(
      f"{path} does not exist, but {CONFIG_FILE} next to it says the params are there "
      f"(params_format 'safetensors'). Copy the whole converted directory again, or convert "
      "the original weights again with python -m stori_jax.convert."
    )
  if paths.size(path) == 0:
    raise CheckpointError(
      f"{path} is empty (0 bytes): the copy or conversion was cut short. Copy it again, or "
      "convert the original weights again with python -m stori_jax.convert."
    )
  try:
    return (
      safetensors.numpy.load(paths.read_bytes(path)) if paths.is_remote(path) else load_file(path)
    )
  except Exception as e:  # safetensors raises its own error types (SafetensorError, ...)
    raise CheckpointError(
      f"{path} is not a readable safetensors file ({type(e).__name__}: {e}); it is probably "
      "truncated (an interrupted copy or download). Copy it again, or convert the original "
      "weights again with python -m stori_jax.convert."
    ) from None


def params_path(directory: str | os.PathLike) -> str:
  """Where a converted directory keeps its params (the file or orbax folder)."""
  directory = paths.absolute(directory)
  try:
    with paths.open(os.path.join(directory, CONFIG_FILE)) as f:
      params_format = json.load(f).get("params_format", "safetensors")
  except (OSError, ValueError, AttributeError):
    params_format = "safetensors"
  name = ORBAX_DIR if params_format == "orbax" else SAFETENSORS_FILE
  return os.path.join(directory, name)


def read_metadata(directory: str | os.PathLike) -> dict[str, Any]:
  """The free-form metadata of a checkpoint in this format (where its weights came from), without
  reading its params."""
  path = os.path.join(paths.absolute(directory), CONFIG_FILE)
  meta = read_json(path, "checkpoint config", error=CheckpointError)
  return dict(meta.get("metadata", {})) if isinstance(meta, dict) else {}


def load(directory: str | os.PathLike):
  """-> (CLIPConfig, params, PreprocessConfig, metadata dict).

  Raises:
    CheckpointError: naming the file and what is wrong with it (not UTF-8 JSON, a key of the
      wrong type, a missing, empty or truncated params file, mismatched shapes).
  """
  directory = paths.absolute(directory)
  path = os.path.join(directory, CONFIG_FILE)
  meta = read_json(path, "checkpoint config", error=CheckpointError)
  if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict):
    raise CheckpointError(
      f'{path} has no "config" object (the architecture); is it this project\'s '
      f"{CONFIG_FILE}? Convert the checkpoint again with python -m stori_jax.convert."
    )
  config = config_from_dict(meta["config"], path)
  preprocess_config = preprocess_from_dict(meta.get("preprocess"), config, path)
  params_format = meta.get("params_format", "safetensors")
  if params_format == "safetensors":
    target = os.path.join(directory, SAFETENSORS_FILE)
    flat = _read_params_safetensors(target)
    check_float_weights(flat, target)
    check_config_fits_weights(config, {k: v.shape for k, v in flat.items()}, target, path)
    params = unflatten({k: v.astype(np.float32) for k, v in flat.items()})
  elif params_format == "orbax":
    import orbax.checkpoint as ocp  # lazy: a slow import that only the orbax format needs

    # Restoring as host numpy arrays needs no sharding information.
    restore_args = jax.tree_util.tree_map(
      lambda _: ocp.RestoreArgs(restore_type=np.ndarray), param_shapes(config)
    )
    target = os.path.join(directory, ORBAX_DIR)
    try:
      params = ocp.PyTreeCheckpointer().restore(target, restore_args=restore_args)
    except Exception as e:  # orbax / tensorstore raise many types for a damaged checkpoint
      raise CheckpointError(
        f"Cannot restore the orbax params {target} ({type(e).__name__}: {str(e)[:300]}); copy "
        "the directory again, or convert the original weights again."
      ) from None
    check_float_weights(flatten(params), target)
  else:
    raise CheckpointError(
      f"{path}: unknown params_format {params_format!r}; expected 'safetensors' or 'orbax'."
    )
  check_params(params, config, directory)
  return config, params, preprocess_config, meta.get("metadata", {})
