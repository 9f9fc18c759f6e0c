"""Few-shot classification with SToRI's data-driven control (paper §3.2, §4.1).

datasets / augment / prompts: the data and text of a task; prompt_bank and
text_classifier: the fast, sharded weighted-prompt classifier; trainer: the
training loop (`python -m stori_jax.train`); report: what a run writes; pairwise: the
two-class study of Fig. 3 (`python -m stori_jax.contrast`).
"""
