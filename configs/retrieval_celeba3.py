"""Paper section 4.2 / Table 3 on CelebA: 20 prompts of 3 attributes (Table 9), 8 categories
x 100 images each, CLIP ViT-L/14 reweighted from block 7.

  python -m stori_jax.retrieve --config configs/retrieval_celeba3.py \
      --config.data.root=/data/celeba --workdir workdirs/retrieval_celeba3
  python -m stori_jax.retrieve --config configs/retrieval_celeba3.py:backbone=metaclip \
      --config.data.root=/data/celeba --workdir workdirs/retrieval_celeba3_metaclip

`:backbone=metaclip` takes the MetaCLIP ViT-L/14 of the few-shot configs (default `clip`).

data.root holds list_attr_celeba.txt and img_align_celeba/. With a prepared TFDS celeb_a
instead: --config.data.source=celeba_tfds (needs tensorflow-datasets and tensorflow).
The sweep (Figure 5) uses 'a photo of a woman with blond hair, wearing eyeglasses'.
"""

from stori_jax.retrieval.paper_config import CELEBA3_PROMPTS, backbone, celeba_config


def get_config(argument=None):
  config = celeba_config(CELEBA3_PROMPTS, 100, backbone(argument, __file__))
  config.sweep.tasks = (14,)  # Table 9 row 8, woman: blond hair, eyeglasses
  config.sweep.attributes = (1, 2)
  return config
