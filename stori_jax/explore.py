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

JSON API (used by the page; errors are 400 with {"error": message}):
  POST /api/parse {"prompt": str} -> {"words": [{"text", "weight"}]}
  POST /api/rank {"words": [{"text", "weight"}], "k": int} ->
    {"results": [{"index", "key", "score", "category"}], "bars": [{"name", "share"}] | null,
     "ms": float}
  GET /thumb/<index> -> PNG thumbnail
"""

from __future__ import annotations

import functools
import io
import math
import re
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from stori_jax.tokenizer import WeightedPromptError, parse_weighted

#: Slider range; weights outside are refused by the API.
MAX_WEIGHT = 5.0
MAX_K = 100
THUMB_SIZE = 96
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
    self._thumbs: dict[int, bytes] = {}
    self._device_embeddings = jnp.asarray(self.embeddings)

  # Text -----------------------------------------------------------------------------------

  @staticmethod
  def parse(prompt: str) -> list[dict[str, Any]]:
    """A prompt -> its words with weights [{"text", "weight"}]; the texts concatenate to
    the prompt without weight syntax. Raises WeightedPromptError on bad syntax."""
    if not isinstance(prompt, str) or not prompt.strip():
      raise WeightedPromptError("the prompt is empty; type a few words", prompt or "")
    words = []
    for segment in parse_weighted(prompt):
      for match in _WORD_RE.finditer(segment.text):
        words.append({"text": match.group(0), "weight": float(segment.weight)})
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
    return text / max(float(np.linalg.norm(text)), 1e-12)

  def top_k(self, text: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(indices int64 [k] best first, scores float32 [k]) for a unit text embedding [E]."""
    # One compiled shape for every k: the top MAX_K, cut to k.
    k = min(int(k), len(self.keys))
    top = min(max(k, MAX_K), len(self.keys))
    scores, indices = _top_k(self._device_embeddings, jnp.asarray(text, jnp.float32), top)
    return np.asarray(indices[:k], np.int64), np.asarray(scores[:k], np.float32)

  def rank(self, words: Sequence[tuple[str, float]], k: int = 12) -> dict[str, Any]:
    """The top k for word weights, with per-category shares when categories exist."""
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
    """PNG bytes of image `index` at THUMB_SIZE (memoised)."""
    from PIL import Image  # pylint: disable=import-outside-toplevel

    if self._load is None or not 0 <= index < len(self.keys):
      raise KeyError(index)
    if index not in self._thumbs:
      image = self._load(np.asarray([index]), THUMB_SIZE)[0]
      out = io.BytesIO()
      Image.fromarray(image).save(out, format="PNG")
      self._thumbs[index] = out.getvalue()
    return self._thumbs[index]


def validate_words(payload: Any) -> tuple[list[tuple[str, float]], int]:
  """Checks a /api/rank body; returns ([(text, weight)], k) or raises ValueError."""
  if not isinstance(payload, dict):
    raise ValueError("the body must be a JSON object {words: [...], k: int}")
  words = payload.get("words")
  if not isinstance(words, list) or not words:
    raise ValueError("words must be a non-empty list of {text, weight}")
  out = []
  for i, word in enumerate(words):
    if not isinstance(word, dict) or not isinstance(word.get("text"), str):
      raise ValueError(f"words[{i}] must be {{text: str, weight: number}}")
    weight = word.get("weight")
    if isinstance(weight, bool) or not isinstance(weight, (int, float)):
      raise ValueError(f"words[{i}].weight must be a number")
    if not math.isfinite(weight) or not 0 <= weight <= MAX_WEIGHT:
      raise ValueError(f"words[{i}].weight must lie in [0, {MAX_WEIGHT:g}], got {weight}")
    out.append((word["text"], float(weight)))
  if not "".join(t for t, _ in out).strip():
    raise ValueError("the prompt is empty; type a few words")
  k = payload.get("k", 12)
  if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
    raise ValueError(f"k must be an integer in [1, {MAX_K}]")
  return out, k


