"""PyTorch references of the CLIP layer: CLIP's towers as open_clip and transformers build them
(`clip_towers`) and the block-by-block comparison of the parity tool (`parity_report`). Both need
the `torch` extra. The mutual-knowledge pipeline as the authors ran it lives beside what it
checks, in `mutual.reference`."""
