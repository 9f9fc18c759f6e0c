"""Word weights for SToRI: weighted-prompt syntax, per-token weights, token -> word views.

Prompt syntax (user-driven control)::

    a photo of a woman with (blonde hair:1.5), wearing (eyeglasses:0.5)

* `(text:w)` gives every BPE token of `text` the weight `w`; everything else has weight 1.
  `w` is a plain decimal number in ASCII digits (`2`, `1.5`, `.5`, `1e-1`; not `１.５`),
  optionally surrounded by spaces; it must lie in [0, MAX_WEIGHT = 100] (0 removes the
  tokens from attention). Why 100: SToRI multiplies a token's attention by w, i.e. adds
  log w to its attention logits, and at 100 (+4.6) the token already draws nearly all the
  attention, so larger weights change nothing useful; the prompt-weighting baseline scales
  token states by w, where 1e20 overflows float32 in the layer norms (NaN features). The
  weight is what follows the LAST unescaped ':' in the group, so `(ratio 3:2:1.5)`
  weighs "ratio 3:2".
* A parenthesised group WITHOUT an unescaped ':' (e.g. `(cute)`) is literal text: the
  parentheses stay in the text and it keeps weight 1.0. Unlike some image-generation UIs,
  no implicit 1.1 emphasis is applied: every weight is written out. Plain sentences with
  parenthetical remarks therefore tokenize unchanged.
* Escapes: `\\(`, `\\)`, `\\:` and `\\\\` stand for a literal '(', ')', ':' and '\\'. Any
  other backslash is kept as is.
* Errors (`WeightedPromptError`, a ValueError, whose message quotes the prompt, shortened
  when long, and puts a caret under the offending character): unbalanced or nested
  parentheses, a non-numeric or missing weight, a weight outside [0, MAX_WEIGHT], a
  weighted group with no text, and a prompt with more tokens than the context length.
  Every string either parses, giving ids equal to those of its plain text, or raises
  WeightedPromptError (tests/test_tokenizer_property.py).

Programmatic prompts: anywhere a prompt string is accepted, a list of `Segment`s or of
`(text, weight)` pairs works too; their texts are concatenated as written (no syntax).

Token weights. The ids always equal plain tokenization of the prompt with the weight
syntax removed (`tokenizer(strip_weights(prompt))`): the whole text is tokenized once
and each token is mapped back to the segments by character offsets. When a segment
boundary falls inside a single BPE token (e.g. `foot(ball:2)` where "football" is one
token), that token gets the weight of the segment holding most of its characters, the
earlier segment on a tie, and a `SplitTokenWarning` names the token. SOT, EOT and
padding get weight 1.0.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import unicodedata
import warnings
from collections.abc import Callable, Sequence
from typing import Union

import numpy as np
import regex

from stori_jax.plumbing.errors import UserError

from .bpe import Tokenizer

__all__ = [
  "Segment",
  "Word",
  "WeightedPromptError",
  "SplitTokenWarning",
  "parse_weighted",
  "strip_weights",
  "tokenize_weighted",
  "words_from_tokens",
  "word_weights",
  "check_weight",
  "MAX_WEIGHT",
]

#: Largest accepted weight (see the module docstring for why).
MAX_WEIGHT = 100.0

# ASCII digits only: `\d` would also take full-width and other Unicode digits, which float()
# reads, so a prompt could carry a weight the user cannot see as a number.
_NUMBER_RE = regex.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_ESCAPABLE = "()\\:"


class WeightedPromptError(UserError, ValueError):
  """A prompt that cannot be parsed or tokenized.

  Attributes: `reason` (str), `prompt` (str | None), `position` (character index in the
  prompt, or None).
  """

  def __init__(self, reason: str, prompt: str | None = None, position: int | None = None):
    self.reason = reason
    self.prompt = prompt
    self.position = position
    super().__init__(_format_error(reason, prompt, position))


class SplitTokenWarning(UserWarning):
  """A segment boundary fell inside one BPE token, so one token had to carry one weight."""


@dataclasses.dataclass(frozen=True)
class Segment:
  """A piece of prompt text and the weight of all its tokens (finite, >= 0)."""

  text: str
  weight: float = 1.0

  def __post_init__(self):
    if not isinstance(self.text, str):
      raise TypeError(f"Segment.text must be str, got {type(self.text).__name__}")
    weight = check_weight(self.weight, f"segment {_short(self.text)}")
    object.__setattr__(self, "weight", weight)


@dataclasses.dataclass(frozen=True)
class Word:
  """One word of a tokenized row: its text and token positions `[start, end)` in the row.

  A word is a run of BPE tokens ended by a token carrying CLIP's '</w>' mark, i.e. one
  pre-token of CLIP's regex; punctuation runs are words of their own.
  """

  text: str
  start: int
  end: int

  @property
  def span(self) -> slice:
    return slice(self.start, self.end)


SegmentLike = Union[Segment, tuple[str, float]]
Prompt = Union[str, Sequence[SegmentLike]]


# ---------------------------------------------------------------------- parsing
def parse_weighted(prompt: Prompt, max_weight: float = MAX_WEIGHT) -> list[Segment]:
  """Split a weighted prompt into `Segment`s, in order (see the module docstring).

  Unweighted stretches become weight-1.0 segments; literal groups such as `(cute)` are
  part of them. A list of Segments / (text, weight) pairs is validated and returned as
  Segments. Weights above `max_weight` (at most MAX_WEIGHT) are refused, as `check_weight`
  refuses them.
  """
  return _segments_and_sources(prompt, max_weight)[0]


def strip_weights(prompt: Prompt) -> str:
  """The prompt's plain text: weight syntax removed, escapes resolved."""
  return "".join(s.text for s in parse_weighted(prompt))


