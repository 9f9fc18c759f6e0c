"""Paper App. C.6, Fig. 10: few-shot accuracy against the first reweighted block.

  for b in 1 3 5 7 9 11; do
    python -m stori_jax.train --config configs/ablation_start_block.py:dtd,$b \
        --workdir workdirs/start_block_$b
  done
"""

from stori_jax.fewshot.paper_config import fewshot_config


def get_config(argument="dtd,7"):
  dataset, block = argument.split(",")
  config = fewshot_config(dataset, 16, "clip")
  config.start_block = int(block)
  config.name += f"_start{block}"
  return config
