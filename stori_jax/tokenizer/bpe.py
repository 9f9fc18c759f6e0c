"""CLIP's byte-level BPE tokenizer in pure Python (no torch).

Gives ids identical to open_clip's default tokenizer (`open_clip.tokenize`,
`open_clip.get_tokenizer('ViT-B-32')`), which is OpenAI's original CLIP tokenizer:

1. clean: `ftfy.fix_text`, `html.unescape` twice, collapse every whitespace run to one
   space, strip, lowercase;
2. split into pre-tokens with CLIP's regex (contractions, letter runs, single digits,
   runs of other non-space characters);
3. map each pre-token's UTF-8 bytes to printable characters and apply the BPE merges
   (the first 48,894 of `bpe_simple_vocab_16e6.txt.gz`), the last symbol ending in '</w>';
4. frame as `[SOT, tokens..., EOT]` and zero-pad to the context length (77). A text that
   is too long keeps its first `context_length` ids and its last id is forced to EOT.

Vocabulary: 256 byte symbols, the same 256 with '</w>', 48,894 merges, then
`<start_of_text>` (49406) and `<end_of_text>` (49407): 49,408 ids. Padding is id 0, which
is also the id of '!', so padding is only recognisable as "whatever follows EOT".

As in OpenAI's tokenizer, the literal strings '<start_of_text>' / '<end_of_text>' inside a
text become the special ids (kept for id parity).
"""

from __future__ import annotations

import difflib
import functools
import gzip
import html
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import ftfy
import numpy as np
import regex

__all__ = ["Tokenizer", "default_tokenizer", "clean_text", "VOCAB_FILENAME"]

VOCAB_FILENAME = "bpe_simple_vocab_16e6.txt.gz"
SOT_TOKEN = "<start_of_text>"
EOT_TOKEN = "<end_of_text>"
WORD_END = "</w>"
DEFAULT_CONTEXT_LENGTH = 77
# CLIP uses 49152 - 256 - 2 merges: the vocabulary is sized 49152 + 256 byte-with-</w> ids.
_NUM_MERGES = 49152 - 256 - 2

# CLIP's pre-tokenizer. IGNORECASE matters even on lowercased text: e.g. "'ſ" (long s,
# unchanged by lower()) matches the "'s" contraction under case folding.
_PRETOKEN_RE = regex.compile(
  rf"{SOT_TOKEN}|{EOT_TOKEN}|'(?:s|t|re|ve|m|ll|d)|\p{{L}}+|\p{{N}}|[^\s\p{{L}}\p{{N}}]+",
  regex.IGNORECASE,
)

# Text made only of these characters is left unchanged by ftfy.fix_text and
# html.unescape (no '&', no control characters, no non-ASCII), so cleaning may skip
# them: ftfy is the slowest step. Tab/newline/CR only matter as whitespace, which is
# collapsed afterwards anyway.
_NEEDS_FULL_CLEAN = regex.compile(r"[^\t\n\r\x20-\x25\x27-\x7e]")

_CACHE_LIMIT = 1 << 20  # pre-token BPE cache entries; cleared when exceeded (bounds memory)


def _byte_symbols() -> dict[int, str]:
  """Byte -> printable unicode symbol, in CLIP's vocabulary order.

  Printable Latin-1 bytes stand for themselves; the others (controls, space, 0x7f-0xa0,
  0xad) are moved to U+0100 onwards so every symbol is visible and non-space. The dict's
  insertion order is the order of the first 256 vocabulary ids.
  """
  printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
  kept = set(printable)
  symbols = {b: chr(b) for b in printable}
  for k, b in enumerate(b for b in range(256) if b not in kept):
    symbols[b] = chr(256 + k)
  return symbols


_BYTE_TO_SYMBOL = _byte_symbols()
_SYMBOL_TO_BYTE = {s: b for b, s in _BYTE_TO_SYMBOL.items()}
# str.translate table for ASCII pre-tokens, whose code points are their UTF-8 bytes
_ASCII_TO_SYMBOL = {b: _BYTE_TO_SYMBOL[b] for b in range(128)}


