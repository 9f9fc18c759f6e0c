"""The explorer's Flask app: the page, the JSON API and thumbnails, on loopback only.

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
address (DNS rebinding), 404, 405, 408 for a body that did not arrive within BODY_TIMEOUT_S
(`server`), 413 for a body over MAX_BODY_BYTES however it is framed (a Content-Length, or
`Transfer-Encoding: chunked`: read up to one byte past the limit), 500 for the server's own
bug.

The page is package data, `page.html`; its `__NAME__` placeholders are filled per request
(`render_page`). Flask is an optional dependency (the `explore` extra): this module imports
without it, and `require_flask` says how to install it.
"""

from __future__ import annotations

import functools
import importlib.resources
import ipaddress
import json
import re
from urllib.parse import urlsplit

from stori_jax.plumbing.errors import NonFiniteError, UserError
from stori_jax.explorer.limits import (
  MAX_BODY_BYTES,
  MAX_WEIGHT,
  RequestTimeout,
  body_too_large,
  shorten,
  validate_rank,
)
from stori_jax.explorer.ranking import Explorer

_PLACEHOLDER_RE = re.compile(r"__([A-Z_]+?)__")
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


def require_flask() -> None:
  """Checks that the server's optional dependencies (flask, and its werkzeug) import.

  Raises:
    UserError: one is missing; the message names the extra that installs them.
  """
  try:
    # pylint: disable=import-outside-toplevel,unused-import
    import flask  # noqa: F401  # optional: the explore extra (checked)
    import werkzeug.serving  # noqa: F401  # optional: the explore extra (checked)
  except ModuleNotFoundError as e:
    missing = (e.name or "a module").split(".")[0]  # the package, not werkzeug.local
    raise UserError(
      f"the explorer needs flask, an optional dependency ({missing} is not installed): "
      'pip install "stori-jax[explore]" (in a checkout: pip install -e ".[explore]")'
    ) from None


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


@functools.lru_cache(maxsize=1)
def _page_template() -> str:
  """The page with its `__NAME__` placeholders (package data, read once)."""
  return importlib.resources.files("stori_jax.explorer").joinpath("page.html").read_text("utf-8")


def render_page(explorer: Explorer) -> str:
  """The page (HTML) for `explorer`: its index, default prompt, blocks and chart help."""
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
  return _PLACEHOLDER_RE.sub(lambda m: fields[m.group(1)], _page_template())


def _html_attr(text: str) -> str:
  return text.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")


def create_app(explorer: Explorer):
  """The Flask app serving the page, the JSON API and thumbnails (see the module doc).

  Every error, of every route, is JSON {"error": message} with a short message: 400 for a
  bad request, 403 for a Host or Origin that is not this machine, 404, 405, 408 for a body
  too slow to arrive, 413 for a body over MAX_BODY_BYTES, 500 for the server's own bug
  (logged with its traceback).

  Raises:
    UserError: flask is not installed (`require_flask`).
  """
  require_flask()
  # pylint: disable=import-outside-toplevel
  from flask import Flask, Response, jsonify, request  # optional: the explore extra
  from werkzeug.exceptions import HTTPException, RequestEntityTooLarge  # the explore extra

  app = Flask("stori_jax.explore")  # the command's name: its logger's, in error logs
  # One byte past the limit: werkzeug stops a streamed (chunked) body there without a word,
  # so `read_body` must see that byte to tell a body of exactly the limit from a longer one.
  app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES + 1

  def error(message: str, status: int = 400):
    return jsonify({"error": shorten(message)}), status

  @app.before_request
  def guard():
    if not host_is_local(request.host):
      return error(
        f"host {shorten(request.host, 100)!r} is not allowed: the explorer answers only to "
        "localhost and loopback addresses (a guard against DNS rebinding); open "
        "http://127.0.0.1:<port>/ instead",
        403,
      )
    origin = request.headers.get("Origin")
    if origin is not None and not host_is_local(urlsplit(origin).netloc):
      return error(
        f"cross-origin request from {shorten(origin, 100)!r} refused: the explorer serves "
        "only pages it serves itself",
        403,
      )
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
      return error(body_too_large(request.content_length), 413)
    return None

  def read_body() -> bytes:
    """The request's body, read up to one byte past MAX_BODY_BYTES: a longer one is 413
    however it is framed (a Content-Length over the limit is refused earlier, by `guard`; a
    chunked body has none and used to be cut at the limit and parsed)."""
    stream, data = request.stream, bytearray()
    while len(data) <= MAX_BODY_BYTES:
      chunk = stream.read(MAX_BODY_BYTES + 1 - len(data))
      if not chunk:
        break
      data += chunk
    if len(data) > MAX_BODY_BYTES:
      raise RequestEntityTooLarge()
    return bytes(data)

  def json_body():
    """The request's JSON (any value), or a ValueError naming what is wrong."""
    if not request.is_json:
      raise ValueError("the body must be JSON, sent with Content-Type: application/json")
    data = read_body()
    try:
      return json.loads(data)
    except RecursionError:
      raise ValueError("the body is not usable JSON: nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
      raise ValueError(f"the body is not valid JSON: {shorten(str(e), 200)}") from None

  @app.errorhandler(HTTPException)
  def http_error(e: HTTPException):
    if e.code == 404:
      message = (
        f"no such page: {request.method} {shorten(request.path, 100)}; the explorer serves "
        "GET /, POST /api/parse, POST /api/rank, GET /thumb/<index>, GET /health"
      )
    elif e.code == 405:
      methods = set(getattr(e, "valid_methods", None) or []) - {"HEAD", "OPTIONS"}
      allowed = ", ".join(sorted(methods)) or "another method"
      message = f"{request.method} is not allowed on {shorten(request.path, 100)}; use {allowed}"
    elif e.code == 413:
      message = body_too_large(request.content_length)
    elif isinstance(e.__context__, RequestTimeout):  # werkzeug's ClientDisconnected, from ours
      return error(f"{e.__context__}; send the whole request at once", 408)
    else:
      message = f"{e.name}: {e.description}"
    return error(message, e.code or 500)

  @app.errorhandler(Exception)
  def internal_error(e: Exception):
    app.logger.exception("internal error on %s %s", request.method, request.path)
    return error(f"internal error ({type(e).__name__}); the server's log has the traceback", 500)

  @app.get("/")
  def index():
    return Response(render_page(explorer), mimetype="text/html")

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
