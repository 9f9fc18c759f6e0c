"""matplotlib for the figure writers: the file-only Agg backend, imported on first use, and
`save_figure`, which every figure is written through: whole or not at all, a full disk one
paragraph (`DiskFullError`, exit 2 through the commands), as result JSON is written
(`stori_jax.plumbing.jsonio`)."""

from __future__ import annotations

import io
import os
import uuid

from stori_jax.plumbing.errors import DISK_FULL_ERRNOS, DiskFullError


def pyplot():
  """matplotlib.pyplot on the Agg backend (no display needed; figures go to PNG files)."""
  import matplotlib  # lazy: a slow import that only the figure writers need

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # lazy: after the backend is chosen

  return plt


def save_figure(fig, path: str, **kwargs) -> None:
  """`fig.savefig(path, **kwargs)`, rendered in memory and written through a temporary file in
  the same folder and os.replace: a kill or a full disk never leaves half an image, and the
  earlier file, if any, is kept. The format is the path's extension unless `format` is given.

  Raises:
    DiskFullError: the disk (or quota) is full; the message names the file and the fix.
  """
  kwargs.setdefault("format", os.path.splitext(path)[1].lstrip(".").lower() or "png")
  buffer = io.BytesIO()
  fig.savefig(buffer, **kwargs)
  folder, name = os.path.split(os.path.abspath(path))
  # A unique name opened exclusively ("x"), not mkstemp: the mode a plain open() gives.
  tmp = os.path.join(folder, f".{name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
  try:
    with open(tmp, "xb") as f:
      f.write(buffer.getbuffer())
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException as error:
    if os.path.exists(tmp):
      os.remove(tmp)
    if isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS:
      raise DiskFullError(
        f"cannot write the figure {path}: the disk (or quota) is full. The earlier version of "
        "the file, if any, is kept; free some space and run the same command again (a training "
        "run resumes from its last checkpoint)."
      ) from None
    raise
