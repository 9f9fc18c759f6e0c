"""Run identity: a workdir (or cache) belongs to the run that made it.

The first use writes `run.json` in the workdir: the resolved config and whatever else decides
the results (model, data). Reusing the workdir with the same identity resumes; with another it
stops before any work, naming the keys that differ and the two ways on: another `--workdir`, or
`--restart`, which moves the old run aside (`<workdir>.old-<time>`) instead of deleting it.
"""

from __future__ import annotations

import atexit
import datetime
import fcntl
import hashlib
import json
import os
import socket
import sys
import threading
import time
import uuid
from typing import Any, Iterable, Mapping

from stori_jax.plumbing import jsonio, multihost, paths
from stori_jax.plumbing.jsonio import differences  # the identities' diff, re-exported
from stori_jax.plumbing.errors import UserError

RUN_FILE = "run.json"
#: Config keys that only choose when a run logs, evaluates or saves, or how many checkpoints it
#: keeps: another value never changes a result, so every claim (`claim_run`) accepts a change
#: there and records the new value.
SCHEDULE_KEYS = ("log_every", "eval_every", "checkpoint_every", "keep_checkpoints")
#: The workdir's lock: held (flock) by the process that claimed it, for the rest of its life.
#: On object storage (gs://) it is an object naming its holder, kept alive by a heartbeat
#: (`RemoteLock`).
LOCK_FILE = ".lock"
# Workdirs whose lock this process holds (real path -> open descriptor). A claim holds its
# workdir until the process exits, when the system releases the lock, after a crash too.
_HELD: dict[str, int] = {}
#: Seconds a lock object on object storage stays valid after its holder's last heartbeat (the
#: holder renews it every quarter of that); $STORI_LOCK_LEASE_S overrides it.
LOCK_LEASE_S = 120
#: Seconds between writing a lock object and reading it back (see `RemoteLock`).
LOCK_SETTLE_S = 0.5
# This process's identity in the lock objects it writes.
_TOKEN = uuid.uuid4().hex
# Workdir URLs whose lock object this process holds.
_REMOTE_HELD: dict[str, "RemoteLock"] = {}


class WorkdirMismatchError(UserError):
  """The workdir holds another run (other config, model or data)."""


class WorkdirBusyError(UserError):
  """Another process holds the workdir (a run in progress)."""


def _holder(path: str) -> str:
  try:
    with open(path, encoding="utf-8") as f:
      return f.read().strip() or "a process that did not say which"
  except OSError:
    return "a process that did not say which"


def _busy(workdir: str, path: str) -> WorkdirBusyError:
  return WorkdirBusyError(
    f"{workdir} is in use by another run ({_holder(path)}). Two runs in one workdir would mix "
    "their checkpoints and logs, so nothing was done. Wait for that run to finish, stop it, "
    "or pass another --workdir."
  )


def _lease_s() -> float:
  value = os.environ.get("STORI_LOCK_LEASE_S", "")
  try:
    return float(value) if float(value) > 0 else LOCK_LEASE_S
  except ValueError:
    return LOCK_LEASE_S


def _process_start(pid: int) -> str | None:
  """When process `pid` started, as "<boot id>:<start tick>" (Linux), else None: with the pid
  it names one process, whatever reuses the pid later."""
  try:
    with open("/proc/sys/kernel/random/boot_id", encoding="utf-8") as f:
      boot = f.read().strip()
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
      fields = f.read().rsplit(")", 1)[1].split()
    return f"{boot}:{fields[19]}"
  except (OSError, IndexError):
    return None


def _holder_alive(record: Mapping[str, Any]) -> bool:
  """Whether the run that wrote a lock record still holds it: on this host, whether its
  process is still running (a killed run frees its workdir at once); on another host, whether
  its last heartbeat is younger than its lease."""
  if record.get("host") == socket.gethostname() and isinstance(record.get("pid"), int):
    start = _process_start(record["pid"])
    if start is None:
      try:
        os.kill(record["pid"], 0)
      except ProcessLookupError:
        return False
      except OSError:
        pass
      return True
    return record.get("process_start") in (None, start)
  heartbeat, lease = record.get("heartbeat"), record.get("lease_s")
  if not isinstance(heartbeat, (int, float)) or not isinstance(lease, (int, float)):
    return True  # not written by this project: not ours to take
  return time.time() - heartbeat < lease


