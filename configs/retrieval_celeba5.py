"""Paper App. C.4 / Table 6: CelebA with five attributes (sex, smiling, bangs, gray hair,
eyeglasses), 32 categories x 5 images, two prompts (woman / man); P@80.

  python -m stori_jax.retrieve --config configs/retrieval_celeba5.py \
      --config.data.root=/data/celeba --workdir workdirs/retrieval_celeba5
"""

from stori_jax.retrieval.paper_config import CELEBA5_PROMPTS, celeba_config


def get_config():
  config = celeba_config(CELEBA5_PROMPTS, images_per_category=5)
  config.sweep.tasks = (0,)
  config.sweep.attributes = (2, 4)  # bangs w, eyeglasses 1 - w
  return config
