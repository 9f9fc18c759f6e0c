r"""App. G of the mutual-knowledge paper: MI and its dynamics (AUC) across models on Places365
(Table 6) and Food-101 (Table 7), one run per dataset.

  python -m mutual.sweep --config configs/mutual_appg.py:places365 --workdir DIR \
    --config.data.root=/data/places365/val --config.data.descriptors=PATH
  python -m mutual.sweep --config configs/mutual_appg.py:food101 --workdir DIR \
    --config.data.root=/data/food-101/images --config.data.descriptors=PATH
  python -m mutual.sweep --config configs/mutual_appg.py:random --workdir DIR   # offline
  python -m mutual.sweep --config configs/mutual_appg.py:smoke --workdir DIR    # < 1 min

Data and analysis are configs/mutual_places365.py's / mutual_food101.py's (paper Table 8's
templates; TFDS: --config.data.source=tfds). The sweep (`mutual.sweep`, configs/mutual_sweep.py's
fields) runs every model of the tables once and, besides its Table 3 outputs, writes
table_groups.md: the paper's groups of models (`config.table_groups`), each model's data, Top-1
(%), MI and AUC per concept method (the paper prints one MI and one AUC and does not say which
concept method they are of).

The argument (`:dataset=NAME`, or just `:NAME`) picks one of:
  places365  (default) Table 6: the model-size group (ViT-B/32, B/16, L/14, L/14@336 on WIT-400M)
             and the pretraining-data group (ViT-B/32 400M, ViT-B/32-dcp, ViT-B/16-dcp,
             ViT-B/16-dfn); 7 models
  food101    Table 7: ViT-B/32-dcp, ViT-B/16-dcp, ViT-B/16-dfn (model size fixed, data varied)
  random     the offline path: random-weight instances of Table 6's 7 architectures at about
             64 px on 4 classes x 2 images of the embedded synthetic world (configs/
             mutual_sweep.py:random's data and analysis); the numbers carry no meaning. Not
             timed: 7 of configs/mutual_sweep.py:random's 13 models (3-4 min on 2 CPU cores).
  smoke      Table 6's groups cut to 3 models (widths shrunk 16x) on 2 classes x 2 images (the
             tests' run)
"""

from mutual.paper_config import sweep_config
from stori_jax.plumbing.config_files import config_arguments, sibling_config

#: Table 6 (Places365): its two groups, in its order (ViT-B/32 sits in both).
PLACES365_GROUPS = (
  (
    "Model Size",
    ("openai-vit-b-32", "openai-vit-b-16", "openai-vit-l-14", "openai-vit-l-14-336"),
  ),
  (
    "Pretrain Data",
    ("openai-vit-b-32", "datacomp-vit-b-32", "datacomp-vit-b-16", "dfn2b-vit-b-16"),
  ),
)
#: Table 7 (Food-101): one group without a title.
FOOD101_GROUPS = (("", ("datacomp-vit-b-32", "datacomp-vit-b-16", "dfn2b-vit-b-16")),)
SMOKE_GROUPS = (
  ("Model Size", ("openai-vit-b-32", "openai-vit-b-16")),
  ("Pretrain Data", ("openai-vit-b-32", "datacomp-vit-b-32")),
)


def _models(groups) -> tuple[str, ...]:
  """The groups' models, each once, in their first appearance's order."""
  return tuple(dict.fromkeys(name for _, members in groups for name in members))


def get_config(argument=None):
  dataset = config_arguments(
    argument, __file__, dataset=("places365", "food101", "random", "smoke")
  )["dataset"]
  if dataset in ("places365", "food101"):
    config = sweep_config(sibling_config(__file__, f"mutual_{dataset}"))
    groups = PLACES365_GROUPS if dataset == "places365" else FOOD101_GROUPS
  else:
    config = sibling_config(__file__, "mutual_sweep", dataset)
    groups = SMOKE_GROUPS if dataset == "smoke" else PLACES365_GROUPS
  config.name = f"mutual_appg_{dataset}"
  config.models = _models(groups)
  config.table_groups = groups
  return config
