"""Paper App. C.6, Fig. 10: few-shot accuracy against the first reweighted block.

  for b in 1 3 5 7 9 11; do
    python -m stori_jax.train --config configs/ablation_start_block.py:dataset=dtd,block=$b \
        --workdir workdirs/start_block_$b
  done
"""

from stori_jax.plumbing.config_files import config_arguments
from stori_jax.fewshot.paper_config import DATASETS, fewshot_config


def get_config(argument=None):
  values = config_arguments(
    argument, __file__, dataset=("dtd", *(d for d in DATASETS if d != "dtd")), block=7
  )
  config = fewshot_config(values["dataset"], 16, "clip")
  config.start_block = values["block"]
  config.name += f"_start{values['block']}"
  return config
