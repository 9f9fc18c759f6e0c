r"""SToRI's Figure 5 across models: per-category AUC while 'with blond hair' gets w and 'wearing
eyeglasses' 1 - w, for CLIP ViT-B/16, CLIP ViT-L/14, OpenCLIP ViT-L/14 (LAION-2B) and MetaCLIP
ViT-L/14, one panel and one line per model, in one run.

  python -m stori_jax.retrieve --config configs/retrieval_fig5_models.py \
      --config.data.root=/data/celeba --workdir workdirs/fig5_models
  python -m stori_jax.retrieve --config configs/retrieval_fig5_models.py:synthetic \
      --workdir workdirs/fig5_models_synthetic    # offline
  python -m stori_jax.retrieve --config configs/retrieval_fig5_models.py:smoke --workdir DIR

`models` takes registry names (python -m stori_jax.list_models --paper stori), shipped checkpoints
(tiny-synthetic), paths or hub ids, and "random:<registry name>" for a random-weight instance of
that architecture (config.random_models: input size about image_size px, 0 for the model's own;
widths divided by shrink; seed). Each model is reweighted from its default start block (block 7
of 12 for the four paper models, as the paper states) unless config.start_block is set.
Registered weights are found (models_dir, the Hugging Face cache) or downloaded before any work.

The argument (`:variant=NAME`, or just `:NAME`) picks one of:
  celeba     (default) the paper's prompt 'a photo of a woman with blond hair, wearing eyeglasses'
             (configs/retrieval_celeba3.py's data, 8 categories x 100 images) and its 4 models
  synthetic  the offline path: the shipped tiny CLIP and random-weight instances of the 4
             paper architectures at about 64 px, on 4 prompts of the synthetic world
             (configs/retrieval_synthetic.py's: w on the pattern, 1 - w on the colour); only the
             tiny CLIP's curves mean something (its favoured category's AUC rises from 0.07 at
             w = 0 to 0.37 at w = 1). 3 min of CPU time on 2 shared cores (8 min wall at load 10).
  smoke      the tiny CLIP and two random instances shrunk 16x on 2 small prompts (the tests' run)
"""

import ml_collections

from stori_jax.plumbing.config_files import config_arguments, sibling_config
from stori_jax.retrieval.model_sweep import PAPER_MODELS


def get_config(argument=None):
  variant = config_arguments(argument, __file__, variant=("celeba", "synthetic", "smoke"))[
    "variant"
  ]
  base = sibling_config(
    __file__, "retrieval_celeba3" if variant == "celeba" else "retrieval_synthetic"
  )
  config = ml_collections.ConfigDict()
  config.name = "retrieval_fig5_models" + ("" if variant == "celeba" else f"_{variant}")
  config.models = PAPER_MODELS
  config.models_dir = ""  # hand-placed registry weights; default $STORI_JAX_MODELS
  config.random_models = ml_collections.ConfigDict(dict(image_size=64, shrink=1, seed=0))
  config.cache_dir = base.cache_dir
  config.batch_size = base.batch_size
  # None: each model's default start block.
  config.start_block = ml_collections.config_dict.placeholder(int)
  config.data = base.data
  config.sweep = ml_collections.ConfigDict(
    dict(
      tasks=base.sweep.tasks,
      attributes=base.sweep.attributes,
      ws=base.sweep.ws,  # 0, 0.1, ..., 1
      normalize=base.sweep.normalize,
    )
  )
  if variant != "celeba":
    config.models = ("tiny-synthetic",) + tuple(f"random:{m}" for m in PAPER_MODELS)
    config.data.n_triples = 4
  if variant == "smoke":
    config.models = ("tiny-synthetic", "random:openai-vit-b-16", "random:laion2b-vit-l-14")
    config.random_models.shrink = 16
    config.data.n_triples = 2
    config.data.images_per_category = 2
    config.sweep.ws = (0.0, 0.5, 1.0)
  return config
