"""Candidate successor of `tiny-synthetic`: pattern hard negatives in groups of four.

  python -m stori_jax.pretrain --config configs/tiny_clip_pretrain_quads.py \
      --workdir workdirs/tiny_clip_quads

configs/tiny_clip_pretrain.py made the shipped checkpoint. This recipe gives half of each batch
to groups of four objects that differ only in pattern, each caption naming it (see
stori_jax.pretrain.batch_for_step), lowers the two-colour / two-pattern group to 1/4, and
trains longer.
"""

from stori_jax.config_files import sibling_config


def get_config():
  config = sibling_config(__file__, "tiny_clip_pretrain")
  config.model.name = "tiny-synthetic-quads"
  config.data.hard_negative_fraction = 0.25
  config.data.pattern_negative_fraction = 0.5
  config.total_steps = 6000
  config.warmup_steps = 200
  return config
