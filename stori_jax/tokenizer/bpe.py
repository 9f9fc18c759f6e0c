"""CLIP's byte-level BPE tokenizer in pure Python (no torch).

Gives ids identical to open_clip's default tokenizer (`open_clip.tokenize`,
`open_clip.get_tokenizer('ViT-B-32')`), which is OpenAI's original CLIP tokenizer:

1. clean: `ftfy.fix_text`, `html.unescape` twice, collapse every whitespace run to one
   space, strip, lowercase;
2. split into pre-tokens with CLIP's regex (contractions, letter runs, single digits,
   runs of other non-space characters);
3. map each pre-token's UTF-8 bytes to printable characters and apply the BPE merges
   (the first 48,894 of `bpe_simple_vocab_16e6.txt.gz`), the last symbol ending in '</w>'.
   Short words use CLIP's own loop; long ones an exact n log n version of it (the same ids
   for every word), so one 64 KB word costs a fraction of a second instead of CLIP's
   quadratic 26 s, and 100 KB of any text tokenizes in well under a second;
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
import heapq
import html
import os
import sys
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
_CACHE_MAX_WORD = 64  # longer pre-tokens are not cached (characters)
# Words of at most this many byte symbols use CLIP's reference merge loop (fastest when short);
# longer ones the heap, whose cost grows as n log n instead of n^2 (a pathological long word).
_SHORT_WORD = 8


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
    # The heap merge equals the reference loop only for a vocabulary learned in order; a
    # merges file that is not falls back to the reference loop for every word.
    self._short_word = _SHORT_WORD if _ranks_are_ordered(merges) else float("inf")
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
    """Ids of one pre-token (a regex match of the cleaned text); cached when short."""
    ids = self._cache.get(pretoken)
    if ids is not None:
      return ids
    if pretoken.isascii():
      syms = list(pretoken.translate(_ASCII_TO_SYMBOL))
    else:
      syms = [_BYTE_TO_SYMBOL[b] for b in pretoken.encode("utf-8")]
    syms[-1] += WORD_END
    if len(syms) <= self._short_word:
      syms = self._merge_by_rounds(syms)
    else:
      syms = self._merge_by_heap(syms)
    ids = tuple(self._token_to_id[s] for s in syms)
    # Long pre-tokens are rare in text and unbounded in size: caching them would let a stream
    # of distinct long words hold megabytes each.
    if len(pretoken) <= _CACHE_MAX_WORD:
      if len(self._cache) >= _CACHE_LIMIT:
        self._cache.clear()
        self._cache[SOT_TOKEN] = (self.sot_token_id,)
        self._cache[EOT_TOKEN] = (self.eot_token_id,)
      self._cache[pretoken] = ids
    return ids

  def _merge_by_rounds(self, syms: list[str]) -> list[str]:
    """CLIP's reference loop: merge the lowest-ranked adjacent pair everywhere, left to right.

    O(n^2) in the number of symbols: used for short words only, where it is the fastest.
    """
    rank = self._merge_rank
    while len(syms) > 1:
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
    return syms

  def _merge_by_heap(self, syms: list[str]) -> list[str]:
    """The same merges as `_merge_by_rounds` in O(n log n), for long words.

    Symbols are nodes of a linked list indexed by their original position. Pending pairs are
    kept per rank (positions) with a heap of the ranks: taking the smallest rank and its
    positions in order visits the pairs of one rank left to right, as a reference round
    does, because a merge only creates pairs that contain the new, longer token and every
    such pair has a higher rank than the merge that made the token (true of a vocabulary
    learned in order, checked when it is loaded: `_ranks_are_ordered`). A position is stale
    when its node was absorbed or either node has grown since (symbols only grow, and a rank
    names exactly one pair), which the rank lookup of the current pair detects.
    """
    rank = self._merge_rank.get
    n = len(syms)
    following = list(range(1, n + 1))
    following[-1] = -1
    preceding = list(range(-1, n - 1))
    pending: dict[int, list[int]] = {}  # rank -> positions of its pairs (maybe stale)
    for i in range(n - 1):
      r = rank((syms[i], syms[i + 1]))
      if r is not None:
        pending.setdefault(r, []).append(i)
    ranks = list(pending)
    heapq.heapify(ranks)

    def add(r: int, i: int) -> None:
      positions = pending.get(r)
      if positions is None:
        pending[r] = [i]
        heapq.heappush(ranks, r)
      else:
        positions.append(i)

    while ranks:
      r = heapq.heappop(ranks)
      for i in sorted(pending.pop(r)):
        first = syms[i]
        j = following[i]
        if first is None or j < 0 or rank((first, syms[j])) != r:
          continue  # stale
        merged = first + syms[j]
        syms[i], syms[j] = merged, None
        k = following[j]
        following[i] = k
        if k >= 0:
          preceding[k] = i
          if (r_next := rank((merged, syms[k]))) is not None:
            add(r_next, i)  # r_next > r: handled in a later round
        p = preceding[i]
        if p >= 0 and (r_prev := rank((syms[p], merged))) is not None:
          add(r_prev, p)
    return [s for s in syms if s is not None]

  # ------------------------------------------------------------------ encode / decode
  def encode(self, text: str) -> list[int]:
    """BPE ids of `text`, without SOT/EOT and without padding or truncation."""
    ids: list[int] = []
    for pretoken in _PRETOKEN_RE.findall(clean_text(text)):
      ids.extend(self._bpe(pretoken))
    return ids

  def encode_with_spans(
    self, text: str, span_limit: int | None = None
  ) -> tuple[list[int], list[tuple[int, int]]]:
    """Ids (as `encode`) plus, per id, the `[start, end)` character span in `text`.

    The ids are computed exactly as `encode` does. Spans refer to the ORIGINAL text,
    before cleaning: when cleaning only lowercases and collapses whitespace (almost
    always) the spans are exact; when ftfy or HTML unescaping rewrote characters,
    they come from aligning each whitespace-free piece of the text with its cleaned form
    (exact for such local rewrites) or, when cleaning crossed pieces, from a difflib
    alignment (best effort). A token that covers part of a multi-byte character spans
    that whole character.

    Args:
      text: the text.
      span_limit: if given, spans are computed for the first `span_limit` ids only (every
        id is still returned): a context of 77 tokens needs no more, and the work stays
        proportional to what is used.
    """
    cleaned = clean_text(text)
    limit = sys.maxsize if span_limit is None else max(0, int(span_limit))
    ids: list[int] = []
    pieces: list[tuple[int, str, tuple[int, ...]]] = []  # (start, pre-token, ids) with spans
    for m in _PRETOKEN_RE.finditer(cleaned):
      piece_ids = self._bpe(m.group())
      if len(ids) < limit:
        pieces.append((m.start(), m.group(), piece_ids))
      ids.extend(piece_ids)
    upto = pieces[-1][0] + len(pieces[-1][1]) if pieces else 0
    src = _source_positions(text, cleaned, upto)
    spans: list[tuple[int, int]] = []
    for start, pretoken, piece_ids in pieces:
      if len(piece_ids) == 1:
        char_spans = [(0, len(pretoken))]
      else:
        char_spans = self._piece_char_spans(pretoken, piece_ids[: max(0, limit - len(spans))])
      for a, b in char_spans:
        s = src[start + a]
        e = src[start + b - 1] + 1
        spans.append((s, max(e, s + 1)))
    return ids, spans[: len(ids) if span_limit is None else span_limit]

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
def _ranks_are_ordered(merges: Sequence[tuple[str, str]]) -> bool:
  """True when both halves of every merge are byte symbols or tokens of an earlier merge.

  That is how BPE learns its merges, and it makes every pair containing a token rank after
  the merge that created it, which `Tokenizer._merge_by_heap` relies on.
  """
  known = set(_BYTE_TO_SYMBOL.values())
  known |= {s + WORD_END for s in _BYTE_TO_SYMBOL.values()}
  for a, b in merges:
    if a not in known or b not in known:
      return False
    known.add(a + b)
  return True


def _as_int_list(ids) -> list[int]:
  arr = np.asarray(ids)
  if arr.ndim != 1:
    raise ValueError(f"expected a 1-D sequence of token ids, got shape {arr.shape}")
  return [int(i) for i in arr.tolist()]


def _quote(text: str, limit: int = 300) -> str:
  if len(text) <= limit:
    return repr(text)
  return f"{text[:limit]!r}... ({len(text)} characters)"


def _source_positions(text: str, cleaned: str, upto: int | None = None) -> list[int]:
  """For each of the first `upto` characters of `cleaned` (= clean_text(text)), or all of
  them, its index in `text`.

  Linear in the text in all but a pathological case: cleaning is local to the whitespace-free
  pieces of the text (lowercase, ftfy's and HTML's character fixes), so each piece is aligned
  on its own and the result is checked against `cleaned`. Only when cleaning crossed pieces
  (e.g. ftfy stops unescaping HTML after a '<', or turns a NEL into '…') is the whole text
  aligned, with difflib on the part that differs.
  """
  upto = len(cleaned) if upto is None else min(upto, len(cleaned))
  target = cleaned[:upto]
  pieces = [(m.start(), m.group()) for m in _PIECE_RE.finditer(text)]
  # 1. Lowercase only (almost every text): per-character positions, exact.
  lowered, lowered_src = _join_pieces(pieces, _lowered_piece, upto)
  if lowered[:upto] == target:
    return lowered_src[:upto]
  # 2. Each piece cleaned on its own (ftfy, HTML entities) and aligned within the piece.
  joined, src = _join_pieces(pieces, _cleaned_piece, upto)
  if joined[:upto] == target:
    return src[:upto]
  # 3. Cleaning crossed pieces: align the whole text (a prefix alone would match its end to
  # the text's end).
  lowered, lowered_src = _join_pieces(pieces, _lowered_piece, None)
  return _align(cleaned, lowered, lowered_src)[:upto]


# Maximal runs of characters that are not whitespace in str.split()'s sense (str.isspace).
_PIECE_RE = regex.compile(r"[^\s\x1c-\x1f\x85]+", regex.V0)
_ALIGN_LIMIT = 4096  # characters on each side beyond which difflib (quadratic) is not used


def _lowered_piece(piece: str, start: int) -> tuple[str, list[int]]:
  low = piece.lower()
  if len(low) == len(piece):
    return low, list(range(start, start + len(piece)))
  src: list[int] = []
  for i, ch in enumerate(piece):
    src.extend([start + i] * len(ch.lower()))  # e.g. 'İ' lowers to 2 characters
  return low, src


def _cleaned_piece(piece: str, start: int) -> tuple[str, list[int]]:
  low, low_src = _lowered_piece(piece, start)
  if _NEEDS_FULL_CLEAN.search(piece) is None:
    return low, low_src
  # ftfy is the slow step, and words repeat: short pieces are memoised
  cleaned = _clean_short_piece(piece) if len(piece) <= _CACHE_MAX_WORD else clean_text(piece)
  return cleaned, _align(cleaned, low, low_src)


@functools.lru_cache(maxsize=4096)
def _clean_short_piece(piece: str) -> str:
  return clean_text(piece)


def _join_pieces(pieces, clean_piece, upto: int | None) -> tuple[str, list[int]]:
  """Pieces cleaned by `clean_piece`, joined by one space as clean_text collapses them;
  stops once `upto` characters are made (None: all pieces)."""
  chars: list[str] = []
  src: list[int] = []
  previous_end = 0
  for start, piece in pieces:
    if upto is not None and len(src) >= upto:
      break
    piece_text, piece_src = clean_piece(piece, start)
    if not piece_text:
      continue  # nothing left after cleaning (e.g. control characters)
    if chars:
      chars.append(" ")
      src.append(previous_end)  # the first whitespace after the previous piece
    chars.append(piece_text)
    src.extend(piece_src)
    previous_end = start + len(piece)
  return "".join(chars), src


def _align(target: str, source: str, source_src: list[int]) -> list[int]:
  """For each character of `target`, the text index of its match in `source`.

  `source_src[k]` is the text index of `source[k]`. Characters of `target` that match none
  inherit their left neighbour's index (or the right one's at the start); a replaced run
  maps proportionally onto the run it replaces. Best effort beyond `_ALIGN_LIMIT`
  differing characters, where the middle is mapped proportionally instead of by difflib.
  """
  if not source_src:
    return [0] * len(target)
  # common prefix and suffix: exact and linear
  n_t, n_s = len(target), len(source)
  head = 0
  while head < min(n_t, n_s) and target[head] == source[head]:
    head += 1
  tail = 0
  while tail < min(n_t, n_s) - head and target[n_t - 1 - tail] == source[n_s - 1 - tail]:
    tail += 1
  mapped: list[int | None] = [None] * n_t
  for k in range(head):
    mapped[k] = source_src[k]
  for k in range(tail):
    mapped[n_t - 1 - k] = source_src[n_s - 1 - k]
  t0, t1, s0, s1 = head, n_t - tail, head, n_s - tail
  if t1 > t0 and s1 > s0:
    if max(t1 - t0, s1 - s0) <= _ALIGN_LIMIT:
      matcher = difflib.SequenceMatcher(None, target[t0:t1], source[s0:s1], autojunk=False)
      opcodes = [
        (tag, t0 + i1, t0 + i2, s0 + j1, s0 + j2) for tag, i1, i2, j1, j2 in matcher.get_opcodes()
      ]
    else:
      opcodes = [("replace", t0, t1, s0, s1)]
    for tag, i1, i2, j1, j2 in opcodes:
      if tag == "equal":
        for k in range(i2 - i1):
          mapped[i1 + k] = source_src[j1 + k]
      elif tag == "replace":
        for k in range(i1, i2):
          mapped[k] = source_src[j1 + (k - i1) * (j2 - j1) // (i2 - i1)]
  # characters created by cleaning inherit their left neighbour's source (or the right's)
  last = next((m for m in mapped if m is not None), source_src[0])
  out = []
  for m in mapped:
    if m is not None:
      last = m
    out.append(last)
  return out
