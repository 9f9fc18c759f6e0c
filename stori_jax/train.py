r"""Few-shot SToRI: trains the token weights of every CuPL prompt (paper §3.2, §4.1).

  python -m stori_jax.train --config configs/demo.py
  python -m stori_jax.train --config configs/demo.py --config.method=taskres --workdir /tmp/taskres
  python -m stori_jax.train --config configs/dtd.py:shots=4 --config.method=taskres \
      --config.prompts.use_cupl=False      # Table 2's "TaskRes / Base": no CuPL file needed
  python -m stori_jax.train --config configs/imagenet.py:shots=4 --config.seed=2
  python -m stori_jax.train --config configs/imagenet_16shot.py --distributed   # every host of a pod

Writes to the workdir: run.json (the config, model and data of the run that made it),
metrics.json (zero-shot and trained accuracy, per class, config echo), weights.json (every
prompt's token and word weights), history.jsonl, training_curve.png,
interpretability.html/.png, and orbax checkpoints. An interrupted run restarted with the same
command resumes; another config in the same workdir stops before any work (pass another
--workdir, or --restart to move the old run aside). A bad config value, or a run that diverges
(NaN or infinity), prints one paragraph and exits with status 2.
Prompts are sharded over all devices of all hosts (see launch/).
"""

from __future__ import annotations

import os

import jax
from absl import flags
from ml_collections import config_flags

from stori_jax.plumbing import cli, multihost
from stori_jax.plumbing.errors import UserError


def define_flags(values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the command's flags (when run as a program, or on a test's own FlagValues)."""
  fv = {"flag_values": values}
  config_flags.DEFINE_config_file(
    "config", None, "Config file (get_config()).", lock_config=True, **fv
  )
  flags.mark_flag_as_required("config", flag_values=values)
  flags.DEFINE_string(
    "workdir",
    None,
    "Output directory (default: workdirs/<config name>); one made by the same config resumes.",
    **fv,
  )
  flags.DEFINE_bool(
    "restart",
    False,
    "If the workdir holds a run of another config, move it aside to <workdir>.old-<time> and "
    "start afresh (without it such a workdir is refused).",
    **fv,
  )
  multihost.define_flags(values)


#: What a run writes to its workdir (fewshot.trainer and fewshot.report), in the order shown.
OUTPUTS = (
  "run.json",
  "metrics.json",
  "weights.json",
  "history.jsonl",
  "training_curve.png",
  "interpretability.html",
  "interpretability.png",
  "checkpoints",
)


def top_words_table(top_words: dict[str, list[tuple[str, float]]]) -> list[str]:
  """One line per class: its name, then its top words with their weights, each column as wide
  as its widest entry, so the columns line up whatever the lengths of class names and words."""
  if not top_words:
    return []
  names = list(top_words)
  cells = [[f"{w} {v:.2f}" for w, v in top_words[n]] for n in names]
  columns = max(len(row) for row in cells)
  widths = [max((len(row[i]) for row in cells if i < len(row)), default=0) for i in range(columns)]
  name_width = max(len("class"), *(len(n) for n in names))
  header = f"  {'class':<{name_width}}  top words (mean weight over the class's prompts)"
  lines = [header]
  for name, row in zip(names, cells):
    shown = "  ".join(f"{cell:<{width}}" for cell, width in zip(row, widths))
    lines.append(f"  {name:<{name_width}}  {shown}".rstrip())
  return lines


def main(argv: list[str], values: flags.FlagValues = flags.FLAGS) -> None:
  """Trains the config's weights in its workdir and prints the accuracies and top words."""
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {argv[1:]}; flags are written --name=value")
  multihost.initialize_from_flags(values)
  # lazy: after jax.distributed.initialize, before which nothing may touch a JAX backend
  from stori_jax.fewshot import trainer  # lazy: see above

  config = values.config
  workdir = values.workdir or os.path.join("workdirs", str(config.get("name") or "train"))
  # Missing data or weights, a bad config value, a workdir of another run, a diverged run:
  # UserErrors, which cli.run prints as one paragraph (exit status 2).
  metrics = trainer.run(config, workdir, restart=values.restart)
  if jax.process_index() != 0:
    return
  zero_shot, trained = metrics["zero_shot"]["accuracy"], metrics["trained"]["accuracy"]
  print(
    f"\n{metrics['dataset']} {metrics['shots']}-shot, {metrics['num_prompts']} CuPL + "
    f"{metrics['num_fixed_prompts']} Base prompts, "
    f"{metrics['steps']} steps on {metrics['num_devices']} device(s), "
    f"{metrics['seconds']:.0f} s"
  )
  print(f"  zero-shot accuracy: {100 * zero_shot:6.2f}%")
  print(f"  {metrics['method']:<9} accuracy: {100 * trained:6.2f}%")
  if "word_rank_auc" in metrics:
    auc = metrics["word_rank_auc"]
    print(
      f"  word-rank AUC, discriminating words vs nuisance words: {auc['nuisance']:.3f}"
      f" (vs all other words: {auc['other']:.3f}; chance 0.5)"
    )
    medians = ", ".join(f"{k} {v:.2f}" for k, v in metrics["median_word_weight"].items())
    print(f"  median word weight by kind: {medians}")
    explained = metrics["classes_with_discriminating_top3"]
    print(
      f"  classes with a discriminating word among their 3 top-weighted words: "
      f"{len(explained)} of {len(metrics['top_words'])}"
    )
  for line in top_words_table(metrics.get("top_words", {})):
    print(line)
  cli.print_outputs(workdir, OUTPUTS)


if __name__ == "__main__":
  define_flags()
  cli.run(main)
