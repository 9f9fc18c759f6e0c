"""Measurements of a model on the embedded synthetic world (`metrics`); the command is
`python -m stori_jax.evaluate_world`."""