def create_app(explorer: Explorer):
  """The Flask app serving the page, the JSON API and thumbnails."""
  from flask import Flask, Response, jsonify, request  # pylint: disable=import-outside-toplevel

  app = Flask("stori_jax.explore")

  def error(message: str, status: int = 400):
    return jsonify({"error": message}), status

  @app.get("/")
  def index():
    page = _PAGE.replace("__DEFAULT_PROMPT__", _html_attr(explorer.default_prompt))
    page = page.replace("__MAX_WEIGHT__", f"{MAX_WEIGHT:g}")
    return Response(page, mimetype="text/html")

  @app.post("/api/parse")
  def parse():
    body = request.get_json(silent=True)
    if not isinstance(body, dict) or not isinstance(body.get("prompt"), str):
      return error('the body must be {"prompt": "..."}')
    try:
      return jsonify({"words": explorer.parse(body["prompt"])})
    except WeightedPromptError as e:
      return error(str(e))

  @app.post("/api/rank")
  def rank():
    try:
      words, k = validate_words(request.get_json(silent=True))
      return jsonify(explorer.rank(words, k))
    except ValueError as e:  # WeightedPromptError included (e.g. too many tokens)
      return error(str(e))

  @app.get("/thumb/<int:index>")
  def thumb(index: int):
    try:
      data = explorer.thumbnail(index)
    except KeyError:
      return error(f"no image {index}", 404)
    return Response(data, mimetype="image/png", headers={"Cache-Control": "max-age=3600"})

  @app.get("/health")
  def health():
    return jsonify({"ok": True, "images": len(explorer.keys)})

  return app


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
  """An Explorer over an image folder, or over one synthetic triple's 8 categories."""
  import stori_jax  # pylint: disable=import-outside-toplevel
  from stori_jax.retrieval import datasets, index  # pylint: disable=import-outside-toplevel

  bundle = stori_jax.load(source)
  size = int(bundle.config.vision.image_size)
  if images:
    data = datasets.folder_data(images)
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


def main(argv):
  del argv
  from absl import flags  # pylint: disable=import-outside-toplevel
  from werkzeug.serving import make_server  # pylint: disable=import-outside-toplevel

  f = flags.FLAGS
  if f.host not in ("127.0.0.1", "localhost", "::1"):
    raise SystemExit(f"--host must be a loopback address (127.0.0.1, localhost, ::1), got {f.host}")
  try:
    explorer = build_explorer(
      f.source,
      f.images,
      f.cache_dir or None,
      f.images_per_category,
      f.triple,
      start_block=f.start_block,
    )
  except (ValueError, FileNotFoundError) as e:
    raise SystemExit(f"explore: {e}") from e
  words = explorer.parse(explorer.default_prompt or "a photo")
  explorer.rank([(w["text"], w["weight"]) for w in words], 12)  # compile once
  server = make_server(f.host, f.port, create_app(explorer), threaded=True)
  print(f"SToRI explorer on http://{f.host}:{server.server_port} ({len(explorer.keys)} images)")
  server.serve_forever()


def _define_flags():
  from absl import flags  # pylint: disable=import-outside-toplevel

  flags.DEFINE_string("source", "tiny-synthetic", "Model (anything stori_jax.load accepts).")
  flags.DEFINE_string("images", None, "Folder of images to index; default: the synthetic world.")
  flags.DEFINE_string("host", "127.0.0.1", "Loopback address to listen on.")
  flags.DEFINE_integer("port", 8000, "Port (0: any free port).")
  flags.DEFINE_string("cache_dir", "workdirs/retrieval_cache", "Index cache ('' disables).")
  flags.DEFINE_integer("images_per_category", 64, "Synthetic world: images per category.")
  flags.DEFINE_integer("triple", 0, "Synthetic world: which attribute triple (its 8 categories).")
  flags.DEFINE_integer(
    "start_block", None, "First reweighted text block (1-indexed); default: the second half."
  )


if __name__ == "__main__":
  from absl import app  # pylint: disable=import-outside-toplevel

  _define_flags()
  app.run(main)
