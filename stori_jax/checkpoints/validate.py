"""Checking a parameter tree against the shapes an architecture expects."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
from flax import traverse_util

from stori_jax.checkpoints.errors import CheckpointMismatchError
from stori_jax.models import CLIPConfig, param_shapes


def flatten(params: Mapping[str, Any]) -> dict[str, Any]:
  """Nested params -> {'text/resblocks_0/attn/query/kernel': array}."""
  return traverse_util.flatten_dict(params, sep="/")


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
  return traverse_util.unflatten_dict(dict(flat), sep="/")


def check_params(
  params: Mapping[str, Any],
  config: CLIPConfig,
  source: str = "parameters",
  unexpected_source_keys=(),
) -> None:
  """Raises CheckpointMismatchError naming every missing, unexpected or misshaped key.

  unexpected_source_keys are keys of the original checkpoint that no rule consumed.
  """
  want = flatten(param_shapes(config))
  got = flatten(params)
  missing = set(want) - set(got)
  unexpected = (set(got) - set(want)) | set(unexpected_source_keys)
  mismatched = [
    (k, tuple(np.shape(got[k])), tuple(want[k].shape))
    for k in set(want) & set(got)
    if tuple(np.shape(got[k])) != tuple(want[k].shape)
  ]
  if missing or unexpected or mismatched:
    raise CheckpointMismatchError(source, missing, unexpected, mismatched)
