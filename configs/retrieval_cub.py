"""Paper section 4.2 / Table 3 on CUB-200-2011: the 15 attributes of Table 10 in
combinations of three with different colours (57 prompts; the paper reports 58), all
images, prompt 'a photo of a bird, which has {0}, has {1}, and has {2}'.

  python -m stori_jax.retrieve --config configs/retrieval_cub.py \
      --config.data.root=/data/CUB_200_2011 --workdir workdirs/retrieval_cub
  python -m stori_jax.retrieve --config configs/retrieval_cub.py:backbone=metaclip \
      --config.data.root=/data/CUB_200_2011 --workdir workdirs/retrieval_cub_metaclip

`:backbone=metaclip` takes the MetaCLIP ViT-L/14 of the few-shot configs (default `clip`).
"""

import ml_collections

from stori_jax.retrieval.paper_config import backbone, base_config, cub_prompt_dicts


def get_config(argument=None):
  config = base_config()
  config.model = backbone(argument, __file__)  # or a local checkpoint path
  config.data = ml_collections.ConfigDict(
    {"source": "cub", "root": "", "seed": 0, "prompts": cub_prompt_dicts()}
  )
  config.data.images_per_category = ml_collections.config_dict.placeholder(int)
  config.sweep.tasks = (0,)
  config.sweep.attributes = (0, 1)
  return config
