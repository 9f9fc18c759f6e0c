"""Serving the explorer: a loopback HTTP server over the app, bound before the index is built.

`serve` is what `python -m stori_jax.explore` runs: it checks the address, binds the port
(a busy port is reported before minutes of indexing), builds the explorer, compiles the
ranking once, and serves until interrupted. Requests are not logged unless asked for.
"""

from __future__ import annotations

import logging
import socket
from typing import Callable

from stori_jax.errors import UserError
from stori_jax.explorer.app import create_app, require_flask
from stori_jax.explorer.index import build_explorer
from stori_jax.explorer.ranking import Explorer

#: The addresses `serve` listens on: this machine's browser only.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def serve(
  host: str = "127.0.0.1",
  port: int = 8000,
  source: str = "tiny-synthetic",
  images: str | None = None,
  cache_dir: str | None = "workdirs/retrieval_cache",
  images_per_combination: int = 2,
  start_block: int | None = None,
  stop_block: int | None = None,
  log_requests: bool = False,
  on_ready: Callable[[str, Explorer], None] | None = None,
) -> None:
  """Builds the explorer (`build_explorer`'s arguments) and serves it on host:port until
  interrupted (Ctrl-C returns normally).

  Args:
    host: a loopback address (LOOPBACK_HOSTS).
    port: in [0, 65535]; 0 picks a free port.
    log_requests: log a line per request (werkzeug's request log); else warnings only.
    on_ready: called with the server's URL and the explorer once it listens and the ranking
      is compiled.

  Raises:
    UserError: flask missing, a bad address or port, a port in use, or a bad build option.
  """
  require_flask()
  from werkzeug.serving import make_server  # pylint: disable=import-outside-toplevel

  if host not in LOOPBACK_HOSTS:
    raise UserError(
      f"--host must be a loopback address (127.0.0.1, localhost, ::1), got {host!r}: the "
      "explorer serves this machine's browser only"
    )
  if not 0 <= port <= 65535:
    raise UserError(f"--port must lie in [0, 65535] (0 picks a free port), got {port}")
  if not log_requests:
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
  listener = _listen(host, port)
  try:
    explorer = build_explorer(
      source,
      images,
      cache_dir,
      images_per_combination,
      start_block=start_block,
      stop_block=stop_block,
    )
    words = explorer.parse(explorer.default_prompt or "a photo")
    explorer.rank([(w["text"], w["weight"]) for w in words], 12)  # compile once
    server = make_server(host, port, create_app(explorer), threaded=True, fd=listener.fileno())
  finally:
    listener.close()  # the server holds its own duplicate
  shown = f"[{host}]" if ":" in host else host
  if on_ready is not None:
    on_ready(f"http://{shown}:{server.port}", explorer)
  try:
    server.serve_forever()
  except KeyboardInterrupt:
    pass
  finally:
    server.server_close()


def _listen(host: str, port: int) -> socket.socket:
  """A socket listening on host:port, or a UserError naming the fix.

  werkzeug would exit(1) on a bind error, so the socket is made here and handed over.
  """
  family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
  listener = socket.socket(family, kind, proto)
  try:
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(address)
    listener.listen(128)
  except OSError as e:
    listener.close()
    raise UserError(
      f"cannot listen on {host}:{port}: {e.strerror or e}; stop the program using it or "
      "choose another port with --port (0 picks a free one)"
    ) from None
  return listener