def clean_text(text: str) -> str:
  """CLIP's text normalisation: ftfy, double HTML unescape, whitespace collapse, lowercase."""
  if _NEEDS_FULL_CLEAN.search(text) is not None:
    text = html.unescape(html.unescape(ftfy.fix_text(text)))
  # str.split() splits on the same whitespace set as str.isspace() and drops the ends,
  # so this is CLIP's strip + collapse + strip.
  return " ".join(text.split()).lower()


def _default_vocab_path() -> str:
  # shipped next to this module as package data (setup.py: tokenizer/*.gz)
  return str(Path(__file__).resolve().with_name(VOCAB_FILENAME))


class Tokenizer:
  """CLIP BPE tokenizer with open_clip-identical ids.

  Attributes:
    sot_token_id: 49406, eot_token_id: 49407, pad_token_id: 0.
    vocab_size: 49408.
    context_length: default row length of `__call__` (77).
  """

  def __init__(
    self, vocab_path: str | os.PathLike | None = None, context_length: int = DEFAULT_CONTEXT_LENGTH
  ):
    path = _default_vocab_path() if vocab_path is None else os.fspath(vocab_path)
    with gzip.open(path, "rt", encoding="utf-8") as f:
      lines = f.read().split("\n")
    # line 0 is a version header; CLIP uses only the first _NUM_MERGES merges.
    merges = [tuple(line.split()) for line in lines[1 : 1 + _NUM_MERGES]]
    if len(merges) != _NUM_MERGES or any(len(m) != 2 for m in merges):
      raise ValueError(f"{path}: not a CLIP BPE merges file ({len(merges)} merges read)")
    byte_syms = list(_BYTE_TO_SYMBOL.values())
    vocab = byte_syms + [s + WORD_END for s in byte_syms] + [a + b for a, b in merges]
    vocab += [SOT_TOKEN, EOT_TOKEN]
    self._id_to_token: list[str] = vocab
    self._token_to_id: dict[str, int] = {t: i for i, t in enumerate(vocab)}
    if len(self._token_to_id) != len(vocab):
      raise ValueError(f"{path}: duplicate vocabulary entries")
    self._merge_rank: dict[tuple[str, str], int] = {m: r for r, m in enumerate(merges)}
    self.sot_token_id: int = self._token_to_id[SOT_TOKEN]
    self.eot_token_id: int = self._token_to_id[EOT_TOKEN]
    self.pad_token_id: int = 0
    self.context_length: int = int(context_length)
    special = (self.sot_token_id, self.eot_token_id)
    # Per-id raw bytes and word-end flag: used by decode, spans and word grouping.
    self._id_bytes: list[bytes] = [
      t.encode("utf-8")
      if i in special
      else bytes(_SYMBOL_TO_BYTE[c] for c in t.removesuffix(WORD_END))
      for i, t in enumerate(vocab)
    ]
    self._id_ends_word: list[bool] = [t.endswith(WORD_END) for t in vocab]
    self._cache: dict[str, tuple[int, ...]] = {
      SOT_TOKEN: (self.sot_token_id,),
      EOT_TOKEN: (self.eot_token_id,),
    }

  # ------------------------------------------------------------------ vocabulary
  @property
  def vocab_size(self) -> int:
    return len(self._id_to_token)

  def token_bytes(self, token_id: int) -> bytes:
    """The raw UTF-8 bytes a token stands for (without the '</w>' word-end mark)."""
    return self._id_bytes[int(token_id)]

  def ends_word(self, token_id: int) -> bool:
    """True when the token carries CLIP's '</w>' mark, i.e. it ends a pre-token (word)."""
    return self._id_ends_word[int(token_id)]

  # ------------------------------------------------------------------ BPE
  def _bpe(self, pretoken: str) -> tuple[int, ...]:
    """Ids of one pre-token (a regex match of the cleaned text); cached."""
    ids = self._cache.get(pretoken)
    if ids is not None:
      return ids
    if pretoken.isascii():
      syms = list(pretoken.translate(_ASCII_TO_SYMBOL))
    else:
      syms = [_BYTE_TO_SYMBOL[b] for b in pretoken.encode("utf-8")]
    syms[-1] += WORD_END
    rank = self._merge_rank
    while len(syms) > 1:
      # the adjacent pair with the lowest merge rank is merged everywhere (left to right)
      best = None
      best_rank = _NUM_MERGES
      for pair in zip(syms, syms[1:]):
        r = rank.get(pair, _NUM_MERGES)
        if r < best_rank:
          best, best_rank = pair, r
      if best is None:
        break
      first, second = best
      merged = first + second
      out = []
      i, n = 0, len(syms)
      while i < n:
        if i + 1 < n and syms[i] == first and syms[i + 1] == second:
          out.append(merged)
          i += 2
        else:
          out.append(syms[i])
          i += 1
      syms = out
    ids = tuple(self._token_to_id[s] for s in syms)
    if len(self._cache) >= _CACHE_LIMIT:
      self._cache.clear()
      self._cache[SOT_TOKEN] = (self.sot_token_id,)
      self._cache[EOT_TOKEN] = (self.eot_token_id,)
    self._cache[pretoken] = ids
    return ids

  # ------------------------------------------------------------------ encode / decode
  def encode(self, text: str) -> list[int]:
    """BPE ids of `text`, without SOT/EOT and without padding or truncation."""
    ids: list[int] = []
    for pretoken in _PRETOKEN_RE.findall(clean_text(text)):
      ids.extend(self._bpe(pretoken))
    return ids

  def encode_with_spans(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Ids (as `encode`) plus, per id, the `[start, end)` character span in `text`.

    The ids are computed exactly as `encode` does. Spans refer to the ORIGINAL text,
    before cleaning: when cleaning only lowercases and collapses whitespace (almost
    always) the spans are exact; when ftfy or HTML unescaping rewrote characters,
    they come from a character alignment (difflib) and are best effort. A token that
    covers part of a multi-byte character spans that whole character.
    """
    cleaned = clean_text(text)
    src = _source_positions(text, cleaned)
    ids: list[int] = []
    spans: list[tuple[int, int]] = []
    for m in _PRETOKEN_RE.finditer(cleaned):
      pretoken = m.group()
      start = m.start()
      piece_ids = self._bpe(pretoken)
      ids.extend(piece_ids)
      if len(piece_ids) == 1:
        char_spans = [(0, len(pretoken))]
      else:
        char_spans = self._piece_char_spans(pretoken, piece_ids)
      for a, b in char_spans:
        s = src[start + a]
        e = src[start + b - 1] + 1
        spans.append((s, max(e, s + 1)))
    return ids, spans

  def _piece_char_spans(self, pretoken: str, piece_ids: Sequence[int]) -> list[tuple[int, int]]:
    """Character span, within `pretoken`, of each BPE piece (pieces split bytes)."""
    if pretoken.isascii():
      byte_to_char = None
    else:
      byte_to_char = []
      for ci, ch in enumerate(pretoken):
        byte_to_char.extend([ci] * len(ch.encode("utf-8")))
    out = []
    pos = 0
    for tid in piece_ids:
      nbytes = len(self._id_bytes[tid])
      if byte_to_char is None:
        out.append((pos, pos + nbytes))
      else:
        out.append((byte_to_char[pos], byte_to_char[pos + nbytes - 1] + 1))
      pos += nbytes
    return out

  def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
    """Text of `ids`: word-final tokens are followed by a space; the result is stripped.

    With `skip_special_tokens` (default) SOT is dropped and decoding stops at the first
    EOT (what follows it is padding), so a padded row decodes to its text. Otherwise
    SOT/EOT are written as '<start_of_text>'/'<end_of_text>' and every id, padding
    included (id 0 is '!'), is decoded.
    """
    parts: list[bytes] = []
    for tid in _as_int_list(ids):
      if skip_special_tokens:
        if tid == self.sot_token_id:
          continue
        if tid == self.eot_token_id:
          break
      parts.append(self._id_bytes[tid])
      if self._id_ends_word[tid]:
        parts.append(b" ")
    return b"".join(parts).decode("utf-8", errors="replace").strip()

  def token_strings(self, ids: Iterable[int], word_end: str = "") -> list[str]:
    """One readable string per id (same length as `ids`, so it lines up with weights).

    Tokens show their text without CLIP's '</w>' mark; `word_end` is appended to
    word-final tokens instead (pass " " so that `"".join(...)` reads as the text).
    SOT/EOT show as '<start_of_text>'/'<end_of_text>', zeros after the first EOT as
    '<pad>'. A token holding only part of a multi-byte character shows its bytes
    escaped (e.g. '\\xe7\\x8c').
    """
    out: list[str] = []
    after_eot = False
    for tid in _as_int_list(ids):
      if tid == self.sot_token_id:
        out.append(SOT_TOKEN)
      elif tid == self.eot_token_id:
        out.append(EOT_TOKEN)
        after_eot = True
      elif after_eot and tid == self.pad_token_id:
        out.append("<pad>")
      else:
        s = self._id_bytes[tid].decode("utf-8", errors="backslashreplace")
        out.append(s + word_end if self._id_ends_word[tid] else s)
    return out

  def __call__(
    self, texts: str | Sequence[str], context_length: int | None = None, truncate: bool = True
  ) -> np.ndarray:
    """Tokenize into an int32 array of shape [B, context_length] (B = 1 for a str).

    Rows are `[SOT, ids..., EOT, 0, 0, ...]`. A text longer than the context keeps its
    first `context_length` ids with the last one forced to EOT (open_clip's rule) when
    `truncate` is true, and raises ValueError otherwise.
    """
    if isinstance(texts, str):
      texts = [texts]
    length = self.context_length if context_length is None else int(context_length)
    if length < 2:
      raise ValueError(f"context_length must be >= 2 (room for SOT and EOT); got {length}")
    texts = list(texts)
    out = np.zeros((len(texts), length), dtype=np.int32)
    for row, text in enumerate(texts):
      if not isinstance(text, str):
        raise TypeError(f"texts[{row}] is {type(text).__name__}, expected str")
      ids = [self.sot_token_id, *self.encode(text), self.eot_token_id]
      if len(ids) > length:
        if not truncate:
          raise ValueError(
            f"texts[{row}] has {len(ids)} tokens including SOT/EOT, more than the "
            f"context length {length} (pass truncate=True to cut it): {_quote(text)}"
          )
        ids = ids[:length]
        ids[-1] = self.eot_token_id
      out[row, : len(ids)] = ids
    return out

  def __repr__(self) -> str:
    return f"Tokenizer(vocab_size={self.vocab_size}, context_length={self.context_length})"


@functools.lru_cache(maxsize=None)
def default_tokenizer() -> Tokenizer:
  """The shared CLIP tokenizer built from the bundled vocabulary (built once, then cached)."""
  return Tokenizer()


# ---------------------------------------------------------------------- helpers
def _as_int_list(ids) -> list[int]:
  arr = np.asarray(ids)
  if arr.ndim != 1:
    raise ValueError(f"expected a 1-D sequence of token ids, got shape {arr.shape}")
  return [int(i) for i in arr.tolist()]


def _quote(text: str, limit: int = 300) -> str:
  if len(text) <= limit:
    return repr(text)
  return f"{text[:limit]!r}... ({len(text)} characters)"


def _source_positions(text: str, cleaned: str) -> list[int]:
  """For each character of `cleaned` (= clean_text(text)), its index in `text`."""
  # Cheap tracked version of the cleaning (per-character lowercase + whitespace
  # collapse): equals `cleaned` unless ftfy/HTML unescaping changed something or a
  # lowercase depends on context (Greek final sigma).
  chars: list[str] = []
  src: list[int] = []
  space_at = -1
  for i, ch in enumerate(text):
    if ch.isspace():
      if chars and space_at < 0:
        space_at = i
      continue
    if space_at >= 0:
      chars.append(" ")
      src.append(space_at)
      space_at = -1
    low = ch.lower()  # may be 2 characters (e.g. 'İ')
    chars.extend(low)
    src.extend([i] * len(low))
  if "".join(chars) == cleaned:
    return src
  # Fallback: align the true cleaned text with the tracked one.
  tracked = "".join(chars)
  mapped: list[int | None] = [None] * len(cleaned)
  matcher = difflib.SequenceMatcher(None, cleaned, tracked, autojunk=False)
  for tag, i1, i2, j1, j2 in matcher.get_opcodes():
    if tag == "equal":
      for k in range(i2 - i1):
        mapped[i1 + k] = src[j1 + k]
    elif tag == "replace":
      for k in range(i1, i2):
        mapped[k] = src[j1 + (k - i1) * (j2 - j1) // (i2 - i1)]
  # characters created by cleaning inherit their left neighbour's source (or the right's)
  last = next((m for m in mapped if m is not None), 0)
  out = []
  for m in mapped:
    if m is not None:
      last = m
    out.append(last)
  return out
