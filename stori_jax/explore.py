r"""Interactive preference-retrieval explorer (the paper's Figure 1) on a local web page.

  python -m stori_jax.explore --source tiny-synthetic                # embedded world
  python -m stori_jax.explore --source /ckpt/ViT-B-32 --images DIR   # any image folder

Opens http://127.0.0.1:8000: type a prompt (weights in the `(words:1.5)` syntax are allowed),
every word gets a weight slider, and the top images re-rank as a slider moves. On the
synthetic world the bars show each category's share of the top k (the 8 categories of the
prompt's attribute triple). The server listens on loopback only.

Only the text is encoded per change: the image index (float32 [N, E], built once and cached
by `stori_jax.retrieval.index`) is multiplied by the new text embedding and the top k is
taken with jax.lax.top_k (one jitted call; NumPy's threaded BLAS stalls for tens of ms on a
busy CPU).

JSON API (used by the page):
  POST /api/parse {"prompt": str} -> {"words": [{"text", "weight"}]}
  POST /api/rank {"words": [{"text", "weight"}], "k": int} ->
    {"results": [{"index", "key", "score", "category"}], "bars": [{"name", "share"}] | null,
     "ms": float}
  GET /thumb/<index> -> PNG thumbnail
  GET /health -> {"ok": true, "images": int}

Every error is JSON {"error": message}, short (long prompts are not echoed): 400 for a bad
request (syntax with a caret, a weight outside [0, MAX_WEIGHT], a prompt over
MAX_PROMPT_CHARS characters, checked before tokenizing, or over the model's context), 403
for a Host or Origin header that is not localhost or a loopback address (DNS rebinding), 404,
405, 413 for a body over MAX_BODY_BYTES, 500 for the server's own bug. Images of `--images`
that cannot be read are skipped, each named in a warning; the index cache is keyed by every
file's size and times, so replacing an image rebuilds it, and a corrupt cache file is rebuilt
with a warning. Requests are not logged unless --verbosity is given.
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
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit

import jax
import jax.numpy as jnp
import numpy as np

from stori_jax.errors import InputError, NonFiniteError, UserError
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


@functools.partial(jax.jit, static_argnums=2)
def _top_k(embeddings: jax.Array, text: jax.Array, k: int):
  """Scores [N] = embeddings [N, E] @ text [E]; their top k (values, indices), best first,
  ties by lower index (XLA's TopK is stable)."""
  return jax.lax.top_k(embeddings @ text, k)


class Explorer:
  """Ranks indexed images for word-weighted prompts.

  Args:
    bundle: a CLIPBundle.
    embeddings: float32 [N, E] unit image embeddings (the index).
    keys: N image names.
    load: (indices int [n], size) -> uint8 [n, size, size, 3] (thumbnails).
    categories: optional int [N] category per image, with `category_names` [C].
    default_prompt: shown when the page opens.
    start_block: first reweighted block (None: the bundle's default).
  """

  def __init__(
    self,
    bundle,
    embeddings: np.ndarray,
    keys: Sequence[str],
    load: Callable[[np.ndarray, int], np.ndarray] | None = None,
    categories: np.ndarray | None = None,
    category_names: Sequence[str] | None = None,
    default_prompt: str = "",
    start_block: int | None = None,
  ):
    self.bundle = bundle
    self.embeddings = np.ascontiguousarray(embeddings, np.float32)
    self.keys = list(keys)
    if len(self.keys) != len(self.embeddings):
      raise ValueError(f"{len(self.keys)} keys for {len(self.embeddings)} embeddings")
    self._load = load
    self.categories = None if categories is None else np.asarray(categories, np.int64)
    self.category_names = list(category_names or [])
    self.default_prompt = default_prompt
    self.start_block = start_block
    self._thumbs: collections.OrderedDict[int, bytes] = collections.OrderedDict()
    self._thumbs_lock = threading.Lock()
    self._device_embeddings = jnp.asarray(self.embeddings)
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

  def encode(self, words: Sequence[tuple[str, float]]) -> np.ndarray:
    """[(text, weight)] -> float32 [E] unit text embedding (SToRI)."""
    ids, weights = self.bundle.tokenize([list(words)], with_weights=True)
    ids, weights = np.asarray(ids), np.asarray(weights, np.float32)
    # Cut the padding to a bucketed length: exact (causal mask), few compiled shapes.
    length = int((ids[0] != 0).sum())
    length = min(ids.shape[1], -(-length // _LENGTH_BUCKET) * _LENGTH_BUCKET)
    text = self.bundle.encode_text(
      ids[:, :length], weights[:, :length], start_block=self.start_block
    )
    text = np.asarray(text, np.float32)[0]
    norm = float(np.linalg.norm(text))
    if not np.isfinite(norm):
      raise NonFiniteError(
        f"the text embedding of {_shorten(repr(list(words)), 200)} is not finite: the model's "
        "parameters hold NaN or infinity"
      )
    return text / max(norm, 1e-12)

  def top_k(self, text: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(indices int64 [k] best first, scores float32 [k]) for a unit text embedding [E]."""
    # One compiled shape for every k: the top MAX_K, cut to k.
    k = min(int(k), len(self.keys))
    top = min(max(k, MAX_K), len(self.keys))
    scores, indices = _top_k(self._device_embeddings, jnp.asarray(text, jnp.float32), top)
    return np.asarray(indices[:k], np.int64), np.asarray(scores[:k], np.float32)

  def rank(self, words: Sequence[tuple[str, float]], k: int = 12) -> dict[str, Any]:
    """The top k for word weights, with per-category shares when categories exist."""
    return self._model_thread.submit(self._rank, list(words), k).result()

  def _rank(self, words: Sequence[tuple[str, float]], k: int) -> dict[str, Any]:
    start = time.perf_counter()
    indices, scores = self.top_k(self.encode(words), k)
    bars = None
    if self.categories is not None:
      counts = np.bincount(self.categories[indices], minlength=len(self.category_names))
      bars = [
        {"name": n, "share": float(c) / len(indices)} for n, c in zip(self.category_names, counts)
      ]
    return {
      "results": [
        {
          "index": int(i),
          "key": self.keys[i],
          "score": float(s),
          "category": None if self.categories is None else self.category_names[self.categories[i]],
        }
        for i, s in zip(indices, scores)
      ],
      "bars": bars,
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


def validate_words(payload: Any) -> tuple[list[tuple[str, float]], int]:
  """Checks a /api/rank body; returns ([(text, weight)], k) or raises ValueError.

  Weights go through the same rule as the prompt syntax of /api/parse (`check_weight` with
  the slider's MAX_WEIGHT), so both routes accept and refuse the same weights.
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
  return out, k


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
    page = _PAGE.replace("__DEFAULT_PROMPT__", _html_attr(explorer.default_prompt))
    page = page.replace("__MAX_WEIGHT__", f"{MAX_WEIGHT:g}")
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
      words, k = validate_words(json_body())
      return jsonify(explorer.rank(words, k))
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


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>SToRI explorer</title>
<style>
 body { font-family: sans-serif; margin: 1.5em; max-width: 1100px; }
 #prompt { width: 70%; font-size: 1.05em; padding: .3em; }
 #error { color: #b00020; white-space: pre; font-family: monospace; margin: .5em 0; }
 #sliders { display: flex; flex-wrap: wrap; gap: .4em 1.2em; margin: .8em 0; }
 .word { display: flex; flex-direction: column; align-items: center; font-size: .9em; }
 .word input { width: 90px; }
 #results { display: flex; flex-wrap: wrap; gap: 6px; }
 #results figure { margin: 0; text-align: center; font-size: .7em; }
 #results img { width: 96px; height: 96px; image-rendering: pixelated; border: 1px solid #ccc; }
 .bar { display: flex; align-items: center; gap: .5em; font-size: .8em; }
 .bar .track { width: 200px; height: .8em; background: #eee; display: inline-block; }
 .bar .fill { background: #3b6fb6; height: 100%; display: block; }
 #status { color: #666; font-size: .8em; }
</style></head><body>
<h2>SToRI: weight the words, watch the ranking</h2>
<form id="form"><input id="prompt" name="prompt" value="__DEFAULT_PROMPT__"
  placeholder="a photo of a (red:1.5) striped circle"> <button id="search" type="submit">Search</button>
  k <input id="k" type="number" min="1" max="100" value="12" style="width:4em"></form>
<div id="error" role="alert"></div>
<div id="sliders"></div>
<div id="status"></div>
<div id="results"></div>
<div id="bars"></div>
<script>
const MAX_WEIGHT = __MAX_WEIGHT__;
let words = [];
let latest = 0;
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

async function rank() {
  const id = ++latest;
  try {
    const k = parseInt($("k").value) || 12;
    const data = await post("/api/rank", {words: words, k: k});
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
    const bars = $("bars");
    bars.innerHTML = "";
    if (data.bars) {
      const h = document.createElement("h4");
      h.textContent = "share of each category in the top " + data.results.length;
      bars.append(h);
      data.bars.forEach((b) => {
        const row = document.createElement("div");
        row.className = "bar";
        const track = document.createElement("span");
        track.className = "track";
        const fill = document.createElement("span");
        fill.className = "fill";
        fill.style.width = (100 * b.share) + "%";
        track.append(fill);
        const name = document.createElement("span");
        name.textContent = b.name + " " + (100 * b.share).toFixed(0) + "%";
        row.append(track, name);
        bars.append(row);
      });
    }
    $("status").textContent = "ranked in " + data.ms + " ms";
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
$("k").addEventListener("change", () => { if (words.length) rank(); });
if ($("prompt").value) $("form").requestSubmit();
</script></body></html>
"""


# ---------------------------------------------------------------------------------------------
# Command line.


def build_explorer(
  source: str = "tiny-synthetic",
  images: str | None = None,
  cache_dir: str | None = "workdirs/retrieval_cache",
  images_per_category: int = 64,
  triple: int = 0,
  batch_size: int = 256,
  start_block: int | None = None,
) -> Explorer:
  """An Explorer over an image folder, or over one synthetic triple's 8 categories.

  Raises:
    UserError: a bad option (named), a folder without readable images, a bad model source.
  """
  # pylint: disable=import-outside-toplevel
  import stori_jax
  from stori_jax.models.text import reweighted_block_indices
  from stori_jax.retrieval import datasets, index

  _check_options(images, images_per_category, triple, batch_size)
  bundle = stori_jax.load(source)
  if start_block is not None:
    try:
      reweighted_block_indices(bundle.config.text.layers, start_block)
    except ValueError as e:
      raise InputError(f"--start_block {start_block}: {e}") from None
  size = int(bundle.config.vision.image_size)
  if images:
    data = image_folder(images, cache_dir)
    task = None
  else:
    data = datasets.synthetic_data(triple + 1, images_per_category, image_size=size)
    task = data.tasks[triple]
    rows = task.images
    data = datasets.RetrievalData(
      data.name,
      {**data.spec, "triple": triple},
      tuple(data.keys[i] for i in rows),
      lambda indices, s, _load=data.load, _rows=rows: _load(_rows[np.asarray(indices)], s),
      (),
    )
  idx = index.build_index(bundle, data, cache_dir, batch_size)
  return Explorer(
    bundle,
    idx.embeddings,
    idx.keys,
    data.load,
    categories=None if task is None else task.categories,
    category_names=None if task is None else task.category_names,
    default_prompt="" if task is None else task.prompt(),
    start_block=start_block,
  )


def _check_options(images, images_per_category: int, triple: int, batch_size: int) -> None:
  # pylint: disable=import-outside-toplevel
  from stori_jax.data import synthetic
  from stori_jax.evaluation import synthetic_world as sw

  if batch_size < 1:
    raise InputError(f"the batch size must be at least 1, got {batch_size}")
  if images:
    return
  triples = len(synthetic.COLOURS) * len(sw.EMPHASIS_PATTERNS) * len(synthetic.SHAPES)
  if not 0 <= triple < triples:
    raise InputError(
      f"--triple must lie in [0, {triples - 1}] (the synthetic world's attribute "
      f"triples), got {triple}"
    )
  if images_per_category < 1:
    raise InputError(f"--images_per_category must be at least 1, got {images_per_category}")


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
    f.images_per_category,
    f.triple,
    start_block=f.start_block,
  )
  words = explorer.parse(explorer.default_prompt or "a photo")
  explorer.rank([(w["text"], w["weight"]) for w in words], 12)  # compile once
  server = make_server(f.host, f.port, create_app(explorer), threaded=True, fd=listener.fileno())
  listener.close()  # the server holds its own duplicate
  host = f"[{f.host}]" if ":" in f.host else f.host
  print(f"SToRI explorer on http://{host}:{server.port} ({len(explorer.keys)} images)", flush=True)
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
  flags.DEFINE_integer("images_per_category", 64, "Synthetic world: images per category.")
  flags.DEFINE_integer("triple", 0, "Synthetic world: which attribute triple (its 8 categories).")
  flags.DEFINE_integer(
    "start_block", None, "First reweighted text block (1-indexed); default: the second half."
  )


if __name__ == "__main__":
  from stori_jax.cli import run  # pylint: disable=import-outside-toplevel

  _define_flags()
  run(main)
