"""The embedded default: few-shot SToRI on the synthetic world with the shipped tiny CLIP.

  python -m stori_jax.train --config configs/demo.py

12 fine-grained classes (colour x pattern x shape), 16 shots, 8 CuPL-like
prompts per class plus the Base prompt; offline, a few minutes on 2 CPU cores.
"""

import ml_collections


def get_config():
  config = ml_collections.ConfigDict()
  config.name = "demo"
  config.method = "stori"  # or "taskres"
  config.seed = 1
  config.shots = 16
  config.model = ml_collections.ConfigDict(dict(source="tiny-synthetic", arch=""))
  config.data = ml_collections.ConfigDict(
    dict(
      name="synthetic",
      source="synthetic",
      root="",
      tfds_name="",
      image_size=64,
      n_test_per_class=50,
    )
  )
  config.prompts = ml_collections.ConfigDict(
    dict(cupl_path="", per_class=0, rare_tokens=0, use_base=True)
  )
  # Reweighting from the paper's relative depth (blocks 4-6 of the tiny 6-block tower).
  config.start_block = ml_collections.config_dict.placeholder(int)
  config.views = 4  # Cached augmented views per training image.
  # The objects fill a small part of a 64x64 image: crops keep at least half of it.
  config.augment_scale = (0.5, 1.0)
  config.batch_size = 256
  config.epochs = 100
  config.optim = ml_collections.ConfigDict(dict(lr=0.05))
  config.taskres = ml_collections.ConfigDict(dict(alpha=0.5, lr=2e-4, weight_decay=5e-3))
  config.chunk = 64
  config.log_every = 10
  config.eval_every = 50
  config.checkpoint_every = 50
  return config
