r"""Measures which text block SToRI should start reweighting at, for any model (the paper's
App. C.6, generalised; see stori_jax.retrieval.start_block_sweep).

  python -m stori_jax.start_block --model tiny-synthetic
  python -m stori_jax.start_block --model checkpoints/clip-vit-base-patch32 \
      --data_config configs/retrieval_celeba3.py --workdir workdirs/start_block_b32

Prints a table (one row per start block: dAP and category-AUC gap per unit log-weight, and
the effect of weight 0) and the recommended default, and writes start_block.json and
start_block.png to the workdir. To make the recommendation a model's default, set
`text.default_start_block` in its stori_config.json (python -m stori_jax.convert writes one).
"""

from __future__ import annotations

import os

from absl import flags

import stori_jax
from stori_jax.plumbing import cli, jsonio, paths, run_identity
from stori_jax.plumbing.config_files import load_config
from stori_jax.plumbing.errors import UserError
from stori_jax.retrieval import start_block_sweep


def define_flags(values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the command's flags (when run as a program, or on a test's own FlagValues)."""
  fv = {"flag_values": values}
  flags.DEFINE_string(
    "model", "tiny-synthetic", "Model to measure (any stori_jax.load source).", **fv
  )
  flags.DEFINE_string(
    "data_config",
    "configs/retrieval_synthetic.py",
    "Retrieval config whose `data` block is the probe set (prompts with several attributes).",
    **fv,
  )
  flags.DEFINE_string("workdir", "workdirs/start_block", "Where the table and plot go.", **fv)
  flags.DEFINE_bool(
    "restart",
    False,
    "Move a workdir made for another model or probe set aside instead of refusing it.",
    **fv,
  )


def main(argv: list[str], values: flags.FlagValues = flags.FLAGS) -> None:
  """Measures the start blocks of --model, writes the table and plot, prints the advice."""
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {argv[1:]}; flags are written --name=value")

  path, _, argument = values.data_config.partition(":")
  if not paths.isfile(path):
    raise UserError(f"--data_config: no config file {path}; pass a retrieval config (.py).")
  data_config = load_config(path, argument or None)
  start_block_sweep.check_probe_config(data_config, f"--data_config {values.data_config}")
  run_identity.claim_run(
    values.workdir,
    {"model": values.model, "data": data_config.data},
    what="start-block measurement",
    restart=values.restart,
  )
  bundle = stori_jax.load(values.model)
  sweep = start_block_sweep.measure(
    bundle, data_config.data, cache_dir=data_config.get("cache_dir")
  )
  paths.makedirs(values.workdir, exist_ok=True)
  jsonio.write_json(
    os.path.join(values.workdir, "start_block.json"), {"model": values.model, **sweep}, indent=1
  )
  start_block_sweep.plot_sweep(
    sweep,
    os.path.join(values.workdir, "start_block.png"),
    f"{values.model}: response to token weights by first reweighted block ({sweep['data']})",
  )
  default = stori_jax.models.default_start_block(bundle.config.text)
  print(
    f"{values.model} on {sweep['data']} ({sweep['n_tasks']} prompts, {sweep['n_images']} images)"
  )
  print(start_block_sweep.format_table(sweep))
  print(f"recommended start block: {sweep['recommended']} (the model's default: {default})")
  cli.print_outputs(values.workdir, ["run.json", "start_block.json", "start_block.png"])


if __name__ == "__main__":
  define_flags()
  cli.run(main)
