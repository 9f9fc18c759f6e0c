"""Training of the shipped tiny CLIP: contrastive pretraining (`contrastive`) and the
weight-response stage (`weight_response`), both run by `python -m stori_jax.pretrain`."""
