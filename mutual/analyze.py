r"""Mutual-knowledge analysis of a CLIP model on a dataset, class by class.

  python -m mutual.analyze --config configs/mutual_synthetic.py --workdir workdirs/mutual
  python -m mutual.analyze --config configs/mutual_imagenet.py --workdir DIR \
      --config.data.root=/data/imagenet/val --config.data.classnames=/data/imagenet/classnames.txt \
      --config.data.descriptors=/data/descriptors_imagenet.json

Writes to the workdir:
  per_image/<class index>/<image index>.json   concepts, descriptors, mutual concepts, MI curve, AUC
  classes/<class index>.json                   written once a class's records (and figures) are:
                                               the class is final (its ids, and for a folder its
                                               files' sizes and times); <index>_fig5.npz: a
                                               figure class's first images for Fig. 5
  results.json                                 per-class and dataset aggregates (Table 3 columns)
  table.md                                     the dataset row of Table 3
  figures/concepts_<method>_<class>.png        Fig. 4: concept overlays with their descriptors
  figures/curves_<class>.png, curves.png       MI curves of a class / the dataset per method
  figures/fig5_<method>.png                    Fig. 5: the figure classes' MI curves overlaid
                                               (AUCs in the legend), each class's shared
                                               concept on its first images
  figures/mutual_<method>_<class>.png          Fig. 6: vision / language / mutual descriptors
  report.html                                  all of it as one page to open from disk
                                               (mutual.report_html)
Same config and seed, same JSON. The same command again (after a kill, or on a finished run)
keeps every class with its class file and analyses only the others, then writes the aggregates
again: a finished run is not redone (another config is refused: run.json). Several processes
share the classes (a TPU pod or SLURM job with --distributed, or local processes:
`launch/local_multiprocess.sh 2 -- python -m mutual.analyze --config ... --workdir DIR`); the
workdir must then be on a filesystem they all share.
"""

from __future__ import annotations

import jax
from absl import flags

from mutual.analysis import runner as analysis
from mutual import run_flags, report
from stori_jax.plumbing import cli as stori_cli
from stori_jax.plumbing import multihost


def define_flags(values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the command's flags (when run as a program, or on a test's own FlagValues)."""
  run_flags.define_run_flags("Analysis", values)
  multihost.define_flags(values)


def main(argv: list[str], values: flags.FlagValues = flags.FLAGS) -> None:
  """Analyses the config's images in its workdir and prints the table."""
  multihost.initialize_from_flags(values)
  config, workdir, results = run_flags.run_from_flags(
    argv,
    values,
    analysis.run,
    "python -m mutual.analyze --config configs/mutual_synthetic.py --workdir DIR",
  )
  if jax.process_index() != 0:  # process 0 aggregates and reports
    return
  print(report.markdown_table(results["dataset"], results["model"], tuple(config.analysis.methods)))
  stori_cli.print_outputs(
    workdir,
    ["run.json", "results.json", "table.md", "report.html", "figures", "per_image", "classes"],
  )


if __name__ == "__main__":
  define_flags()
  stori_cli.run(main)
