"""Paper App. C.4 / Table 6: CelebA with five attributes (sex, smiling, bangs, gray hair,
eyeglasses), 32 categories x 5 images, two prompts (woman / man); P@80.

  python -m stori_jax.retrieve --config configs/retrieval_celeba5.py \
      --config.data.root=/data/celeba --workdir workdirs/retrieval_celeba5
  python -m stori_jax.retrieve --config configs/retrieval_celeba5.py:backbone=metaclip \
      --config.data.root=/data/celeba --workdir workdirs/retrieval_celeba5_metaclip

`:backbone=metaclip` takes the MetaCLIP ViT-L/14 of the few-shot configs (default `clip`).
"""

from stori_jax.retrieval.paper_config import CELEBA5_PROMPTS, backbone, celeba_config


def get_config(argument=None):
  config = celeba_config(CELEBA5_PROMPTS, 5, backbone(argument, __file__))
  config.sweep.tasks = (0,)
  config.sweep.attributes = (2, 4)  # bangs w, eyeglasses 1 - w
  return config
