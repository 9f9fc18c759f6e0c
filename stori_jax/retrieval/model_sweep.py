"""SToRI's Figure 5 across models (section 4.2: "the effect of weight control is consistent across
different CLIP models, such as CLIP ViT-B/16, CLIP ViT-L/14, OpenCLIP and MetaCLIP"): the AUC sweep
of `protocol.auc_sweep` (w on one attribute, 1 - w on another) run for every model of
`config.models` in one run, one panel and one line per model. `python -m stori_jax.retrieve` runs
it when the config names `models` (configs/retrieval_fig5_models.py).

A model is anything `stori_jax.load` takes (a registry name, a shipped checkpoint such as
tiny-synthetic, a path or hub id), or "random:<registry name>": a random-weight instance of that
architecture (`stori_jax.clip.loading.random_instance`, sized by config.random_models), the offline
stand-in. Each model gets its own data at its input size, its own cached index and its own start
block (config.start_block None: the model's default, block 7 of 12 for the paper's models), and
the same sweep as `retrieve`'s "stori_pair" sweep for that model alone (tested equal).

Writes to the workdir:
  fig5_models.png           Figure 5 per model: every category's mean AUC against w
  fig5_models_favoured.png  the favoured category's AUC against w, one line per model (left), and
                            its change from the first w (right)
  fig5_models.json          per model: its source, label, start block and auc_sweep result
  fig5_models.md            a summary row per model, then each model's AUC table
  run.json                  the run's identity (config and models)
"""

from __future__ import annotations

import os
import time
from typing import Any, Sequence

import numpy as np
from absl import logging
from tqdm import tqdm

import stori_jax
from stori_jax.plumbing import jsonio, paths, run_identity
from stori_jax.clip import loading
from stori_jax.clip.bundle import resolve_start_block
from stori_jax.checkpoints import hub
from stori_jax.plumbing.config_files import ConfigChecks, ConfigError
from stori_jax.plumbing.errors import InputError, UserError
from stori_jax.models import registry
from stori_jax.plumbing.plotting import pyplot, save_figure
from stori_jax.retrieval import datasets, index, plots, protocol, tables

#: The prefix of a random-weight instance's name in config.models.
RANDOM = "random:"
#: Figure 5's models in the paper's words: CLIP ViT-B/16 and ViT-L/14 (OpenAI), OpenCLIP (which
#: the paper does not specify: LAION-2B ViT-L/14, its other models' size) and MetaCLIP ViT-L/14
#: (the 2.5B data of SToRI's few-shot runs).
PAPER_MODELS = ("openai-vit-b-16", "openai-vit-l-14", "laion2b-vit-l-14", "metaclip-2.5b-vit-l-14")
NORMALIZE = ("share", "recall")
DATA_SOURCES = ("synthetic", "celeba", "celeba_tfds", "cub")
#: Keys that change how the work is cached or batched, not a number it reports.
IDENTITY_IGNORED = ("cache_dir", "batch_size")


def validate_config(config) -> None:
  """Every value checked for type and range before any work (one ConfigError names them all)."""
  checks = ConfigChecks(config)
  models = checks.get("models")
  if not isinstance(models, (tuple, list)) or not models:
    checks.problem(f"config.models must be a tuple of one or more model names, got {models!r}")
  else:
    for name in models:
      if not isinstance(name, str) or not name.strip():
        checks.problem(f"config.models holds {name!r}, not a model name")
      elif name.startswith(RANDOM) and registry.find(name[len(RANDOM) :]) is None:
        checks.problem(
          f"config.models' {name!r} is no registered architecture (random:<name> takes one of "
          f"{', '.join(registry.names())})"
        )
    if len(set(models)) != len(models):
      checks.problem(f"config.models names a model twice: {models!r}")
  checks.text("models_dir")
  checks.text("cache_dir")
  checks.integer("batch_size", minimum=1)
  checks.integer("start_block", minimum=1, optional=True)
  checks.integer("random_models.image_size", minimum=0)
  checks.integer("random_models.shrink", minimum=1)
  checks.integer("random_models.seed", minimum=0)
  checks.integers("sweep.tasks", minimum=0, nonempty=False)
  checks.integers("sweep.attributes", minimum=0, count=2, distinct=True)
  checks.numbers("sweep.ws", minimum=0, maximum=1)  # a gets w, b gets 1 - w: both >= 0
  checks.choice("sweep.normalize", NORMALIZE)
  checks.choice("data.source", DATA_SOURCES)
  checks.raise_if_any()


