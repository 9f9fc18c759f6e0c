r"""Table 2 of the mutual-knowledge paper (App. K) over its 8 models in one run: zero-shot Top-1
of the descriptor classifier (Base), then with the textual concepts that the analysis finds on
the neighbouring classes' images added (Ours), for OpenAI's 4 ResNets and 4 ViTs on ImageNet val.

  python -m mutual.sweep --config configs/mutual_table2_models.py --workdir DIR \
    --config.data.root=/data/imagenet/val \
    --config.data.classnames=/data/imagenet/classnames.txt \
    --config.data.descriptors=data/descriptors/descriptors_imagenet.json
  python -m mutual.sweep --config configs/mutual_table2_models.py:random --workdir DIR  # offline
  python -m mutual.sweep --config configs/mutual_table2_models.py:smoke --workdir DIR   # < 1 min

The sweep (`mutual.sweep`, configs/mutual_sweep.py's fields) runs the analysis of every model
class chunk by class chunk through its model pool, keeps each model's concepts, then computes
each model's Table 2 exactly as `python -m mutual.evaluate` computes it for one model
(`mutual.protocols.table2_descriptor_accuracy` with config.protocols.table2, the same settings).
Besides the sweep's Table 3 outputs it writes table2.md (the paper's layout: ResNets | Base |
Ours | delta beside ViTs | Base | Ours | delta, one table per concept method; then every column
of the protocol, its footnote-4 "Guarded" rows included) and table2.json. One process only.

The argument (`:variant=NAME`, or just `:NAME`) picks one of:
  imagenet   (default) the 8 trained models on ImageNet val (configs/mutual_imagenet.py's data and
             analysis; the paper's full val set took 10-20 h per model on one RTX 3090)
  random     the offline path: random-weight instances of the 8 architectures at about 64 px on 4
             classes x 2 images of the embedded synthetic world (configs/mutual_sweep.py:random's
             data and analysis) with configs/mutual_eval_synthetic.py's Table 2 settings; the
             numbers carry no meaning. Not timed: 8 of configs/mutual_sweep.py:random's 13
             models (3-4 min on 2 CPU cores) plus Table 2's prompts.
  smoke      `random` for one ResNet and one ViT, widths shrunk 16x, on 2 classes x 2 images (the
             tests' run)
"""

from mutual.paper_config import sweep_config
from stori_jax.plumbing.config_files import config_arguments, sibling_config

#: Table 2's models in its order: the ResNets (left), then the ViTs (right).
TABLE2_MODELS = (
  "openai-rn50",
  "openai-rn50x4",
  "openai-rn50x16",
  "openai-rn101",
  "openai-vit-b-16",
  "openai-vit-b-32",
  "openai-vit-l-14",
  "openai-vit-l-14-336",
)
SMOKE_MODELS = ("openai-rn50", "openai-vit-b-32")


def get_config(argument=None):
  variant = config_arguments(argument, __file__, variant=("imagenet", "random", "smoke"))["variant"]
  if variant == "imagenet":
    config = sweep_config(sibling_config(__file__, "mutual_imagenet"))
  else:
    config = sibling_config(__file__, "mutual_sweep", variant)
    # The single-model offline run's settings (python -m mutual.evaluate on this world).
    config.protocols.table2 = sibling_config(__file__, "mutual_eval_synthetic").protocols.table2
  config.name = "mutual_table2_models" + ("" if variant == "imagenet" else f"_{variant}")
  config.models = SMOKE_MODELS if variant == "smoke" else TABLE2_MODELS
  config.table2 = True
  return config
