"""A small paper-style grid offline: the demo's task (configs/demo.py) at 1 and 16 shots, seeds
1-3, SToRI against the zero-shot classifier of the same prompts; a few minutes on 2 CPU cores.

  python -m stori_jax.run_grid --config configs/grid_synthetic.py --workdir workdirs/grid_synthetic

Six SToRI runs (2 shot counts x 3 seeds) in <workdir>/synthetic/<shots>shot/stori/seed<k>; the
zero-shot row reads the zero-shot accuracy each run measures before it trains (all weights 1).
The learning rate is the demo's 0.05: the paper gives none for the synthetic world (the table
says so). The schedule is the paper grids' (App. A.1: TaskRes's scheme, as Dassl steps it): one
constant warm-up epoch at 1e-5, then a cosine stepped once per epoch. Smaller or larger versions through the overrides, e.g. --config.base.overrides.epochs=2
--config.base.overrides.model.source=tiny-synthetic-base.
"""

import ml_collections


def get_config():
  config = ml_collections.ConfigDict()
  config.name = "grid_synthetic"
  # The few-shot config of every cell; "{dataset}" and "{shots}" would be replaced per cell.
  config.base = ml_collections.ConfigDict(
    dict(
      config_file="configs/demo.py",
      # Set in every cell (configs/demo.py's values, named so that they can be overridden).
      overrides=ml_collections.ConfigDict(
        dict(
          model=dict(source="tiny-synthetic"),
          data=dict(n_test_per_class=50),
          # TaskRes's scheme, as the paper configs (configs/demo.py keeps its per-step cosine).
          optim=dict(schedule="taskres", warmup_epochs=1, warmup_lr=1e-5),
          views=4,
          epochs=100,
          log_every=10,
          eval_every=50,
          checkpoint_every=50,
        )
      ),
    )
  )
  config.datasets = ("synthetic",)
  config.shots = (1, 16)
  config.seeds = (1, 2, 3)
  # The rows, in order; each defined in method_settings.
  config.methods = ("zero_shot", "stori")
  config.method_settings = ml_collections.ConfigDict(
    dict(
      zero_shot=dict(
        label="Zero-shot CLIP",
        text="Base+CuPL",
        accuracy="zero_shot",
        reads="stori",  # the zero-shot accuracy of the SToRI runs: the same prompts at w = 1
        overrides={},
      ),
      stori=dict(
        label="SToRI",
        text="Base+CuPL",
        accuracy="trained",
        reads="",
        overrides=dict(method="stori"),
      ),
    )
  )
  # Standard deviation over seeds: ddof 0 (numpy's np.std, as Dassl's parse_test_res.py); the
  # paper does not say which.
  config.std_ddof = 0
  return config
