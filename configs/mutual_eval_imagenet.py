r"""Table 1 and the paper's protocols on ImageNet val with OpenAI ViT-B/16 (the paper's setting).

python -m mutual.evaluate --config configs/mutual_eval_imagenet.py --workdir DIR \
  --config.data.root=/data/imagenet/val \
  --config.data.classnames=/data/imagenet/classnames.txt \
  --config.data.descriptors=data/descriptors/descriptors_imagenet.json \
  --config.baselines.data.root=/data/imagenet/train \
  --config.protocols.corloc.boxes=/data/imagenet/val_boxes

The analysis is configs/mutual_imagenet.py's (classnames.txt: CoOp's "<wnid> <class name>" per
line, which pairs the wnid folders of both splits with the descriptor classes). The baselines
train on ImageNet's train split (folder <root>/<wnid>/<images>, or
--config.baselines.data.source=tfds with split "train") at App. D's settings: Adam, batch 64,
learning rate 1e-4 decayed by a cosine to 1e-5, q = 512.
As the paper (§4, App. D: "we train them on the full ImageNet training set"), the baselines see
every training image (`images_per_class` 0). Their patch features (ViT-B/16 tokens in float16,
301 KB per image: some 385 GB for the 1.28 million images) are written to
DIR/baselines/features/tokens.bin as they are encoded and read back memory-mapped
(`cache_on_disk`), so the workdir's disk must hold them. Table 5's Standard MLP and LF-CBM (its
authors' ImageNet recipe: mutual.paper_config.LF_CBM_DEFAULTS) train on the same images'
embeddings; LF-CBM's GLM-SAGA keeps a [images, 1000] float32 table on the device (5 GB for the
full set).

`:quick` (`:variant=quick`) trains the baselines on 20 images per class (20,000 images, 6 GB of
features kept in memory): not the paper's setting, and the run's Table 5 (printed, table1.md,
table1.json) says so.

CorLoc (App. A.1) reads ImageNet's val boxes: ILSVRC2012_bbox_val_v3.tgz from image-net.org,
extracted (one PASCAL VOC XML per image, ILSVRC2012_val_00000001.xml ...) into the folder that
config.protocols.corloc.boxes names.
"""

from mutual.paper_config import baselines_config, evaluation_config, protocols_config
from stori_jax.plumbing.config_files import config_arguments, sibling_config


def get_config(argument=None):
  variant = config_arguments(argument, __file__, variant=("full", "quick"))["variant"]
  config = sibling_config(__file__, "mutual_imagenet")
  config.name = "mutual_eval_imagenet"
  config.evaluation = evaluation_config(batch_size=128)
  config.baselines = baselines_config(
    data_overrides=dict(root="", split="train", images_per_class=0),  # 0: every image (App. D)
    cache_dtype="float16",
    cache_on_disk=True,
    train=dict(epochs=10),
  )
  config.protocols = protocols_config()
  if variant == "quick":
    config.name = "mutual_eval_imagenet_quick"
    config.baselines.data.images_per_class = 20
    config.baselines.cache_on_disk = False
  return config
