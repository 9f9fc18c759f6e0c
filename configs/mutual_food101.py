"""Mutual knowledge on Food-101 test (paper App. G, Table 7) with OpenAI ViT-B/16.

python -m mutual.analyze --config configs/mutual_food101.py --workdir DIR \
  --config.data.root=/data/food-101/images --config.data.descriptors=PATH
TFDS: --config.data.source=tfds (food101, its validation split).
"""

from mutual.paper_config import real_dataset_config

# Paper Table 8.
TEMPLATES = ("a photo of {c}, a type of food.",)


def get_config():
  return real_dataset_config("food101", "food101", TEMPLATES)
