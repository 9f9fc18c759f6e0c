r"""App. A.1's Table 1 of the mutual-knowledge paper in one run: CorLoc (%) of the most prominent
region per feature facet (keys, tokens, their ensemble) and decomposition (GDC, PCA), one column
per model, ViT-B/16 and ViT-L/14, on ImageNet val.

  python -m mutual.sweep --config configs/mutual_appa1.py --workdir DIR \
    --config.data.root=/data/imagenet/val \
    --config.data.classnames=/data/imagenet/classnames.txt \
    --config.data.descriptors=data/descriptors/descriptors_imagenet.json \
    --config.protocols.corloc.boxes=/data/imagenet/val_boxes
  python -m mutual.sweep --config configs/mutual_appa1.py:smoke --workdir DIR   # < 1 min, offline

The sweep (`mutual.sweep`, configs/mutual_sweep.py's fields) analyses both models (its Table 3
outputs) and then runs `mutual.protocols.corloc` on each model's images with
config.protocols.corloc's settings, as `python -m mutual.evaluate` runs it for one model
(`config.model_protocols`); protocols.md holds the table in the paper's layout (rows: facet
(decomposition); columns: the models), protocols.json every number. Boxes: ImageNet's
ILSVRC2012_bbox_val_v3 (PASCAL VOC XML per image), as configs/mutual_eval_imagenet.py says.
The paper's column heads read "ViT-B/16" and "ViT-L/14" (OpenAI's, 224 px); it prints "-" for
ViT-L/14's ensemble rows, which this run fills.

The argument (`:variant=NAME`, or just `:NAME`) picks one of:
  imagenet  (default) the two models on ImageNet val (configs/mutual_imagenet.py's data and
            analysis)
  smoke     random-weight instances of the two architectures, widths shrunk 16x, on 2 classes x
            2 images of the embedded world (its boxes come from the object masks; the numbers
            carry no meaning: the tests' run)
"""

from mutual.paper_config import sweep_config
from stori_jax.plumbing.config_files import config_arguments, sibling_config

#: App. Table 1's columns, in its order.
APPA1_MODELS = ("openai-vit-b-16", "openai-vit-l-14")


def get_config(argument=None):
  variant = config_arguments(argument, __file__, variant=("imagenet", "smoke"))["variant"]
  if variant == "imagenet":
    config = sweep_config(sibling_config(__file__, "mutual_imagenet"))
  else:
    config = sibling_config(__file__, "mutual_sweep", "smoke")
  # Item 1 of issue 41 (config.analysis.bank_template, App. L's descriptor prompt) is set by
  # the analysis config this one starts from.
  # Item 4 of issue 41 (config.spectral_across_models, one batched eigh over models) is a sweep
  # field: set it here if these models' default should differ from the sweep's.
  config.name = "mutual_appa1" + ("" if variant == "imagenet" else f"_{variant}")
  config.models = APPA1_MODELS
  config.model_protocols = ("corloc",)
  return config
