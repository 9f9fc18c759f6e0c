"""Serving the explorer: a loopback HTTP server over the app, bound before the index is built.

`serve` is what `python -m stori_jax.explore` runs: it checks the address, binds the port
(a busy port is reported before minutes of indexing), builds the explorer, compiles the
ranking once, and serves until interrupted. Requests are not logged unless asked for.

The server (`make_server`) bounds what clients can hold: at most MAX_HANDLER_THREADS
connections are served at once (werkzeug's threaded server starts a thread per connection,
so 300 clients sending half a header held 300 threads, issue 26 row 8); a request's line and
headers must arrive within HEADER_TIMEOUT_S of the connection's acceptance, so connections
left waiting for a thread expire too, and its body within BODY_TIMEOUT_S (408). A client that
runs out of time is disconnected silently. Once a response has started, the rest of a body the
app did not read (one refused with 413) is read and dropped for at most a second.
"""

from __future__ import annotations

import io
import logging
import queue
import socket
import threading
import time
from typing import Callable

from stori_jax.plumbing.errors import UserError
from stori_jax.explorer.app import create_app, require_flask
from stori_jax.explorer.index import build_explorer
from stori_jax.explorer.limits import (
  BODY_TIMEOUT_S,
  HEADER_TIMEOUT_S,
  MAX_HANDLER_THREADS,
  MAX_PENDING_CONNECTIONS,
  RequestTimeout,
)
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
    server = make_server(host, port, create_app(explorer), fd=listener.fileno())
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


#: A connection whose deadline passed while it waited for a thread still gets this long to
#: deliver what it already sent (a request queued behind slow clients is served).
_GRACE_S = 0.05
#: Once the response has started, what the client still sends of its body (the rest of a body
#: refused with 413) is read and dropped for at most this long, so that the client sees the
#: answer rather than a reset; then the connection closes, without an error.
_DRAIN_S = 1.0


class _DeadlineReader(io.RawIOBase):
  """The connection's input, each read bounded by the handler's current deadline."""

  def __init__(self, handler):
    super().__init__()
    self._handler = handler

  def readable(self) -> bool:
    return True

  def readinto(self, buffer) -> int:
    handler = self._handler
    sock = handler.connection
    remaining = handler.deadline - time.monotonic()
    try:
      if remaining <= 0:
        raise TimeoutError
      sock.settimeout(remaining)
      return sock.recv_into(buffer)
    except TimeoutError:
      handler.close_connection = True
      if handler.phase == "drain":  # the answer is sent: the rest of the body is dropped
        return 0
      raise RequestTimeout(
        f"the request's {handler.phase} did not arrive within {handler.phase_timeout:g} s"
      ) from None
    finally:
      sock.settimeout(handler.server.body_timeout)  # bounds the response's writes


def _handler_class():
  """werkzeug's request handler with deadlines (imported here: flask is optional)."""
  from werkzeug.serving import WSGIRequestHandler  # optional: the explore extra

  class DeadlineRequestHandler(WSGIRequestHandler):
    """Reads each request against a deadline: HEADER_TIMEOUT_S for the line and headers
    (from acceptance, then from the previous response), then BODY_TIMEOUT_S for the body."""

    protocol_version = "HTTP/1.1"  # keep-alive, as werkzeug's threaded server

    def setup(self):
      super().setup()
      self._start_phase("headers", self.server.header_timeout, self.server.accepted_at())
      self.deadline = max(self.deadline, time.monotonic() + _GRACE_S)
      plain, self.rfile = self.rfile, io.BufferedReader(_DeadlineReader(self))
      plain.close()  # the socket stays open: the server closes it

    def _start_phase(self, phase: str, timeout: float, since: float | None = None) -> None:
      self.phase, self.phase_timeout = phase, timeout
      self.deadline = (time.monotonic() if since is None else since) + timeout

    def parse_request(self) -> bool:
      ok = super().parse_request()
      self._start_phase("body", self.server.body_timeout)
      return ok

    def send_response(self, code, message=None) -> None:
      # The answer starts: werkzeug then reads and drops the rest of the body (a 413's) until
      # the client stops sending; bounded by _DRAIN_S, not by the body's deadline.
      self._start_phase("drain", _DRAIN_S)
      super().send_response(code, message)

    def handle_one_request(self) -> None:
      super().handle_one_request()
      self._start_phase("headers", self.server.header_timeout)  # for the next, kept alive

  return DeadlineRequestHandler


def make_server(
  host: str,
  port: int,
  app,
  fd: int | None = None,
  threads: int = MAX_HANDLER_THREADS,
  header_timeout: float = HEADER_TIMEOUT_S,
  body_timeout: float = BODY_TIMEOUT_S,
  max_pending: int = MAX_PENDING_CONNECTIONS,
):
  """A werkzeug WSGI server for `app` with a bounded pool of handler threads and request
  deadlines (see the module doc); `serve_forever` runs it, `server_close` stops its threads.

  Args:
    host, port, fd: as werkzeug.serving.make_server (fd: a socket already listening).
    threads: connections served at once, one thread each (started as needed).
    header_timeout: seconds from a connection's acceptance (or its previous response) to the
      end of a request's headers.
    body_timeout: seconds for a request's body once its headers are in; also each write of
      the response.
    max_pending: connections waiting for a thread beyond which a new one is closed at once.
  """
  require_flask()
  from werkzeug.serving import BaseWSGIServer  # optional: the explore extra

  class BoundedWSGIServer(BaseWSGIServer):
    """Hands accepted connections to at most `threads` worker threads."""

    multithread = True

    def __init__(self):
      self.header_timeout, self.body_timeout = float(header_timeout), float(body_timeout)
      self._queue: queue.Queue = queue.Queue()
      self._lock = threading.Lock()
      self._workers: list[threading.Thread] = []
      self._idle = 0
      self._local = threading.local()
      self._closed = False
      super().__init__(host, port, app, _handler_class(), fd=fd)
      # werkzeug calls server_close on the socket it replaces with fd's: still open for work
      self._closed = False

    def accepted_at(self) -> float:
      """When the connection the calling handler thread serves was accepted."""
      return self._local.accepted

    def process_request(self, request, client_address):
      with self._lock:
        if self._closed or self._queue.qsize() >= max_pending:
          self.shutdown_request(request)  # every thread busy and the queue full: refuse
          return
        self._queue.put((request, client_address, time.monotonic()))
        if self._idle == 0 and len(self._workers) < threads:
          worker = threading.Thread(
            target=self._work, name=f"explorer-http-{len(self._workers)}", daemon=True
          )
          self._workers.append(worker)
          worker.start()

    def _work(self):
      while True:
        with self._lock:
          self._idle += 1
        item = self._queue.get()
        with self._lock:
          self._idle -= 1
        if item is None:
          return
        request, client_address, self._local.accepted = item
        try:
          self.finish_request(request, client_address)
        except Exception:  # pylint: disable=broad-except  # socketserver's rule: log, go on
          self.handle_error(request, client_address)
        finally:
          self.shutdown_request(request)

    def server_close(self):
      super().server_close()
      with self._lock:
        if self._closed:
          return
        self._closed = True
        workers = list(self._workers)
      while True:  # connections never served: closed
        try:
          item = self._queue.get_nowait()
        except queue.Empty:
          break
        if item is not None:
          self.shutdown_request(item[0])
      for _ in workers:
        self._queue.put(None)

  return BoundedWSGIServer()
