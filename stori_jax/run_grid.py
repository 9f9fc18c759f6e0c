r"""The paper's few-shot tables as one command: datasets x shots x seeds x methods (SToRI
Tables 1, 2 and 8), or x the values of a swept config key (App. C.6, Fig. 10: the first
reweighted block), each cell a full few-shot run, reported as mean ± std over seeds.

  python -m stori_jax.run_grid --config configs/grid_synthetic.py --workdir workdirs/grid_synthetic
  python -m stori_jax.run_grid --config configs/table2.py --workdir workdirs/table2
  python -m stori_jax.run_grid --config configs/table2.py:backbone=metaclip --workdir workdirs/table8
  python -m stori_jax.run_grid --config configs/table2.py --dry_run   # the cells and their rates
  python -m stori_jax.run_grid --config configs/table1.py --workdir workdirs/table1
  python -m stori_jax.run_grid --config configs/fig10.py --workdir workdirs/fig10
  python -m stori_jax.run_grid --config configs/table1.py:synthetic   # offline, the demo's task
  python -m stori_jax.run_grid --config configs/fig10.py:synthetic    # offline, the demo's task

Each cell runs in <workdir>/<dataset>/<shots>shot/<method>/seed<k> as `python -m
stori_jax.train` would run its config (the trainer's run, in this process), with the paper's
learning rate for the cell (App. A.1); a sweep's rows are methods too (`stori_start_block7`).
Writes to the workdir: run.json (the grid config), tables.md and tables.json (one table per
shot count: rows = methods, columns = datasets and their average, "mean ± std"), and for a grid
with a sweep accuracy_by_<key>.png (per dataset the mean over seeds against the swept value,
the std shaded). Running the same command again skips the finished cells and resumes an
interrupted one from its checkpoint; another grid config in the same workdir stops before any
work (pass another --workdir, or --restart to move the old grid aside). A bad config value
prints one paragraph and exits with status 2, and so does a grid of more than --max_cells
cells (default 10,000; the paper's largest has 270), before any cell is built: each is a whole
few-shot run. --dry_run lists a grid of millions of cells (with --max_cells raised) in seconds.
"""

from __future__ import annotations

import os
import sys

import jax
from absl import flags
from ml_collections import config_flags

from stori_jax.plumbing import cli, multihost
from stori_jax.plumbing.errors import UserError
from stori_jax.grid import cells, runner, tables


def define_flags(values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the command's flags (when run as a program, or on a test's own FlagValues)."""
  fv = {"flag_values": values}
  config_flags.DEFINE_config_file(
    "config", None, "Grid config file (get_config()).", lock_config=True, **fv
  )
  flags.mark_flag_as_required("config", flag_values=values)
  flags.DEFINE_string(
    "workdir",
    None,
    "The grid's folder (default: workdirs/<config name>); one made by the same grid config "
    "goes on where it stopped.",
    **fv,
  )
  flags.DEFINE_bool(
    "restart",
    False,
    "If the workdir holds a grid of another config, move it aside to <workdir>.old-<time> and "
    "start afresh (without it such a workdir is refused).",
    **fv,
  )
  flags.DEFINE_bool(
    "dry_run",
    False,
    "List the cells, their workdirs and learning rates, and exit: nothing is written.",
    **fv,
  )
  flags.DEFINE_integer(
    "max_cells",
    cells.MAX_CELLS,
    "Refuse a grid of more cells than this before building any (each cell is a whole few-shot "
    "run); raise it to run or list a larger grid.",
    lower_bound=1,
    **fv,
  )
  multihost.define_flags(values)


def _where(cell: cells.Cell) -> str:
  return f"{cell.dataset} {cell.shots}-shot {cell.method} seed {cell.seed}"


def _print_plan(grid, workdir: str, max_cells: int) -> None:
  """The cells as they are listed (`cells.plan`): the count first, then one line a cell."""
  print(f"{cells.check_size(grid, max_cells)} cells in {workdir}:", flush=True)
  for cell in cells.plan(grid):
    paper = "the paper's" if cell.lr_source == "paper" else "set by the config"
    print(f"  {os.path.join(workdir, cell.path)}  {cell.lr_key} = {cell.lr:g} ({paper})")
    if cell.config is not None:  # the first cell of a dataset, shot count and row
      sys.stdout.flush()


def _print_progress(event) -> None:
  cell, metrics = event["cell"], event["metrics"]
  done = {
    "skipped": "finished before, skipped",
    "resumed": f"resumed, {event['seconds']:.0f} s",
    "redone": f"its metrics.json was damaged: run again, {event['seconds']:.0f} s",
    "trained": f"{event['seconds']:.0f} s",
  }[event["status"]]
  print(
    f"[{event['index'] + 1}/{event['total']}] {_where(cell)}: "
    f"{tables.accuracy(metrics, 'trained'):.2f}% "
    f"(zero-shot {tables.accuracy(metrics, 'zero_shot'):.2f}%; {done})",
    flush=True,
  )


def main(argv: list[str], values: flags.FlagValues = flags.FLAGS) -> None:
  """Runs the grid's cells in its workdir and prints the tables."""
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {argv[1:]}; flags are written --name=value")
  grid = values.config
  workdir = values.workdir or os.path.join("workdirs", str(grid.get("name") or "grid"))
  if values.dry_run:
    _print_plan(grid, workdir, values.max_cells)
    return
  multihost.initialize_from_flags(values)
  result = runner.run(
    grid,
    workdir,
    restart=values.restart,
    max_cells=values.max_cells,
    progress=_print_progress if jax.process_index() == 0 else None,
  )
  if jax.process_index() != 0:
    return
  print()
  print(tables.markdown(result))
  cli.print_outputs(workdir, runner.outputs(result))


if __name__ == "__main__":
  define_flags()
  cli.run(main)