def _read_lock(path: str) -> tuple[dict[str, Any] | None, int | None, bool]:
  """(record, generation, present) of a lock object; an unreadable one is a record {}."""
  found = paths.read_object(path)
  if found is None:
    return None, None, False
  try:
    record = json.loads(found[0])
  except ValueError:
    record = {}
  return (record if isinstance(record, dict) else {}), found[1], True


def _describe_holder(record: Mapping[str, Any]) -> str:
  if not record:
    return "a process that did not say which"
  text = f"pid {record.get('pid')} on {record.get('host')}, since {record.get('since')}"
  heartbeat = record.get("heartbeat")
  if isinstance(heartbeat, (int, float)) and record.get("host") != socket.gethostname():
    lapse = datetime.datetime.fromtimestamp(
      heartbeat + float(record.get("lease_s") or 0), datetime.timezone.utc
    ).strftime("%H:%M:%S UTC")
    text += (
      f"; its last heartbeat was {max(0, time.time() - heartbeat):.0f} s ago, and if that run "
      f"is gone its lock lapses at {lapse}"
    )
  return text


def _busy_remote(workdir: str, record: Mapping[str, Any]) -> WorkdirBusyError:
  return WorkdirBusyError(
    f"{workdir} is in use by another run ({_describe_holder(record)}). Two runs in one workdir "
    "would mix their checkpoints and logs, so nothing was done. Wait for that run to finish, "
    f"stop it, or pass another --workdir (a run that died on another host frees the workdir "
    f"{_lease_s():.0f} s after its last heartbeat, or at once if its lock object "
    f"{paths.join(workdir, LOCK_FILE)} is deleted)."
  )


