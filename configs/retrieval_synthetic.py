"""Preference retrieval on the synthetic world (offline default; paper section 4.2 setup).

  python -m stori_jax.retrieve --config configs/retrieval_synthetic.py \
      --workdir workdirs/retrieval_synthetic

24 prompts "a photo of a {colour} {pattern} {shape}", each with its 8 categories
(value or alternative of each attribute) x 8 rendered images, as in
stori_jax.world_evaluation.metrics.emphasis_effect. The sweep gives the pattern w and the
colour 1 - w (the tiny model's pattern is its weakest attribute; see docs/embedded_world.md).
"""

import ml_collections

from stori_jax.data.synthetic_tasks import EMPHASIS_SEED
from stori_jax.retrieval.paper_config import base_config


def get_config():
  config = base_config()
  config.model = "tiny-synthetic"
  config.data = ml_collections.ConfigDict(
    {"source": "synthetic", "n_triples": 24, "images_per_category": 8, "seed": EMPHASIS_SEED}
  )
  config.sweep.attributes = (1, 0)
  return config
