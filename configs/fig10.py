"""SToRI App. C.6, Fig. 10: few-shot accuracy against the first reweighted block (every block
from it on is reweighted), seeds 1-3, the mean as a line and the std as shading.

  python -m stori_jax.run_grid --config configs/fig10.py --workdir workdirs/fig10
  python -m stori_jax.run_grid --config configs/fig10.py --dry_run   # the 216 cells and rates
  python -m stori_jax.run_grid --config configs/fig10.py --config.datasets="('dtd',)"  # one line
  python -m stori_jax.run_grid --config configs/fig10.py:synthetic   # offline, 18 short runs

Writes accuracy_by_start_block.png besides tables.md and tables.json (one row per start block).
The figure is lost from the paper's text and the text names neither its datasets, its shot
count nor its blocks; this grid takes Table 2's six datasets at 16 shots (Table 1's shot count,
and configs/ablation_start_block.py's) and every block of ViT-L/14's 12-block text tower, with
App. A.1's settings and learning rates otherwise (the paper's runs start at block 7): 216 runs,
narrowed with --config.datasets or --config.sweep.values. Each cell is
configs/<dataset>.py:shots=16 with `start_block` set to the row's block.

`:synthetic` runs the demo's task (configs/demo.py at configs/grid_synthetic.py's settings) on
the shipped tiny CLIP, whose text tower has 6 blocks (its default start block is 4): blocks 1-6
x seeds 1-3, 18 runs offline (about 6 CPU-minutes; the table has no average column).
"""

import ml_collections

from stori_jax.plumbing.config_files import config_arguments, sibling_config


def get_config(argument=None):
  data = config_arguments(argument, __file__, data=("paper", "synthetic"))["data"]
  config = ml_collections.ConfigDict()
  if data == "synthetic":
    config.name = "fig10_synthetic"
    # The demo's task at the offline grid's settings (one place for them).
    config.base = sibling_config(__file__, "grid_synthetic").base
    config.datasets = ("synthetic",)
    blocks = tuple(range(1, 7))  # the tiny CLIP's 6 text blocks
  else:
    config.name = "fig10"
    config.base = ml_collections.ConfigDict(
      dict(config_file="configs/{dataset}.py:shots={shots}", overrides=ml_collections.ConfigDict())
    )
    # Table 2's datasets, in its order.
    config.datasets = ("imagenet", "dtd", "flowers102", "sun397", "caltech101", "food101")
    blocks = tuple(range(1, 13))  # ViT-L/14's 12 text blocks
  config.shots = (16,)
  config.seeds = (1, 2, 3)
  config.methods = ("stori",)
  config.method_settings = ml_collections.ConfigDict(
    dict(
      stori=dict(
        label="SToRI",
        text="Base+CuPL",
        accuracy="trained",
        reads="",
        overrides=dict(method="stori"),
      ),
    )
  )
  # One row per first reweighted block: the grid sets config.start_block of each row's cells.
  config.sweep = ml_collections.ConfigDict(
    dict(key="start_block", values=blocks, label="first reweighted block")
  )
  config.average_column = False  # a figure of its own; no average over the datasets
  # Standard deviation over seeds: ddof 0 (numpy's np.std, as Dassl's parse_test_res.py); the
  # paper does not say which.
  config.std_ddof = 0
  return config
