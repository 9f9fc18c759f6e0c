"""Mutual knowledge on Places365 val (paper App. G, Table 6) with OpenAI ViT-B/16.

python -m mutual.analyze --config configs/mutual_places365.py --workdir DIR \
  --config.data.root=/data/places365/val --config.data.descriptors=PATH
TFDS: --config.data.source=tfds (places365_small).
"""

from mutual.paper_config import real_dataset_config

# Paper Table 8.
TEMPLATES = ("a photo taken in an {c}.", "a photo of a {c}.", "a scene taken in a {c}.")


def get_config():
  return real_dataset_config("places365", "places365_small", TEMPLATES)