class RemoteLock:
  """A workdir's lock on object storage: the object `<workdir>/.lock`, a JSON record of its
  holder (host, pid, the process's start, a token unique to the process, since when) and a
  heartbeat that a background thread renews every quarter of the lease.

  Taken by creating the object only if there is none (GCS: ifGenerationMatch=0, atomic), or by
  replacing a record whose holder is gone (its process ended, on this host; its heartbeat older
  than its lease, elsewhere) only if it is still that record (ifGenerationMatch=<its
  generation>); then read back after LOCK_SETTLE_S: the holder is whoever the object names.
  Renewals are conditional on the generation the holder last wrote; one that finds another
  holder stops renewing and says so on stderr. Released (deleted, conditionally) when the
  process exits normally or `release_workdirs` runs."""

  def __init__(self, workdir: str):
    self.workdir = workdir
    self.path = paths.join(workdir, LOCK_FILE)
    self.lease_s = _lease_s()
    self.generation: int | None = None
    self.lost = False
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None
    self._since = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")

  def _record(self) -> bytes:
    record = {
      "token": _TOKEN,
      "host": socket.gethostname(),
      "pid": os.getpid(),
      "process_start": _process_start(os.getpid()),
      "since": self._since,
      "heartbeat": time.time(),
      "lease_s": self.lease_s,
    }
    return (json.dumps(record, indent=1, sort_keys=True) + "\n").encode()

  def acquire(self, record: dict[str, Any] | None, generation: int | None, present: bool) -> None:
    """Takes the lock over `record` (the one read: absent, gone or this process's own)."""
    try:
      self.generation = paths.write_object(
        self.path, self._record(), if_generation=generation if present else 0
      )
    except paths.PreconditionFailed:
      raise _busy_remote(self.workdir, _read_lock(self.path)[0] or {}) from None
    time.sleep(LOCK_SETTLE_S)  # a rival that read the same state writes within this
    back, generation, _ = _read_lock(self.path)
    if not back or back.get("token") != _TOKEN:
      raise _busy_remote(self.workdir, back or {})
    self.generation = generation if generation is not None else self.generation
    self._thread = threading.Thread(target=self._renew_loop, daemon=True, name="workdir-lock")
    self._thread.start()

  def _renew_loop(self) -> None:
    while not self._stop.wait(self.lease_s / 4):
      try:
        record, generation, _ = _read_lock(self.path)
        if not record or record.get("token") != _TOKEN:
          self.lost = True
          print(
            f"warning: the lock of {self.workdir} was taken over by another run "
            f"({_describe_holder(record or {})}): this run did not renew it within its lease "
            f"of {self.lease_s:.0f} s. The two runs may now mix their files; stop one of them.",
            file=sys.stderr,
          )
          return
        self.generation = paths.write_object(self.path, self._record(), if_generation=generation)
      except paths.PreconditionFailed:
        continue  # changed between the read and the write: look again next time
      except Exception as error:  # pylint: disable=broad-except  # a network blip: next time
        print(f"warning: could not renew the lock of {self.workdir}: {error}", file=sys.stderr)

  def release(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join(timeout=5)
    if self.lost:
      return
    try:
      record, generation, _ = _read_lock(self.path)
      if record and record.get("token") == _TOKEN:
        paths.delete_object(self.path, generation)
    except Exception:  # pylint: disable=broad-except  # the lease lapses by itself
      pass


def _lock_remote(workdir: str, check_only: bool) -> None:
  key = workdir.rstrip("/")
  held = _REMOTE_HELD.get(key)
  if held is not None and not held.lost:
    return
  path = paths.join(workdir, LOCK_FILE)
  record, generation, present = _read_lock(path)
  if present and (record or {}).get("token") != _TOKEN and _holder_alive(record or {}):
    raise _busy_remote(workdir, record or {})
  if check_only:
    return
  lock = RemoteLock(workdir)
  lock.acquire(record, generation, present)
  if not _REMOTE_HELD:
    # Registered now, after the storage client's own exit hooks (atexit runs the last
    # registered first): the lock object is deleted while the client can still send.
    atexit.register(_release_remote_locks)
  _REMOTE_HELD[key] = lock


def _release_remote_locks() -> None:
  for key in list(_REMOTE_HELD):
    _REMOTE_HELD.pop(key).release()


def lock_workdir(workdir: str, check_only: bool = False) -> None:
  """Takes `workdir`'s lock for this process (re-entrant; released when the process exits).

  check_only: only check that no other process holds it (nothing is created or kept).

  A local workdir's lock is an flock on `<workdir>/.lock`; a gs:// one is a lock object with
  a heartbeat (`RemoteLock`).

  Raises:
    WorkdirBusyError: another process holds it; the message names that process (pid, host,
      since when), which it wrote into the lock file.
  """
  if paths.is_remote(workdir):
    _lock_remote(workdir, check_only)
    return
  key = os.path.realpath(workdir)
  path = os.path.join(workdir, LOCK_FILE)
  if key in _HELD and os.path.exists(path):
    return
  if check_only and not os.path.exists(path):
    return  # a holder always has the file; checking creates nothing
  try:
    fd = os.open(path, os.O_RDWR | (0 if check_only else os.O_CREAT), 0o644)
  except OSError as e:
    raise WorkdirMismatchError(
      f"cannot open the lock file {path}: {e.strerror}; pass a writable --workdir"
    ) from None
  # A check takes the lock shared: the processes of one run check at once (and must not see
  # each other as the holder), while a holder's exclusive lock still refuses every check.
  try:
    fcntl.flock(fd, (fcntl.LOCK_SH if check_only else fcntl.LOCK_EX) | fcntl.LOCK_NB)
  except OSError:
    os.close(fd)
    raise _busy(workdir, path) from None
  if check_only:
    os.close(fd)  # releases the lock
    return
  stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
  os.ftruncate(fd, 0)
  os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}, since {stamp}\n".encode())
  _HELD[key] = fd


def _release(workdir: str) -> None:
  if workdir.rstrip("/") in _REMOTE_HELD:
    _REMOTE_HELD.pop(workdir.rstrip("/")).release()
    return
  fd = _HELD.pop(os.path.realpath(workdir), None)
  if fd is not None:
    os.close(fd)  # closing the descriptor releases the flock


