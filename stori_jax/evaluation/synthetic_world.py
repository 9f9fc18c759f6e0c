"""Deprecated path, kept for one release: use `stori_jax.world_metrics` (the library) and
`python -m stori_jax.evaluate_world` (the command)."""

import warnings

from stori_jax.world_metrics import *  # noqa: F401,F403  (the old public names)

warnings.warn(
  "stori_jax.evaluation.synthetic_world moved: import stori_jax.world_metrics and run "
  "`python -m stori_jax.evaluate_world`; this path goes in the next release.",
  DeprecationWarning,
  stacklevel=2,
)

if __name__ == "__main__":
  from stori_jax import cli, evaluate_world

  evaluate_world.define_flags()
  cli.run(evaluate_world.main)
