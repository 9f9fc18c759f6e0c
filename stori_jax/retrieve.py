r"""Preference retrieval with user-driven control (paper section 4.2, App. B, C.1, C.4, C.6).

  python -m stori_jax.retrieve --config configs/retrieval_synthetic.py --workdir workdirs/retrieval

Builds (or loads from `config.cache_dir`) the image-embedding index of the config's data,
then runs the protocol of `stori_jax.retrieval.protocol` and writes to the workdir:

* retrieval_metrics.json: every number (per prompt and attribute, summaries, sweeps);
* retrieval_tables.md: tables shaped like the paper's Tables 3-6 and the AUC sweep;
* fig4_ranking.png, fig5_auc_sweep.png, fig6_prompt_weighting.png, fig9a_start_block.png,
  fig9b_single_block.png.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import numpy as np
from absl import app, flags, logging
from ml_collections import config_flags

from stori_jax.retrieval import datasets, index, plots, protocol, tables


def _blocks(value, layers: int) -> list[int]:
  """A config's block list: "all" (1..layers), "none", or block numbers ("1,4,7", "(1,4)")."""
  if isinstance(value, str):
    text = value.strip().strip("()[] ")
    if text in ("all", "none", ""):
      return list(range(1, layers + 1)) if text == "all" else []
    try:
      value = [int(b) for b in text.split(",") if b.strip()]
    except ValueError as e:
      raise ValueError(
        f"block lists are 'all', 'none' or numbers like '1,4,7', got {value!r}"
      ) from e
  blocks = [int(b) for b in value]
  bad = [b for b in blocks if not 1 <= b <= layers]
  if bad:
    raise ValueError(f"blocks {bad} are outside the text tower's 1..{layers}")
  return blocks


def _precision_k(config) -> int | None:
  k = int(config.get("precision_k", 0) or 0)
  return k if k > 0 else None


def run(config, workdir: str, bundle=None) -> dict[str, Any]:
  """Runs the whole protocol for a config; returns the results written to workdir."""
  import stori_jax  # pylint: disable=import-outside-toplevel

  if bundle is None:
    bundle = stori_jax.load(config.model)
  os.makedirs(workdir, exist_ok=True)
  started = time.perf_counter()
  data = datasets.build_data(config.data, int(bundle.config.vision.image_size))
  if not data.tasks:
    raise ValueError(f"data {data.name!r} defines no prompts (tasks)")
  idx = index.build_index(bundle, data, config.get("cache_dir") or None, config.batch_size)
  logging.info("index: %s (%s)", idx.path, "cached" if idx.from_cache else "built")
  emb, tasks = idx.embeddings, list(data.tasks)
  k, batch = _precision_k(config), config.batch_size
  methods = tuple(config.methods)
  unknown = set(methods) - {"stori", "prompt_weighting"}
  if unknown:
    raise ValueError(f"config.methods: unknown {sorted(unknown)}; use stori, prompt_weighting")
  results: dict[str, Any] = {
    "model": str(config.model),
    "data": data.name,
    "data_spec": dict(data.spec),
    "n_tasks": len(tasks),
    "n_images": len(data.keys),
    "index": {"path": idx.path, "from_cache": idx.from_cache},
    "prompts": [t.prompt() for t in tasks],
    "category_sizes": [np.bincount(t.categories, minlength=t.n_categories).tolist() for t in tasks],
  }
  weights = tuple(config.weights)
  start = config.get("start_block")
  stori, baseline = protocol.Setting("stori", start), protocol.Setting("prompt_weighting", start)
  results["emphasis"] = protocol.emphasis(bundle, emb, tasks, weights, stori, k, batch)
  if "prompt_weighting" in methods:
    results["emphasis_prompt_weighting"] = protocol.emphasis(
      bundle, emb, tasks, weights, baseline, k, batch
    )
  high, low = config.pair_weights
  results["pairs"] = protocol.pair_emphasis(bundle, emb, tasks, high, low, stori, k, batch)

  sweep = config.sweep
  bad = [i for i in sweep.tasks if not 0 <= int(i) < len(tasks)]
  if bad:
    raise ValueError(f"sweep.tasks {bad} are not task indices 0..{len(tasks) - 1}")
  chosen = [tasks[int(i)] for i in sweep.tasks] if len(sweep.tasks) else tasks
  attrs = tuple(sweep.attributes)
  layers = int(bundle.config.text.layers)
  settings = {"stori": stori}
  if "prompt_weighting" in methods:
    settings["prompt_weighting"] = baseline
  sweeps = {}

  def add(name, setting, ws, complement):
    sweeps[name] = protocol.auc_sweep(
      bundle, emb, chosen, ws, attrs, complement, setting, sweep.normalize, batch
    )

  for method, setting in settings.items():
    add(f"{method}_pair", setting, sweep.ws, True)
    add(f"{method}_single", setting, sweep.single_ws, False)
  for b in _blocks(sweep.start_blocks, layers):
    add(f"start_{b}", protocol.Setting(start_block=b), sweep.ws, True)
  for b in _blocks(sweep.single_blocks, layers):
    add(f"only_{b}", protocol.Setting(start_block=b, stop_block=b), sweep.ws, True)
  results["sweeps"] = sweeps
  focus = sweeps["stori_pair"]["focus"]
  focus_auc = [row[focus] for row in sweeps["stori_pair"]["mean_auc"]]
  results["focus_auc_monotonic"] = protocol.is_monotonic(focus_auc)
  results["seconds"] = round(time.perf_counter() - started, 2)

  _write_figures(bundle, emb, chosen[0], config, stori, sweeps, workdir)
  with open(os.path.join(workdir, "retrieval_metrics.json"), "w", encoding="utf-8") as f:
    json.dump(results, f, indent=1)
  with open(os.path.join(workdir, "retrieval_tables.md"), "w", encoding="utf-8") as f:
    f.write(tables.report(results, config.get("table_digits", 3)))
  return results


