"""SToRI on ImageNet, 16 shots, CLIP ViT-L/14, the paper's hyperparameters.

  python -m stori_jax.train --config configs/imagenet_16shot.py
  python -m stori_jax.train --config configs/imagenet_16shot.py --config.method=taskres
(configs/imagenet.py:shots=N,backbone=metaclip covers the other settings.)
"""

from stori_jax.fewshot.paper_config import fewshot_config


def get_config():
  return fewshot_config("imagenet", 16, "clip")
