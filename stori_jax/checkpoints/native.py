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
import numpy as np

from stori_jax.checkpoints.errors import CheckpointError
from stori_jax.checkpoints.validate import check_params, flatten, unflatten
from stori_jax.models import CLIPConfig, param_shapes
from stori_jax.preprocess import PreprocessConfig

CONFIG_FILE = "stori_config.json"
SAFETENSORS_FILE = "params.safetensors"
ORBAX_DIR = "params"
FORMAT_VERSION = 1


def is_native_dir(path: str | os.PathLike) -> bool:
  return os.path.isfile(os.path.join(path, CONFIG_FILE))


def save(
  directory: str | os.PathLike,
  config: CLIPConfig,
  params: Mapping[str, Any],
  preprocess_config: PreprocessConfig = PreprocessConfig(),
  params_format: str = "safetensors",
  metadata: Mapping[str, Any] | None = None,
  params_dtype: str = "float32",
) -> str:
  """Writes a converted checkpoint; returns the directory.

  params_dtype "float16"/"bfloat16" halves the file (safetensors only); loading
  always returns float32 params.
  """
  directory = os.path.abspath(directory)
  os.makedirs(directory, exist_ok=True)
  check_params(params, config, "params to save")
  if params_format == "safetensors":
    from safetensors.numpy import save_file  # pylint: disable=import-outside-toplevel
    import ml_dtypes  # pylint: disable=import-outside-toplevel

    dtype = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[
      params_dtype
    ]
    # np.array (not ascontiguousarray) keeps 0-d params 0-d.
    flat = {k: np.array(v, dtype, order="C") for k, v in flatten(params).items()}
    save_file(flat, os.path.join(directory, SAFETENSORS_FILE))
  elif params_format == "orbax":
    if params_dtype != "float32":
      raise ValueError(
        "orbax checkpoints are written in float32; use safetensors for "
        f"params_dtype={params_dtype!r}."
      )
    import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel

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
  with open(os.path.join(directory, CONFIG_FILE), "w", encoding="utf-8") as f:
    json.dump(meta, f, indent=2)
  return directory


def load(directory: str | os.PathLike):
  """-> (CLIPConfig, params, PreprocessConfig, metadata dict)."""
  directory = os.path.abspath(directory)
  path = os.path.join(directory, CONFIG_FILE)
  try:
    with open(path, encoding="utf-8") as f:
      meta = json.load(f)
    config = CLIPConfig.from_dict(meta["config"])
  except (OSError, KeyError, ValueError, TypeError) as e:
    raise CheckpointError(f"Cannot read {path}: {e}") from e
  preprocess_config = PreprocessConfig(
    **{k: tuple(v) if isinstance(v, list) else v for k, v in meta.get("preprocess", {}).items()}
  )
  params_format = meta.get("params_format", "safetensors")
  if params_format == "safetensors":
    from safetensors.numpy import load_file  # pylint: disable=import-outside-toplevel

    params = unflatten(
      {
        k: v.astype(np.float32)
        for k, v in load_file(os.path.join(directory, SAFETENSORS_FILE)).items()
      }
    )
  elif params_format == "orbax":
    import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel

    # Restoring as host numpy arrays needs no sharding information.
    restore_args = jax.tree_util.tree_map(
      lambda _: ocp.RestoreArgs(restore_type=np.ndarray), param_shapes(config)
    )
    params = ocp.PyTreeCheckpointer().restore(
      os.path.join(directory, ORBAX_DIR), restore_args=restore_args
    )
  else:
    raise CheckpointError(f"{path}: unknown params_format {params_format!r}.")
  check_params(params, config, directory)
  return config, params, preprocess_config, meta.get("metadata", {})