def label(name: str) -> str:
  """How the figures and tables name a model: the registry's label (random instances say so),
  else the source as given."""
  random = name.startswith(RANDOM)
  entry = registry.find(name[len(RANDOM) :] if random else name)
  if entry is None:
    return name
  return f"{entry.label} (random weights)" if random else entry.label


def load_model(name: str, config):
  """The CLIPBundle of one entry of config.models."""
  if name.startswith(RANDOM):
    r = config.random_models
    return loading.random_instance(
      name[len(RANDOM) :], int(r.image_size), int(r.shrink), int(r.seed)
    )
  return stori_jax.load(name, models_dir=config.models_dir or None)


def fetch_registered(models: Sequence[str], models_dir: str = "") -> None:
  """Makes sure every registered model's weights are here (local copy, HF cache or download)
  before any work; CheckpointError names what to fetch and where to put it."""
  for name in models:
    entry = registry.find(name) if not name.startswith(RANDOM) else None
    if entry is not None and not paths.exists(name):
      hub.fetch_weights(entry.name, entry.hf_repo, entry.weights_files, models_dir or None)


def identity(config) -> dict[str, Any]:
  """What decides the results: the config and each model's contents where it is a local path."""
  return {
    "config": config,
    "models": [run_identity.content_identity(str(m)) for m in config.models],
    "data": {"root": run_identity.absolute_path(config.data.get("root") or "")},
  }


def sweep_model(bundle, config) -> dict[str, Any]:
  """One model's Figure 5: its data at its input size, its index, then `protocol.auc_sweep` of
  the chosen tasks with SToRI from config.start_block (None: the model's default)."""
  start = resolve_start_block(bundle, config.get("start_block"), "config.start_block")
  try:
    data = datasets.build_data(config.data, int(bundle.config.vision.image_size))
  except UserError:
    raise
  except (ValueError, FileNotFoundError) as e:
    raise InputError(f"config.data ({config.data.source}): {e}") from None
  tasks = list(data.tasks)
  if not tasks:
    raise ConfigError(f"data {data.name!r} defines no prompts (tasks)")
  bad = [i for i in config.sweep.tasks if not 0 <= int(i) < len(tasks)]
  if bad:
    raise ConfigError(
      f"config.sweep.tasks {bad} are not task indices 0..{len(tasks) - 1} of the data's prompts"
    )
  chosen = [tasks[int(i)] for i in config.sweep.tasks] if len(config.sweep.tasks) else tasks
  attributes = tuple(int(a) for a in config.sweep.attributes)
  short = [t.name for t in chosen if max(attributes) >= t.n_attributes]
  if short:
    raise ConfigError(
      f"config.sweep.attributes {list(attributes)} must be attribute indices of every chosen "
      f"task; {short[:3]} have fewer attributes"
    )
  idx = index.build_index(bundle, data, config.cache_dir or None, config.batch_size)
  sweep = protocol.auc_sweep(
    bundle,
    idx.embeddings,
    chosen,
    config.sweep.ws,
    attributes,
    True,
    protocol.Setting("stori", config.get("start_block")),
    config.sweep.normalize,
    config.batch_size,
  )
  focus = [row[sweep["focus"]] for row in sweep["mean_auc"]]
  return {
    "start_block": start,
    "prompt": chosen[0].prompt() if len(chosen) == 1 else f"mean over {len(chosen)} prompts",
    "index": {"path": idx.path, "from_cache": idx.from_cache},
    "focus_auc_monotonic": protocol.is_monotonic(focus),
    "sweep": sweep,
  }


