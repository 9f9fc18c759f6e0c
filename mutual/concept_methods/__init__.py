"""The concept methods of the mutual-knowledge analysis, found by name (see registry.py).

Importing this package registers the built-in ones, PCA and K-means, in the paper's order.
"""

# The built-in methods register themselves on import, in the paper's order (its tables' columns).
from mutual.concept_methods import pca as _pca
from mutual.concept_methods import kmeans as _kmeans
from mutual.concept_methods.registry import (
  ConceptMethod,
  defaults,
  get,
  mode_stages,
  names,
  reference_labelers,
  register,
  stage_choices,
  title,
  unregister,
)

__all__ = [
  "ConceptMethod",
  "defaults",
  "get",
  "mode_stages",
  "names",
  "reference_labelers",
  "register",
  "stage_choices",
  "title",
  "unregister",
]
