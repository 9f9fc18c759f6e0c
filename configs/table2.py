"""SToRI Table 2 (CLIP ViT-L/14) or Table 8 (MetaCLIP ViT-L/14): six datasets x 1/2/4/8/16
shots x seeds 1-3, TaskRes with the Base prompts, TaskRes with Base+CuPL, and SToRI.

  python -m stori_jax.run_grid --config configs/table2.py --workdir workdirs/table2
  python -m stori_jax.run_grid --config configs/table2.py:backbone=metaclip --workdir workdirs/table8
  python -m stori_jax.run_grid --config configs/table2.py --dry_run   # the 270 cells and their rates
  python -m stori_jax.run_grid --config configs/table2.py --config.datasets="('dtd',)"  # one column

Needs the datasets in CoOp's layout under data/ and CuPL's prompt files under data/cupl/ (see
docs/fewshot.md's "Few-shot SToRI on real datasets"); a missing one stops at its first cell with
what to download. Every cell is configs/<dataset>.py:shots=K,backbone=B (the paper's settings,
App. A.1) at seed k, its learning rate the paper's rule for its dataset, shots and backbone.
270 runs of ViT-L/14: hours to days on one accelerator; a rerun goes on where the last stopped.
"""

import ml_collections

from stori_jax.plumbing.config_files import config_arguments
from stori_jax.fewshot.paper_config import BACKBONES


def get_config(argument=None):
  backbone = config_arguments(argument, __file__, backbone=tuple(BACKBONES))["backbone"]
  config = ml_collections.ConfigDict()
  config.name = "table2" if backbone == "clip" else "table8"
  config.base = ml_collections.ConfigDict(
    dict(
      config_file=f"configs/{{dataset}}.py:shots={{shots}},backbone={backbone}",
      overrides=ml_collections.ConfigDict(),
    )
  )
  # Table 2's columns, in its order.
  config.datasets = ("imagenet", "dtd", "flowers102", "sun397", "caltech101", "food101")
  config.shots = (1, 2, 4, 8, 16)
  config.seeds = (1, 2, 3)
  config.methods = ("taskres_base", "taskres", "stori")
  config.method_settings = ml_collections.ConfigDict(
    dict(
      taskres_base=dict(
        label="TaskRes",
        text="Base",
        accuracy="trained",
        reads="",
        overrides=dict(method="taskres", prompts=dict(use_cupl=False)),
      ),
      taskres=dict(
        label="TaskRes",
        text="Base+CuPL",
        accuracy="trained",
        reads="",
        overrides=dict(method="taskres"),
      ),
      stori=dict(
        label="SToRI",
        text="Base+CuPL",
        accuracy="trained",
        reads="",
        overrides=dict(method="stori"),
      ),
      # Not in the paper's tables; add them to config.methods for zero-shot rows (no training
      # of their own: each TaskRes / SToRI run measures its classifier at the start).
      zero_shot_base=dict(
        label="Zero-shot CLIP",
        text="Base",
        accuracy="zero_shot",
        reads="taskres_base",
        overrides={},
      ),
      zero_shot=dict(
        label="Zero-shot CLIP",
        text="Base+CuPL",
        accuracy="zero_shot",
        reads="stori",
        overrides={},
      ),
    )
  )
  # Standard deviation over seeds: ddof 0 (numpy's np.std, as Dassl's parse_test_res.py); the
  # paper does not say which.
  config.std_ddof = 0
  return config
