"""Preference retrieval with user-driven control (paper section 4.2): data, index, metrics,
protocol, tables and plots. The command line is `python -m stori_jax.retrieve`."""
