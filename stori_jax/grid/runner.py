"""The run of `python -m stori_jax.run_grid`: every cell of a grid config in its own workdir,
then the tables.

The grid's workdir records the grid config (run.json) and refuses another one, like every
command's (`run_identity.claim_run`). Each cell runs in `<workdir>/<dataset>/<shots>shot/
<method>/seed<k>` through `fewshot.trainer.run`, the function `python -m stori_jax.train`
calls, in this process: the cell's folder is what that command writes for the cell's config.
A cell is finished when its record of finished work (`stori_jax.plumbing.finished`, in the
grid's finished/ folder, written once the cell's run ends) names its metrics.json as it is now,
that file is whole (`read_metrics`) and its run.json holds the cell's identity
(`trainer.identity`): it is skipped. A cell with a run.json and no metrics.json was interrupted:
the trainer resumes it from its last checkpoint; so is one whose metrics.json is damaged (cut
short, `{}`, other contents than the run wrote), which its final checkpoint makes an
evaluation. A cell folder
that holds another run (the model file, the data or the CuPL file changed under the same grid
config) stops the grid before any training. A grid with a sweep (configs/fig10.py) also gets
its figure, accuracy against the sweep's values (`grid.figure`).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable

import jax
import ml_collections

from stori_jax.plumbing import finished, jsonio, paths, run_identity, workdir_layout
from stori_jax.fewshot import trainer
from stori_jax.grid import cells as cells_lib
from stori_jax.grid import figure, tables

#: What the grid writes to its workdir, besides the cells' folders and a sweep's figure (and
#: finished/, the cells' records of finished work).
OUTPUTS = ("run.json", "tables.md", "tables.json")
#: Grid config keys that change no result: the grid's name, how the tables and the figure name
#: and show things, and the cells' schedule keys.
IDENTITY_IGNORED = (
  "name",
  "average_column",
  "sweep.label",
  *(f"base.overrides.{key}" for key in run_identity.SCHEDULE_KEYS),
)
#: The cells' run.json keys that a finished cell may differ in (the trainer's claim ignores
#: them too).
_CELL_IGNORED = tuple(
  f"config.{key}" for key in (*run_identity.SCHEDULE_KEYS, *trainer.IDENTITY_IGNORED)
)


def outputs(result: dict[str, Any]) -> tuple[str, ...]:
  """The files `run` wrote to the grid's workdir for its `result`: OUTPUTS and, with a sweep,
  the figure."""
  return OUTPUTS + ((figure.file_name(result),) if result["sweep"] else ())


class CellMismatchError(run_identity.WorkdirMismatchError):
  """A cell's folder holds a run of other settings than the grid's cell."""


def identity(grid: ml_collections.ConfigDict, cells: list[cells_lib.Cell]) -> dict[str, Any]:
  """What decides the grid's results: its config and the contents of the few-shot config
  files it builds its cells from (editing one in place is a change)."""
  files = sorted({c.base_file.partition(":")[0] for c in cells})
  return {
    "config": grid,
    "base_files": {f: run_identity.content_identity(f) for f in files},
  }


def cell_differences(cell: cells_lib.Cell, directory: str) -> list[tuple[str, Any, Any]] | None:
  """How the run recorded in a cell's folder differs from the cell ([] when it is the cell's
  run), or None when the folder holds no run.json."""
  path = os.path.join(directory, run_identity.RUN_FILE)
  if not paths.exists(path):
    return None
  try:
    with paths.open(path) as f:
      stored = json.load(f)
  except (OSError, ValueError) as e:
    return [(run_identity.RUN_FILE, f"unreadable ({e})", "the cell's identity")]
  current = run_identity.to_jsonable(trainer.identity(cell.config))
  return [
    d
    for d in run_identity.differences(stored, current)
    if not any(d[0] == k or d[0].startswith(k + ".") for k in _CELL_IGNORED)
  ]


def read_metrics(directory: str) -> dict[str, Any] | None:
  """A cell's metrics.json, or None when it is missing or damaged: not readable as JSON (cut
  short by a full disk or a copy, not UTF-8), not an object, or without a finite accuracy in
  [0, 1] under each of "trained" and "zero_shot" (what the tables read)."""
  try:
    with paths.open(os.path.join(directory, "metrics.json")) as f:
      metrics = json.load(f)
  except (OSError, ValueError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
    return None
  if not isinstance(metrics, dict):
    return None
  for which in cells_lib.ACCURACIES:
    entry = metrics.get(which)
    value = entry.get("accuracy") if isinstance(entry, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
      return None
  return metrics


def cell_unit(workdir: str, cell: cells_lib.Cell) -> finished.Unit:
  """A cell as a unit of work (its settings are checked against its run.json apart:
  `cell_differences`)."""
  return finished.Unit(
    workdir, f"cell {cell.path}", workdir_layout.grid_cell_record(cell.path), dict(cell=cell.path)
  )


def _metrics_file(cell: cells_lib.Cell) -> str:
  return f"{cell.path}/{workdir_layout.GRID_CELL_METRICS}".replace(os.sep, "/")


def _check_cells(cells: list[cells_lib.Cell], workdir: str) -> None:
  """Stops, before any training, at a cell folder that holds a run of other settings."""
  for cell in cells:
    diffs = cell_differences(cell, os.path.join(workdir, cell.path))
    if diffs:
      shown = "; ".join(f"{k}: {old!r} then, {new!r} now" for k, old, new in diffs[:6])
      more = f"; and {len(diffs) - 6} more" if len(diffs) > 6 else ""
      raise CellMismatchError(
        f"the cell {os.path.join(workdir, cell.path)} holds a run with other settings "
        f"({shown}{more}), though the grid config is the same: a file it names changed (the "
        f"model, the data folder, the CuPL file). Its results would be mixed with the new "
        f"ones, so nothing was run. Pass another --workdir, add --restart to move the whole "
        f"grid aside, or delete that cell's folder to run it again."
      )


def run(
  grid: ml_collections.ConfigDict,
  workdir: str,
  *,
  restart: bool = False,
  progress: Callable[[dict[str, Any]], None] | None = None,
  max_cells: int = cells_lib.MAX_CELLS,
) -> dict[str, Any]:
  """Runs (or resumes) every cell of the grid, then writes tables.md and tables.json (and with a
  sweep, the figure `figure.file_name`).

  Args:
    grid: a grid config (configs/grid_synthetic.py, configs/table1.py, configs/table2.py,
      configs/fig10.py; see `cells`).
    workdir: the grid's folder; one made by the same grid config goes on where it stopped.
    restart: move a workdir made by another grid config aside instead of refusing it.
    progress: called after each cell with {"index", "total", "cell", "status" ("skipped",
      "resumed", "trained", or "redone": its metrics.json was damaged), "seconds", "metrics"}.
    max_cells: a grid of more cells is refused before any is built (`cells.check_size`).

  Returns:
    The tables (`tables.build`), as written to tables.json.

  Raises:
    ConfigError: a bad grid value or cell config, or more than `max_cells` cells (before any
      work).
    WorkdirMismatchError: the workdir holds another grid (before any work), or a cell's folder
      holds another run (`CellMismatchError`, before any training).
    NonFiniteError: a cell diverged; the cells before it are kept, and the same command goes
      on from it once the cause is fixed.
  """
  cells = cells_lib.expand(grid, max_cells=max_cells)
  methods = cells_lib.grid_methods(grid)
  run_identity.claim_run(
    workdir, identity(grid, cells), what="grid run", restart=restart, ignore=IDENTITY_IGNORED
  )
  _check_cells(cells, workdir)
  metrics: dict[str, dict[str, Any]] = {}
  for index, cell in enumerate(cells):
    directory = os.path.join(workdir, cell.path)
    started = time.perf_counter()
    unit = cell_unit(workdir, cell)
    kept = None
    if finished.check(unit) is not None and cell_differences(cell, directory) == []:
      kept = read_metrics(directory)
    if kept is not None:
      metrics[cell.path] = kept
      status = "skipped"
    else:
      # A damaged metrics.json (cut short, emptied) is no finished cell: the trainer runs it
      # again, from its last checkpoint (the final one of a finished run: evaluation only).
      status = "resumed" if paths.isdir(os.path.join(directory, "checkpoints")) else "trained"
      if paths.exists(os.path.join(directory, "metrics.json")):
        status = "redone"
      held = run_identity.held_workdirs()
      try:
        metrics[cell.path] = trainer.run(cell.config, directory)
      finally:
        # The cell's run ends here: free its folder (the grid's own stays held).
        run_identity.release_workdirs(keep=held)
      if jax.process_index() == 0:
        written = paths.file_sha256(unit.path(_metrics_file(cell)))
        finished.finish(unit, {_metrics_file(cell): written})
    if progress is not None:
      progress(
        {
          "index": index,
          "total": len(cells),
          "cell": cell,
          "status": status,
          "seconds": time.perf_counter() - started,
          "metrics": metrics[cell.path],
        }
      )
  result = tables.build(
    methods,
    cells,
    metrics,
    datasets=tuple(grid.datasets),
    shots=tuple(grid.shots),
    seeds=tuple(grid.seeds),
    ddof=int(grid.std_ddof),
    sweep=grid.sweep if cells_lib.sweep_key(grid) else None,
    average_column=bool(grid.get("average_column", True)),
  )
  if jax.process_index() == 0:
    jsonio.write_json(os.path.join(workdir, "tables.json"), result, indent=1)
    jsonio.write_text_atomic(os.path.join(workdir, "tables.md"), tables.markdown(result) + "\n")
    if result["sweep"]:
      figure.plot(result, os.path.join(workdir, figure.file_name(result)))
  return result
