r"""App. A.3's Table 3 of the mutual-knowledge paper in one run: ImageNet val zero-shot Top-1 (%)
as is (Base), with the non-prominent regions of the nearest-neighbour importance map blurred (NN
Interp.), of its largest connected component (+FCC) and after the CRF (+CRF), and the last
step's change (delta), one row per model: ViT-B/32, ViT-B/16, ViT-L/14, RN50, RN101.

  python -m mutual.sweep --config configs/mutual_appa3.py --workdir DIR \
    --config.data.root=/data/imagenet/val \
    --config.data.classnames=/data/imagenet/classnames.txt \
    --config.data.descriptors=data/descriptors/descriptors_imagenet.json
  python -m mutual.sweep --config configs/mutual_appa3.py:smoke --workdir DIR   # < 1 min, offline

The sweep (`mutual.sweep`, configs/mutual_sweep.py's fields) analyses the five models (its
Table 3 outputs) and then runs `mutual.protocols.blur_accuracy` on each model's images with
config.protocols.blur's settings, as `python -m mutual.evaluate` runs it for one model
(`config.model_protocols`); protocols.md holds the table in the paper's layout (Model | Base |
NN Interp. | +FCC | +CRF | delta), protocols.json every number.

The argument (`:variant=NAME`, or just `:NAME`) picks one of:
  imagenet  (default) the five models on ImageNet val (configs/mutual_imagenet.py's data and
            analysis)
  smoke     random-weight instances of one ViT and one ResNet of the five, widths shrunk 16x,
            on 2 classes x 2 images of the embedded world (the numbers carry no meaning: the
            tests' run)
"""

from mutual.paper_config import sweep_config
from stori_jax.plumbing.config_files import config_arguments, sibling_config

#: App. Table 3's rows, in its order.
APPA3_MODELS = (
  "openai-vit-b-32",
  "openai-vit-b-16",
  "openai-vit-l-14",
  "openai-rn50",
  "openai-rn101",
)
SMOKE_MODELS = ("openai-vit-b-32", "openai-rn50")


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
  config.name = "mutual_appa3" + ("" if variant == "imagenet" else f"_{variant}")
  config.models = SMOKE_MODELS if variant == "smoke" else APPA3_MODELS
  config.model_protocols = ("blur",)
  return config
