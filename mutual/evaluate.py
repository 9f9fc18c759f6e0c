r"""The mutual-knowledge paper's evaluation protocols: Table 1 (App. D, E) and the protocols of
mutual.protocols (Table 2, App. A.1-A.4), in one run.

  python -m mutual.evaluate --config configs/mutual_eval_synthetic.py --workdir workdirs/eval
  python -m mutual.evaluate --config configs/mutual_eval_imagenet.py --workdir DIR \
      --config.data.root=/data/imagenet/val --config.data.classnames=/data/imagenet/classnames.txt \
      --config.data.descriptors=data/descriptors/descriptors_imagenet.json \
      --config.baselines.data.root=/data/imagenet/train \
      --config.protocols.corloc.boxes=/data/imagenet/val_boxes

Table 1 compares the multimodal explanations of the analysis (mutual.pipeline, PCA and K-means
concepts) with the three trained baselines of App. D (mutual.baselines, trained on cached
features of training images) and with a random ordering of the method's own concepts, on the XAI
metrics of App. E (mutual.xai): Deletion, Insertion, AccDrop, AccIncrease.

Writes to the workdir:
  table1.md, table1.json     Table 1, and Table 5 (App. D: top-1 / top-5 of the Standard MLP,
                             LF-CBM, MM-CBM, MM-ProtoSim; the concept labeler's top-all /
                             top-10) on the evaluation images, with the baselines' training set
                             (every image of the training split, as App. D, or "not the
                             paper's setting")
  curves.png                 the four mean curves (score / accuracy per step) per explanation
  fig7_<method>.png          App. E's Fig. 7: the first image's deletion and insertion steps
                             and its two score curves
  fig6_feature_maps.png      App. D.2's Fig. 6: per image (the first of each class, 6 at most),
                             the feature activation maps of the neurons of largest spatial norm
                             (the first the main object) at the 0.9 threshold, each labelled by
                             the concept labeler of Table 5's top-all / top-10 (with baselines)
  protocols.md, protocols.json   Table 2, App. A.1-A.4 (config.evaluation.protocols)
  layer_similarity.png       App. A.1's Fig. 1: the [CLS] token's similarity across layers
  classes/<class>.npz        a class's Table 1 pass (concepts, curves, Table 5's scores)
  protocols/<name>.json      a protocol's result
  baselines/                 the baselines' checkpoints and training summary
Same config and seed, same JSON (up to the run times it records). The same command again (after
a kill, or on a finished run) keeps every class and protocol file of the same images and
computes only the rest (another config is refused: run.json).
"""

from __future__ import annotations

import os

from absl import flags

from mutual import run_flags
from mutual.evaluation import runner as evaluation
from stori_jax.plumbing import cli as stori_cli
from stori_jax.plumbing import paths


#: Every file the command writes, listed at the end of its output (those a config turns off are
#: left out).
OUTPUTS = (
  "run.json",
  "table1.md",
  "table1.json",
  "curves.png",
  "fig7_*.png",
  "fig6_feature_maps.png",
  "protocols.md",
  "protocols.json",
  "layer_similarity.png",
  "baselines",  # the baselines' training checkpoints (a rerun resumes from them)
  "classes",  # each class's Table 1 pass, kept by a rerun
  "protocols",  # each protocol's result, kept by a rerun
  "finished",  # the records of the classes' passes and the baselines' training, for a rerun
)


def define_flags(values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the command's flags (when run as a program, or on a test's own FlagValues)."""
  run_flags.define_run_flags("Evaluation", values)


def main(argv: list[str], values: flags.FlagValues = flags.FLAGS) -> None:
  """Runs the config's evaluation in its workdir and prints Table 1 and the protocols."""
  _, workdir, results = run_flags.run_from_flags(
    argv,
    values,
    evaluation.run,
    "python -m mutual.evaluate --config configs/mutual_eval_synthetic.py --workdir DIR",
  )
  print(paths.read_text(os.path.join(workdir, "table1.md")))
  if "protocols" in results:
    print(paths.read_text(os.path.join(workdir, "protocols.md")))
  stori_cli.print_outputs(workdir, OUTPUTS)


if __name__ == "__main__":
  define_flags()
  stori_cli.run(main)
