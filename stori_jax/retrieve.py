r"""Preference retrieval with user-driven control (paper section 4.2, App. B, C.1, C.4, C.6).

  python -m stori_jax.retrieve --config configs/retrieval_synthetic.py --workdir workdirs/retrieval

Builds (or loads from `config.cache_dir`) the image-embedding index of the config's data,
then runs the protocol of `stori_jax.retrieval.protocol` and writes to the workdir:

* retrieval_metrics.json: every number (per prompt and attribute, summaries, sweeps);
* retrieval_tables.md: tables shaped like the paper's Tables 3-6 and the AUC sweep;
* fig4_ranking.png, fig5_auc_sweep.png, fig6_prompt_weighting.png, fig9a_start_block.png,
  fig9b_single_block.png;
* with a config that names `models` (configs/retrieval_fig5_models.py), Figure 5 for each of
  them instead (`stori_jax.retrieval.model_sweep`): fig5_models.png, fig5_models_favoured.png,
  fig5_models.json, fig5_models.md;
* run.json: the config, model and data that made these files. Running again with the same
  config redoes the run in place; another config stops before any work (pass another
  --workdir, or --restart to move the old results aside), so results of two configs are
  never mixed in one folder. A bad config value prints one paragraph and exits with status 2.
"""

from __future__ import annotations

import os

from absl import flags
from ml_collections import config_flags

from stori_jax.plumbing import cli, paths
from stori_jax.plumbing.errors import UserError
from stori_jax.retrieval import model_sweep, runner, tables


def main(argv: list[str], values: flags.FlagValues = flags.FLAGS) -> None:
  """Runs the config's protocol in its workdir and prints the tables."""
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {argv[1:]}; flags are written --name=value")
  config = values.config
  if config is None:
    raise UserError("--config is required, e.g. --config configs/retrieval_synthetic.py")
  workdir = values.workdir or os.path.join("workdirs", "retrieval", config.data.source)
  if "models" in config:  # Figure 5 for several models (configs/retrieval_fig5_models.py)
    results = model_sweep.run(config, workdir, restart=values.restart)
    print(model_sweep.markdown(results))
    cli.print_outputs(workdir, ["run.json", "fig5_models.json", "fig5_models.md", "fig5_*.png"])
    return
  results = runner.run(config, workdir, restart=values.restart)
  print(tables.report(results, config.get("table_digits", 3)))
  index = results.get("index", {})
  # The index cache lies outside the workdir; named when this run built it.
  cache = [paths.absolute(index["path"])] if index.get("path") and not index["from_cache"] else []
  cli.print_outputs(
    workdir, ["run.json", "retrieval_metrics.json", "retrieval_tables.md", "fig*.png", *cache]
  )


def define_flags(values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the command's flags (when run as a program, or on a test's own FlagValues)."""
  fv = {"flag_values": values}
  config_flags.DEFINE_config_file("config", None, "Retrieval config file.", **fv)
  flags.DEFINE_string(
    "workdir",
    None,
    "Where metrics, tables and figures go; one made by the same config is redone.",
    **fv,
  )
  flags.DEFINE_bool(
    "restart",
    False,
    "If the workdir holds results of another config, move them aside to <workdir>.old-<time> "
    "(without it such a workdir is refused).",
    **fv,
  )


if __name__ == "__main__":
  define_flags()
  cli.run(main)
