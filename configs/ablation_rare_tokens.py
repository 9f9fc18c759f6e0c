"""Paper Table 1: CuPL prompts with five rare tokens ('sks', 'pll', 'ucd') appended.

python -m stori_jax.train --config configs/ablation_rare_tokens.py:dataset=dtd
python -m stori_jax.train --config configs/ablation_rare_tokens.py:dataset=demo   # synthetic world
"""

from stori_jax.plumbing.config_files import config_arguments, sibling_config
from stori_jax.fewshot.paper_config import DATASETS, fewshot_config


def get_config(argument=None):
  dataset = config_arguments(
    argument, __file__, dataset=("dtd", "demo", *(d for d in DATASETS if d != "dtd"))
  )["dataset"]
  if dataset == "demo":
    config = sibling_config(__file__, "demo")
  else:
    config = fewshot_config(dataset, 16, "clip")
  config.name += "_rare_tokens"
  config.prompts.rare_tokens = 5
  return config
