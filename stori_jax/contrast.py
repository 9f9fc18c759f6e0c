r"""SToRI Fig. 3: one class contrasted with others by two-class text classifiers whose prompts
come from the classes' attribute labels (paper §4.1.2, "Does optimization occur in
interpretable space?").

  python -m stori_jax.contrast --config configs/pairwise_synthetic.py   # offline, the tiny CLIP
  python -m stori_jax.contrast --config configs/pairwise_cub.py \
      --config.data.root=/data/CUB_200_2011 --workdir workdirs/pairwise_cub

For each pairing (the config's anchor against each of data.others) the SToRI weights of both
classes' attribute prompts are trained on the two classes' images (stori_jax.fewshot.pairwise_contrast),
in <workdir>/vs_<class>/ with a few-shot run's files (weights.json, interpretability.html/.png,
history.jsonl, training_curve.png, checkpoints/). Writes to the workdir: fig3_pairwise.png (the
pairings side by side, words shaded by weight normalised to sum to 1 per prompt), pairwise.json
(every prompt's token and word weights, the accuracies, the anchor's words whose weight changes
most between pairings) and run.json. Running the same command again resumes each pairing from
its checkpoint; another config in the same workdir stops before any work (pass another
--workdir, or --restart to move the old study aside). A missing CUB folder is reported with what
to download, before any model loads; a bad config value prints one paragraph and exits with
status 2.
"""

from __future__ import annotations

import os

from absl import flags
from ml_collections import config_flags

from stori_jax.plumbing import cli
from stori_jax.plumbing.errors import UserError
from stori_jax.fewshot import pairwise_contrast


def define_flags(values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the command's flags (when run as a program, or on a test's own FlagValues)."""
  fv = {"flag_values": values}
  config_flags.DEFINE_config_file("config", None, "Pairwise study config file.", **fv)
  flags.DEFINE_string(
    "workdir",
    None,
    "Where the study goes (default: workdirs/<config name>); one made by the same config resumes.",
    **fv,
  )
  flags.DEFINE_bool(
    "restart",
    False,
    "If the workdir holds a study of another config, move it aside to <workdir>.old-<time> "
    "(without it such a workdir is refused).",
    **fv,
  )


def main(argv: list[str], values: flags.FlagValues = flags.FLAGS) -> None:
  """Runs the config's pairings in its workdir and prints a summary."""
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {argv[1:]}; flags are written --name=value")
  config = values.config
  if config is None:
    raise UserError("--config is required, e.g. --config configs/pairwise_synthetic.py")
  workdir = values.workdir or os.path.join("workdirs", str(config.get("name") or "pairwise"))
  results = pairwise_contrast.run(config, workdir, restart=values.restart)
  print(pairwise_contrast.summary(results))
  cli.print_outputs(workdir, ["run.json", "pairwise.json", "fig3_pairwise.png", "vs_*"])


if __name__ == "__main__":
  define_flags()
  cli.run(main)
