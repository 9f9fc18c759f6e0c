"""PyTorch references: the CLIP towers of the parity tool (`clip_towers`) and the mutual-knowledge
pipeline as the authors ran it (`mutual_knowledge`). Both need the `torch` extra."""
