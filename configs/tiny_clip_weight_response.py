"""Weight-response training of the shipped tiny CLIP (`tiny-synthetic`), the stage after
contrastive pretraining (configs/tiny_clip_pretrain.py made `tiny-synthetic-base`):

  python -m stori_jax.pretrain --config configs/tiny_clip_weight_response.py --workdir /tmp/wr

The text tower learns to respond to token weights at blocks start_block..6 (see
stori_jax/pretraining/weight_response.py); the image tower and the temperature are the base model's.
This config and seed made the shipped checkpoint (its stori_config.json echoes it under
metadata.weight_response_config; a test checks they agree).
"""

import ml_collections


def get_config():
  config = ml_collections.ConfigDict()
  config.stage = "weight_response"
  config.init_from = "tiny-synthetic-base"
  config.seed = 0
  # Blocks trained to respond (4..6 of 6: the paper's second half), and the default start
  # block the exported model stores, chosen with `python -m stori_jax.start_block` (docs/embedded_world.md).
  config.start_block = 4
  config.default_start_block = 4
  # Weights a caption's attribute word gets; 1 is the plain caption, trained by `keep`.
  config.weights = (0.0, 0.5, 1.5)
  config.captions = 30000
  config.template_fraction = 1 / 3
  config.text_length = 40
  config.batch_size = 128
  config.total_steps = 1500
  config.warmup_steps = 100
  config.learning_rate = 1e-3
  config.end_learning_rate_fraction = 0.05
  config.log_every = 25
  config.checkpoint_every = 250
  config.keep_checkpoints = 2
  config.export_dir = "export"
  config.export_dtype = "float16"
  return config
