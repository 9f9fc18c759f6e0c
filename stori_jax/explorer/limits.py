"""What an explorer request may ask for, and the check of a /api/rank body.

Every limit is checked before the model runs: a weight outside [0, MAX_WEIGHT], a prompt over
MAX_PROMPT_CHARS characters (before tokenizing), over MAX_WORDS words, a k outside
[1, MAX_K], a body over MAX_BODY_BYTES. Error messages quote the user's prompt, so they are
cut to MAX_ERROR_CHARS (`shorten`). The server (`server`) also bounds time and threads: a
request's line and headers must arrive within HEADER_TIMEOUT_S, its body within
BODY_TIMEOUT_S, and at most MAX_HANDLER_THREADS connections are served at once.
"""

from __future__ import annotations

import json
import math
from typing import Any

from stori_jax.models.text import reweighted_block_indices
from stori_jax.tokenizer import check_weight

#: Slider range; weights outside are refused by the API (the parser and /api/rank alike).
MAX_WEIGHT = 5.0
MAX_K = 100
#: Prompt length limits, checked before any tokenizing. CLIP reads 75 tokens, a few hundred
#: characters; anything longer cannot be encoded, and only costs the server work.
MAX_PROMPT_CHARS = 2000
MAX_WORDS = 200
#: Request bodies beyond this are refused with 413 before they are read.
MAX_BODY_BYTES = 64 * 1024
#: Error messages are cut to this many characters (they quote the user's prompt).
MAX_ERROR_CHARS = 2000
#: Seconds a client has to send a request's line and headers, counted from when its connection
#: is accepted (or from the previous response on a kept-alive connection): a client that
#: sends half a header holds a handler thread this long at most.
HEADER_TIMEOUT_S = 10.0
#: Seconds a client has to send a request's body once its headers are in (at most
#: MAX_BODY_BYTES; a local client sends it in milliseconds).
BODY_TIMEOUT_S = 30.0
#: Connections served at once, one handler thread each; more wait for a free thread.
MAX_HANDLER_THREADS = 16
#: Connections waiting for a handler thread (a file descriptor each) beyond which a new one is
#: closed at once; those waiting expire with their header deadline.
MAX_PENDING_CONNECTIONS = 512


class RequestTimeout(ConnectionAbortedError):
  """A client did not send its request's headers or body in time (HEADER_TIMEOUT_S,
  BODY_TIMEOUT_S). A ConnectionError: werkzeug drops the connection silently when it surfaces
  while headers are read; while the app reads the body, the app answers 408."""


def too_long(n: int) -> str:
  """The message for a prompt of n characters, over MAX_PROMPT_CHARS."""
  return (
    f"the prompt has {n} characters; the explorer takes at most {MAX_PROMPT_CHARS} (CLIP reads "
    "only its first 75 tokens, a few hundred characters): shorten it"
  )


def body_too_large(length: int | None) -> str:
  """The message for a request body of `length` bytes (None: unknown), over MAX_BODY_BYTES."""
  size = f"{length} bytes" if length is not None else "over the limit"
  return (
    f"the request body is {size}; the explorer takes at most {MAX_BODY_BYTES} bytes "
    f"(prompts of at most {MAX_PROMPT_CHARS} characters)"
  )


def shorten(text: str, limit: int = MAX_ERROR_CHARS) -> str:
  """`text` cut to `limit` characters, saying how long it was."""
  return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters in all)"


def validate_rank(
  payload: Any, layers: int, default_blocks: tuple[int, int]
) -> tuple[list[tuple[str, float]], int, tuple[int, int]]:
  """Checks a /api/rank body; returns ([(text, weight)], k, (start_block, stop_block)) or
  raises ValueError.

  Weights go through the same rule as the prompt syntax of /api/parse (`check_weight` with
  the slider's MAX_WEIGHT), so both routes accept and refuse the same weights. The blocks are
  integers, each defaulting to `default_blocks`, with 1 <= start <= stop <= layers
  (`models.text.reweighted_block_indices`, which the encoder applies).
  """
  if not isinstance(payload, dict):
    raise ValueError("the body must be a JSON object {words: [...], k: int}")
  words = payload.get("words")
  if not isinstance(words, list) or not words:
    raise ValueError("words must be a non-empty list of {text, weight}")
  if len(words) > MAX_WORDS:
    raise ValueError(f"{len(words)} words; the explorer takes at most {MAX_WORDS}")
  for i, word in enumerate(words):
    if not isinstance(word, dict) or not isinstance(word.get("text"), str):
      raise ValueError(f"words[{i}] must be {{text: str, weight: number}}")
  chars = sum(len(word["text"]) for word in words)
  if chars > MAX_PROMPT_CHARS:
    raise ValueError(too_long(chars))
  out = []
  for i, word in enumerate(words):
    text = word["text"]
    shown = text if len(text) <= 40 else text[:40] + "..."
    what, weight = f"words[{i}] {shown!r}", word.get("weight")
    if isinstance(weight, int) and not isinstance(weight, bool):
      # JSON integers are unbounded: one of 4,000 digits overflows float() (issue 26 row 10).
      try:
        float(weight)
      except OverflowError:
        digits = int(weight.bit_length() * math.log10(2)) + 1  # str() may refuse the digits
        raise ValueError(
          f"the weight of {what} is an integer of about {digits} digits, too large: weights "
          f"must lie in [0, {MAX_WEIGHT:g}] (0 removes the words)"
        ) from None
    out.append((text, check_weight(weight, what, MAX_WEIGHT)))
  if not "".join(t for t, _ in out).strip():
    raise ValueError("the prompt is empty; type a few words")
  k = payload.get("k", 12)
  if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
    raise ValueError(f"k must be an integer in [1, {MAX_K}]")
  blocks = []
  for name, default in zip(("start_block", "stop_block"), default_blocks):
    block = payload.get(name)
    if block is None:
      block = default
    elif isinstance(block, bool) or not isinstance(block, int):
      raise ValueError(
        f"{name} must be an integer, a block of the text tower in [1, {layers}], got "
        f"{shorten(json.dumps(block), 40)}"
      )
    blocks.append(block)
  try:
    reweighted_block_indices(layers, *blocks)
  except ValueError as e:
    raise ValueError(f"start_block {blocks[0]}, stop_block {blocks[1]}: {e}") from None
  return out, k, (blocks[0], blocks[1])
