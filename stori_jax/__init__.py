"""stori-jax: SToRI and CLIP mutual-knowledge analysis in JAX/Flax.

Public surface: `load`, `save`, `CLIPBundle` (tokenize, encode_text,
encode_prompts, encode_image, preprocess), the model configs, and the
weighted-prompt helpers `parse_weighted`, `tokenize_weighted`, `word_weights`.
"""

# The built-in image-tower kinds, registered before anything else of the package runs (each is
# one module of stori_jax/kinds/; models' registry is asked by every config and checkpoint).
from stori_jax import kinds as _kinds  # noqa: F401
from stori_jax.clip.bundle import CLIPBundle
from stori_jax.checkpoints import CheckpointError, CheckpointMismatchError
from stori_jax.clip.loading import load, named_checkpoints, save
from stori_jax.models import CLIPConfig, TextConfig, VisionConfig, get_architecture
from stori_jax.data.preprocess import PreprocessConfig, preprocess
from stori_jax.tokenizer import (
  Segment,
  Tokenizer,
  WeightedPromptError,
  default_tokenizer,
  parse_weighted,
  strip_weights,
  tokenize_weighted,
  word_weights,
  words_from_tokens,
)

__version__ = "0.1.0"
