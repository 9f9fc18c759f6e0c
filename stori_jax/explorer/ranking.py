"""The explorer's model side: word-weighted prompts -> the top k of the image index.

Only the text is encoded per change: the image index (float32 [N, E], built once and cached
by `stori_jax.retrieval.index`) is multiplied by the new text embedding and the top k is
taken with jax.lax.top_k (one jitted call; NumPy's threaded BLAS stalls for tens of ms on a
busy CPU). When the index has attribute labels, a ranking also gets App. B's per-category
curves (`curves`).

The text program takes the reweighted blocks as data, not as a static argument: every block
gets its own log-weights, zero outside start_block..stop_block (adding 0 to the attention
logits is exact, the same as not reweighting). So the explorer compiles one text program per
padded length (`length_buckets`, 5 for a 77-token context), whatever blocks requests choose;
a static block range compiled a program per (start, stop, length), 390 for a 12-block tower,
each kept for the life of the process (about 9 MB each for ViT-B/32, issue 26 row 7).
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import io
import re
import threading
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image

from stori_jax.plumbing.errors import NonFiniteError
from stori_jax.explorer import curves
from stori_jax.explorer.limits import MAX_K, MAX_PROMPT_CHARS, MAX_WEIGHT, shorten, too_long
from stori_jax.models.clip import CLIP
from stori_jax.models.text import default_start_block, reweighted_block_indices
from stori_jax.tokenizer import WeightedPromptError, parse_weighted, tokenize_weighted

THUMB_SIZE = 96
#: Thumbnails kept in memory (PNG bytes, a few KB each).
THUMB_CACHE = 1024
_LENGTH_BUCKET = 16
_WORD_RE = re.compile(r"\s*\S+\s*|\s+")


def length_buckets(context_length: int) -> tuple[int, ...]:
  """The padded lengths the explorer encodes prompts at: multiples of _LENGTH_BUCKET, and the
  context length; one compiled text program each."""
  return tuple(range(_LENGTH_BUCKET, context_length, _LENGTH_BUCKET)) + (context_length,)


def _text_program(model: CLIP):
  """The jitted text tower with per-block log-weights: (params, ids int32 [B, L], log_weights
  float32 [layers, B, L]) -> features float32 [B, E].

  Block i adds log_weights[i] to its attention logits (`attention_probs`); rows of zeros
  leave a block as plain CLIP, so one program serves every start and stop block. Built from
  the text tower's own embed, blocks and pool, as TextTransformer.__call__ runs them.
  """

  def encode(module: CLIP, ids, log_weights):
    text = module.text
    x = text.embed(ids)
    for index in range(log_weights.shape[0]):
      x = text.blocks(x, index, index + 1, log_weights[index], (index,))
    return text.pool(x, ids)

  @jax.jit
  def run(params, ids, log_weights):
    return model.apply({"params": params}, ids, log_weights, method=encode)

  return run


@functools.partial(jax.jit, static_argnums=2)
def _top_k(embeddings: jax.Array, text: jax.Array, k: int):
  """Scores [N] = embeddings [N, E] @ text [E], and their top k (values, indices), best
  first, ties by lower index (XLA's TopK is stable)."""
  scores = embeddings @ text
  return (scores, *jax.lax.top_k(scores, k))


class Explorer:
  """Ranks indexed images for word-weighted prompts.

  Args:
    bundle: a CLIPBundle.
    embeddings: float32 [N, E] unit image embeddings (the index).
    keys: N image names.
    load: (indices int [n], size) -> uint8 [n, size, size, 3] (thumbnails).
    attributes: optional ground truth {family: str [N]}, each image's value of each family
      (e.g. {"colour": ["red", ...]}); prompt words naming a value (`synthetic.ATTRIBUTE_WORDS`
      of these families) define the categories of the per-category curves.
    default_prompt: shown when the page opens.
    start_block, stop_block: the reweighted blocks (1-indexed, inclusive) a request gets when
      it names none; None: the model's default start block, the last block.
    description: what the index holds, stated on the page.

  Raises:
    ValueError: blocks outside the text tower's, or attributes not [N].
  """

  def __init__(
    self,
    bundle,
    embeddings: np.ndarray,
    keys: Sequence[str],
    load: Callable[[np.ndarray, int], np.ndarray] | None = None,
    attributes: Mapping[str, Sequence[str]] | None = None,
    default_prompt: str = "",
    start_block: int | None = None,
    stop_block: int | None = None,
    description: str | None = None,
  ):
    self.bundle = bundle
    self.embeddings = np.ascontiguousarray(embeddings, np.float32)
    self.keys = list(keys)
    if len(self.keys) != len(self.embeddings):
      raise ValueError(f"{len(self.keys)} keys for {len(self.embeddings)} embeddings")
    self._load = load
    self.attributes = None
    self._word_values: dict[str, tuple[str, str]] = {}
    if attributes is not None:
      self.attributes = {f: np.asarray(v).astype(str) for f, v in attributes.items()}
      for family, values in self.attributes.items():
        if values.shape != (len(self.keys),):
          raise ValueError(f"attributes[{family!r}] is {values.shape}, not [{len(self.keys)}]")
      self._word_values = curves.attribute_words(list(self.attributes))
    self.default_prompt = default_prompt
    self.layers = int(bundle.config.text.layers)
    self.start_block = (
      default_start_block(bundle.config.text) if start_block is None else int(start_block)
    )
    self.stop_block = self.layers if stop_block is None else int(stop_block)
    reweighted_block_indices(self.layers, self.start_block, self.stop_block)
    self.description = description or f"{len(self.keys)} images"
    self._thumbs: collections.OrderedDict[int, bytes] = collections.OrderedDict()
    self._thumbs_lock = threading.Lock()
    self._device_embeddings = jnp.asarray(self.embeddings)
    self._text_fn = None  # `_text_program`, built on first use (a stub bundle has no model)
    # A slider move keeps the prompt's words: their categories are worked out once.
    self._task = functools.lru_cache(maxsize=64)(self._make_task)
    # The server answers each request on its own thread, but the model runs on this one:
    # requests queue for it (the CPU is the limit anyway, same throughput), and memory stays
    # flat, where JAX calls from many threads each grow their own allocator arenas (500
    # requests, 20 at a time: peak RSS 450 MB instead of 850 MB).
    self._model_thread = concurrent.futures.ThreadPoolExecutor(1, "explorer-model")

  # Text -----------------------------------------------------------------------------------

  @staticmethod
  def parse(prompt: str) -> list[dict[str, Any]]:
    """A prompt -> its words with weights [{"text", "weight"}]; the texts concatenate to
    the prompt without weight syntax. Raises WeightedPromptError on bad syntax, on a weight
    outside [0, MAX_WEIGHT] and on a prompt over MAX_PROMPT_CHARS (checked first)."""
    if not isinstance(prompt, str) or not prompt.strip():
      raise WeightedPromptError("the prompt is empty; type a few words", prompt or "")
    if len(prompt) > MAX_PROMPT_CHARS:
      raise WeightedPromptError(too_long(len(prompt)))
    words = []
    for segment in parse_weighted(prompt, max_weight=MAX_WEIGHT):
      for match in _WORD_RE.finditer(segment.text):
        words.append({"text": match.group(0), "weight": float(segment.weight)})
    return words

  def words(self, prompt: str) -> list[dict[str, Any]]:
    """`parse`, and a check that the prompt fits the model's context (a caret at the first
    token that does not)."""
    words = self.parse(prompt)
    tokenize_weighted(self.bundle.tokenizer, prompt, self.bundle.config.text.context_length)
    return words

  def encode(
    self,
    words: Sequence[tuple[str, float]],
    start_block: int | None = None,
    stop_block: int | None = None,
  ) -> np.ndarray:
    """[(text, weight)] -> float32 [E] unit text embedding (SToRI over blocks
    start_block..stop_block, 1-indexed, inclusive; None: the explorer's default).

    Raises:
      ValueError: blocks outside the text tower's.
    """
    bundle = self.bundle
    ids, weights = bundle.tokenize([list(words)], with_weights=True)
    ids = bundle.check_tokens(ids)
    weights = bundle.check_weights(weights, ids)
    # Cut the padding to a bucketed length: exact (causal mask), few compiled shapes.
    used = int((ids[0] != 0).sum())
    length = next(b for b in length_buckets(ids.shape[1]) if b >= used)
    ids, weights = ids[:, :length], weights[:, :length]
    blocks = reweighted_block_indices(
      self.layers,
      self.start_block if start_block is None else start_block,
      self.stop_block if stop_block is None else stop_block,
    )
    # The blocks as data: log-weights in the chosen blocks, zeros (no reweighting) elsewhere.
    log_weights = np.zeros((self.layers, *ids.shape), np.float32)
    with np.errstate(divide="ignore"):  # log 0 = -inf excludes the token (floored in attention)
      log_weights[list(blocks)] = np.log(weights)
    if self._text_fn is None:
      self._text_fn = _text_program(bundle.model)
    text = np.asarray(self._text_fn(bundle.params, ids, log_weights), np.float32)[0]
    norm = float(np.linalg.norm(text))
    if not np.isfinite(norm):
      raise NonFiniteError(
        f"the text embedding of {shorten(repr(list(words)), 200)} is not finite: the model's "
        "parameters hold NaN or infinity"
      )
    return text / max(norm, 1e-12)

  def compiled_text_programs(self) -> int:
    """How many text programs this explorer has compiled: at most len(length_buckets), one
    per padded length, whatever the blocks asked for."""
    return 0 if self._text_fn is None else self._text_fn._cache_size()  # pylint: disable=protected-access

  def _ranked(self, text: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(scores float32 [N], top indices int64 [k] best first, their scores float32 [k])."""
    # One compiled shape for every k: the top MAX_K, cut to k.
    k = min(int(k), len(self.keys))
    top = min(max(k, MAX_K), len(self.keys))
    scores, values, indices = _top_k(self._device_embeddings, jnp.asarray(text, jnp.float32), top)
    # Cut to k on the host: a device slice would compile a program per k.
    return (
      np.asarray(scores, np.float32),
      np.asarray(indices, np.int64)[:k],
      np.asarray(values, np.float32)[:k],
    )

  def top_k(self, text: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(indices int64 [k] best first, scores float32 [k]) for a unit text embedding [E]."""
    return self._ranked(text, k)[1:]

  # Categories -----------------------------------------------------------------------------

  def task(self, texts: Sequence[str]):
    """The categories a prompt's words define over the index, and a note on them
    (`curves.prompt_categories`; cached per prompt).

    Args:
      texts: the prompt's words (`parse`'s texts), weights left out.

    Returns:
      (RetrievalTask over all N images or None, a note for the page or None).
    """
    return self._task(tuple(texts))

  def _make_task(self, texts: tuple[str, ...]):
    return curves.prompt_categories(texts, self.attributes, self._word_values)

  # Ranking --------------------------------------------------------------------------------

  def rank(
    self,
    words: Sequence[tuple[str, float]],
    k: int = 12,
    start_block: int | None = None,
    stop_block: int | None = None,
  ) -> dict[str, Any]:
    """The top k for word weights, and the per-category curves when the index has labels.

    Returns:
      The /api/rank answer (see `stori_jax.explorer.app`): "results", "bars" (category shares
      of the top k), "curves" ({"shares": [C][N], ...} or None) with "curves_note", "blocks",
      "ms".

    Raises:
      ValueError: blocks outside the text tower's.
    """
    return self._model_thread.submit(self._rank, list(words), k, start_block, stop_block).result()

  def _rank(self, words, k, start_block, stop_block) -> dict[str, Any]:
    start = time.perf_counter()
    blocks = (
      self.start_block if start_block is None else int(start_block),
      self.stop_block if stop_block is None else int(stop_block),
    )
    scores, indices, top_scores = self._ranked(self.encode(words, *blocks), k)
    task, note = self.task([text for text, _ in words])
    chart = bars = None
    names = codes = None
    if task is not None:
      bars, chart = curves.category_chart(scores, len(indices), task)
      names, codes = task.category_names, task.categories
    return {
      "results": [
        {
          "index": int(i),
          "key": self.keys[i],
          "score": float(s),
          "category": None if task is None else names[codes[i]],
        }
        for i, s in zip(indices, top_scores)
      ],
      "bars": bars,
      "curves": chart,
      "curves_note": note,
      "blocks": list(blocks),
      "ms": round(1000 * (time.perf_counter() - start), 2),
    }

  # Images ---------------------------------------------------------------------------------

  def thumbnail(self, index: int) -> bytes:
    """PNG bytes of image `index` at THUMB_SIZE (the last THUMB_CACHE are kept).

    Raises:
      KeyError: no image `index`.
      InputError: the image file cannot be read any more (named).
    """
    if self._load is None or not 0 <= index < len(self.keys):
      raise KeyError(index)
    with self._thumbs_lock:
      if index in self._thumbs:
        self._thumbs.move_to_end(index)
        return self._thumbs[index]
    image = self._load(np.asarray([index]), THUMB_SIZE)[0]
    out = io.BytesIO()
    Image.fromarray(image).save(out, format="PNG")
    with self._thumbs_lock:
      self._thumbs[index] = out.getvalue()
      while len(self._thumbs) > THUMB_CACHE:
        self._thumbs.popitem(last=False)
    return out.getvalue()
