"""Mutual knowledge on ImageNet val with OpenAI ViT-B/16 (the reference's setting).

python -m mutual.analyze --config configs/mutual_imagenet.py --workdir DIR \
  --config.data.root=/data/imagenet/val \
  --config.data.classnames=/data/imagenet/classnames.txt \
  --config.data.descriptors=data/descriptors/descriptors_imagenet.json
The image folders are ImageNet's wnids (n01440764, ...): CoOp's classnames.txt ("<wnid> <class
name>" per line) pairs them with the descriptor file's classes by name.
TFDS instead of a folder: --config.data.source=tfds --config.data.root=TFDS_DATA_DIR.
The descriptor file (Menon & Vondrick) is not shipped; mutual.data.download_descriptors fetches it.
"""

from mutual.paper_config import real_dataset_config

# Paper Table 8.
TEMPLATES = (
  "itap of a {c}.",
  "a bad photo of the {c}.",
  "a origami {c}.",
  "a photo of the large {c}.",
  "a {c} in a video game.",
  "art of the {c}.",
  "a photo of the small {c}.",
  "a photo of a {c}.",
)


def get_config():
  return real_dataset_config("imagenet", "imagenet2012", TEMPLATES)
