"""Paths that may be URLs: every file a command reads or writes (a workdir, a result, a figure,
a cache, a config, a prompt or descriptor file, a dataset root, a model, an `--output`) may be
a local path or an object in object storage, `gs://bucket/key` (or `s3://`, `az://`, `hf://`:
the schemes of etils.epath, which orbax uses too, through fsspec; gs:// needs gcsfs, the `gcs`
extra).

A URL is never made absolute or joined by os.path's rules beyond `join` (which keeps the
scheme), so it never becomes a local folder named `gs:`. Local paths keep their exact local
behaviour (atomic writes through a temporary file and os.replace; the caller's os errors).

Object storage has no folders and no rename: a "folder" is a key prefix (`makedirs` does
nothing there, `isdir` is "some object has this prefix"), an atomic write is one upload (an
object appears whole or not at all), an append rewrites the object, and a move copies then
deletes. gcsfs's listings cache is off: several processes and hosts share a workdir, and a
cached listing would not show the objects another one wrote.

`check_location` is the one check before any work: the URL says where its objects go
(`check_url`: no one-slash `gs:/` typo, no `GS://`, no `..`, no `#` or `?`, which tensorstore
would read as URL syntax and write orbax's arrays elsewhere), the bucket exists, the
credentials are there, and a write is allowed; each failure is one paragraph (`StorageError`,
exit 2).

`read_object`, `write_object` and `delete_object` are the conditional operations a lock on
object storage needs (`run_identity`): on gs:// they carry GCS's generation preconditions
(`ifGenerationMatch`; 0 means "only if absent"), which GCS applies atomically.

With STORAGE_EMULATOR_HOST set (a local GCS emulator, as the tests run), every client goes
there: gcsfs reads it itself, tensorstore (orbax's arrays) gets it as TENSORSTORE_GCS_HTTP_URL
and a placeholder token, and gcsfs's probe for zonal buckets (gRPC, which emulators lack, 60 s
per bucket) is off.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import functools
import glob as glob_module
import hashlib
import logging
import math
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from typing import IO, Any, Iterator

from stori_jax.plumbing.errors import DISK_FULL_ERRNOS, DiskFullError, UserError

#: URL schemes read and written through etils.epath / fsspec.
REMOTE_SCHEMES = ("gs", "s3", "az", "hf")
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_INSTALL = {"gs": "gcsfs", "s3": "s3fs", "az": "adlfs", "hf": "huggingface_hub"}


class StorageError(UserError):
  """A location in object storage cannot be used: a missing bucket, missing credentials, a
  refused write, an unknown scheme or a missing client library."""


class PreconditionFailed(FileExistsError):
  """A conditional object write or delete found another generation (someone else wrote)."""


def scheme(path: str | os.PathLike) -> str | None:
  """The URL scheme of `path` ("gs"), or None for a local path."""
  match = _URL.match(os.fspath(path)) if isinstance(path, (str, os.PathLike)) else None
  return match.group(1).lower() if match else None


def is_url(path: str | os.PathLike) -> bool:
  """Whether `path` is written as a URL (`scheme://...`)."""
  return scheme(path) is not None


def is_remote(path: str | os.PathLike) -> bool:
  """Whether `path` is an object-storage URL (gs://, s3://, az://, hf://)."""
  return scheme(path) in REMOTE_SCHEMES


def check_scheme(path: str | os.PathLike) -> None:
  """Refuses a URL of a scheme this project cannot read or write (StorageError): such a path
  would otherwise become a local folder named after the scheme."""
  found = scheme(path)
  if found is not None and found not in REMOTE_SCHEMES:
    hint = " (write a local path without file://)" if found == "file" else ""
    raise StorageError(
      f"{os.fspath(path)}: paths may be local or URLs of "
      f"{', '.join(s + '://' for s in REMOTE_SCHEMES)}, not {found}://{hint}; nothing was done."
    )


# A remote scheme written with one slash (`gs:/bucket/x`, `gs:bucket`): a typo that would
# otherwise name a local folder `gs:`.
_ONE_SLASH = re.compile(r"^(%s):/?(?!/)" % "|".join(REMOTE_SCHEMES), re.IGNORECASE)


def check_url(path: str | os.PathLike) -> None:
  """Refuses, before any work, a path this project would read or write somewhere else than it
  says (StorageError, one paragraph): a URL of an unknown scheme (`check_scheme`); a remote
  scheme with one slash (`gs:/b/x`, a typo that would make a local folder `gs:`); a scheme in
  capitals (`GS://`, which etils does not know); a URL without a bucket; `.` or `..` in a URL
  (object storage has no parent folders: `gs://b/x/../y` is an object name of its own); `#` or
  `?` in an object-storage URL (tensorstore, which writes orbax's arrays, reads them as URL
  syntax, so checkpoints would land outside the folder named, shared with other runs)."""
  text = os.fspath(path)
  check_scheme(text)
  found = scheme(text)
  if found is None:
    typo = _ONE_SLASH.match(text)
    if typo:
      fixed = f"{typo.group(1).lower()}://{text[typo.end() :]}"
      raise StorageError(
        f"{text}: a URL's scheme takes two slashes ({fixed}); with one this would be a local "
        f"folder named {typo.group(1)}:. Write {fixed} for object storage, or ./{text} for a "
        "local folder of that name. Nothing was done."
      )
    return
  if found not in REMOTE_SCHEMES:
    return
  head = text[: len(found)]
  rest = text[len(found) + 3 :]
  if head != found:
    raise StorageError(
      f"{text}: write the URL scheme in lower case ({found}://{rest}). Nothing was done."
    )
  bucket, _, key = rest.partition("/")
  if not bucket:
    raise StorageError(
      f"{text}: the URL names no bucket; write {found}://BUCKET/FOLDER. Nothing was done."
    )
  parts = key.split("/")
  if "." in parts or ".." in parts:
    resolved = _walk_up(parts)
    suggestion = (
      "this one climbs above the bucket"
      if resolved is None
      else f"{found}://{bucket}/{resolved}, if that is the one meant"
    )
    raise StorageError(
      f"{text}: object storage has no folders, so '.' and '..' in a URL are not the current "
      f"and parent folder but parts of an object's name, and the objects would not be where "
      f"the path seems to point. Write the URL without them ({suggestion}). Nothing was done."
    )
  odd = sorted({c for c in key if c in "#?"})
  if odd:
    raise StorageError(
      f"{text}: object names here may not hold {' or '.join(repr(c) for c in odd)}: "
      "tensorstore, which writes the checkpoints' arrays, reads them as URL syntax (a fragment "
      "or a query), so the arrays would be written outside this folder, where another run "
      "whose name differs only after that character would share them. Name the folder "
      "without it (e.g. with '-' or '_'). Nothing was done."
    )


def _walk_up(parts: list[str]) -> str | None:
  """The key `parts` with '.' and '..' resolved ("x/../y" -> "y"); None if it climbs above
  the bucket."""
  kept: list[str] = []
  for part in parts:
    if part == "..":
      if not kept:
        return None
      kept.pop()
    elif part != ".":
      kept.append(part)
  return "/".join(kept)


def is_bucket_root(path: str | os.PathLike) -> bool:
  """Whether `path` is an object-storage URL naming a whole bucket (`gs://b`, `gs://b/`)."""
  return is_remote(path) and not _bucket_key(os.fspath(path).rstrip("/"))[1]


_CONFIGURED = False


def _configure() -> None:
  """Once per process, before the first gs:// client is made: the emulator's endpoint for
  every client (when STORAGE_EMULATOR_HOST is set) and no listings cache in gcsfs."""
  global _CONFIGURED
  if _CONFIGURED:
    return
  _CONFIGURED = True
  emulator = os.environ.get("STORAGE_EMULATOR_HOST", "")
  if emulator and emulator != "default":
    url = emulator if emulator.startswith(("http://", "https://")) else f"http://{emulator}"
    os.environ.setdefault("TENSORSTORE_GCS_HTTP_URL", url.rstrip("/"))
    os.environ.setdefault("GOOGLE_AUTH_TOKEN_FOR_TESTING", "emulator")
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
  logging.getLogger("gcsfs").addFilter(_DropRetryTracebacks())
  try:
    import fsspec.config  # lazy: only object storage needs it
  except ImportError:
    return
  fsspec.config.conf.setdefault("gcs", {}).setdefault("use_listings_cache", False)


def as_path(path: str | os.PathLike):
  """`path` as an etils.epath.Path (what orbax takes); a URL keeps its scheme."""
  from etils import epath  # lazy: orbax's dependency, imported where a path is made

  if is_remote(path):
    _configure()
  return epath.Path(path)


def absolute(path: str | os.PathLike) -> str:
  """A local path made absolute (it then does not depend on the working folder); a URL as
  given (a URL is absolute already)."""
  path = os.fspath(path)
  check_url(path)
  return path if is_url(path) else os.path.abspath(path)


def join(path: str | os.PathLike, *parts: str) -> str:
  """`path` / `parts` (a URL keeps its `scheme://`)."""
  path = os.fspath(path)
  if is_url(path):
    return "/".join([path.rstrip("/"), *(p.strip("/") for p in parts if p)])
  return os.path.join(path, *parts)


def parent(path: str | os.PathLike) -> str:
  """The folder holding `path` (for a URL, the prefix before its last part; a bucket's URL is
  its own parent)."""
  path = os.fspath(path)
  if is_url(path):
    head, _, rest = path.rstrip("/").partition("://")
    return f"{head}://{rest.rsplit('/', 1)[0]}" if "/" in rest else path
  return os.path.dirname(os.path.abspath(path))


def _fs(path: str):
  """The fsspec filesystem of a URL (gcsfs for gs://, with epath's options: the same client)."""
  _configure()
  import fsspec  # lazy: only object storage needs it

  kwargs = {"finalize_on_close": True} if scheme(path) == "gs" else {}
  try:
    return fsspec.filesystem(scheme(path), **kwargs)
  except ImportError as error:
    raise _missing_library(path) from error


def _missing_library(path: str) -> StorageError:
  library = _INSTALL.get(scheme(path) or "", "an fsspec filesystem")
  extra = " (pip install 'stori-jax[gcs]')" if scheme(path) == "gs" else ""
  return StorageError(
    f"{path}: reading and writing {scheme(path)}:// needs the {library} package, which is not "
    f"installed; install it{extra} and run the same command again. Nothing was done."
  )


def _classified(doing: str):
  """Decorates a function of a path: on a URL, a failure that is the user's to fix (missing
  credentials, a refusal, a missing client library; `describe_error`) becomes one paragraph,
  StorageError. FileNotFoundError and FileExistsError pass as they are (callers handle them)."""

  def decorate(function):
    @functools.wraps(function)
    def run(path, *args, **kwargs):
      if not is_remote(path):
        return function(path, *args, **kwargs)
      try:
        return function(path, *args, **kwargs)
      except (FileNotFoundError, FileExistsError, StorageError):
        raise
      except Exception as error:  # pylint: disable=broad-except  # classified, else raised
        problem = describe_error(os.fspath(path), error, doing)
        if problem is None:
          raise
        raise problem from None

    return run

  return decorate


#: The name start of `check_location`'s probe objects (a workdir's claim ignores them: another
#: process of the same run may be probing it).
PROBE_PREFIX = ".write-probe-"


@_classified("read")
def exists(path: str | os.PathLike) -> bool:
  if is_remote(path):
    return as_path(path).exists()
  return os.path.exists(path)


@_classified("read")
def isdir(path: str | os.PathLike) -> bool:
  """A local folder, or a URL prefix that some object lies under."""
  if is_remote(path):
    return as_path(path).is_dir()
  return os.path.isdir(path)


@_classified("read")
def isfile(path: str | os.PathLike) -> bool:
  """A local file, or an object named exactly as the URL. (epath's is_file is "exists and not
  a folder": a prefix whose only object another process is just deleting passes the first
  check and fails the second, so a bare prefix would read as a file for a moment.)"""
  if is_remote(path):
    try:  # info, not fsspec's isfile, which would hide a refused read as "not a file"
      return _fs(os.fspath(path)).info(os.fspath(path))["type"] == "file"
    except FileNotFoundError:
      return False
  return os.path.isfile(path)


@_classified("list")
def listdir(path: str | os.PathLike) -> list[str]:
  """The names in a folder (or under a URL prefix), like os.listdir (unsorted)."""
  if is_remote(path):
    return [p.name for p in as_path(path).iterdir()]
  return os.listdir(path)


@_classified("list")
def glob(pattern: str | os.PathLike) -> list[str]:
  """The paths that match a glob pattern (glob.glob's rules; for a URL, fsspec's), sorted."""
  pattern = os.fspath(pattern)
  if not is_remote(pattern):
    return sorted(glob_module.glob(pattern))
  prefix = f"{scheme(pattern)}://"
  return sorted(p if is_url(p) else prefix + p for p in _fs(pattern).glob(pattern))


def walk(
  path: str | os.PathLike, topdown: bool = True
) -> Iterator[tuple[str, list[str], list[str]]]:
  """os.walk's (folder, folder names, file names), for a URL prefix too (nothing when absent)."""
  if not is_remote(path):
    yield from os.walk(path, topdown=topdown)
    return
  root = os.fspath(path).rstrip("/")
  fs = _fs(root)
  found, pending = [], [root]
  while pending:
    folder = pending.pop(0)
    try:
      entries = _list_entries(folder, fs)
    except FileNotFoundError:
      entries = []
    if not entries and folder == root:
      return
    dirs = sorted(
      e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e["type"] == "directory"
    )
    files = sorted(e["name"].rsplit("/", 1)[-1] for e in entries if e["type"] != "directory")
    if topdown:
      yield folder, dirs, files
    else:
      found.append((folder, dirs, files))
    pending.extend(join(folder, d) for d in dirs)
  yield from reversed(found)


@_classified("list")
def _list_entries(folder: str, fs) -> list[dict[str, Any]]:
  return fs.ls(folder, detail=True)


@_classified("read")
def version(path: str | os.PathLike) -> tuple[int, str]:
  """(size, version) of a file: the version changes whenever the contents are written (a
  local file's modification time in ns; an object's generation, or its etag / update time)."""
  if is_remote(path):
    info = _fs(os.fspath(path)).info(os.fspath(path))
    tag = next(
      (str(info[k]) for k in ("generation", "ETag", "etag", "mtime", "updated") if info.get(k)), ""
    )
    return int(info.get("size") or 0), tag
  stat = os.stat(path)
  return stat.st_size, str(stat.st_mtime_ns)


@_classified("read")
def size(path: str | os.PathLike) -> int:
  if is_remote(path):
    return int(_fs(os.fspath(path)).size(os.fspath(path)))
  return os.path.getsize(path)


def makedirs(path: str | os.PathLike, exist_ok: bool = True) -> None:
  """os.makedirs for a local path; nothing for a URL (object storage has no folders: a prefix
  exists once an object is written under it, and gcsfs's makedirs would create a missing
  bucket)."""
  if not is_remote(path):
    os.makedirs(path, exist_ok=exist_ok)


@_classified("delete")
def remove(path: str | os.PathLike) -> None:
  if is_remote(path):
    as_path(path).unlink()
  else:
    os.remove(path)


@_classified("delete")
def rmtree(path: str | os.PathLike) -> None:
  if is_remote(path):
    as_path(path).rmtree()
  else:
    shutil.rmtree(path)


@_classified("move")
def move(source: str | os.PathLike, target: str | os.PathLike) -> None:
  """Renames a file or folder (os.replace); on object storage every object under `source` is
  copied to `target` and then deleted (not atomic: a kill leaves both, never neither)."""
  if is_remote(source) or is_remote(target):
    if not (is_remote(source) and is_remote(target)):
      raise StorageError(f"cannot move {source} to {target}: one is local, one is not")
    # Copy, then delete (gcsfs's mv first tries GCS's moveTo, which not every server has).
    fs = _fs(os.fspath(source))
    fs.copy(os.fspath(source), os.fspath(target), recursive=True)
    fs.rm(os.fspath(source), recursive=True)
  else:
    os.replace(source, target)


@_classified("open")
def open(path: str | os.PathLike, mode: str = "r") -> IO[Any]:  # pylint: disable=redefined-builtin
  """builtins.open (text as UTF-8) for a local path; the object's stream for a URL (a write
  becomes visible when the stream is closed, whole)."""
  if is_remote(path):
    _forget_appends(os.fspath(path))
    return as_path(path).open(mode)
  if "b" in mode:
    return builtins.open(path, mode)
  return builtins.open(path, mode, encoding="utf-8")


@_classified("read")
def read_bytes(path: str | os.PathLike) -> bytes:
  with open(path, "rb") as f:
    return f.read()


def read_text(path: str | os.PathLike) -> str:
  return read_bytes(path).decode("utf-8")


class AtomicWrite:
  """A file written whole or not at all, through a binary file object (for arrays larger than
  a second copy in memory would allow):

      writer = paths.AtomicWrite(path)
      with writer as f:
        np.save(f, array)
      writer.sha256  # the hex SHA-256 of what was written

  Locally the file object is a temporary file beside `path` (the mode a plain open() gives),
  fsynced and renamed over `path` when the block ends without an exception (a kill leaves the
  old file or the new one); an exception removes it. For a URL it is a local temporary file,
  uploaded to the object in chunks once the block ends (GCS makes an object visible only once
  it is whole; a failed upload is discarded); the temporary file is removed either way.
  `f.name` is the temporary file's local path, for a library that writes only to a path.

  Raises (on leaving the block):
    DiskFullError: the disk (or quota) is full; the message names the file (`what` its kind,
      "the figure ") and the fix.
    StorageError: the storage service refused the upload (`describe_error`).
  """

  def __init__(self, path: str | os.PathLike, what: str = ""):
    self.path = os.fspath(path)
    self.what = what
    self.sha256: str | None = None
    self._file: IO[bytes] | None = None
    self._tmp = ""

  def __enter__(self) -> IO[bytes]:
    try:
      if is_remote(self.path):
        fd, self._tmp = tempfile.mkstemp(prefix="stori_jax_upload_")
        self._file = os.fdopen(fd, "w+b")
      else:
        folder, name = os.path.split(os.path.abspath(self.path))
        # A unique name opened exclusively ("x"), not mkstemp: the file gets the mode a plain
        # open() gives (mkstemp's are private, 0600).
        self._tmp = os.path.join(folder, f".{name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
        self._file = builtins.open(self._tmp, "xb")
    except OSError as error:
      raise self._disk_full(error) or error
    return self._file

  def __exit__(self, kind, error, traceback) -> bool:
    try:
      if kind is not None:
        self._file.close()
        # A write inside the block that met a full disk is the same paragraph as one at the
        # flush or rename below (the writer, e.g. PIL, raises the bare OSError).
        full = self._disk_full(error) if isinstance(error, OSError) else None
        if full is not None:
          raise full from None
        return False
      try:
        self._file.flush()
        if not is_remote(self.path):
          os.fsync(self._file.fileno())
        self._file.close()
        self.sha256 = file_sha256(self._tmp)
        if is_remote(self.path):
          self._upload()
        else:
          os.replace(self._tmp, self.path)
      except OSError as failure:
        full = self._disk_full(failure)
        if full is None:
          raise
        raise full from None
    finally:
      if os.path.exists(self._tmp):
        os.remove(self._tmp)
    return False

  def _upload(self) -> None:
    """Copies the temporary file to the object in chunks; a failed copy is discarded (never
    a half object)."""
    _forget_appends(self.path)
    try:
      target = _fs(self.path).open(self.path, "wb")
      try:
        with builtins.open(self._tmp, "rb") as source:
          shutil.copyfileobj(source, target, _UPLOAD_CHUNK)
      except BaseException:
        target.discard()
        target.closed = True  # a small upload has not started: closing would commit it
        raise
      target.close()
    except (FileNotFoundError, StorageError):
      raise
    except Exception as failure:  # pylint: disable=broad-except  # classified, else raised
      problem = describe_error(self.path, failure, "write")
      if problem is None:
        raise
      raise problem from None

  def _disk_full(self, error: OSError):
    """DiskFullError for a full disk, else None."""
    if error.errno not in DISK_FULL_ERRNOS:
      return None
    return DiskFullError(
      f"cannot write {self.what}{self.path}: the disk (or quota) is full. The earlier version "
      "of the file, if any, is kept; free some space and run the same command again (a "
      "training run resumes from its last checkpoint)."
    )


#: Bytes per chunk of an upload (`AtomicWrite`), and of a read by `file_sha256`.
_UPLOAD_CHUNK = 8 << 20


def file_sha256(path: str | os.PathLike) -> str:
  """The hex SHA-256 of a file's (or object's) contents, read in chunks."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(_UPLOAD_CHUNK), b""):
      digest.update(chunk)
  return digest.hexdigest()


def write_bytes_atomic(path: str | os.PathLike, data: bytes, what: str = "") -> str:
  """Writes `data` whole or not at all (`AtomicWrite`); returns its hex SHA-256.

  Raises:
    DiskFullError: the disk (or quota) is full.
  """
  writer = AtomicWrite(path, what)
  with writer as f:
    f.write(data)
  return writer.sha256


def write_text_atomic(path: str | os.PathLike, text: str) -> str:
  """`write_bytes_atomic` of UTF-8 text; returns its hex SHA-256."""
  return write_bytes_atomic(path, text.encode("utf-8"))


@_classified("write")
def append_text(path: str | os.PathLike, text: str) -> None:
  """Appends `text` to a file: locally in place. An object cannot grow, so it is rewritten
  whole with the text (a reader sees the old contents or the new ones), at most once per
  APPEND_INTERVAL_S: GCS takes about one write per second to one object, so appends that come
  faster wait in memory for the next rewrite, or for `flush_appends` (the training loop calls it
  before each checkpoint, so the history holds every record up to the step a checkpoint saves),
  a read of the object in this process, or the process's exit."""
  if not is_remote(path):
    with builtins.open(path, "a", encoding="utf-8") as f:
      f.write(text)
    return
  path = os.fspath(path)
  with _APPENDS_LOCK:
    entry = _APPENDS.get(path)
    if entry is None:
      if not _APPENDS:
        atexit.register(flush_appends)  # now: after the client's own exit hooks, so run before
      old = read_bytes(path) if exists(path) else b""
      entry = _APPENDS[path] = {"data": old, "written": -math.inf, "pending": False}
    entry["data"] += text.encode("utf-8")
    entry["pending"] = True
    if time.monotonic() - entry["written"] >= APPEND_INTERVAL_S:
      _write_appended(path, entry)


#: Seconds between two rewrites of one object by `append_text`.
APPEND_INTERVAL_S = 1.0
# Objects appended to by this process: URL -> {"data": contents, "written": monotonic time of
# the last rewrite, "pending": appends not written yet}.
_APPENDS: dict[str, dict[str, Any]] = {}
_APPENDS_LOCK = threading.RLock()


def _write_appended(path: str, entry: dict[str, Any]) -> None:
  as_path(path).write_bytes(entry["data"])
  entry["written"], entry["pending"] = time.monotonic(), False


def flush_appends(path: str | os.PathLike | None = None) -> None:
  """Writes the appends still waiting (`append_text`) to their objects (only `path`'s when
  given)."""
  with _APPENDS_LOCK:
    for url, entry in list(_APPENDS.items()):
      if entry["pending"] and (path is None or url == os.fspath(path)):
        _write_appended(url, entry)


def _forget_appends(path: str) -> None:
  """Before `path` is read or rewritten here: its waiting appends are written (a read sees
  them), and a rewrite makes the kept contents stale."""
  with _APPENDS_LOCK:
    if path in _APPENDS:
      flush_appends(path)
      del _APPENDS[path]


#: The temporary folders of `local_copy`'s downloads still on disk (removed by
#: `remove_local_copies`: at the end of a command, else at the process's exit).
_LOCAL_COPIES: list[str] = []
_LOCAL_COPIES_LOCK = threading.Lock()


@_classified("read")
def local_copy(path: str | os.PathLike, expect: str | None = None) -> str:
  """A local file or folder with `path`'s contents: `path` itself when local, else a download
  into a new temporary folder, under the same name (for readers that take only local files:
  a Python config file, a PyTorch checkpoint, a transformers folder). The download is removed
  by `remove_local_copies` (the command's end: `cli`; the process's exit otherwise), or at
  once by `copied_locally`.

  Args:
    expect: "file" or "folder": a URL of the other kind is refused before anything is
      downloaded; None takes either.

  Raises:
    FileNotFoundError: there is no such object or prefix.
    StorageError: `path` is a folder where a file is expected, or the reverse (named by URL).
  """
  path = os.fspath(path)
  if not is_remote(path):
    return path
  folder = isdir(path)
  if expect is not None and folder != (expect == "folder"):
    if not folder and not exists(path):
      raise FileNotFoundError(path)
    found, wanted = ("a folder", "a file") if folder else ("a file", "a folder")
    raise StorageError(
      f"{path} is {found} in object storage where {wanted} is expected; pass the URL of "
      f"{wanted}. Nothing was downloaded."
    )
  name = path.rstrip("/").rsplit("/", 1)[-1]
  temporary = tempfile.mkdtemp(prefix="stori_jax_")
  with _LOCAL_COPIES_LOCK:
    if not _LOCAL_COPIES:
      atexit.register(remove_local_copies)  # registered once the list is in use
    _LOCAL_COPIES.append(temporary)
  target = os.path.join(temporary, name)
  try:
    if not folder:
      data = read_bytes(path)
      with builtins.open(target, "wb") as f:
        f.write(data)
      return target
    root = path.rstrip("/")
    for where, _, names in walk(root):
      local = os.path.join(target, *where[len(root) :].strip("/").split("/"))
      os.makedirs(local, exist_ok=True)
      for file_name in names:
        with builtins.open(os.path.join(local, file_name), "wb") as f:
          f.write(read_bytes(join(where, file_name)))
    return target
  except BaseException:
    remove_local_copies([temporary])
    raise


def local_copies() -> list[str]:
  """The temporary folders of `local_copy`'s downloads still on disk."""
  with _LOCAL_COPIES_LOCK:
    return list(_LOCAL_COPIES)


def remove_local_copies(folders: list[str] | None = None) -> None:
  """Removes `local_copy`'s temporary folders (`folders` of them, default all)."""
  with _LOCAL_COPIES_LOCK:
    chosen = list(_LOCAL_COPIES) if folders is None else [f for f in folders if f in _LOCAL_COPIES]
    for folder in chosen:
      _LOCAL_COPIES.remove(folder)
  for folder in chosen:
    shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def copied_locally(path: str | os.PathLike, expect: str | None = None) -> Iterator[str]:
  """`local_copy(path, expect)` for the length of a `with` block: the download is removed on
  leaving it, and a UserError raised inside that names the local copy names `path` instead
  (the user gave the URL, not the temporary folder)."""
  path = os.fspath(path)
  local = local_copy(path, expect)
  try:
    yield local
  except UserError as error:
    if local == path or local not in str(error):
      raise
    try:
      renamed = type(error)(str(error).replace(local, path))
    except Exception:  # pylint: disable=broad-except  # an error type of another signature
      raise error from error.__cause__
    raise renamed.with_traceback(error.__traceback__) from error.__cause__
  finally:
    if local != path:
      remove_local_copies([os.path.dirname(local)])


# ---- Conditional object operations (a lock on object storage) -------------------------------


def _bucket_key(path: str) -> tuple[str, str]:
  rest = path.partition("://")[2]
  bucket, _, key = rest.partition("/")
  return bucket, key


@_classified("read")
def read_object(path: str | os.PathLike) -> tuple[bytes, int | None] | None:
  """(contents, generation) of an object, or None when there is none. The generation (GCS's
  version number of the object) is None off gs:// and for local files."""
  path = os.fspath(path)
  if scheme(path) != "gs":
    try:
      return read_bytes(path), None
    except FileNotFoundError:
      return None
  fs = _fs(path)
  bucket, key = _bucket_key(path)
  try:
    meta = fs.call("GET", "b/{}/o/{}", bucket, key, json_out=True)
    generation = int(meta["generation"])
    _, data = fs.call("GET", "b/{}/o/{}", bucket, key, alt="media", generation=str(generation))
  except FileNotFoundError:
    return None  # absent, or replaced between the two reads (read again)
  return bytes(data), generation


@_classified("write")
def write_object(
  path: str | os.PathLike, data: bytes, if_generation: int | None = None
) -> int | None:
  """Writes an object whole; returns its new generation on gs:// (else None). `if_generation`:
  only if the object is still at that generation (0: only if there is none); on gs:// GCS
  checks it atomically with the write (ifGenerationMatch), elsewhere it is checked before the
  write (not atomic).

  Raises:
    PreconditionFailed: the object is at another generation (or exists, for 0).
  """
  path = os.fspath(path)
  if scheme(path) != "gs":
    if if_generation == 0 and not is_remote(path):
      try:
        with builtins.open(path, "xb") as f:
          f.write(data)
        return None
      except FileExistsError:
        raise PreconditionFailed(path) from None
    if if_generation == 0 and exists(path):
      raise PreconditionFailed(path)
    write_bytes_atomic(path, data)
    return None
  fs = _fs(path)
  bucket, key = _bucket_key(path)
  upload = fs.base.replace("/storage/v1/", "/upload/storage/v1/") + "b/{}/o"
  condition = {} if if_generation is None else {"ifGenerationMatch": str(if_generation)}
  try:
    written = fs.call(
      "POST",
      upload,
      bucket,
      uploadType="media",
      name=key,
      data=bytes(data),
      headers={"Content-Type": "application/octet-stream"},
      json_out=True,
      **condition,
    )
  except FileExistsError:  # gcsfs's 412 Precondition Failed
    raise PreconditionFailed(path) from None
  return int(written["generation"])


@_classified("delete")
def delete_object(path: str | os.PathLike, if_generation: int | None = None) -> bool:
  """Deletes an object (only at generation `if_generation` when given; checked by GCS on
  gs://); returns whether it was deleted (False: absent or at another generation)."""
  path = os.fspath(path)
  if scheme(path) != "gs":
    try:
      remove(path)
      return True
    except FileNotFoundError:
      return False
  fs = _fs(path)
  bucket, key = _bucket_key(path)
  extra = {} if if_generation is None else {"ifGenerationMatch": str(if_generation)}
  try:
    fs.call("DELETE", "b/{}/o/{}", bucket, key, **extra)
  except (FileNotFoundError, FileExistsError):
    return False
  return True


# ---- The check before any work ----------------------------------------------------------------


def _http_code(error: BaseException) -> int | None:
  code = getattr(error, "code", None)
  if isinstance(code, int):
    return code
  text = str(error)
  if text.startswith("Forbidden:"):
    return 403
  return None


def describe_error(path: str, error: BaseException, doing: str) -> StorageError | None:
  """The one-paragraph StorageError for an object-storage failure of `doing` ("write to"),
  or None when `error` is none of the user's to fix (a bug, a network failure: raised as is)."""
  seen, current = set(), error
  while current is not None and id(current) not in seen:
    seen.add(id(current))
    name = type(current).__name__
    module = type(current).__module__
    code = _http_code(current)
    text = str(current)
    if isinstance(current, StorageError):
      return current
    if isinstance(current, ImportError):
      return _missing_library(path)
    if (
      code == 401
      or name in ("DefaultCredentialsError", "RefreshError")
      or (module.startswith("google.auth") and "credential" in text.lower())
      or "Anonymous caller" in text
    ):
      return StorageError(
        f"cannot {doing} {path}: no valid credentials for {scheme(path)}:// ({_first(text)}). "
        "On a workstation run `gcloud auth application-default login`; on a Cloud VM or TPU "
        "VM give its service account access to the bucket; or set "
        "GOOGLE_APPLICATION_CREDENTIALS to a service-account key file. Nothing was done."
      )
    if name in _UNREACHABLE or isinstance(current, ConnectionError):
      endpoint = os.environ.get("STORAGE_EMULATOR_HOST") or f"the {scheme(path)}:// service"
      return StorageError(
        f"cannot {doing} {path}: {endpoint} cannot be reached, after the storage client's "
        f"retries ({_first(text)}). Check the network connection (or that the emulator at "
        "STORAGE_EMULATOR_HOST runs), then run the same command again: a run resumes from "
        "what it had written."
      )
    if code == 403 or isinstance(current, PermissionError):
      return StorageError(
        f"cannot {doing} {path}: the storage service refused it (403 Forbidden: "
        f"{_first(text)}). The account in use needs to create, read and delete objects there "
        "(e.g. roles/storage.objectAdmin on the bucket); grant that or pass another location. "
        "Nothing was done."
      )
    current = current.__cause__ or current.__context__
  return None


#: The client's errors (aiohttp's, under gcsfs) for a storage service that cannot be reached:
#: raised after gcsfs's own bounded retries (about 35 s).
_UNREACHABLE = (
  "ClientConnectorError",
  "ServerDisconnectedError",
  "ClientOSError",
  "ServerTimeoutError",
  "ConnectionTimeoutError",
)


class _DropRetryTracebacks(logging.Filter):
  """Drops gcsfs's logged tracebacks of a request out of retries: the error is raised to the
  caller as well, and the path layer reports it as one paragraph."""

  def filter(self, record: logging.LogRecord) -> bool:
    message = record.getMessage()
    return not (record.exc_info and ("out of retries" in message or "non-retriable" in message))


def _first(text: str, limit: int = 160) -> str:
  line = (text.strip().splitlines() or ["no message"])[-1].strip() or "no message"
  return line if len(line) <= limit else line[: limit - 3] + "..."


def check_location(path: str | os.PathLike, write: bool = True) -> None:
  """Checks, before any work, that a URL can be used (nothing for a local path): its client
  library is installed, its bucket exists, the credentials are accepted and (`write`) an
  object can be written and deleted there (a probe object, removed at once).

  Raises:
    StorageError: one paragraph naming what is missing and the fix.
  """
  path = os.fspath(path)
  check_url(path)
  if not is_remote(path):
    return
  bucket, key = _bucket_key(path)
  root = f"{scheme(path)}://{bucket}"
  try:
    if scheme(path) == "gs":
      fs = _fs(path)
      # Listing needs storage.objects.list only (a bucket GET needs more than many roles give).
      fs.call("GET", "b/{}/o", bucket, json_out=True, prefix=key, maxResults="1")
    elif not as_path(root).exists():
      raise FileNotFoundError(root)
  except FileNotFoundError:
    raise StorageError(
      f"{path}: the bucket {root} does not exist (or this account cannot see it). Create it "
      f"(gcloud storage buckets create {root}) or pass a path in an existing bucket. Nothing "
      "was done."
    ) from None
  except Exception as error:  # pylint: disable=broad-except  # classified below
    problem = describe_error(path, error, "read")
    if problem is None:
      raise
    raise problem from None
  if not write:
    return
  probe = join(path, f"{PROBE_PREFIX}{uuid.uuid4().hex}")
  try:
    write_bytes_atomic(probe, b"stori_jax write probe\n")
    delete_object(probe)
  except Exception as error:  # pylint: disable=broad-except  # classified below
    problem = describe_error(path, error, "write to")
    if problem is None:
      raise
    raise problem from None
