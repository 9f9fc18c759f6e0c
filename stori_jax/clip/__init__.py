"""The shared CLIP layer every feature builds on: `load` a checkpoint into a `CLIPBundle`
(`loading`, `bundle`) and encoding many images or texts in fixed-size batches (`encoding`).
CLIP's image transform is stori_jax.data.preprocess, below the checkpoints that record it."""
