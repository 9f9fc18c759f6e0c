"""CLIP tokenizer (open_clip-identical ids, no torch) and SToRI word weights.

    tok = default_tokenizer()
    ids = tok(["a photo of a cat"])                        # int32 [B, 77]
    ids, w = tokenize_weighted(tok, "a photo of a (cat:1.5)")  # int32 [1, 77], float32 [1, 77]
    word_weights(tok, ids[0], w[0])                        # [('a', 1.0), ..., ('cat', 1.5)]

See `bpe` for the tokenizer and `weighted` for the prompt syntax and weight rules.
"""

from .bpe import Tokenizer, default_tokenizer
from .weighted import (
  MAX_WEIGHT,
  Segment,
  SplitTokenWarning,
  WeightedPromptError,
  Word,
  check_weight,
  parse_weighted,
  strip_weights,
  tokenize_weighted,
  word_weights,
  words_from_tokens,
)

__all__ = [
  "Tokenizer",
  "default_tokenizer",
  "Segment",
  "Word",
  "parse_weighted",
  "strip_weights",
  "tokenize_weighted",
  "words_from_tokens",
  "word_weights",
  "WeightedPromptError",
  "SplitTokenWarning",
  "MAX_WEIGHT",
  "check_weight",
]
