"""The sweep's run: checks, model weights, class chunks through every model, then results.json,
Table 3, Figure 3 and the MI curves in the workdir."""

from __future__ import annotations

import functools
import json
import os
import time
from typing import Any, Mapping, Sequence

import jax
from absl import logging
from tqdm import tqdm

from mutual import run_flags, data, pipeline, report
from mutual.sweep.chunk import analyze_classes
from mutual.sweep.fits import ACCURACIES, auc_accuracy_fits
from mutual.sweep.models import ModelPool, family, model_image_size, shrink_config, sweep_models
from mutual.sweep.plots import plot_auc_vs_accuracy, plot_curves
from mutual.sweep.table import RANDOM_WEIGHTS, markdown_table, table_order
from stori_jax import multihost
from stori_jax.checkpoints.errors import CheckpointError
from stori_jax.config_files import ConfigError
from stori_jax.errors import UserError
from stori_jax.models import registry


def check_config(config) -> None:
  """The sweep's own fields, checked before any work (ConfigError names the fix)."""
  if not config.models:
    raise ConfigError(
      "config.models is empty: name registered models (python -m stori_jax.list_models)."
    )
  for name in config.models:
    try:
      registry.get(name)
    except ValueError as error:  # an unknown name: the message lists the registered ones
      raise ConfigError(str(error)) from None
  if config.accuracy not in ACCURACIES:
    raise ConfigError(f"config.accuracy must be one of {ACCURACIES}, got {config.accuracy!r}.")
  if config.classes_per_chunk < 1:
    raise ConfigError(f"config.classes_per_chunk must be >= 1, got {config.classes_per_chunk}.")


#: What report.aggregate reads of an image record (the rest is dropped to bound memory).
_KEEP = (
  "mi",
  "auc",
  "curve",
  "visual_descriptors",
  "mutual_descriptors",
  "entropy",
  "entropy_without_ot",
)


def _slim(record: Mapping[str, Any]) -> dict[str, Any]:
  methods = {m: {k: v for k, v in r.items() if k in _KEEP} for m, r in record["methods"].items()}
  return dict(class_name=record["class_name"], correct=record["correct"], methods=methods)


def _class_chunks(streams: Mapping[int, Any], sizes: Sequence[int], chunk: int):
  """Yields per-size tuples of ClassImages, `chunk` classes at a time; every size must see the
  same classes in the same order."""
  batch: list[tuple] = []
  for items in zip(*(streams[size] for size in sizes)):
    if len({(c.label, len(c)) for c in items}) != 1:
      raise ConfigError("The image streams of the models' input sizes disagree; check config.data.")
    batch.append(items)
    if len(batch) == chunk:
      yield batch
      batch = []
  if batch:
    yield batch


def _model_row(config, entry: registry.ModelEntry, image_size: int, records, methods) -> dict:
  """One model's row of results.json and Table 3, from its slimmed image records."""
  summary = report.aggregate(records, methods)["dataset"]
  arch = entry.config
  if config.random_weights:
    arch = shrink_config(arch, int(config.random_models.shrink))
  return dict(
    name=entry.name,
    label=entry.label,
    family=family(arch),
    arch=entry.arch,
    data=entry.data,
    image_size=image_size,
    embed_dim=int(arch.embed_dim),
    images=summary["images"],
    top1=summary["top1"],
    reported_top1=dict(paper=entry.imagenet_paper, open_clip=entry.imagenet_open_clip),
    **{m: summary[m] for m in methods},
  )


def _write_outputs(workdir: str, config, results: Mapping[str, Any], rows, methods) -> None:
  """results.json, table.md (Table 3), fig3_auc_vs_accuracy.png and fig3_curves_<method>.png."""
  report.write_json(os.path.join(workdir, "results.json"), results)
  random_weights = bool(config.random_weights)
  table = markdown_table(rows, methods, random_weights)
  if random_weights:
    size = config.random_models.image_size
    where = f"at about {size} px" if size else "at each model's own input size"
    table += (
      f"\nRandom-weight instances {where} (an offline check of the path: the numbers carry no "
      "meaning; the last column is the trained models' Top-1 from the paper).\n"
    )
  with open(os.path.join(workdir, "table.md"), "w", encoding="utf-8") as f:
    f.write(table)
  plot_auc_vs_accuracy(
    os.path.join(workdir, "fig3_auc_vs_accuracy.png"),
    rows,
    results["fits"],
    methods,
    config.accuracy,
    title=config.name,
    random_weights=random_weights,
  )
  for method in methods:
    plot_curves(
      os.path.join(workdir, f"fig3_curves_{method}.png"),
      rows,
      method,
      title=config.name,
      random_weights=random_weights,
    )


def _shard_path(workdir: str, chunk: int) -> str:
  """Where a multi-process sweep keeps one class chunk's slimmed records for process 0."""
  return os.path.join(workdir, "shards", f"chunk_{chunk:05d}.json")


def _read_shards(workdir: str, n_chunks: int, n_models: int) -> list[list[dict]]:
  """Every chunk's slimmed records, per model in chunk order, as one process would hold them."""
  records: list[list[dict]] = [[] for _ in range(n_models)]
  for chunk in range(n_chunks):
    path = _shard_path(workdir, chunk)
    try:
      with open(path, encoding="utf-8") as f:
        shard = json.load(f)
    except FileNotFoundError:
      raise UserError(
        f"{path} was not found after every process finished its chunks: in a multi-process "
        "sweep the workdir must be on a filesystem all processes share (a network or cloud "
        "path), so that process 0 can aggregate the others' records."
      ) from None
    for j in range(n_models):
      records[j] += shard[j]
  return records


