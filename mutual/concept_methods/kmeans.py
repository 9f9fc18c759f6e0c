"""K-means concepts (paper Sec. 3.1): the B images' L2-normalised foreground tokens clustered
jointly (mutual.concepts.kmeans_concepts), either as the authors' kmeans_pytorch call under the
seeding protocol (reference mode) or from seeded k-means++ starts (improved mode)."""

from __future__ import annotations

import functools

import jax

from mutual import concepts
from mutual.concept_methods import registry
from stori_jax.plumbing.config_files import ConfigError


# One program per class shape: eagerly, K-means' flattening, normalisation and start draws
# compiled about 20 small programs of their own.
@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def _kmeans_maps(features, mask, n_concepts: int, seed: int, init: str) -> jax.Array:
  return concepts.kmeans_concepts(features, mask, n_concepts=n_concepts, seed=seed, init=init)


def _fit(features, mask, n_concepts: int, settings):
  return _kmeans_maps(
    features, mask, n_concepts, int(settings["kmeans_seed"]), settings["kmeans_init"]
  )


def _check(settings) -> None:
  seed = settings["kmeans_seed"]
  if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
    raise ConfigError(
      "config.analysis.kmeans_seed (the seed of the K-means starts) must be an integer >= 0, "
      f"got {seed!r}."
    )
  # np.random.seed takes [0, 2**32): the protocol's seed of the authors' K-means call.
  if seed >= 2**32:
    raise ConfigError(
      "config.analysis.kmeans_seed must be below 2**32 (4294967296): np.random.seed, which the "
      f"reference's K-means protocol seeds with it, takes no more; got {seed}."
    )


def _reference(reference, fg_tokens, n_concepts: int, settings, stats):
  # utils.kmeans_clustering, once per class on the B images' foreground tokens (in image, row,
  # column order), after np.random.seed and torch.manual_seed.
  return reference.kmeans_labels(fg_tokens, n_concepts, int(settings["kmeans_seed"]), stats)


KMEANS = registry.register(
  registry.ConceptMethod(
    name="kmeans",
    title="K-means",
    fit=_fit,
    stages=dict(
      kmeans_init={
        "reference": "random",  # kmeans_pytorch: one random start
        "improved": "k-means++",  # 10 seeded k-means++ starts, the lowest inertia kept
      }
    ),
    choices=dict(kmeans_init=("random", "k-means++")),
    # Reference mode's K-means seeding protocol: np.random.seed and torch.manual_seed with it
    # before each class's kmeans_pytorch call (its start and empty-cluster redraws; mutual.
    # concepts.random_start_kmeans); improved mode's k-means++ starts take it as a PRNG key.
    defaults=dict(kmeans_seed=0),
    check=_check,
    reference=_reference,
  )
)