def release_workdirs(keep: Iterable[str] = ()) -> None:
  """Releases the workdir locks this process holds (but those in `keep`, real paths): for a
  process that runs several commands in turn (tests, notebooks; `stori_jax.plumbing.cli.run_in_process`
  calls it after each command), where exiting does not end a run."""
  for key in [*_HELD, *_REMOTE_HELD]:
    if key not in set(keep):
      _release(key)


def held_workdirs() -> tuple[str, ...]:
  """The real paths (URLs) of the workdirs whose lock this process holds."""
  return (*_HELD, *_REMOTE_HELD)


def absolute_path(path: str) -> str:
  """An existing local path as an absolute one (a relative path depends on the cwd); anything
  else (a URL, a registry name, a hub id, "") as given."""
  if paths.is_url(path):
    return path
  return os.path.abspath(path) if path and os.path.exists(path) else path


# Digests already computed by this process: (real path, size, mtime_ns) -> sha256.
_DIGESTS: dict[tuple[str, int, int], str] = {}


def _digest_cache_path() -> str:
  root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(root, "stori_jax", "file_digests.json")


def file_digest(path: str) -> str:
  """sha256 of a file's contents, computed once per (path, size, modification time): kept in
  memory and in ~/.cache/stori_jax/file_digests.json ($XDG_CACHE_HOME), so a model of
  gigabytes is read once, not at every resume. A URL's key is its object's generation."""
  real = path if paths.is_remote(path) else os.path.realpath(path)
  size, version = paths.version(real)
  key = (real, size, version)
  if key in _DIGESTS:
    return _DIGESTS[key]
  cache_path = _digest_cache_path()
  stored_key = f"{real}|{size}|{version}"
  try:
    with open(cache_path, encoding="utf-8") as f:
      stored = json.load(f)
  except (OSError, ValueError):
    stored = {}
  digest = stored.get(stored_key) if isinstance(stored, dict) else None
  if not isinstance(digest, str):
    h = hashlib.sha256()
    with paths.open(real, "rb") as f:
      for block in iter(lambda: f.read(1 << 22), b""):
        h.update(block)
    digest = h.hexdigest()
    if size >= 1 << 20:  # small files are cheaper to read again than to record
      stored = stored if isinstance(stored, dict) else {}
      stored = {k: v for k, v in stored.items() if not k.startswith(real + "|")}
      stored[stored_key] = digest
      try:
        os.makedirs(os.path.dirname(cache_path), exist_ok=True)
        jsonio.write_json(cache_path, stored, indent=0, sort_keys=True)
      except OSError:
        pass  # a cache that cannot be written costs time, not correctness
  _DIGESTS[key] = digest
  return digest


def content_identity(path: str) -> Any:
  """What a model, prompt, descriptor or split path contributes to a run's identity: for a
  local file {"path": absolute path, "sha256": its contents' digest}; for a local folder the
  digest covers every file's relative name and contents (hidden files aside); anything else (a
  registry name, a hub id, "") as given. Editing a file in place, or replacing a model folder's
  weights under the same path, thus changes the identity like a changed config. A URL
  (gs://) counts as a file or folder there."""
  if not path or (paths.is_url(path) and not paths.is_remote(path)) or not paths.exists(path):
    return path
  absolute = paths.absolute(path)
  if paths.isfile(absolute):
    return {"path": absolute, "sha256": file_digest(absolute)}
  h = hashlib.sha256()
  for folder, dirs, names in paths.walk(absolute):
    dirs[:] = sorted(d for d in dirs if not d.startswith("."))
    for name in sorted(n for n in names if not n.startswith(".")):
      full = paths.join(folder, name)
      if paths.isfile(full):
        relative = full[len(absolute) :].lstrip("/" + os.sep)
        h.update(f"{relative}\0{file_digest(full)}\n".encode())
  return {"path": absolute, "sha256": h.hexdigest()}


