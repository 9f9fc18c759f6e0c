"""Preference retrieval with user-driven control (paper section 4.2): data, index, metrics,
protocol, tables and plots, and the attributes chosen by zero-shot AUROC (App. A.2,
`attribute_selection`). The command line is `python -m stori_jax.retrieve`."""
