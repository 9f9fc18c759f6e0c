"""Contrastive pretraining of the tiny CLIP shipped as `tiny-synthetic`.

  python -m stori_jax.pretrain --config configs/tiny_clip_pretrain.py --workdir /tmp/tiny_clip

Real CLIP architecture (causal text tower with the real BPE tokenizer, ViT)
at toy width, trained on freshly generated synthetic-world images each step.
This config and seed made the shipped checkpoint (stori_jax/assets/tiny-synthetic/, whose
stori_config.json echoes it under metadata.pretrain_config; a test checks they agree).
"""

import ml_collections


def get_config():
  config = ml_collections.ConfigDict()
  config.seed = 0
  config.model = ml_collections.ConfigDict(
    dict(
      embed_dim=64,
      # Six text blocks, so SToRI's default reweighting (blocks 4-6) starts mid-way.
      text=dict(
        vocab_size=49408, context_length=64, width=64, layers=6, heads=4, activation="quick_gelu"
      ),
      # 64x64 images in 8x8 patches: an 8x8 grid for the mutual-knowledge analysis.
      vision=dict(
        image_size=64, patch_size=8, width=96, layers=4, heads=4, activation="quick_gelu"
      ),
      name="tiny-synthetic",
    )
  )
  # A quarter of each batch: single objects whose colour and pattern take only two values
  # (colour alone cannot match them); half: groups of four objects that differ only in pattern
  # (pattern is what a tiny ViT learns last); the rest: the world's usual one- and two-object
  # scenes (see stori_jax.pretraining.batch_for_step).
  config.data = ml_collections.ConfigDict(
    dict(
      max_objects=2,
      two_object_fraction=0.35,
      hard_negative_fraction=0.25,
      pattern_negative_fraction=0.5,
    )
  )
  # Captions are at most ~34 tokens: training cuts token rows to this length
  # (exact: the mask is causal); the context stays 64 for longer prompts.
  config.text_length = 40
  # Sized to finish in under an hour on 2 CPU cores.
  config.batch_size = 128
  config.total_steps = 4000
  config.warmup_steps = 200
  config.learning_rate = 1.5e-3
  config.end_learning_rate_fraction = 0.02
  config.weight_decay = 0.1
  config.adam_b2 = 0.98
  config.max_logit_scale = 100.0
  config.log_every = 50
  config.checkpoint_every = 250
  config.keep_checkpoints = 2
  config.eval_every = 500
  config.eval_images = 512
  # Where the final model is written in this project's format (relative to
  # the workdir unless absolute); params stored as float16 keeps it small.
  config.export_dir = "export"
  config.export_dtype = "float16"
  return config