def run(config, workdir: str, restart: bool = False, progress: bool = True) -> dict[str, Any]:
  """Runs Figure 5 for every model of the config; returns what fig5_models.json holds.

  The config is checked, registered weights are found (or fetched), and the workdir is claimed
  before any model loads; then one model at a time is loaded, swept and dropped.
  """
  validate_config(config)
  fetch_registered(config.models, config.models_dir)
  run_identity.claim_run(
    workdir,
    identity(config),
    what="retrieval run over models",
    restart=restart,
    ignore=IDENTITY_IGNORED,
  )
  started = time.perf_counter()
  models: dict[str, Any] = {}
  for name in tqdm(config.models, desc="models", disable=not progress, dynamic_ncols=True):
    bundle = load_model(name, config)
    result = sweep_model(bundle, config)
    del bundle  # one model held at a time
    models[name] = {"label": label(name), "source": name, **result}
    focus = [row[result["sweep"]["focus"]] for row in result["sweep"]["mean_auc"]]
    logging.info("%s: favoured category's AUC %.4f -> %.4f", name, focus[0], focus[-1])
  results = {
    "models": models,
    "order": list(config.models),
    "attributes": list(config.sweep.attributes),
    "ws": [float(w) for w in config.sweep.ws],
    "normalize": config.sweep.normalize,
    "seconds": round(time.perf_counter() - started, 2),
  }
  write_outputs(workdir, results, config.get("name", "retrieval_fig5_models"))
  return results


# ---------------------------------------------------------------------------------------------
# Outputs.


def markdown(results) -> str:
  """A summary row per model (start block, the favoured category, its AUC at the first, middle
  and last w, whether it rises with w), then each model's AUC table (`tables.sweep_table`)."""
  ws = results["ws"]
  picks = sorted({0, len(ws) // 2, len(ws) - 1})
  head = ["Model", "start block", "favoured category"]
  head += [f"AUC at w = {ws[i]:g}" for i in picks] + ["rises with w"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for name in results["order"]:
    m = results["models"][name]
    sweep = m["sweep"]
    focus = sweep["focus"]
    cells = [m["label"], str(m["start_block"]), sweep["category_names"][focus]]
    cells += [f"{sweep['mean_auc'][i][focus]:.4f}" for i in picks]
    cells.append("yes" if m["focus_auc_monotonic"] else "no")
    lines.append("| " + " | ".join(cells) + " |")
  text = "## Figure 5 across models: the favoured category's AUC\n\n" + "\n".join(lines) + "\n"
  for name in results["order"]:
    m = results["models"][name]
    text += f"\n## {m['label']}: {m['prompt']}\n\n{tables.sweep_table(m['sweep'])}\n"
  return text


def plot_favoured(path: str, results, title: str = "") -> None:
  """The favoured category's mean AUC against w, one line per model (left), and its change from
  the first swept weight (right), which compares models whose AUC levels differ."""
  plt = pyplot()
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
  first = results["models"][results["order"][0]]["sweep"]
  for name in results["order"]:
    m = results["models"][name]
    sweep = m["sweep"]
    auc = np.asarray(sweep["mean_auc"])[:, sweep["focus"]]
    for ax, values in zip(axes, (auc, auc - auc[0])):
      ax.plot(
        sweep["ws"], values, marker="o", ms=3, label=f"{m['label']} (from block {m['start_block']})"
      )
  favoured = first["category_names"][first["focus"]]
  for ax, what in zip(axes, ("mean AUC", f"mean AUC minus its value at w = {first['ws'][0]:g}")):
    ax.set_xlabel(tables.weight_label(first), fontsize=8)
    ax.set_ylabel(f"{what} ({first['normalize']})", fontsize=8)
    ax.set_title(f"favoured category: {favoured}", fontsize=9)
  axes[1].axhline(0.0, color="0.6", lw=0.8)
  axes[1].legend(
    fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5), frameon=False, title="model"
  )
  fig.suptitle(title or "Figure 5 across models", fontsize=10)
  fig.tight_layout()
  save_figure(fig, path, dpi=110)
  plt.close(fig)


def write_outputs(workdir: str, results, name: str) -> None:
  """fig5_models.json / .md / .png and fig5_models_favoured.png."""
  paths.makedirs(workdir, exist_ok=True)
  jsonio.write_json(os.path.join(workdir, "fig5_models.json"), results, indent=1)
  jsonio.write_text_atomic(os.path.join(workdir, "fig5_models.md"), markdown(results))
  first = results["models"][results["order"][0]]
  panels = [
    (
      f"{results['models'][n]['label']}, from block {results['models'][n]['start_block']}",
      results["models"][n]["sweep"],
    )
    for n in results["order"]
  ]
  plots.sweep_figure(
    os.path.join(workdir, "fig5_models.png"),
    panels,
    ncols=min(4, len(panels)),
    suptitle=f"{name}: {first['prompt']}",
  )
  plot_favoured(
    os.path.join(workdir, "fig5_models_favoured.png"), results, f"{name}: {first['prompt']}"
  )
