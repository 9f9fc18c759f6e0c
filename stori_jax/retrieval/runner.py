"""The retrieval run behind `python -m stori_jax.retrieve`: the config's checks, the image index
(built or read from `config.cache_dir`), the protocol of `retrieval.protocol`, and the files it
writes to the workdir (metrics JSON, tables, figures, run.json). See the command's docstring."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
from absl import logging

import stori_jax
from stori_jax.plumbing import jsonio, run_identity
from stori_jax.clip.bundle import resolve_start_block
from stori_jax.plumbing.config_files import ConfigChecks, ConfigError
from stori_jax.plumbing.errors import InputError, UserError
from stori_jax.retrieval import attribute_selection, datasets, index, plots, protocol, tables

METHODS = ("stori", "prompt_weighting")
DATA_SOURCES = ("synthetic", "celeba", "celeba_tfds", "cub")
NORMALIZE = ("share", "recall")
#: Config keys that change how the work is batched, cached or printed, not a number it
#: reports: another value may reuse the workdir (every output file is rewritten anyway).
IDENTITY_IGNORED = ("cache_dir", "batch_size", "table_digits", "figure_weights")


def _blocks(value, layers: int, key: str = "sweep blocks") -> list[int]:
  """A config's block list: "all" (1..layers), "none", or block numbers ("1,4,7", "(1,4)")."""
  if isinstance(value, str):
    text = value.strip().strip("()[] ")
    if text in ("all", "none", ""):
      return list(range(1, layers + 1)) if text == "all" else []
    try:
      value = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
      raise ConfigError(
        f"{key}: block lists are 'all', 'none' or numbers like '1,4,7', got {value!r}"
      ) from None
  if not isinstance(value, (tuple, list)) or not all(isinstance(b, int) for b in value):
    raise ConfigError(
      f"{key}: block lists are 'all', 'none' or numbers like '1,4,7', got {value!r}"
    )
  blocks = [int(b) for b in value]
  bad = [b for b in blocks if not 1 <= b <= layers]
  if bad:
    raise ConfigError(f"{key}: blocks {bad} are outside the text tower's 1..{layers}")
  return blocks


def validate_config(config) -> None:
  """Checks every value for type and range before any work; one ConfigError names them all.

  What depends on the model (block numbers) or the data (task and attribute indices) is
  checked as soon as they are loaded, before the index is built.
  """
  checks = ConfigChecks(config)
  checks.text("model", nonempty=True)
  if "cache_dir" in config:
    checks.text("cache_dir")
  checks.integer("batch_size", minimum=1)
  checks.numbers("weights", minimum=0)
  if "precision_k" in config:
    checks.integer("precision_k", minimum=0)
  checks.numbers("pair_weights", minimum=0, count=2)
  checks.subset("methods", METHODS)
  if "start_block" in config:
    checks.integer("start_block", minimum=1, optional=True)
  if "table_digits" in config:
    checks.integer("table_digits", minimum=0, maximum=12)
  checks.numbers("figure_weights", minimum=0, count=2)
  checks.integers("sweep.tasks", minimum=0, nonempty=False)
  checks.integers("sweep.attributes", minimum=0, count=2, distinct=True)
  # The pair sweep gives one attribute w and another 1 - w: both must stay >= 0.
  checks.numbers("sweep.ws", minimum=0, maximum=1)
  checks.numbers("sweep.single_ws", minimum=0)
  checks.choice("sweep.normalize", NORMALIZE)
  source = checks.choice("data.source", DATA_SOURCES)
  if source == "synthetic":
    checks.integer("data.n_triples", minimum=1)
    checks.integer("data.images_per_category", minimum=1)
  elif source is not None and config.data.get("images_per_category") is not None:
    checks.integer("data.images_per_category", minimum=1)
  if "attributes" in config:
    chosen = checks.choice("attributes.source", attribute_selection.SOURCES)
    checks.number("attributes.threshold", minimum=0, maximum=1)
    checks.choice("attributes.split", attribute_selection.SPLITS)
    checks.integer("attributes.max_images", minimum=0)
    checks.integer("attributes.min_category_images", minimum=0)
    checks.integer("attributes.n_images", minimum=2)
    if chosen == "auroc" and source == "celeba_tfds":
      checks.problem(
        "config.attributes.source='auroc' reads CelebA's attribute table and test split from a "
        "folder: use data.source='celeba' with data.root (list_attr_celeba.txt, "
        "list_eval_partition.txt, img_align_celeba/)"
      )
  checks.raise_if_any()


def identity(config, bundle=None) -> dict[str, Any]:
  """What decides the results: the resolved config, the model and the data folder."""
  if bundle is not None:  # a model passed in: its own source names it
    model = getattr(bundle, "source", "") or str(config.model)
  else:
    model = run_identity.content_identity(str(config.model))
  return {
    "config": config,
    "model": model,
    "data": {"root": run_identity.absolute_path(config.data.get("root") or "")},
  }


