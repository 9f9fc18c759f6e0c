"""SToRI few-shot on caltech101 with the paper's hyperparameters (App. A.1).

python -m stori_jax.train --config configs/caltech101.py:shots=16                   # 16 shots, CLIP ViT-L/14
python -m stori_jax.train --config configs/caltech101.py:shots=4,backbone=metaclip  # 4 shots, MetaCLIP ViT-L/14
"""

from stori_jax.fewshot.paper_config import fewshot_config, parse_argument


def get_config(argument=None):
  shots, backbone = parse_argument(argument, __file__)
  return fewshot_config("caltech101", shots, backbone)
