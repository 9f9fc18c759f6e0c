"""Evaluation of CLIP bundles: zero-shot accuracy, retrieval and SToRI's emphasis effect.

`stori_jax.evaluation.synthetic_world` holds the synthetic-world measurements; its public names
are re-exported here lazily (so that `python -m stori_jax.evaluation.synthetic_world` does not
import the module twice).
"""

import importlib

_EXPORTS = (
  "EMPHASIS_FAMILIES",
  "EMPHASIS_PATTERNS",
  "EMPHASIS_SEED",
  "EMPHASIS_WEIGHTS",
  "FAMILY_TEMPLATES",
  "METHODS",
  "RETRIEVAL_SEED",
  "ZERO_SHOT_FAMILIES",
  "ZERO_SHOT_SEED",
  "emphasis_effect",
  "emphasis_prompt",
  "emphasis_scenes",
  "emphasis_triples",
  "evaluate",
  "markdown_tables",
  "retrieval_batch",
  "retrieval_recall",
  "zero_shot_attributes",
  "zero_shot_batch",
  "zero_shot_prompts",
)
__all__ = list(_EXPORTS) + ["synthetic_world"]


def __getattr__(name):
  if name in _EXPORTS:
    return getattr(importlib.import_module("stori_jax.evaluation.synthetic_world"), name)
  if name == "synthetic_world":
    return importlib.import_module("stori_jax.evaluation.synthetic_world")
  raise AttributeError(f"module 'stori_jax.evaluation' has no attribute {name!r}")


def __dir__():
  return sorted(__all__)
