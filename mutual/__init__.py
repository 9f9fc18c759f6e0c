"""Mutual-knowledge analysis of CLIP zero-shot predictions (Sammani & Deligiannis, NeurIPS 2024).

Built on stori_jax's models; stori_jax never imports this package.
"""
