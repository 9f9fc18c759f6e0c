"""The evaluation's progress bars: one bar per stage, labelled with the paper's name of the stage
and with its total, and quiet when stderr is a log file rather than a terminal."""

from __future__ import annotations

import sys
from typing import Iterable

from tqdm import tqdm

#: Seconds between a bar's redraws when stderr is not a terminal: each redraw there is one more
#: line of the log (tqdm's 0.1 s gave about 150 of them for one evaluation).
LOGGED_INTERVAL = 60.0


def stage_bar(
  iterable: Iterable | None = None, desc: str = "", total: int | None = None, show: bool = True
) -> tqdm:
  """tqdm over one stage: `desc` names it, `total` defaults to len(iterable)."""
  if total is None and iterable is not None and hasattr(iterable, "__len__"):
    total = len(iterable)
  logged = not getattr(sys.stderr, "isatty", lambda: False)()
  return tqdm(
    iterable,
    desc=desc,
    total=total,
    disable=not show,
    dynamic_ncols=True,
    mininterval=LOGGED_INTERVAL if logged else 0.1,
  )
