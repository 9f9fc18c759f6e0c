"""PCA concepts (paper Sec. 3.1): each foreground patch takes the principal axis, of a joint PCA
over the B images' foreground tokens, on which its min-max scaled score is largest
(mutual.concepts.pca_concepts)."""

from __future__ import annotations

from mutual import concepts
from mutual.concept_methods import registry


def _fit(features, mask, n_concepts: int, settings):
  return concepts.pca_concepts(
    features, mask, n_concepts=n_concepts, sign_rule=settings["pca_sign_rule"]
  )


def _reference(reference, fg_tokens, n_concepts: int, settings, stats):
  # utils.get_component_feats and its argmax, on scikit-learn's PCA.
  del stats
  return reference.pca_labels(fg_tokens.cpu().numpy(), n_concepts, settings["pca_sign_rule"])


PCA = registry.register(
  registry.ConceptMethod(
    name="pca",
    title="PCA",
    fit=_fit,
    stages=dict(
      pca_sign_rule={
        "reference": "sklearn<1.5",  # scikit-learn before 1.5, as the reference ran it
        "improved": "sklearn>=1.5",  # the convention of every current scikit-learn solver
      }
    ),
    choices=dict(pca_sign_rule=("sklearn<1.5", "sklearn>=1.5")),
    reference=_reference,
  )
)