def _segments_and_sources(
  prompt: Prompt, max_weight: float = MAX_WEIGHT
) -> tuple[list[Segment], list[int] | None]:
  """Segments plus, for a string prompt, each plain-text character's index in it."""
  if isinstance(prompt, str):
    return _parse(prompt, max_weight)
  if isinstance(prompt, Segment) or not isinstance(prompt, Sequence):
    raise TypeError(
      f"a prompt is a str or a list of Segment / (text, weight) pairs; got {type(prompt).__name__}"
    )
  segments = []
  for k, item in enumerate(prompt):
    if isinstance(item, Segment):
      segments.append(item)
    elif _is_pair(item):
      segments.append(Segment(item[0], item[1]))
    else:
      raise TypeError(f"prompt item {k} is {item!r}; expected a Segment or a (text, weight) pair")
    if max_weight < MAX_WEIGHT:
      check_weight(segments[-1].weight, f"segment {_short(segments[-1].text)}", max_weight)
  return segments, None


def _is_pair(item) -> bool:
  return (
    isinstance(item, (tuple, list))
    and len(item) == 2
    and isinstance(item[0], str)
    and isinstance(item[1], (numbers.Real, np.generic))
    and not isinstance(item[1], bool)
  )


def _parse(prompt: str, max_weight: float = MAX_WEIGHT) -> tuple[list[Segment], list[int]]:
  if not any(c in prompt for c in "()\\"):  # no syntax at all: the common case, made cheap
    return ([Segment(prompt, 1.0)] if prompt else []), list(range(len(prompt)))
  segments: list[Segment] = []
  sources: list[int] = []  # plain-text char -> prompt index, over all segments
  buf: list[str] = []  # pending weight-1.0 text
  buf_src: list[int] = []

  def flush():
    if buf:
      segments.append(Segment("".join(buf), 1.0))
      sources.extend(buf_src)
      buf.clear()
      buf_src.clear()

  i, n = 0, len(prompt)
  while i < n:
    ch = prompt[i]
    if ch == "\\" and i + 1 < n and prompt[i + 1] in _ESCAPABLE:
      buf.append(prompt[i + 1])
      buf_src.append(i + 1)
      i += 2
    elif ch == ")":
      raise WeightedPromptError(
        "unbalanced parentheses: ')' has no matching '(' (write \\) for a literal parenthesis)",
        prompt,
        i,
      )
    elif ch == "(":
      open_at = i
      chars: list[str] = []  # group content, escapes resolved
      srcs: list[int] = []
      colons: list[int] = []  # indices into `chars` of unescaped ':'
      i += 1
      while True:
        if i >= n:
          raise WeightedPromptError(
            "unbalanced parentheses: '(' is never closed (write \\( for a literal parenthesis)",
            prompt,
            open_at,
          )
        c = prompt[i]
        if c == "\\" and i + 1 < n and prompt[i + 1] in _ESCAPABLE:
          chars.append(prompt[i + 1])
          srcs.append(i + 1)
          i += 2
          continue
        if c == "(":
          raise WeightedPromptError(
            f"nested parentheses are not supported (group opened at position "
            f"{open_at}); escape literal ones as \\( \\)",
            prompt,
            i,
          )
        if c == ")":
          break
        if c == ":":
          colons.append(len(chars))
        chars.append(c)
        srcs.append(i)
        i += 1
      close_at = i
      i += 1
      if not colons:
        # literal group: keep the parentheses as text, weight 1.0
        buf.extend(["(", *chars, ")"])
        buf_src.extend([open_at, *srcs, close_at])
        continue
      colon = colons[-1]
      text = "".join(chars[:colon])
      weight_start = srcs[colon] + 1
      weight = _parse_weight(prompt, weight_start, close_at, max_weight)
      if not text.strip():
        raise WeightedPromptError("weighted group has no text before its ':'", prompt, open_at)
      flush()
      segments.append(Segment(text, weight))
      sources.extend(srcs[:colon])
    else:
      buf.append(ch)
      buf_src.append(i)
      i += 1
  flush()
  return segments, sources


