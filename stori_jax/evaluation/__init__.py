"""Moved: the synthetic-world measurements are `stori_jax.world_metrics` and their command is
`python -m stori_jax.evaluate_world`. This package is kept for one release so that old imports
and `python -m stori_jax.evaluation.synthetic_world` keep working, with a warning."""
