r"""Contrastive CLIP pretraining on the synthetic world (the embedded default model).

  python -m stori_jax.pretrain --config configs/tiny_clip_pretrain.py --workdir /tmp/tiny_clip
  python -m stori_jax.pretrain --config configs/tiny_clip_pretrain.py --config.total_steps=200
  python -m stori_jax.pretrain --config configs/tiny_clip_weight_response.py   # second stage

Every step draws a fresh batch from the generator, seeded by (seed, step), so
a run killed at any point and restarted with the same workdir resumes from its
last checkpoint to exactly the same result. Writes run.json (the config that made the
workdir), metrics.jsonl, orbax checkpoints and, at the end, training_curve.png and the model in
this project's format. Another config in the same workdir stops before any work (pass another
--workdir, or --restart to move the old run aside); a bad config value, or a run that diverges
(a NaN or infinite loss, gradient or weight: it stops at that step, keeping the last good
checkpoint), prints one paragraph and exits with status 2.

The stage a config names (`config.stage`) picks the library: `stori_jax.pretraining` for the
contrastive stage, `stori_jax.pretraining.weight_response` for the weight-response stage.
"""

from __future__ import annotations

import os

from absl import flags
from ml_collections import config_flags

from stori_jax.plumbing import cli
from stori_jax.trainloop import metrics_log
from stori_jax.pretraining import contrastive, weight_response
from stori_jax.plumbing.errors import UserError

EXAMPLE = "python -m stori_jax.pretrain --config configs/tiny_clip_pretrain.py"


def define_flags(values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the command's flags on `values`: only when it runs (as a program, or in a test's
  process with `cli.run_in_process`), so importing this module defines none."""
  config_flags.DEFINE_config_file(
    "config",
    None,
    "Pretraining or weight-response config file (configs/tiny_clip_*.py).",
    flag_values=values,
    lock_config=True,
  )
  flags.DEFINE_string(
    "workdir",
    None,
    "Checkpoints, metrics and the exported model go here (default: workdirs/pretrain or "
    "workdirs/weight_response); one made by the same config resumes.",
    flag_values=values,
  )
  flags.DEFINE_bool(
    "restart",
    False,
    "If the workdir holds a run of another config, move it aside to <workdir>.old-<time> and "
    "start afresh (without it such a workdir is refused).",
    flag_values=values,
  )


def main(argv: list[str], values: flags.FlagValues = flags.FLAGS) -> None:
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {argv[1:]}; flags are written --name=value")
  config = values.config
  if config is None:
    raise UserError(f"missing --config; for example: {EXAMPLE}")
  if config.get("stage") == "weight_response":
    # The second stage of the shipped tiny CLIP (configs/tiny_clip_weight_response.py).
    stage, what, default_workdir = weight_response, "weight-response training", "weight_response"
  else:
    stage, what, default_workdir = contrastive, "pretraining", "pretrain"
  workdir = values.workdir or os.path.join("workdirs", default_workdir)
  stage.train(config, workdir, restart=values.restart)
  records = metrics_log.read_records(os.path.join(workdir, "metrics.jsonl"))
  print(f"\n{what}: {config.total_steps} steps in {workdir}")
  if records:
    last = records[-1]
    shown = ", ".join(f"{k} {v:.4g}" for k, v in last.items() if k != "step")
    print(f"  step {last['step']}: {shown}")
  # export_dir is relative to the workdir unless absolute, as os.path.join reads it.
  export = [config.export_dir] if config.export_dir else []
  cli.print_outputs(
    workdir,
    ["run.json", "config.json", "metrics.jsonl", "training_curve.png", "checkpoints", *export],
  )


if __name__ == "__main__":
  define_flags()
  cli.run(main)