def _parse_weight(prompt: str, start: int, end: int, max_weight: float) -> float:
  raw = prompt[start:end]
  stripped = raw.strip()
  pos = start + (len(raw) - len(raw.lstrip()))
  if not stripped:
    raise WeightedPromptError(
      "missing weight after ':' (expected e.g. (words:1.5); write \\: for a literal colon)",
      prompt,
      start - 1,
    )
  if not _NUMBER_RE.fullmatch(stripped):
    raise WeightedPromptError(
      f"weight {_short(stripped)} is not a number in ASCII digits (expected e.g. "
      "(words:1.5); write \\: for a literal colon)",
      prompt,
      pos,
    )
  value = float(stripped)
  refusal = _weight_refusal(value, stripped, max_weight)
  if refusal:
    raise WeightedPromptError(refusal, prompt, pos)
  return value


def check_weight(weight, what: str = "a word", max_weight: float = MAX_WEIGHT) -> float:
  """`weight` as a float when it is a real number in [0, max_weight]; else WeightedPromptError.

  The one rule for every weight: the prompt syntax, Segments, (text, weight) pairs and the
  explorer's JSON API all go through it (with the explorer's smaller `max_weight`).
  """
  if isinstance(weight, (bool, np.bool_)) or not isinstance(weight, numbers.Real):
    raise WeightedPromptError(
      f"the weight of {what} must be a number, got {_short(repr(weight))} ({type(weight).__name__})"
    )
  value = float(weight)
  refusal = _weight_refusal(value, f"{value:g} for {what}", max_weight)
  if refusal:
    raise WeightedPromptError(refusal)
  return value


def _weight_refusal(value: float, shown: str, max_weight: float) -> str | None:
  """Why `value` cannot be a weight (a message), or None when it can."""
  if math.isnan(value) or math.isinf(value):
    head = f"weight {shown} is not finite"
  elif value < 0:
    head = f"negative weight {shown}"
  elif value > max_weight:
    head = f"weight {shown} is too large"
  else:
    return None
  if max_weight >= MAX_WEIGHT:
    why = (
      f"at {MAX_WEIGHT:g} a word already draws nearly all the attention, and larger weights "
      "overflow the prompt-weighting baseline"
    )
  else:
    why = f"{max_weight:g} is the largest weight accepted here"
  return f"{head}: weights must lie in [0, {max_weight:g}] (0 removes the words; {why})"


