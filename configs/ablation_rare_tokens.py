"""Paper Table 1: CuPL prompts with five rare tokens ('sks', 'pll', 'ucd') appended.

python -m stori_jax.train --config configs/ablation_rare_tokens.py:dtd
python -m stori_jax.train --config configs/ablation_rare_tokens.py:demo   # synthetic world
"""

import importlib.util
import os

from stori_jax.fewshot.paper_config import fewshot_config


def get_config(argument="dtd"):
  if argument == "demo":
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "demo.py")
    spec = importlib.util.spec_from_file_location("demo_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
  else:
    config = fewshot_config(argument, 16, "clip")
  config.name += "_rare_tokens"
  config.prompts.rare_tokens = 5
  return config