def run(config, workdir: str, progress: bool = True, restart: bool = False) -> dict:
  """Runs the sweep; returns results.json's content (also written with table.md and figures).

  The data (descriptor file, classes matched by name, no empty class) and every model's weights
  are checked, and the workdir claimed for this config (`restart` moves another run aside),
  before any image is read.

  In a multi-process run (jax.distributed initialised, see stori_jax.multihost) process p
  analyses the class chunks c with c % processes == p through every model and writes their
  slimmed records to workdir/shards; process 0 then reads them back in chunk order (the
  workdir must be on a filesystem all processes share) and writes the same files as one process
  writes. Other processes return {}.
  """
  check_config(config)
  if config.random_weights:  # said first: the log names the trained models throughout
    logging.warning(
      "config.random_weights: the models are instances of their architectures with %s, not "
      "the trained models (an offline check: the numbers carry no meaning).",
      RANDOM_WEIGHTS,
    )
  processes, rank = jax.process_count(), jax.process_index()
  dataset = data.prepare(config)  # a data mistake stops before any model loads
  a = config.analysis
  methods = tuple(a.methods)
  models = sweep_models(config)
  sizes_by_model = [model_image_size(config, m.entry) for m in models]
  pool = ModelPool(models, config.max_loaded_models)

  # Phase 0: registered weights are fetched / found before any image is read, so a missing one
  # stops here (or is skipped). Text banks are encoded at each model's first load.
  skipped = {}
  for model in models:
    if model.fetch is None:
      continue
    try:
      model.fetch()
    except CheckpointError as error:
      if not config.skip_missing:
        raise
      logging.warning("Skipping %s: %s", model.name, error)
      skipped[model.name] = str(error)
  kept = [i for i, model in enumerate(models) if model.name not in skipped]
  if not kept:
    raise CheckpointError("No model of config.models could be loaded (see the warnings above).")
  # Run identity once the inputs are known good (a missing model is a mistake to fix first).
  run_flags.claim_workdir(config, workdir, restart, "mutual-knowledge sweep")
  sizes = sorted({sizes_by_model[i] for i in kept})
  # One class stream per input size (each resizes the source images itself), reading the next
  # chunk's classes on a background thread while this chunk runs; a process reads only the
  # images of its own chunks.
  class_names = list(dataset.names)
  per_chunk = int(config.classes_per_chunk)

  def mine(position: int) -> bool:
    return (position // per_chunk) % processes == rank

  streams = {size: dataset.classes(size, read=mine).prefetched(per_chunk) for size in sizes}
  banks: dict[int, pipeline.TextBank] = {}
  encode = functools.partial(
    pipeline.encode_config_bank, config=config, dataset=dataset, progress=False
  )

  records: list[list[dict]] = [[] for _ in kept]
  n_images, start = 0, time.perf_counter()
  chunks = _class_chunks(streams, sizes, per_chunk)
  n_chunks = -(-len(streams[sizes[0]]) // per_chunk)  # the streams know their class count
  for index, chunk in enumerate(
    tqdm(
      chunks,
      desc="class chunks",
      total=n_chunks,
      disable=not progress or rank != 0,
      dynamic_ncols=True,
    )
  ):
    n_images += sum(len(items[0]) for items in chunk)
    if index % processes != rank:
      continue
    class_images = [[items[sizes.index(sizes_by_model[i])] for items in chunk] for i in kept]
    results = analyze_classes(
      pool, kept, banks, class_images, a, methods, progress and rank == 0, encode
    )
    chunk_records: list[list[dict]] = [[] for _ in kept]
    for j, i in enumerate(kept):
      for c, cls in enumerate(class_images[j]):
        image_records = report.image_records(
          cls, results[j][c], banks[i].descriptors, class_names, methods
        )
        if config.per_image:
          for k, record in enumerate(image_records):
            report.write_json(
              os.path.join(
                workdir, "per_image", models[i].name, f"{cls.label:04d}", f"{k:05d}.json"
              ),
              record,
            )
        chunk_records[j] += [_slim(r) for r in image_records]
    if processes > 1:
      report.write_json(_shard_path(workdir, index), chunk_records)
    else:
      for j in range(len(kept)):
        records[j] += chunk_records[j]
  seconds = time.perf_counter() - start
  if not n_images:
    raise ConfigError("No images were analysed: check config.data (classes, images_per_class).")
  if processes > 1:
    multihost.wait_for_all_processes("mutual.sweep: chunks done")
    if rank != 0:
      return {}
    records = _read_shards(workdir, n_chunks, len(kept))

  rows = [
    _model_row(config, models[i].entry, sizes_by_model[i], records[j], methods)
    for j, i in enumerate(kept)
  ]
  fits = auc_accuracy_fits(rows, methods, config.accuracy)
  results = dict(
    models={r["name"]: r for r in rows},
    order=[r["name"] for r in table_order(rows)],
    fits=fits,
    accuracy=config.accuracy,
    weights="random" if config.random_weights else "registered",
    skipped=skipped,
    images_per_model=n_images,
    **({"skipped_classes": dataset.skipped} if dataset.skipped else {}),
    config=config.to_dict(),
  )
  _write_outputs(workdir, config, results, rows, methods)
  # Timing and load counts vary run to run: returned and logged, kept out of results.json.
  results.update(seconds=round(seconds, 3), model_loads=pool.loads)
  logging.info(
    "%d models (%s) x %d images in %.1f s (%d model loads)",
    len(rows),
    RANDOM_WEIGHTS if config.random_weights else "registered weights",
    n_images,
    seconds,
    pool.loads,
  )
  return results