def to_jsonable(value: Any) -> Any:
  """A JSON round-trippable copy of `value` (ConfigDicts, tuples, numpy scalars, paths)."""
  if hasattr(value, "to_dict"):
    value = value.to_dict()
  if isinstance(value, Mapping):
    return {str(k): to_jsonable(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [to_jsonable(v) for v in value]
  if isinstance(value, (str, bool, int, type(None))):
    return value
  if isinstance(value, float):
    return value if value == value and abs(value) != float("inf") else repr(value)
  if hasattr(value, "item"):  # numpy scalars
    return to_jsonable(value.item())
  return str(value)


def _describe(diffs: list[tuple[str, Any, Any]], limit: int = 8) -> str:
  shown = "; ".join(f"{k}: {old!r} then, {new!r} now" for k, old, new in diffs[:limit])
  more = f"; and {len(diffs) - limit} more" if len(diffs) > limit else ""
  return shown + more


def move_aside(workdir: str) -> str:
  """Renames `workdir` to `<workdir>.old-<UTC time>` (a free name); returns the new path."""
  stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
  target = f"{workdir.rstrip(os.sep)}.old-{stamp}"
  n = 1
  while paths.exists(target):
    n += 1
    target = f"{workdir.rstrip(os.sep)}.old-{stamp}-{n}"
  paths.move(workdir, target)
  return target


def _contents(workdir: str) -> set[str]:
  """The names in a workdir, less other processes' write probes; none if it is no folder (on
  object storage a prefix whose only object was a probe can vanish between two calls)."""
  try:
    names = paths.listdir(workdir) if paths.isdir(workdir) else []
  except (FileNotFoundError, NotADirectoryError):
    names = []
  return {name for name in names if not name.startswith(paths.PROBE_PREFIX)}


def claim_workdir(
  workdir: str,
  identity: Mapping[str, Any],
  *,
  restart: bool = False,
  what: str = "run",
  ignore: Iterable[str] = (),
  check_only: bool = False,
) -> str | None:
  """Makes `workdir` the home of the run described by `identity`, before any work.

  Args:
    workdir: the output folder (created if absent).
    identity: what decides the results, e.g. {"config": config, "model": ..., "data": ...};
      converted with `to_jsonable` and written to `<workdir>/run.json` on first use.
    restart: move an existing workdir that holds another run aside and start afresh.
    what: the kind of run, for messages ("training run", "retrieval index").
    ignore: dotted keys that do not change results (e.g. "config.log_every"); differences
      there are accepted and the stored identity is updated.
    check_only: raise as a claim would, but change nothing (no folder made, nothing moved
      or written): the other processes of a multi-host run, while process 0 claims.

  Returns:
    The path the old run was moved to (restart), else None; with check_only, the identity as
    it would be recorded (JSON-able), which the processes of a multi-process run compare.

  The claiming process holds the workdir's lock (`lock_workdir`) until it exits, so a second
  command on the same workdir stops at its claim while the first runs.

  Raises:
    WorkdirMismatchError: the workdir is a file, holds files but no run.json (made by
      something else), or holds a run with another identity (the keys that differ named).
    WorkdirBusyError: another process holds the workdir.
  """
  identity = to_jsonable(identity)
  ignored = tuple(ignore)
  # A gs:// workdir: its bucket, the credentials and a write are checked before anything else.
  paths.check_location(workdir)
  if restart and paths.is_bucket_root(workdir):
    # Moving a bucket's whole contents aside would mean another bucket (gs://b.old-<time>).
    raise WorkdirMismatchError(
      f"--restart cannot move {workdir} aside: it is a whole bucket, and the old run would have "
      f"to go to another bucket. Name a folder in it as the workdir (e.g. "
      f"{workdir.rstrip('/')}/run1), or leave out --restart. Nothing was done."
    )
  path = paths.join(workdir, RUN_FILE)
  # paths.isfile, not "exists and no folder": on object storage a prefix can exist and then not
  # list as a folder while another process's write probe comes and goes.
  if paths.isfile(workdir):
    raise WorkdirMismatchError(
      f"the workdir {workdir} is a file, not a folder; pass another --workdir"
    )
  moved = None
  if paths.isdir(workdir) or paths.is_remote(workdir):
    # Before anything is read: a run in progress there is not compared with, only refused.
    lock_workdir(workdir, check_only=True)
  # A workdir holding only run.json has no results to lose (a run stopped by a bad value
  # before its first output): the new run takes it over.
  if _contents(workdir) - {RUN_FILE, LOCK_FILE}:
    problem = None
    if not paths.exists(path):
      problem = f"{workdir} holds files but no {RUN_FILE}, so it was not made by this {what}"
    else:
      try:
        stored = json.loads(paths.read_text(path))
      except (OSError, ValueError) as e:
        stored, problem = None, f"{path} cannot be read ({e})"
      if stored is not None:
        diffs = [
          d
          for d in differences(stored, identity)
          if not any(d[0] == k or d[0].startswith(k + ".") for k in ignored)
        ]
        if diffs:
          problem = f"{workdir} holds a {what} with other settings ({_describe(diffs)})"
    if problem is not None:
      if not restart:
        raise WorkdirMismatchError(
          f"{problem}. Its results would be mixed with this one's, so nothing was done. "
          f"Either pass another --workdir, or add --restart to move the old run aside "
          f"(to {workdir.rstrip(os.sep)}.old-<time>) and start afresh."
        )
      here = os.path.realpath(os.getcwd())
      real = workdir if paths.is_url(workdir) else os.path.realpath(workdir)
      if here == real or here.startswith(real.rstrip(os.sep) + os.sep):
        # Renaming the folder this process stands in would leave "." pointing into the moved
        # run, where the new run would then write.
        raise WorkdirMismatchError(
          f"{problem}, and --restart cannot move it aside: it is the current folder or holds "
          f"it ({here}). Pass a --workdir outside the current folder, or run the command from "
          "another folder."
        )
      if check_only:
        return identity
      moved = move_aside(workdir)
      _release(workdir)  # the old run's folder keeps its lock file, unlocked
  if check_only:
    return identity
  try:
    paths.makedirs(workdir, exist_ok=True)
  except OSError as e:
    raise WorkdirMismatchError(f"cannot create the workdir {workdir}: {e.strerror}") from None
  if not paths.is_remote(workdir) and not os.access(workdir, os.W_OK):
    raise WorkdirMismatchError(f"the workdir {workdir} is not writable; pass a writable --workdir")
  lock_workdir(workdir)
  try:
    jsonio.write_json(path, identity, indent=1, sort_keys=True)
  except OSError as e:
    raise WorkdirMismatchError(
      f"cannot write {path}: {e.strerror}; pass a writable --workdir"
    ) from None
  return moved


def claim_run(
  workdir: str,
  identity: Mapping[str, Any],
  *,
  what: str,
  restart: bool = False,
  ignore: Iterable[str] = (),
) -> str | None:
  """The claim of every command that writes a workdir, made after its config is checked and
  before anything else is read or written.

  A change of the config's SCHEDULE_KEYS, or of the config keys in `ignore`, keeps the run. On
  several processes (jax.distributed) every process checks the workdir, then process 0 claims
  while the others wait (`multihost.claim_on_process_zero`); one process just claims.

  Args:
    workdir: the run's folder (created if absent).
    identity: what decides the results, the resolved config at "config" ({"config": config,
      "model": content_identity(path), ...}); see `claim_workdir`.
    what: the kind of run, for messages ("training run", "retrieval run").
    restart: move a workdir that holds another run aside instead of refusing it.
    ignore: config keys besides SCHEDULE_KEYS (dotted below the config, e.g. "batch_size")
      that change how the work is batched, cached or printed, not a result.

  Returns:
    Where `restart` moved the old run (on process 0), else None.

  Raises:
    WorkdirMismatchError, WorkdirBusyError: as `claim_workdir`, before anything is written.
    multihost.ProcessesDisagreeError: the processes were started with other identities.
  """
  ignored = tuple(f"config.{key}" for key in (*SCHEDULE_KEYS, *ignore))
  return multihost.claim_on_process_zero(
    lambda check_only: claim_workdir(
      workdir, identity, restart=restart, what=what, ignore=ignored, check_only=check_only
    ),
    what,
  )
