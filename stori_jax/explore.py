r"""Interactive preference-retrieval explorer (the paper's Figure 1) on a local web page.

  python -m stori_jax.explore --source tiny-synthetic                # embedded world
  python -m stori_jax.explore --source /ckpt/ViT-B-32 --images DIR   # any image folder

Opens http://127.0.0.1:8000: type a prompt (weights in the `(words:1.5)` syntax are allowed),
every word gets a weight slider, and the top images re-rank as a slider moves. The page
states what the index holds. The default index is the synthetic world: every colour x
pattern x shape (8 x 4 x 8) with --images_per_combination images each (2: 512 images, built
in seconds and cached). There the images' attributes are known, and beside the top k the
page plots App. B's per-category curves over the whole ranking: the prompt's colour, pattern
and shape words define 2**A categories (for "a red checkered heart": has red? has checkered?
has heart?), and curve c at n is category c's share of the top n images, n = 1..N. An image
folder has no labels: the page shows the top k only and says why. Start and stop block of
the reweighting (1-indexed, inclusive) are chosen in the page; they default to the model's
default start block and the text tower's last block. The server listens on loopback only.

Only the text is encoded per change: the image index (float32 [N, E], built once and cached
by `stori_jax.retrieval.index`) is multiplied by the new text embedding and the top k is
taken with jax.lax.top_k (one jitted call; NumPy's threaded BLAS stalls for tens of ms on a
busy CPU).

JSON API (used by the page):
  POST /api/parse {"prompt": str} -> {"words": [{"text", "weight"}]}
  POST /api/rank {"words": [{"text", "weight"}], "k": int, "start_block": int,
                  "stop_block": int} (the blocks optional: the page's defaults) ->
    {"results": [{"index", "key", "score", "category"}], "bars": [{"name", "share"}] | null,
     "curves": {"attributes": [A], "names": [C], "sizes": [C], "shares": [C][N], "auc": [C],
                "n": N} | null, "curves_note": str | null, "blocks": [start, stop],
     "ms": float}
    (C = 2**A categories, shares[c][n - 1] = share of category c among the top n, summing to
    1 over c at every n; auc = each curve's mean over n, `metrics.category_auc`; bars = the
    shares in the top k; curves null with a note saying why when there are no labels or the
    prompt names no attribute of the index)
  GET /thumb/<index> -> PNG thumbnail
  GET /health -> {"ok": true, "images": int}

Every error is JSON {"error": message}, short (long prompts are not echoed): 400 for a bad
request (syntax with a caret, a weight outside [0, MAX_WEIGHT], a block outside the text
tower's, a prompt over MAX_PROMPT_CHARS characters, checked before tokenizing, or over the
model's context), 403 for a Host or Origin header that is not localhost or a loopback
address (DNS rebinding), 404, 405, 413 for a body over MAX_BODY_BYTES, 500 for the server's
own bug. Images of `--images` that cannot be read are skipped, each named in a warning; the
index cache is keyed by every file's size and times, so replacing an image rebuilds it, and
a corrupt cache file is rebuilt with a warning. Requests are not logged unless --verbosity
is given.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import hashlib
import io
import ipaddress
import json
import os
import re
import threading
import time
from typing import Any, Callable, Mapping, Sequence
from urllib.parse import urlsplit

import jax
import jax.numpy as jnp
import numpy as np

from stori_jax.errors import InputError, NonFiniteError, UserError
from stori_jax.models.text import default_start_block
from stori_jax.retrieval import metrics
from stori_jax.tokenizer import WeightedPromptError, check_weight, parse_weighted, tokenize_weighted

#: Slider range; weights outside are refused by the API (the parser and /api/rank alike).
MAX_WEIGHT = 5.0
MAX_K = 100
THUMB_SIZE = 96
#: Prompt length limits, checked before any tokenizing. CLIP reads 75 tokens, a few hundred
#: characters; anything longer cannot be encoded, and only costs the server work.
MAX_PROMPT_CHARS = 2000
MAX_WORDS = 200
#: Request bodies beyond this are refused with 413 before they are read.
MAX_BODY_BYTES = 64 * 1024
#: Error messages are cut to this many characters (they quote the user's prompt).
MAX_ERROR_CHARS = 2000
#: Thumbnails kept in memory (PNG bytes, a few KB each).
THUMB_CACHE = 1024
_LENGTH_BUCKET = 16
_WORD_RE = re.compile(r"\s*\S+\s*|\s+")


#: The synthetic world's index: its families whose prompt words define the chart's categories,
#: the render seed (its own namespace, apart from pretraining's (0, k) and the evaluations'
#: (2024, 1..3): held-out images), the prompt the page opens with, and a bound on its size
#: (every change sends C x N curve points to the page).
WORLD_FAMILIES = ("colour", "pattern", "shape")
WORLD_SEED = (2024, 17)
WORLD_PROMPT = "a photo of a red checkered heart"
MAX_IMAGES_PER_COMBINATION = 16
#: At most this many attribute words of a prompt define categories (2**4 = 16 curves).
MAX_ATTRIBUTES = 4
#: Decimals of the curve points sent to the page (8 x 512 numbers per change by default).
_CURVE_DECIMALS = 5
_PLACEHOLDER_RE = re.compile(r"__([A-Z_]+?)__")
_ATTRIBUTE_WORD_RE = re.compile(r"(\W*)([^\W\d_]+)(\W*)")


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
    # pylint: disable=import-outside-toplevel
    from stori_jax.data.synthetic import ATTRIBUTE_WORDS
    from stori_jax.models.text import reweighted_block_indices

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
      self._word_values = {
        word: (family, value)
        for (family, value), words in ATTRIBUTE_WORDS.items()
        if family in self.attributes
        for word in words
      }
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
      raise WeightedPromptError(_too_long(len(prompt)))
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
    ids, weights = self.bundle.tokenize([list(words)], with_weights=True)
    ids, weights = np.asarray(ids), np.asarray(weights, np.float32)
    # Cut the padding to a bucketed length: exact (causal mask), few compiled shapes.
    length = int((ids[0] != 0).sum())
    length = min(ids.shape[1], -(-length // _LENGTH_BUCKET) * _LENGTH_BUCKET)
    text = self.bundle.encode_text(
      ids[:, :length],
      weights[:, :length],
      start_block=self.start_block if start_block is None else start_block,
      stop_block=self.stop_block if stop_block is None else stop_block,
    )
    text = np.asarray(text, np.float32)[0]
    norm = float(np.linalg.norm(text))
    if not np.isfinite(norm):
      raise NonFiniteError(
        f"the text embedding of {_shorten(repr(list(words)), 200)} is not finite: the model's "
        "parameters hold NaN or infinity"
      )
    return text / max(norm, 1e-12)

  def _ranked(self, text: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(scores float32 [N], top indices int64 [k] best first, their scores float32 [k])."""
    # One compiled shape for every k: the top MAX_K, cut to k.
    k = min(int(k), len(self.keys))
    top = min(max(k, MAX_K), len(self.keys))
    scores, values, indices = _top_k(self._device_embeddings, jnp.asarray(text, jnp.float32), top)
    return (
      np.asarray(scores, np.float32),
      np.asarray(indices[:k], np.int64),
      np.asarray(values[:k], np.float32),
    )

  def top_k(self, text: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(indices int64 [k] best first, scores float32 [k]) for a unit text embedding [E]."""
    return self._ranked(text, k)[1:]

  # Categories -----------------------------------------------------------------------------

  def task(self, texts: Sequence[str]):
    """The categories a prompt's words define over the index, and a note on them.

    The words naming an attribute value of the index (a colour, pattern or shape of the
    synthetic world; the first mention of each value, at most MAX_ATTRIBUTES) are the
    attributes; label [i, a] says whether image i has attribute a's value.

    Args:
      texts: the prompt's words (`parse`'s texts), weights left out: a weight, even 0, does
        not change what the prompt asks for.

    Returns:
      (RetrievalTask over all N images, its 2**A categories named like "red, checkered, not
      heart", or None; a note for the page: why there are no categories, or which words were
      left out, or None).
    """
    return self._task(tuple(texts))

  def _make_task(self, texts: tuple[str, ...]):
    # pylint: disable=import-outside-toplevel
    from stori_jax.retrieval.datasets import RetrievalTask

    if self.attributes is None:
      return None, (
        "the chart needs attribute labels, and this index (an image folder) has none: the "
        "top k only"
      )
    template, phrases, values, seen, dropped = [], [], [], [], []
    for text in texts:
      match = _ATTRIBUTE_WORD_RE.fullmatch(text.strip())
      value = self._word_values.get(match.group(2).lower()) if match else None
      if value is None or value in seen:
        template.append(text.replace("{", "{{").replace("}", "}}"))
        continue
      if len(phrases) == MAX_ATTRIBUTES:
        dropped.append(match.group(2))
        template.append(text.replace("{", "{{").replace("}", "}}"))
        continue
      lead = text[: len(text) - len(text.lstrip())] + match.group(1)
      trail = match.group(3) + text[len(text.rstrip()) :]
      template.append(f"{lead}{{{len(phrases)}}}{trail}")
      word = match.group(2).lower()
      seen.append(value)
      phrases.append(match.group(2))
      values.append((word, "not " + word))
    if not phrases:
      families = ", ".join(self.attributes)
      return None, f"the prompt names no {families} of the index, so it defines no categories"
    labels = np.stack([self.attributes[f] == v for f, v in seen], axis=1)  # [N, A]
    task = RetrievalTask(
      name="prompt",
      template="".join(template),
      phrases=tuple(phrases),
      values=tuple(values),
      images=np.arange(len(self.keys)),
      labels=labels,
      attribute_names=tuple(f for f, _ in seen),
    )
    note = None
    if dropped:
      note = f"only the first {MAX_ATTRIBUTES} attribute words define categories; not {dropped}"
    return task, note

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
      The /api/rank answer (see the module doc): "results", "bars" (category shares of the
      top k), "curves" ({"shares": [C][N], ...} or None) with "curves_note", "blocks", "ms".

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
    curves = bars = None
    if task is not None:
      codes, names = task.categories, task.category_names
      shares = metrics.category_curves(scores, codes, task.n_categories)  # [C, N]
      top = shares[:, len(indices) - 1]  # the top k's composition
      bars = [{"name": n, "share": float(s)} for n, s in zip(names, top)]
      curves = {
        "attributes": list(task.phrases),
        "names": names,
        "sizes": np.bincount(codes, minlength=task.n_categories).tolist(),
        "shares": np.round(shares, _CURVE_DECIMALS).tolist(),
        # = metrics.category_auc(scores, ...), from the curves at hand
        "auc": shares.mean(axis=-1).tolist(),
        "n": len(scores),
      }
    return {
      "results": [
        {
          "index": int(i),
          "key": self.keys[i],
          "score": float(s),
          "category": None if task is None else task.category_names[task.categories[i]],
        }
        for i, s in zip(indices, top_scores)
      ],
      "bars": bars,
      "curves": curves,
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
    from PIL import Image  # pylint: disable=import-outside-toplevel

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


def _too_long(n: int) -> str:
  return (
    f"the prompt has {n} characters; the explorer takes at most {MAX_PROMPT_CHARS} (CLIP reads "
    "only its first 75 tokens, a few hundred characters): shorten it"
  )


def _shorten(text: str, limit: int = MAX_ERROR_CHARS) -> str:
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
  from stori_jax.models.text import reweighted_block_indices  # pylint: disable=import-outside-toplevel

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
    raise ValueError(_too_long(chars))
  out = []
  for i, word in enumerate(words):
    text = word["text"]
    shown = text if len(text) <= 40 else text[:40] + "..."
    out.append((text, check_weight(word.get("weight"), f"words[{i}] {shown!r}", MAX_WEIGHT)))
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
        f"{_shorten(json.dumps(block), 40)}"
      )
    blocks.append(block)
  try:
    reweighted_block_indices(layers, *blocks)
  except ValueError as e:
    raise ValueError(f"start_block {blocks[0]}, stop_block {blocks[1]}: {e}") from None
  return out, k, (blocks[0], blocks[1])


def host_is_local(host: str | None) -> bool:
  """True for a Host header (or an origin's netloc) naming this machine: `localhost` or a
  loopback address (127.0.0.0/8, ::1, also IPv4-mapped), with any port.

  A browser sends the name it resolved as Host; a page that rebinds its own DNS name to
  127.0.0.1 still sends its name, so refusing other names stops it reading the API.
  """
  if not host:
    return False
  host = host.strip().lower()
  if host.startswith("["):  # [v6 address]:port
    end = host.find("]")
    name, rest = host[1:end], host[end + 1 :]
    if end < 0 or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
      return False
  elif host.count(":") == 1:
    name, port = host.split(":")
    if not port.isdigit():
      return False
  else:
    name = host
  if name.rstrip(".") == "localhost":
    return True
  try:
    address = ipaddress.ip_address(name)
  except ValueError:
    return False
  if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
    address = address.ipv4_mapped
  return address.is_loopback


def create_app(explorer: Explorer):
  """The Flask app serving the page, the JSON API and thumbnails.

  Every error, of every route, is JSON {"error": message} with a short message: 400 for a
  bad request, 403 for a Host or Origin that is not this machine, 404, 405, 413 for a body
  over MAX_BODY_BYTES, 500 for the server's own bug (logged with its traceback).
  """
  # pylint: disable=import-outside-toplevel
  from flask import Flask, Response, jsonify, request
  from werkzeug.exceptions import HTTPException

  app = Flask("stori_jax.explore")
  app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES

  def error(message: str, status: int = 400):
    return jsonify({"error": _shorten(message)}), status

  @app.before_request
  def guard():
    if not host_is_local(request.host):
      return error(
        f"host {_shorten(request.host, 100)!r} is not allowed: the explorer answers only to "
        "localhost and loopback addresses (a guard against DNS rebinding); open "
        "http://127.0.0.1:<port>/ instead",
        403,
      )
    origin = request.headers.get("Origin")
    if origin is not None and not host_is_local(urlsplit(origin).netloc):
      return error(
        f"cross-origin request from {_shorten(origin, 100)!r} refused: the explorer serves "
        "only pages it serves itself",
        403,
      )
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
      return error(_body_too_large(request.content_length), 413)
    return None

  def json_body():
    """The request's JSON (any value), or a ValueError naming what is wrong."""
    if not request.is_json:
      raise ValueError("the body must be JSON, sent with Content-Type: application/json")
    data = request.get_data(cache=False)  # raises 413 past MAX_CONTENT_LENGTH (streamed bodies)
    try:
      return json.loads(data)
    except RecursionError:
      raise ValueError("the body is not usable JSON: nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
      raise ValueError(f"the body is not valid JSON: {_shorten(str(e), 200)}") from None

  @app.errorhandler(HTTPException)
  def http_error(e: HTTPException):
    if e.code == 404:
      message = (
        f"no such page: {request.method} {_shorten(request.path, 100)}; the explorer serves "
        "GET /, POST /api/parse, POST /api/rank, GET /thumb/<index>, GET /health"
      )
    elif e.code == 405:
      methods = set(getattr(e, "valid_methods", None) or []) - {"HEAD", "OPTIONS"}
      allowed = ", ".join(sorted(methods)) or "another method"
      message = f"{request.method} is not allowed on {_shorten(request.path, 100)}; use {allowed}"
    elif e.code == 413:
      message = _body_too_large(request.content_length)
    else:
      message = f"{e.name}: {e.description}"
    return error(message, e.code or 500)

  @app.errorhandler(Exception)
  def internal_error(e: Exception):
    app.logger.exception("internal error on %s %s", request.method, request.path)
    return error(f"internal error ({type(e).__name__}); the server's log has the traceback", 500)

  @app.get("/")
  def index():
    fields = {
      "DEFAULT_PROMPT": _html_attr(explorer.default_prompt),
      "MAX_WEIGHT": f"{MAX_WEIGHT:g}",
      "INDEX": _html_attr(explorer.description),
      "CHART_HELP": _CHART_HELP if explorer.attributes else _NO_CHART_HELP,
      "LAYERS": str(explorer.layers),
      "START": str(explorer.start_block),
      "STOP": str(explorer.stop_block),
    }
    # One pass: a substituted text (a path, the prompt) is never scanned again.
    page = _PLACEHOLDER_RE.sub(lambda m: fields[m.group(1)], _PAGE)
    return Response(page, mimetype="text/html")

  @app.post("/api/parse")
  def parse():
    try:
      body = json_body()
      if not isinstance(body, dict) or not isinstance(body.get("prompt"), str):
        raise ValueError('the body must be {"prompt": "..."}')
      return jsonify({"words": explorer.words(body["prompt"])})
    except ValueError as e:  # WeightedPromptError included
      return error(str(e))

  @app.post("/api/rank")
  def rank():
    try:
      layers, defaults = explorer.layers, (explorer.start_block, explorer.stop_block)
      words, k, blocks = validate_rank(json_body(), layers, defaults)
      return jsonify(explorer.rank(words, k, *blocks))
    except ValueError as e:  # WeightedPromptError included (e.g. too many tokens)
      return error(str(e))
    except NonFiniteError as e:  # the model, not the request, is at fault
      return error(str(e), 500)

  @app.get("/thumb/<int:index>")
  def thumb(index: int):
    try:
      data = explorer.thumbnail(index)
    except KeyError:
      return error(f"no image {index} (the index holds {len(explorer.keys)})", 404)
    except UserError as e:  # the file changed or vanished since the index was built
      return error(f"image {index} ({explorer.keys[index]}) cannot be read now: {e}", 404)
    return Response(data, mimetype="image/png", headers={"Cache-Control": "max-age=3600"})

  @app.get("/health")
  def health():
    return jsonify({"ok": True, "images": len(explorer.keys)})

  return app


def _body_too_large(length: int | None) -> str:
  size = f"{length} bytes" if length is not None else "over the limit"
  return (
    f"the request body is {size}; the explorer takes at most {MAX_BODY_BYTES} bytes "
    f"(prompts of at most {MAX_PROMPT_CHARS} characters)"
  )


def _html_attr(text: str) -> str:
  return text.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")


_CHART_HELP = (
  "The chart plots App. B's curves over the whole ranking: the prompt's colour, pattern and "
  "shape words define the categories (for \u201cred checkered heart\u201d: red or not, checkered "
  "or not, heart or not), and each curve is its category's share of the top n images for "
  "n = 1 to N; the legend gives each curve's area (AUC), the dashed line the top k shown."
)
_NO_CHART_HELP = (
  "The category chart needs the images' attributes, and this index has no labels: the page "
  "shows the top k only (the synthetic world, the default index, has labels)."
)

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>SToRI explorer</title>
<style>
 body { font-family: sans-serif; margin: 1.5em; max-width: 1150px; }
 #prompt { width: 60%; font-size: 1.05em; padding: .3em; }
 #form input[type=number] { width: 3.5em; }
 .help { color: #333; font-size: .9em; max-width: 1100px; margin: .3em 0; }
 #index-info { font-size: .9em; font-weight: bold; margin: .3em 0; }
 #error { color: #b00020; white-space: pre; font-family: monospace; margin: .5em 0; }
 #sliders { display: flex; flex-wrap: wrap; gap: .4em 1.2em; margin: .8em 0; }
 .word { display: flex; flex-direction: column; align-items: center; font-size: .9em; }
 .word input { width: 90px; }
 #main { display: flex; flex-wrap: wrap; gap: 1.5em; align-items: flex-start; }
 #results { display: flex; flex-wrap: wrap; gap: 6px; width: 420px; }
 #results figure { margin: 0; text-align: center; font-size: .7em; }
 #results img { width: 96px; height: 96px; image-rendering: pixelated; border: 1px solid #ccc; }
 #chart-box { margin: 0; width: 600px; }
 #chart { width: 600px; height: 360px; font-size: 12px; }
 #chart .title { font-size: 14px; font-weight: bold; }
 #legend { list-style: none; padding: 0; margin: .3em 0 0 0; font-size: .8em; }
 #legend .swatch { display: inline-block; width: 1.6em; height: .35em; margin-right: .4em;
                   vertical-align: middle; }
 #chart-note { color: #666; font-size: .85em; max-width: 600px; }
 #status { color: #666; font-size: .8em; }
</style></head><body>
<h2>SToRI: weight the words, watch the ranking</h2>
<p id="index-info">index: __INDEX__</p>
<p class="help">Every word of the prompt gets a slider. Its weight w multiplies the attention
 that the text encoder pays to that word in every block from the start block to the stop block
 (w = 0 removes the word there, w &gt; 1 emphasises it), and the images are ranked again.
 __CHART_HELP__</p>
<form id="form"><input id="prompt" name="prompt" value="__DEFAULT_PROMPT__"
  placeholder="a photo of a (red:1.5) striped circle"> <button id="search" type="submit">Search</button>
  k <input id="k" type="number" min="1" max="100" value="12">
  blocks <input id="start_block" type="number" min="1" max="__LAYERS__" value="__START__"
  aria-label="start block"> to <input id="stop_block" type="number" min="1" max="__LAYERS__"
  value="__STOP__" aria-label="stop block"> of __LAYERS__</form>
<div id="error" role="alert"></div>
<div id="sliders"></div>
<div id="status"></div>
<div id="main">
<div id="results"></div>
<figure id="chart-box"><svg id="chart" viewBox="0 0 600 360" role="img"
  aria-label="share of each category among the top n images"></svg>
<label id="log-box"><input id="log_n" type="checkbox"> n on a log scale (shows the top of the
  ranking)</label><ul id="legend"></ul><p id="chart-note"></p></figure>
</div>
<script>
const MAX_WEIGHT = __MAX_WEIGHT__;
const SVG = "http://www.w3.org/2000/svg";
const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f",
  "#bab0ac", "#ff9da7", "#1b9e77", "#7570b3", "#66a61e", "#e6ab02", "#a6761d", "#666666",
  "#e15759"];  // the last is the favoured category's (all attributes present), drawn bold
let words = [];
let latest = 0;
let drawn = null;  // the last answer's [curves, k, note], redrawn when the scale changes
const $ = (id) => document.getElementById(id);

async function post(url, body) {
  const r = await fetch(url, {method: "POST", headers: {"Content-Type": "application/json"},
                              body: JSON.stringify(body)});
  const data = await r.json();
  if (!r.ok) throw new Error(data.error || ("HTTP " + r.status));
  return data;
}

function showError(message) { $("error").textContent = message || ""; }

function renderSliders() {
  const box = $("sliders");
  box.innerHTML = "";
  words.forEach((w, i) => {
    if (!w.text.trim()) return;
    const div = document.createElement("div");
    div.className = "word";
    const label = document.createElement("label");
    label.textContent = w.text.trim();
    const slider = document.createElement("input");
    Object.assign(slider, {type: "range", min: 0, max: MAX_WEIGHT, step: 0.05, value: w.weight});
    slider.dataset.word = i;
    slider.setAttribute("aria-label", "weight of " + w.text.trim());
    const value = document.createElement("span");
    value.className = "value";
    value.textContent = Number(w.weight).toFixed(2);
    slider.addEventListener("input", () => {
      words[i].weight = parseFloat(slider.value);
      value.textContent = words[i].weight.toFixed(2);
      rank();
    });
    div.append(label, slider, value);
    box.append(div);
  });
}

function block(id) {
  // an integer, else the raw text: the API answers with what is wrong
  const v = $(id).valueAsNumber;
  return Number.isInteger(v) ? v : $(id).value;
}

function svg(name, attrs, text) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function drawChart(curves, k, note) {
  drawn = [curves, k, note];
  const chart = $("chart"), legend = $("legend");
  chart.innerHTML = "";
  legend.innerHTML = "";
  $("chart-note").textContent = note || "";
  for (const e of [chart, $("log-box")]) e.style.display = curves ? "" : "none";
  if (!curves) return;
  const W = 600, H = 360, L = 50, R = 14, T = 30, B = 44, n = curves.n;
  const log = $("log_n").checked;
  const x = log ? (i) => L + (W - L - R) * Math.log(i) / Math.log(Math.max(n, 2))
                : (i) => L + (W - L - R) * (i - 1) / Math.max(n - 1, 1);
  const y = (v) => T + (H - T - B) * (1 - v);
  chart.append(svg("text", {x: W / 2, y: 18, "text-anchor": "middle", class: "title"},
    "Share of each category among the top n of " + n + " images"));
  for (const v of [0, 0.25, 0.5, 0.75, 1]) {
    chart.append(svg("line", {x1: L, x2: W - R, y1: y(v), y2: y(v), stroke: "#e4e4e4"}));
    chart.append(svg("text", {x: L - 6, y: y(v) + 4, "text-anchor": "end"}, v.toFixed(2)));
  }
  const ticks = log ? [1, 10, 100, 1000, 10000].filter((t) => t < n * 0.8).concat([n])
                     : [...new Set([1, ...[1, 2, 3, 4].map((j) => Math.round(n * j / 4))])];
  for (const t of ticks) {
    chart.append(svg("line", {x1: x(t), x2: x(t), y1: H - B, y2: H - B + 5, stroke: "#000"}));
    chart.append(svg("text", {x: x(t), y: H - B + 18, "text-anchor": "middle"}, t));
  }
  chart.append(svg("line", {x1: L, x2: W - R, y1: H - B, y2: H - B, stroke: "#000"}));
  chart.append(svg("line", {x1: L, x2: L, y1: T, y2: H - B, stroke: "#000"}));
  chart.append(svg("text", {x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle"},
    "n (images retrieved, by rank" + (log ? ", log scale)" : ")")));
  chart.append(svg("text", {x: 14, y: (T + H - B) / 2, "text-anchor": "middle",
    transform: "rotate(-90 14 " + (T + H - B) / 2 + ")"}, "share of the top n"));
  const kx = x(Math.min(k, n));
  chart.append(svg("line", {x1: kx, x2: kx, y1: T, y2: H - B, stroke: "#555",
    "stroke-dasharray": "4 3"}));
  chart.append(svg("text", {x: kx + 4, y: T + 12}, "top " + Math.min(k, n)));
  const C = curves.names.length;
  // at most ~600 points a curve (every point on a log scale: the top is spread out)
  const step = log ? 1 : Math.max(1, Math.ceil(n / 600));
  const empty = [];
  for (let c = C - 1; c >= 0; c--) {  // the favoured category first
    if (!curves.sizes[c]) { empty.push(curves.names[c]); continue; }
    const colour = c === C - 1 ? PALETTE[PALETTE.length - 1] : PALETTE[c % (PALETTE.length - 1)];
    const share = curves.shares[c];
    const points = [];
    for (let i = 1; i <= n; i += step) points.push(x(i).toFixed(1) + "," + y(share[i - 1]).toFixed(1));
    if ((n - 1) % step) points.push(x(n).toFixed(1) + "," + y(share[n - 1]).toFixed(1));
    chart.append(svg("polyline", {points: points.join(" "), fill: "none", stroke: colour,
      "stroke-width": c === C - 1 ? 3 : 1.6, "data-category": curves.names[c]}));
    const item = document.createElement("li");
    item.dataset.category = curves.names[c];
    item.dataset.auc = curves.auc[c];
    const swatch = document.createElement("span");
    swatch.className = "swatch";
    swatch.style.background = colour;
    item.append(swatch, curves.names[c] + " (" + curves.sizes[c] + " images) AUC " +
      curves.auc[c].toFixed(3));
    legend.append(item);
  }
  if (empty.length) {
    $("chart-note").textContent = (note ? note + "; " : "") + "not drawn, no images: " +
      empty.join("; ");
  }
}

async function rank() {
  const id = ++latest;
  try {
    const k = parseInt($("k").value) || 12;
    const data = await post("/api/rank", {words: words, k: k, start_block: block("start_block"),
                                          stop_block: block("stop_block")});
    if (id !== latest) return;  // a newer change is on its way
    showError("");
    const results = $("results");
    results.innerHTML = "";
    data.results.forEach((r, n) => {
      const fig = document.createElement("figure");
      const img = document.createElement("img");
      img.src = "/thumb/" + r.index;
      img.alt = r.key;
      img.dataset.index = r.index;
      img.title = r.key + (r.category ? " (" + r.category + ")" : "");
      const cap = document.createElement("figcaption");
      cap.textContent = (n + 1) + ". " + r.score.toFixed(3);
      fig.append(img, cap);
      results.append(fig);
    });
    drawChart(data.curves, data.results.length, data.curves_note);
    $("status").textContent = "ranked in " + data.ms + " ms, words reweighted in blocks " +
      data.blocks[0] + " to " + data.blocks[1];
    $("status").dataset.done = id;
  } catch (e) {
    if (id === latest) showError(e.message);
  }
}

$("form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  try {
    const data = await post("/api/parse", {prompt: $("prompt").value});
    words = data.words;
    showError("");
    renderSliders();
    rank();
  } catch (e) {
    showError(e.message);
  }
});
$("log_n").addEventListener("change", () => { if (drawn) drawChart(...drawn); });
for (const id of ["k", "start_block", "stop_block"]) {
  $(id).addEventListener("change", () => { if (words.length) rank(); });
}
if ($("prompt").value) $("form").requestSubmit();
</script></body></html>
"""


# ---------------------------------------------------------------------------------------------
# Command line.


def build_explorer(
  source: str = "tiny-synthetic",
  images: str | None = None,
  cache_dir: str | None = "workdirs/retrieval_cache",
  images_per_combination: int = 2,
  batch_size: int = 256,
  start_block: int | None = None,
  stop_block: int | None = None,
) -> Explorer:
  """An Explorer over an image folder, or over the synthetic world (`world_data`).

  Raises:
    UserError: a bad option (named), a folder without readable images, a bad model source.
  """
  # pylint: disable=import-outside-toplevel
  import stori_jax
  from stori_jax.models.text import reweighted_block_indices
  from stori_jax.retrieval import index

  _check_options(images, images_per_combination, batch_size)
  bundle = stori_jax.load(source)
  # The blocks are checked before the index is built (minutes for a large folder).
  start = default_start_block(bundle.config.text) if start_block is None else start_block
  try:
    reweighted_block_indices(bundle.config.text.layers, start, stop_block)
  except ValueError as e:
    given = [f"--{n} {v}" for n, v in [("start_block", start_block), ("stop_block", stop_block)]]
    raise InputError(f"{' '.join(g for g in given if not g.endswith(' None'))}: {e}") from None
  size = int(bundle.config.vision.image_size)
  if images:
    data, attributes, prompt = image_folder(images, cache_dir), None, ""
    description = f"{len(data.keys)} images from {images} (an image folder, without labels)"
  else:
    data, attributes = world_data(images_per_combination, size)
    prompt, description = WORLD_PROMPT, world_description(images_per_combination)
  idx = index.build_index(bundle, data, cache_dir, batch_size)
  return Explorer(
    bundle,
    idx.embeddings,
    idx.keys,
    data.load,
    attributes=attributes,
    default_prompt=prompt,
    start_block=start_block,
    stop_block=stop_block,
    description=description,
  )


def world_data(images_per_combination: int = 2, image_size: int = 64, seed=WORLD_SEED):
  """The synthetic world's index: every colour x pattern x shape, one object per image.

  Args:
    images_per_combination: m images of each of the 8 x 4 x 8 combinations (size, position,
      background and jitter random).
    image_size: render size (the model's input size).
    seed: render seed.

  Returns:
    (RetrievalData of N = 256 m images, keys "red-checkered-heart/0", rendered on first use;
    their attributes {family: str [N]} for WORLD_FAMILIES).
  """
  # pylint: disable=import-outside-toplevel
  import itertools

  from stori_jax.data import synthetic
  from stori_jax.retrieval import datasets

  m = int(images_per_combination)
  vocabularies = [synthetic.VOCABULARIES[f] for f in WORLD_FAMILIES]
  combinations = list(itertools.product(*vocabularies))
  scenes = [
    (synthetic.ObjectSpec(**dict(zip(WORLD_FAMILIES, values))),)
    for values in combinations
    for _ in range(m)
  ]
  attributes = {
    f: np.repeat(np.asarray([values[j] for values in combinations]), m)
    for j, f in enumerate(WORLD_FAMILIES)
  }
  keys = tuple(f"{'-'.join(values)}/{j}" for values in combinations for j in range(m))

  @functools.lru_cache(maxsize=1)
  def rendered() -> np.ndarray:
    return synthetic.render(scenes, seed, image_size=image_size).images

  def load(indices, size):
    return datasets.resize_images(rendered()[np.asarray(indices, np.int64).reshape(-1)], size)

  spec = {
    "source": "synthetic-world",
    "families": list(WORLD_FAMILIES),
    "images_per_combination": m,
    "seed": [int(s) for s in np.atleast_1d(seed)],
    "render_size": int(image_size),
  }
  return datasets.RetrievalData("synthetic-world", spec, keys, load, ()), attributes


def world_description(images_per_combination: int) -> str:
  """What `world_data`'s index holds, for the page."""
  from stori_jax.data import synthetic  # pylint: disable=import-outside-toplevel

  sizes = [len(synthetic.VOCABULARIES[f]) for f in WORLD_FAMILIES]
  names = {"colour": "colours", "pattern": "patterns", "shape": "shapes"}
  m = int(images_per_combination)
  return (
    " x ".join(f"{n} {names[f]}" for n, f in zip(sizes, WORLD_FAMILIES))
    + f", {m} image{'s' if m > 1 else ''} each, {m * int(np.prod(sizes))} images, synthetic "
    "world (one object per image; size, position and background at random)"
  )


def _check_options(images, images_per_combination: int, batch_size: int) -> None:
  if batch_size < 1:
    raise InputError(f"the batch size must be at least 1, got {batch_size}")
  if images:
    return
  if not 1 <= images_per_combination <= MAX_IMAGES_PER_COMBINATION:
    raise InputError(
      f"--images_per_combination must lie in [1, {MAX_IMAGES_PER_COMBINATION}] (every change "
      f"sends each category's share at every rank to the page), got {images_per_combination}"
    )


def image_folder(root: str, cache_dir: str | None = None):
  """The readable images under `root` as RetrievalData (keys: sorted relative paths).

  Unreadable files (truncated, corrupt, not images) are skipped, each named in a warning. The
  data's spec, part of the index cache key, holds a fingerprint of every file's size,
  modification and change times, so an image replaced under the same name builds a new
  index. Finding unreadable files decodes every image once; with a cache_dir the result is
  kept in `folder-<fingerprint>.images.json` beside the index, so later starts only stat files.

  Raises:
    InputError: `root` is not a folder of images, or none of its images can be read.
  """
  from stori_jax.retrieval import datasets  # pylint: disable=import-outside-toplevel

  try:
    listing = datasets.folder_data(root)
  except ValueError as e:
    raise InputError(f"--images {root}: {e}") from None
  stamps = []
  for key in listing.keys:
    try:
      st = os.stat(os.path.join(root, key))
      stamps.append(f"{key}\t{st.st_size}\t{st.st_mtime_ns}\t{st.st_ctime_ns}")
    except OSError:
      stamps.append(f"{key}\tmissing")
  fingerprint = hashlib.sha256("\n".join(stamps).encode()).hexdigest()
  unreadable = _unreadable_images(root, listing.keys, fingerprint, cache_dir)
  kept = tuple(k for k in listing.keys if k not in unreadable)
  if not kept:
    raise InputError(
      f"none of the {len(listing.keys)} images under {root} can be read: "
      + "; ".join(f"{k} ({unreadable[k]})" for k in list(unreadable)[:5])
      + ("; ..." if len(unreadable) > 5 else "")
      + ". Replace them with readable images."
    )
  if unreadable:
    from absl import logging  # pylint: disable=import-outside-toplevel

    logging.warning(
      "Skipping %d of the %d images under %s, which cannot be read:\n%s",
      len(unreadable),
      len(listing.keys),
      root,
      "\n".join(f"  {os.path.join(root, k)}: {reason}" for k, reason in unreadable.items()),
    )
  spec = {**listing.spec, "files": fingerprint}
  return datasets.RetrievalData(
    "folder", spec, kept, _file_loader([os.path.join(root, k) for k in kept]), ()
  )


def _file_loader(paths: Sequence[str]) -> Callable[[np.ndarray, int], np.ndarray]:
  """(indices, size) -> uint8 [n, size, size, 3]: files read, resized and center-cropped."""
  # pylint: disable=import-outside-toplevel
  from stori_jax.preprocess import resize_center_crop, to_pil

  def load(indices, size):
    return np.stack(
      [
        np.asarray(resize_center_crop(to_pil(paths[int(i)]).convert("RGB"), size))
        for i in np.asarray(indices).reshape(-1)
      ]
    ).astype(np.uint8)

  return load


def _image_problem(path: str) -> str | None:
  """Why the image file cannot be used (short), or None when it decodes to pixels."""
  from PIL import Image  # pylint: disable=import-outside-toplevel

  try:
    with Image.open(path) as image:
      image.load()
      if image.width == 0 or image.height == 0:
        return f"it has no pixels ({image.width}x{image.height})"
      image.convert("RGB")
  except Exception as e:  # pylint: disable=broad-except  # any decoder failure: skip, named
    return f"{type(e).__name__}: {e}"
  return None


def _unreadable_images(
  root: str, keys: Sequence[str], fingerprint: str, cache_dir: str | None
) -> dict[str, str]:
  """{key: reason} of the images under root that cannot be read; remembered per fingerprint."""
  from absl import logging  # pylint: disable=import-outside-toplevel

  from stori_jax import jsonio  # pylint: disable=import-outside-toplevel

  record = os.path.join(cache_dir, f"folder-{fingerprint[:32]}.images.json") if cache_dir else None
  if record and os.path.isfile(record):
    try:
      with open(record, encoding="utf-8") as f:
        saved = json.load(f)
      unreadable = saved["unreadable"]
      if saved["images"] == len(keys) and set(unreadable) <= set(keys):
        return {str(k): str(v) for k, v in unreadable.items()}
      problem = "it lists other images"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
      problem = f"{type(e).__name__}: {e}"
    logging.warning(
      "The image check record %s is unusable (%s); checking the images again.", record, problem
    )
  unreadable = {}
  for key in keys:
    problem = _image_problem(os.path.join(root, key))
    if problem is not None:
      unreadable[key] = problem
  if record:
    try:
      os.makedirs(cache_dir, exist_ok=True)
      jsonio.write_json(
        record,
        {"root": os.path.abspath(root), "images": len(keys), "unreadable": unreadable},
        indent=1,
      )
    except OSError as e:  # only an optimisation: say so and go on
      logging.warning(
        "Cannot write %s (%s); the images will be checked again next time.", record, e
      )
  return unreadable


def main(argv):
  # pylint: disable=import-outside-toplevel
  import logging
  import socket

  from absl import flags
  from werkzeug.serving import make_server

  f = flags.FLAGS
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {argv[1:]}; the explorer takes only flags (see --help)")
  if f.host not in ("127.0.0.1", "localhost", "::1"):
    raise UserError(
      f"--host must be a loopback address (127.0.0.1, localhost, ::1), got {f.host!r}: the "
      "explorer serves this machine's browser only"
    )
  if not 0 <= f.port <= 65535:
    raise UserError(f"--port must lie in [0, 65535] (0 picks a free port), got {f.port}")
  if not f["verbosity"].present:
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
  # Bind first: a busy port is reported before minutes of indexing. werkzeug would exit(1)
  # on a bind error, so the socket is made here and handed over.
  family, kind, proto, _, address = socket.getaddrinfo(f.host, f.port, type=socket.SOCK_STREAM)[0]
  listener = socket.socket(family, kind, proto)
  try:
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(address)
    listener.listen(128)
  except OSError as e:
    listener.close()
    raise UserError(
      f"cannot listen on {f.host}:{f.port}: {e.strerror or e}; stop the program using it or "
      "choose another port with --port (0 picks a free one)"
    ) from None
  explorer = build_explorer(
    f.source,
    f.images,
    f.cache_dir or None,
    f.images_per_combination,
    start_block=f.start_block,
    stop_block=f.stop_block,
  )
  words = explorer.parse(explorer.default_prompt or "a photo")
  explorer.rank([(w["text"], w["weight"]) for w in words], 12)  # compile once
  server = make_server(f.host, f.port, create_app(explorer), threaded=True, fd=listener.fileno())
  listener.close()  # the server holds its own duplicate
  host = f"[{f.host}]" if ":" in f.host else f.host
  print(
    f"SToRI explorer on http://{host}:{server.port} (index: {explorer.description})", flush=True
  )
  try:
    server.serve_forever()
  except KeyboardInterrupt:
    pass
  finally:
    server.server_close()


def _define_flags():
  from absl import flags  # pylint: disable=import-outside-toplevel

  flags.DEFINE_string("source", "tiny-synthetic", "Model (anything stori_jax.load accepts).")
  flags.DEFINE_string("images", None, "Folder of images to index; default: the synthetic world.")
  flags.DEFINE_string("host", "127.0.0.1", "Loopback address to listen on.")
  flags.DEFINE_integer("port", 8000, "Port in [0, 65535] (0: any free port).")
  flags.DEFINE_string("cache_dir", "workdirs/retrieval_cache", "Index cache ('' disables).")
  flags.DEFINE_integer(
    "images_per_combination",
    2,
    "Synthetic world: images of each colour x pattern x shape (2: 512 images).",
  )
  flags.DEFINE_integer(
    "start_block",
    None,
    "First reweighted text block (1-indexed) the page opens with; default: the model's.",
  )
  flags.DEFINE_integer(
    "stop_block", None, "Last reweighted text block (inclusive) the page opens with; default: last."
  )


if __name__ == "__main__":
  from stori_jax.cli import run  # pylint: disable=import-outside-toplevel

  _define_flags()
  run(main)