def _precision_k(config) -> int | None:
  k = int(config.get("precision_k", 0) or 0)
  return k if k > 0 else None


def _check_against_data(config, tasks, bundle) -> None:
  """The config's block numbers, task and attribute indices against the model and data."""
  resolve_start_block(bundle, config.get("start_block"), "config.start_block")
  layers = int(bundle.config.text.layers)
  _blocks(config.sweep.start_blocks, layers, "config.sweep.start_blocks")
  _blocks(config.sweep.single_blocks, layers, "config.sweep.single_blocks")
  bad = [i for i in config.sweep.tasks if not 0 <= int(i) < len(tasks)]
  if bad:
    raise ConfigError(
      f"config.sweep.tasks {bad} are not task indices 0..{len(tasks) - 1} of the data's "
      f"{len(tasks)} prompts"
    )
  chosen = [tasks[int(i)] for i in config.sweep.tasks] if len(config.sweep.tasks) else tasks
  attributes = list(config.sweep.attributes)
  for task in chosen:
    if max(attributes) >= task.n_attributes:
      raise ConfigError(
        f"config.sweep.attributes {attributes} must be attribute indices of task {task.name!r}, "
        f"which has {task.n_attributes} attributes (0..{task.n_attributes - 1})"
      )


def run(config, workdir: str, bundle=None, restart: bool = False) -> dict[str, Any]:
  """Runs the whole protocol for a config; returns the results written to workdir.

  Args:
    config: a retrieval config (configs/retrieval_*.py).
    workdir: where results go; one made by the same config is redone in place.
    bundle: the model (default: `stori_jax.load(config.model)`).
    restart: move a workdir made by another config aside instead of refusing it.

  Raises:
    ConfigError: a bad config value (before the index is built).
    WorkdirMismatchError: the workdir holds results of another config, is a file or is not
      writable (before any work).
    InputError: the data cannot be read as the config describes it.
  """
  validate_config(config)
  run_identity.claim_run(
    workdir,
    identity(config, bundle),
    what="retrieval run",
    restart=restart,
    ignore=IDENTITY_IGNORED,
  )
  if bundle is None:
    bundle = stori_jax.load(config.model)
  started = time.perf_counter()
  selection = None
  try:
    if "attributes" in config and config.attributes.source == "auroc":
      config, selection = _recompute_attributes(bundle, config)
    data = datasets.build_data(config.data, int(bundle.config.vision.image_size))
  except UserError:
    raise
  except (ValueError, FileNotFoundError) as e:
    # The data folder or the config's data block does not fit the data source.
    raise InputError(f"config.data ({config.data.source}): {e}") from None
  if not data.tasks:
    raise ConfigError(f"data {data.name!r} defines no prompts (tasks)")
  _check_against_data(config, list(data.tasks), bundle)
  idx = index.build_index(bundle, data, config.get("cache_dir") or None, config.batch_size)
  logging.info("index: %s (%s)", idx.path, "cached" if idx.from_cache else "built")
  emb, tasks = idx.embeddings, list(data.tasks)
  k, batch = _precision_k(config), config.batch_size
  methods = tuple(config.methods)
  results: dict[str, Any] = {
    "model": str(config.model),
    "data": data.name,
    "data_spec": dict(data.spec),
    "n_tasks": len(tasks),
    "n_images": len(data.keys),
    "index": {"path": idx.path, "from_cache": idx.from_cache},
    "prompts": [t.prompt() for t in tasks],
    "attribute_selection": selection,
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
  # Strict JSON: a NaN score (a broken model) raises NonFiniteError instead of writing "NaN".
  jsonio.write_json(os.path.join(workdir, "retrieval_metrics.json"), results, indent=1)
  tables_text = tables.report(results, config.get("table_digits", 3))
  jsonio.write_text_atomic(os.path.join(workdir, "retrieval_tables.md"), tables_text)
  return results


def _recompute_attributes(bundle, config):
  """The config with its prompts (or the embedded world's prompt values) chosen by zero-shot
  AUROC (`attribute_selection.recompute`), and the selection report. The sweep keeps its
  prompts where they are recomputed too (by their text), else sweeps the first prompt."""
  data, selection = attribute_selection.recompute(
    bundle, config, config.get("cache_dir") or None, config.batch_size
  )
  config = config.copy_and_resolve_references()
  if config.data.source != "synthetic" and len(config.sweep.tasks):

    def text(prompt):
      return prompt["template"].format(*(row[1] for row in prompt["attributes"]))

    new = [text(p) for p in data.prompts]
    old = [text(config.data.prompts[int(i)]) for i in config.sweep.tasks]
    tasks = tuple(new.index(t) for t in old if t in new) or (0,)
    selection["sweep_prompts"] = [new[i] for i in tasks]
    config.sweep.tasks = tasks
  config.data = data
  return config, selection


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
