"""Paper Table 1: CuPL prompts with five rare tokens ('sks', 'pll', 'ucd') appended.

python -m stori_jax.train --config configs/ablation_rare_tokens.py:dtd
python -m stori_jax.train --config configs/ablation_rare_tokens.py:demo   # synthetic world
"""

from stori_jax.config_files import sibling_config
from stori_jax.fewshot.paper_config import fewshot_config


def get_config(argument="dtd"):
  if argument == "demo":
    config = sibling_config(__file__, "demo")
  else:
    config = fewshot_config(argument, 16, "clip")
  config.name += "_rare_tokens"
  config.prompts.rare_tokens = 5
  return config