# ---------------------------------------------------------------------- tokenization
def tokenize_weighted(
  tokenizer: Tokenizer,
  prompts: Prompt | Sequence[Prompt],
  context_length: int | None = None,
  truncate: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
  """Token ids and per-token weights of weighted prompts.

  Args:
    tokenizer: a `Tokenizer`.
    prompts: one prompt (a str in the weighted syntax, or a list of Segment /
      (text, weight) pairs) or a sequence of prompts.
    context_length: row length L; default `tokenizer.context_length` (77).
    truncate: if false (default) a prompt with more than L tokens (SOT/EOT included)
      raises WeightedPromptError; if true it is cut as `tokenizer(...)` cuts it.

  Returns:
    ids: int32 [B, L], equal to `tokenizer([strip_weights(p) for p in prompts], L)`.
    weights: float32 [B, L]; each BPE token carries its segment's weight; SOT, EOT and
      padding carry 1.0. B = 1 for a single prompt.
  """
  batch = _as_batch(prompts)
  length = tokenizer.context_length if context_length is None else int(context_length)
  if length < 2:
    raise ValueError(f"context_length must be >= 2 (room for SOT and EOT); got {length}")
  ids_out = np.zeros((len(batch), length), dtype=np.int32)
  w_out = np.ones((len(batch), length), dtype=np.float32)
  for row, prompt in enumerate(batch):
    segments, sources = _segments_and_sources(prompt)
    plain = "".join(s.text for s in segments)
    # spans of the tokens that can fit (and of the first that cannot, for the error)
    ids, spans = tokenizer.encode_with_spans(plain, span_limit=length - 1)
    shown = prompt if isinstance(prompt, str) else plain
    total = len(ids) + 2
    if total > length:
      first_cut = spans[length - 2][0]
      if not truncate:
        raise WeightedPromptError(
          f"prompt too long: {total} tokens including start/end tokens, but the "
          f"context length is {length}; the text from the marked position on "
          "does not fit",
          shown,
          sources[first_cut] if sources is not None else first_cut,
        )
      ids, spans = ids[: length - 2], spans[: length - 2]
    weights = _token_weights(tokenizer, segments, spans, ids, shown)
    ids_out[row, 0] = tokenizer.sot_token_id
    ids_out[row, 1 : len(ids) + 1] = ids
    ids_out[row, len(ids) + 1] = tokenizer.eot_token_id
    w_out[row, 1 : len(ids) + 1] = weights
  return ids_out, w_out


def _as_batch(prompts) -> list:
  if isinstance(prompts, str):
    return [prompts]
  if not isinstance(prompts, Sequence):
    raise TypeError(
      f"prompts must be a str, a segment list or a sequence of those; got {type(prompts).__name__}"
    )
  if len(prompts) and all(isinstance(p, Segment) or _is_pair(p) for p in prompts):
    return [prompts]  # one programmatic prompt
  for k, p in enumerate(prompts):
    if not isinstance(p, (str, Sequence)) or isinstance(p, Segment) or _is_pair(p):
      raise TypeError(
        f"prompts[{k}] is {p!r}; a batch holds strings or lists of Segment / (text, weight) pairs"
      )
  return list(prompts)


def _token_weights(
  tokenizer: Tokenizer,
  segments: list[Segment],
  spans: list[tuple[int, int]],
  ids: list[int],
  shown: str,
) -> list[float]:
  # segment index of each plain-text character; segments are contiguous in the text
  bounds = np.cumsum([0] + [len(s.text) for s in segments])
  out = []
  for tid, (a, b) in zip(ids, spans):
    first = int(np.searchsorted(bounds, a, side="right")) - 1
    last = int(np.searchsorted(bounds, b - 1, side="right")) - 1
    if first == last:
      out.append(segments[first].weight)
      continue
    # boundary inside the token: majority of characters, earlier segment on ties
    counts = [min(b, bounds[k + 1]) - max(a, bounds[k]) for k in range(first, last + 1)]
    best = first + int(np.argmax(counts))
    weight = segments[best].weight
    distinct = {segments[k].weight for k in range(first, last + 1) if counts[k - first] > 0}
    if len(distinct) > 1:
      token = tokenizer.token_strings([tid])[0]
      warnings.warn(
        f"a weight boundary falls inside the token {token!r} of prompt {_quoted(shown)}; "
        f"it gets weight {weight:g} (the segment holding most of its characters; "
        "weights in it: " + ", ".join(f"{w:g}" for w in sorted(distinct)) + ")",
        SplitTokenWarning,
        stacklevel=3,
      )
    out.append(weight)
  return out


# ---------------------------------------------------------------------- token -> word
def words_from_tokens(tokenizer: Tokenizer, ids_row) -> list[Word]:
  """Group a row of ids (1-D, e.g. int32 [L]) into words with their token spans.

  SOT is skipped and the row ends at the first EOT (padding follows it). Spans index the
  given row, so `weights_row[word.span]` are that word's token weights. A row without
  EOT is read to its end; a trailing unfinished word (truncation) is still returned.
  """
  ids = np.asarray(ids_row)
  if ids.ndim != 1:
    raise ValueError(f"words_from_tokens expects one row of ids, got shape {ids.shape}")
  words: list[Word] = []
  start = None
  parts: list[bytes] = []
  for pos, tid in enumerate(int(t) for t in ids.tolist()):
    if tid == tokenizer.sot_token_id:
      continue
    if tid == tokenizer.eot_token_id:
      break
    if start is None:
      start = pos
    parts.append(tokenizer.token_bytes(tid))
    if tokenizer.ends_word(tid):
      words.append(Word(b"".join(parts).decode("utf-8", errors="replace"), start, pos + 1))
      start, parts = None, []
  if start is not None:
    words.append(Word(b"".join(parts).decode("utf-8", errors="replace"), start, pos + 1))
  return words


_REDUCERS: dict[str, Callable[[np.ndarray], float]] = {
  "mean": np.mean,
  "max": np.max,
  "min": np.min,
  "sum": np.sum,
}


def word_weights(
  tokenizer: Tokenizer,
  ids_row,
  token_weights_row,
  reduce: str | Callable[[np.ndarray], float] = "mean",
) -> list[tuple[str, float]]:
  """Per-word weights from per-token weights (e.g. trained SToRI weights).

  Args:
    ids_row: int [L] token ids of one prompt.
    token_weights_row: float [L] weights aligned with `ids_row`.
    reduce: how a multi-token word combines its token weights: 'mean', 'max', 'min',
      'sum' or a callable on a 1-D float array.
  Returns:
    [(word, weight)] in order; SOT, EOT and padding are skipped.
  """
  weights = np.asarray(token_weights_row, dtype=np.float64)
  ids = np.asarray(ids_row)
  if weights.shape != ids.shape:
    raise ValueError(
      f"ids_row has shape {ids.shape} but token_weights_row has shape "
      f"{weights.shape}; they must align"
    )
  if callable(reduce):
    fn = reduce
  elif reduce in _REDUCERS:
    fn = _REDUCERS[reduce]
  else:
    raise ValueError(f"reduce must be one of {sorted(_REDUCERS)} or a callable; got {reduce!r}")
  return [(w.text, float(fn(weights[w.span]))) for w in words_from_tokens(tokenizer, ids)]


# ---------------------------------------------------------------------- error display
_DISPLAY_WINDOW = 100  # characters shown on each side of the caret for long prompts


_QUOTE_LIMIT = 500  # longer prompts are quoted by their start and length only


def _format_error(reason: str, prompt: str | None, position: int | None) -> str:
  if prompt is None:
    return reason
  if position is None:
    return f"{reason}\n  in prompt {_quoted(prompt)}"
  lo = max(0, position - _DISPLAY_WINDOW)
  hi = min(len(prompt), position + _DISPLAY_WINDOW)
  shown = ("..." if lo else "") + _visible(prompt[lo:hi]) + ("..." if hi < len(prompt) else "")
  pad = (3 if lo else 0) + sum(_width(c) for c in _visible(prompt[lo:position]))
  where = f"at position {position} of prompt {_quoted(prompt)}"
  return f"{reason}\n  {where}:\n    {shown}\n    {' ' * pad}^"


def _quoted(prompt: str) -> str:
  """repr of a prompt, or of its start with its length when long: errors stay short."""
  if len(prompt) <= _QUOTE_LIMIT:
    return repr(prompt)
  return f"{prompt[:_DISPLAY_WINDOW]!r}... ({len(prompt)} characters)"


def _short(text: str, limit: int = 60) -> str:
  """repr of a text cut to `limit` characters."""
  return repr(text) if len(text) <= limit else f"{text[:limit]!r}..."


def _visible(text: str) -> str:
  # one printable character per control character, so the caret stays aligned
  return "".join(
    ("\u21b5" if c == "\n" else "\u2192" if c == "\t" else " ")
    if unicodedata.category(c) == "Cc"
    else c
    for c in text
  )


def _width(c: str) -> int:
  if unicodedata.combining(c):
    return 0
  return 2 if unicodedata.east_asian_width(c) in ("W", "F") else 1