def _write_figures(bundle, emb, task, config, setting, sweeps, workdir: str) -> None:
  attrs = tuple(config.sweep.attributes)
  weighted = np.ones(task.n_attributes)
  weighted[attrs[0]], weighted[attrs[1]] = config.figure_weights
  rows = [np.ones(task.n_attributes), weighted]
  scores = protocol.score_tasks(bundle, emb, [task], [np.stack(rows)], setting, batch_size=8)[0]
  plots.ranking_figure(
    os.path.join(workdir, "fig4_ranking.png"),
    [(task.prompt(), scores[0]), (task.prompt(weighted), scores[1])],
    task.categories,
    task.category_names,
  )
  pair = sweeps["stori_pair"]
  n_tasks = len(pair["auc"])
  plots.sweep_figure(
    os.path.join(workdir, "fig5_auc_sweep.png"),
    [(f"{pair['label']}: AUC", pair), (f"{pair['label']}: change in AUC", pair)],
    suptitle=task.prompt() if n_tasks == 1 else f"mean over {n_tasks} prompts",
    relative=(False, True),
  )
  compare = [
    (s["label"] + (", w / 1 - w" if s["complement"] else ", w only"), s)
    for n, s in sweeps.items()
    if n.endswith(("_pair", "_single"))
  ]
  if len(compare) > 2:
    plots.sweep_figure(
      os.path.join(workdir, "fig6_prompt_weighting.png"), compare, ncols=2, relative=True
    )
  for prefix, name in (("start_", "fig9a_start_block.png"), ("only_", "fig9b_single_block.png")):
    panels = [(s["label"], s) for n, s in sweeps.items() if n.startswith(prefix)]
    if panels:
      plots.sweep_figure(os.path.join(workdir, name), panels, ncols=3, relative=True)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  config = flags.FLAGS.config
  if config is None:
    raise SystemExit("--config is required, e.g. --config configs/retrieval_synthetic.py")
  workdir = flags.FLAGS.workdir or os.path.join("workdirs", "retrieval", config.data.source)
  try:
    results = run(config, workdir)
  except (ValueError, FileNotFoundError) as e:
    raise SystemExit(f"retrieve: {e}") from e
  print(tables.report(results, config.get("table_digits", 3)))
  print(f"Wrote retrieval_metrics.json, retrieval_tables.md and figures to {workdir}")


def _define_flags():
  # Defined only when run as a program: importing this module must not claim --config.
  config_flags.DEFINE_config_file("config", None, "Retrieval config file.")
  flags.DEFINE_string("workdir", None, "Where metrics, tables and figures go.")


if __name__ == "__main__":
  _define_flags()
  app.run(main)
