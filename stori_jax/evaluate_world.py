r"""Evaluates a CLIP bundle on the synthetic attribute world: zero-shot accuracy per attribute,
image-caption retrieval and SToRI's emphasis effect (the measurements of `stori_jax.world_evaluation.metrics`).

  python -m stori_jax.evaluate_world --source tiny-synthetic --output_dir workdirs/eval

Writes synthetic_world_eval.json and synthetic_world_eval.md to --output_dir and prints the tables.
"""

from __future__ import annotations

import os

import numpy as np
from absl import flags

import stori_jax
from stori_jax.plumbing import cli, jsonio, paths
from stori_jax.world_evaluation import metrics as world_metrics
from stori_jax.clip.bundle import START_BLOCK_NONE, resolve_start_block
from stori_jax.plumbing.config_files import ConfigError
from stori_jax.clip.encoding import BATCH_SIZE
from stori_jax.plumbing.errors import UserError


def define_flags(values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the command's flags (when run as a program, or on a test's own FlagValues)."""
  fv = {"flag_values": values}
  flags.DEFINE_string(
    "source",
    "tiny-synthetic",
    "Model: a named checkpoint or a path (anything stori_jax.load accepts).",
    **fv,
  )
  flags.DEFINE_string(
    "output_dir",
    os.path.join("workdirs", "eval"),
    "Where synthetic_world_eval.json and .md are written.",
    **fv,
  )
  flags.DEFINE_integer("n_images", 1000, "Zero-shot classification images.", **fv)
  flags.DEFINE_integer("n_pairs", 1000, "Retrieval image-caption pairs.", **fv)
  flags.DEFINE_integer("n_triples", 24, "Emphasis prompts (attribute triples).", **fv)
  flags.DEFINE_integer(
    "images_per_category", 8, "Emphasis images per category (8 categories).", **fv
  )
  flags.DEFINE_list("weights", ["0.5", "1.0", "1.5"], "Emphasis weights.", **fv)
  flags.DEFINE_integer(
    "start_block",
    None,
    f"First reweighted text block (1-indexed); {START_BLOCK_NONE}.",
    **fv,
  )
  flags.DEFINE_integer("batch_size", BATCH_SIZE, "Images / texts per encode call.", **fv)


def _check_flags(config) -> None:
  """Every count >= 1 and every weight finite and >= 0, before any work (--start_block is
  checked against the model once it is loaded)."""
  problems = [
    f"--{name} must be >= 1, got {getattr(config, name)}"
    for name in ("n_images", "n_pairs", "n_triples", "images_per_category", "batch_size")
    if getattr(config, name) < 1
  ]
  weights = []
  for text in config.weights:
    try:
      weights.append(float(text))
    except ValueError:
      problems.append(f"--weights must be numbers, got {text!r}")
  if any(not np.isfinite(w) or w < 0 for w in weights):
    problems.append(f"--weights must be finite and >= 0, got {config.weights}")
  if paths.exists(config.output_dir) and not paths.isdir(config.output_dir):
    problems.append(f"--output_dir {config.output_dir} is a file, not a folder")
  if problems:
    raise ConfigError("; ".join(problems) + ". Nothing was run.")


def main(argv: list[str], values: flags.FlagValues = flags.FLAGS) -> None:
  """Evaluates --source on the synthetic world and writes the tables to --output_dir."""

  if len(argv) > 1:
    raise UserError(f"unexpected arguments {argv[1:]}; flags are written --name=value")
  config = values
  _check_flags(config)
  # Fail on an unwritable output folder now, not after the evaluation.
  paths.check_location(config.output_dir)  # gs://: the bucket, the credentials, a write
  try:
    paths.makedirs(config.output_dir, exist_ok=True)
  except OSError as e:
    raise UserError(f"cannot create --output_dir {config.output_dir}: {e.strerror}") from None
  if not paths.is_remote(config.output_dir) and not os.access(config.output_dir, os.W_OK):
    raise UserError(f"--output_dir {config.output_dir} is not writable; pass another")
  bundle = stori_jax.load(config.source)
  resolve_start_block(bundle, config.start_block, "--start_block")
  results = world_metrics.evaluate(
    bundle,
    n_images=config.n_images,
    n_pairs=config.n_pairs,
    n_triples=config.n_triples,
    images_per_category=config.images_per_category,
    weights=[float(w) for w in config.weights],
    batch_size=config.batch_size,
    start_block=config.start_block,
  )
  results["source"] = config.source
  text = world_metrics.markdown_tables(results)
  print(text)
  # Strict JSON (a NaN from a broken model raises instead of being written), atomic files:
  # both are rewritten whole on every run, so no result of an earlier run is ever mixed in.
  jsonio.write_json(os.path.join(config.output_dir, "synthetic_world_eval.json"), results, indent=1)
  jsonio.write_text_atomic(os.path.join(config.output_dir, "synthetic_world_eval.md"), text)
  print(f"evaluated in {results['seconds']} s")
  cli.print_outputs(config.output_dir, ["synthetic_world_eval.json", "synthetic_world_eval.md"])


if __name__ == "__main__":
  define_flags()
  cli.run(main)
