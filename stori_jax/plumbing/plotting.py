"""matplotlib for the figure writers: the file-only Agg backend, imported on first use, and
`save_figure`, which every figure is written through: whole or not at all, locally or to a
bucket, a full disk one paragraph (`DiskFullError`, exit 2 through the commands), as every
result is written (`stori_jax.plumbing.paths.AtomicWrite`)."""

from __future__ import annotations

import os

from stori_jax.plumbing import paths


def pyplot():
  """matplotlib.pyplot on the Agg backend (no display needed; figures go to PNG files)."""
  import matplotlib  # lazy: a slow import that only the figure writers need

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # lazy: after the backend is chosen

  return plt


def save_figure(fig, path: str, **kwargs) -> None:
  """`fig.savefig(path, **kwargs)`, streamed through `paths.AtomicWrite` (a path or a URL): a kill or a full disk never leaves half an
  image, and the earlier file, if any, is kept. The format is the path's extension unless
  `format` is given.

  Raises:
    DiskFullError: the disk (or quota) is full; the message names the file and the fix.
  """
  kwargs.setdefault("format", os.path.splitext(path)[1].lstrip(".").lower() or "png")
  with paths.AtomicWrite(path, what="the figure ") as f:
    fig.savefig(f, **kwargs)
