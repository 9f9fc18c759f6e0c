"""`python -m mutual.sweep`: flags, config, `runner.run`, the printed Table 3 and fits (and App. G's
grouped tables and Table 2 where the config asks for them)."""

from __future__ import annotations

import os

import jax
from absl import flags

from mutual import run_flags
from mutual.sweep.runner import run
from mutual.sweep.table import fit_equation, markdown_table
from stori_jax.plumbing import cli as stori_cli
from stori_jax.plumbing import multihost, paths


def define_flags(values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the command's flags (when run as a program, or on a test's own FlagValues)."""
  run_flags.define_run_flags("Sweep", values)
  multihost.define_flags(values)


def main(argv: list[str], values: flags.FlagValues = flags.FLAGS) -> None:
  """Runs the sweep in its workdir and prints Table 3 and the fits (process 0 of several)."""
  multihost.initialize_from_flags(values)
  config, workdir, results = run_flags.run_from_flags(
    argv,
    values,
    run,
    "python -m mutual.sweep --config configs/mutual_sweep.py:random --workdir DIR",
  )
  if jax.process_index() != 0:  # process 0 aggregates and reports
    return
  rows = [results["models"][n] for n in results["order"]]
  print(markdown_table(rows, tuple(config.analysis.methods), results["weights"] == "random"))
  for method, groups in results["fits"].items():
    for group, fit in groups.items():
      if fit["slope"] is not None:
        print(
          f"{method} {group}: Top-1 = {fit_equation(fit)}, "
          f"r = {fit['pearson_r']:.3f} (n = {fit['n']})"
        )
  # App. G's groups, Table 2, App. A.1 / A.3 per model (config-dependent)
  for extra in ("table_groups.md", "table2.md", "protocols.md"):
    if paths.isfile(os.path.join(workdir, extra)):
      print(paths.read_text(os.path.join(workdir, extra)))
  stori_cli.print_outputs(
    workdir,
    [
      "run.json",
      "results.json",
      "table.md",
      "table_groups.md",
      "table2.md",
      "table2.json",
      "protocols.md",
      "protocols.json",
      "fig3_*.png",
      "per_image",
      "shards",
      "protocols",  # each (protocol, model) result, kept by a rerun
    ],
  )


if __name__ == "__main__":
  define_flags()
  stori_cli.run(main)
