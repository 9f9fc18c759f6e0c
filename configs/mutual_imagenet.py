"""Mutual knowledge on ImageNet val with OpenAI ViT-B/16 (the reference's setting).

python -m mutual.analyze --config configs/mutual_imagenet.py --workdir DIR \
  --config.data.root=/data/imagenet/val \
  --config.data.classnames=/data/imagenet/classnames.txt \
  --config.data.descriptors=data/descriptors/descriptors_imagenet.json
The image folders are ImageNet's wnids (n01440764, ...): CoOp's classnames.txt ("<wnid> <class
name>" per line) pairs them with the descriptor file's classes by name.
TFDS instead of a folder: --config.data.source=tfds --config.data.root=TFDS_DATA_DIR.
The descriptor file (Menon & Vondrick) is not shipped; mutual.data.download_descriptors fetches it.

`:fig5` (`:variant=fig5`) analyses the three classes of the paper's Fig. 5 (sock, siamang,
crayfish), named in config.data.classes (matched by name, as the descriptor file's classes are),
every val image of each (50), and draws figures/fig5_<method>.png over all three.
"""

from mutual.paper_config import real_dataset_config
from stori_jax.plumbing.config_files import config_arguments

#: Fig. 5's classes, in its legend's order.
FIG5_CLASSES = ("sock", "siamang", "crayfish")

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


def get_config(argument=None):
  variant = config_arguments(argument, __file__, variant=("full", "fig5"))["variant"]
  config = real_dataset_config("imagenet", "imagenet2012", TEMPLATES)
  if variant == "fig5":
    config.name = "mutual_imagenet_fig5"
    config.data.classes = FIG5_CLASSES
    config.figure_classes = len(FIG5_CLASSES)
  return config
