"""stori-jax: SToRI and CLIP mutual-knowledge analysis in JAX/Flax.

Public surface: `load`, `save`, `CLIPBundle`, the model configs, and (once the
tokenizer is present) `parse_weighted`.
"""
from stori_jax.bundle import CLIPBundle
from stori_jax.checkpoints import CheckpointError, CheckpointMismatchError
from stori_jax.loading import load, named_checkpoints, save
from stori_jax.models import CLIPConfig, TextConfig, VisionConfig, get_architecture
from stori_jax.preprocess import PreprocessConfig, preprocess

__version__ = "0.1.0"
