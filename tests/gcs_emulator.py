"""A local GCS for the tests: `gcp-storage-emulator` (the `test` extra installs it) on a loopback
port, in memory, and an HTTP proxy in front of it that answers like GCS does when the caller
has no credentials (401) or no write permission (403).

Run as a program it is that emulator, for trying a gs:// workdir by hand:

  python tests/gcs_emulator.py --port 9023 --bucket demo &
  STORAGE_EMULATOR_HOST=http://127.0.0.1:9023 python -m stori_jax.train \
      --config configs/demo.py --workdir gs://demo/one

One gap of the emulator is filled in: its downloads do not carry GCS's `x-goog-generation`
header, which tensorstore (orbax's array writer) reads as an object's version before it
updates an OCDBT manifest ("Malformed StorageGeneration" without it); the emulator is started
with its download handler wrapped to send the header as GCS does. Generation preconditions
(ifGenerationMatch) stay unchecked, as the emulator has them.

`Emulator.env()` is what a process needs to use it: STORAGE_EMULATOR_HOST (gcsfs reads it,
and `stori_jax.plumbing.paths` points tensorstore, orbax's array writer, at it), gcsfs's
anonymous token and no probe of a GCE metadata server.
"""

from __future__ import annotations

import http.client
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid

#: What the processes of a test need in their environment, besides the emulator's address.
CLIENT_ENV = {
  "FSSPEC_GCS_TOKEN": "anon",  # gcsfs: no credentials to look for
  "NO_GCE_CHECK": "true",  # gcsfs: no GCE metadata server to probe
  "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",  # tensorstore: no credentials to look for
  "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",  # gcsfs: no gRPC probe for zonal buckets
}


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class Emulator:
  """gcp-storage-emulator in a subprocess (in memory) on 127.0.0.1:`port`."""

  def __init__(self):
    self.port = free_port()
    self.url = f"http://127.0.0.1:{self.port}"
    self.process = subprocess.Popen(
      [sys.executable, os.path.abspath(__file__), f"--port={self.port}"],
      stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while True:
      try:
        urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=2).read()
        break
      except OSError:
        if self.process.poll() is not None or time.monotonic() > deadline:
          self.stop()
          raise RuntimeError("gcp-storage-emulator did not start") from None
        time.sleep(0.1)

  def create_bucket(self, name: str | None = None) -> str:
    """A new bucket; returns its name."""
    name = name or f"b-{uuid.uuid4().hex[:12]}"
    request = urllib.request.Request(
      f"{self.url}/storage/v1/b?project=test",
      data=json.dumps({"name": name}).encode(),
      headers={"Content-Type": "application/json"},
      method="POST",
    )
    urllib.request.urlopen(request, timeout=10).read()
    return name

  def objects(self, bucket: str, prefix: str = "") -> list[str]:
    """The names of the objects in `bucket` under `prefix` (straight from the emulator)."""
    names, token = [], None
    while True:
      query = f"prefix={prefix}" + (f"&pageToken={token}" if token else "")
      with urllib.request.urlopen(f"{self.url}/storage/v1/b/{bucket}/o?{query}") as r:
        page = json.loads(r.read())
      names += [item["name"] for item in page.get("items", [])]
      token = page.get("nextPageToken")
      if not token:
        return sorted(names)

  def read(self, bucket: str, name: str) -> bytes:
    quoted = urllib.request.quote(name, safe="")
    with urllib.request.urlopen(f"{self.url}/storage/v1/b/{bucket}/o/{quoted}?alt=media") as r:
      return r.read()

  def env(self, url: str | None = None) -> dict[str, str]:
    """The environment variables of a process that uses the emulator (or `url`, a proxy)."""
    return {"STORAGE_EMULATOR_HOST": url or self.url, **CLIENT_ENV}

  def stop(self) -> None:
    if self.process.poll() is None:
      self.process.terminate()
      try:
        self.process.wait(timeout=10)
      except subprocess.TimeoutExpired:
        self.process.kill()
        self.process.wait()


#: GCS's answers to a caller without credentials and to one without write permission.
_REFUSALS = {
  "unauthenticated": (
    401,
    "Anonymous caller does not have storage.objects.list access to the Google Cloud Storage "
    "bucket. Permission 'storage.objects.list' denied on resource (or it may not exist).",
  ),
  "read_only": (
    403,
    "reader@project.iam.gserviceaccount.com does not have storage.objects.create access to the "
    "Google Cloud Storage object. Permission 'storage.objects.create' denied on resource (or it "
    "may not exist).",
  ),
}


class RefusingProxy:
  """An HTTP proxy to the emulator that refuses as GCS would: `mode` "unauthenticated" answers
  every request 401 (a caller without credentials), "read_only" answers every write 403."""

  def __init__(self, target: str, mode: str):
    code, message = _REFUSALS[mode]
    host, port = target.removeprefix("http://").split(":")

    class Handler(http.server.BaseHTTPRequestHandler):
      def log_message(self, *args):  # quiet
        pass

      def _handle(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        writes = self.command in ("POST", "PUT", "PATCH", "DELETE")
        if mode == "unauthenticated" or writes:
          payload = json.dumps({"error": {"code": code, "message": message}}).encode()
          self.send_response(code)
          self.send_header("Content-Type", "application/json")
          self.send_header("Content-Length", str(len(payload)))
          self.end_headers()
          self.wfile.write(payload)
          return
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
        connection.request(self.command, self.path, body=body, headers=headers)
        response = connection.getresponse()
        data = response.read()
        self.send_response(response.status)
        for key, value in response.getheaders():
          if key.lower() not in ("transfer-encoding", "content-length", "connection"):
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        connection.close()

      do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

    self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
    self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
    self.thread.start()

  def stop(self) -> None:
    self.server.shutdown()
    self.server.server_close()


def in_environment(env: dict[str, str]):
  """A context manager that sets `env` in os.environ for its block (restored after)."""

  class _Env:
    def __enter__(self):
      self.saved = {k: os.environ.get(k) for k in env}
      os.environ.update(env)

    def __exit__(self, *exc):
      for key, value in self.saved.items():
        if value is None:
          os.environ.pop(key, None)
        else:
          os.environ[key] = value

  return _Env()


def serve(port: int, bucket: str | None = None) -> None:
  """Runs gcp-storage-emulator in memory on 127.0.0.1:`port` until interrupted, its downloads
  carrying x-goog-generation / x-goog-metageneration as GCS's do."""
  import logging

  from gcp_storage_emulator.handlers import objects

  download = objects.download

  def download_with_generation(request, response, storage, *args, **kwargs):
    download(request, response, storage, *args, **kwargs)
    try:
      obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
    except Exception:  # pylint: disable=broad-except  # a 404 stays one
      return
    response["x-goog-generation"] = str(obj["generation"])
    response["x-goog-metageneration"] = str(obj["metageneration"])

  objects.download = download_with_generation  # before the server's routes are built
  from gcp_storage_emulator.server import create_server

  logging.getLogger("gcp_storage_emulator").setLevel(logging.CRITICAL)
  create_server("127.0.0.1", port, in_memory=True, default_bucket=bucket).run()


if __name__ == "__main__":
  import argparse

  parser = argparse.ArgumentParser(description="A local GCS (gcp-storage-emulator, in memory).")
  parser.add_argument("--port", type=int, default=9023)
  parser.add_argument("--bucket", default=None, help="a bucket to create at the start")
  arguments = parser.parse_args()
  serve(arguments.port, arguments.bucket)
