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
The paper trains on the full train set; here the patch features are cached in memory (ViT-B/16
tokens in float16: 301 KB per image), so the default takes 20 images per class (20,000 images,
6 GB); raise `images_per_class` where memory allows (0: all). Table 5's Standard MLP and LF-CBM
(its authors' ImageNet recipe: mutual.paper_config.LF_CBM_DEFAULTS) train on the same images'
embeddings; LF-CBM's GLM-SAGA keeps a [images, 1000] float32 table on the device (4 GB per
million images).
CorLoc (App. A.1) reads ImageNet's val boxes: ILSVRC2012_bbox_val_v3.tgz from image-net.org,
extracted (one PASCAL VOC XML per image, ILSVRC2012_val_00000001.xml ...) into the folder that
config.protocols.corloc.boxes names.
"""

from mutual.paper_config import baselines_config, evaluation_config, protocols_config
from stori_jax.plumbing.config_files import sibling_config


def get_config():
  config = sibling_config(__file__, "mutual_imagenet")
  config.name = "mutual_eval_imagenet"
  config.evaluation = evaluation_config(batch_size=128)
  config.baselines = baselines_config(
    data_overrides=dict(root="", split="train", images_per_class=20),
    cache_dtype="float16",
    train=dict(epochs=10),
  )
  config.protocols = protocols_config()
  return config
