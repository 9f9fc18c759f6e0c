"""The sweep's run: checks, model weights, class chunks through every model, then results.json,
Table 3, Figure 3 and the MI curves in the workdir; where the config asks, App. G's grouped
tables (`table_groups`), each model's Table 2 (`table2`) and the protocols that read each
model's images again (`model_protocols`: App. A.1's CorLoc, App. A.3's blurring)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np
from absl import logging
from tqdm import tqdm

from mutual import data, pipeline, protocols, report, run_flags
from mutual.sweep.batched import spectral_across_models
from mutual.sweep.chunk import analyze_classes
from mutual.sweep.fits import ACCURACIES, auc_accuracy_fits
from mutual.sweep.models import ModelPool, family, model_image_size, shrink_config, sweep_models
from mutual.sweep.plots import plot_auc_vs_accuracy, plot_curves, plot_figure3
from mutual.sweep.table import (
  RANDOM_WEIGHTS,
  grouped_tables,
  markdown_table,
  table2_paper_tables,
  table_order,
)
from stori_jax.plumbing import finished, jsonio, multihost, paths, workdir_layout
from stori_jax.checkpoints.errors import CheckpointError
from stori_jax.plumbing.config_files import ConfigError
from stori_jax.plumbing.errors import UserError
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
  spectral_across_models(config.spectral_across_models)  # True, False or "auto"
  check_table_groups(config.get("table_groups", ()), config.models)
  unknown = set(config.get("model_protocols", ())) - set(MODEL_PROTOCOLS)
  if unknown:
    raise ConfigError(
      f"config.model_protocols names {sorted(unknown)}; the sweep runs these per model: "
      f"{tuple(MODEL_PROTOCOLS)} (the others run in python -m mutual.evaluate)."
    )
  if config.get("table2"):
    s = config.protocols.table2
    if s.recipient not in protocols.RECIPIENTS:
      raise ConfigError(
        f"config.protocols.table2.recipient must be one of {protocols.RECIPIENTS}, got "
        f"{s.recipient!r}."
      )
    if s.aggregate not in protocols.AGGREGATES:
      raise ConfigError(
        f"config.protocols.table2.aggregate must be one of {protocols.AGGREGATES}, got "
        f"{s.aggregate!r}."
      )
    if int(s.neighbours) < 1 or int(s.added_per_class) < 0:
      raise ConfigError(
        "config.protocols.table2.neighbours must be >= 1 and added_per_class >= 0 (0: all), "
        f"got {s.neighbours} and {s.added_per_class}."
      )


def check_table_groups(groups, models) -> None:
  """App. G's groups: ((title, (model, ...)), ...), each model one of config.models."""
  for group in groups:
    if (
      len(group) != 2
      or not isinstance(group[0], str)
      or isinstance(group[1], str)
      or not all(isinstance(n, str) for n in group[1])
      or not group[1]
    ):
      raise ConfigError(
        "config.table_groups holds (title, (model, ...)) pairs, e.g. "
        f"(('Model Size', ('openai-vit-b-32', 'openai-vit-b-16')),); got {group!r}."
      )
    names = {registry.get(n).name for n in models}
    missing = [n for n in group[1] if registry.find(n) is None or registry.get(n).name not in names]
    if missing:
      raise ConfigError(
        f"config.table_groups[{group[0]!r}] names {missing}, which config.models does not "
        f"hold ({', '.join(models)}); add them to config.models or drop them from the group."
      )


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


def _random_note(config, paper_column: bool = True) -> str:
  """What a random-weight sweep's tables say under them."""
  size = config.random_models.image_size
  where = f"at about {size} px" if size else "at each model's own input size"
  column = "; the last column is the trained models' Top-1 from the paper" if paper_column else ""
  return (
    f"\nRandom-weight instances {where} (an offline check of the path: the numbers carry no "
    f"meaning{column}).\n"
  )


def _write_text(path: str, text: str) -> None:
  paths.write_text_atomic(path, text)


def _write_outputs(workdir: str, config, results: Mapping[str, Any], rows, methods) -> None:
  """results.json, table.md (Table 3), fig3_auc_vs_accuracy.png, fig3_curves_<method>.png and
  fig3_<method>.png (Figure 3's three panels);
  with config.table_groups, table_groups.md (App. G); with config.table2, table2.md and
  table2.json (Table 2)."""
  report.write_json(os.path.join(workdir, "results.json"), results)
  random_weights = bool(config.random_weights)
  note = _random_note(config, paper_column=False) if random_weights else ""
  table = markdown_table(rows, methods, random_weights)
  _write_text(os.path.join(workdir, "table.md"), table + (_random_note(config) if note else ""))
  groups = tuple(config.get("table_groups", ()))
  if groups:
    text = f"# {config.name}: MI and its dynamics (AUC) per group of models (App. G)\n\n"
    text += grouped_tables(rows, groups, methods, random_weights)
    _write_text(os.path.join(workdir, "table_groups.md"), text + note)
  if "protocols" in results:  # one table per protocol over the models (App. A.1, A.3)
    labels = {r["name"]: r["label"] for r in rows}
    by_protocol = results["protocols"]
    text = f"# {config.name}: protocols per model\n\n" + "\n".join(
      protocols.section(name, {labels[m]: r for m, r in per_model.items()})
      for name, per_model in by_protocol.items()
    )
    _write_text(os.path.join(workdir, "protocols.md"), text + note)
    report.write_json(os.path.join(workdir, "protocols.json"), by_protocol)
  if "table2" in results:
    table2 = results["table2"]
    models = [results["models"][n] for n in table2]
    text = f"# {config.name}: Table 2 (App. K), zero-shot Top-1 (%)\n\n"
    text += table2_paper_tables(models, table2)
    # Every number of the protocol (top-1, guarded rows), as mutual.evaluate writes it.
    text += "\n" + protocols.section("table2", {r["label"]: table2[r["name"]] for r in models})
    _write_text(os.path.join(workdir, "table2.md"), text + note)
    report.write_json(os.path.join(workdir, "table2.json"), table2)
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
    plot_figure3(  # the paper's layout: fixed data, fixed size, the fits
      os.path.join(workdir, f"fig3_{method}.png"),
      rows,
      results["fits"],
      method,
      config.accuracy,
      title=config.name,
      random_weights=random_weights,
    )


def _shard_path(workdir: str, chunk: int) -> str:
  """One class chunk's record of finished work (`stori_jax.plumbing.finished`), its slimmed
  records of every model in the payload, written (atomically) once the chunk is through every
  model; a resumed sweep keeps the chunk, and process 0 of a multi-process sweep reads the
  others' records there."""
  return paths.join(workdir, workdir_layout.sweep_chunk(chunk))


def _concepts_path(workdir: str, chunk: int) -> str:
  """With config.table2, one chunk's concepts of every model (`ConceptPass.class_arrays`),
  written before its record."""
  return paths.join(workdir, workdir_layout.sweep_concepts(chunk))


def _chunk_state(models: Sequence[str], classes, fingerprints) -> dict:
  """What a chunk's file records besides its records: the models and the images (ids, and for
  an image folder the files' sizes and times) they are of."""
  return dict(
    models=list(models),
    classes=[
      dict(label=int(c.label), ids=list(c.ids), fingerprint=fingerprints.get(c.label))
      for c in classes
    ],
  )


def _chunk_unit(workdir: str, chunk: int, state: dict, table2: bool) -> finished.Unit:
  """A class chunk as a unit of work: its inputs are its models and images, and whether its
  concepts are kept for Table 2."""
  return finished.Unit(
    workdir,
    f"class chunk {chunk}",
    workdir_layout.sweep_chunk(chunk),
    dict(state=state, table2=bool(table2)),
  )


def _read_shards(workdir: str, n_chunks: int, n_models: int) -> list[list[dict]]:
  """Every chunk's slimmed records, per model in chunk order, as one process would hold them."""
  records: list[list[dict]] = [[] for _ in range(n_models)]
  for chunk in range(n_chunks):
    path = _shard_path(workdir, chunk)
    try:
      with paths.open(path) as f:
        shard = json.load(f)["payload"]  # the chunk's records, per model
    except FileNotFoundError:
      raise UserError(
        f"{path} was not found after every process finished its chunks: in a multi-process "
        "sweep the workdir must be on a filesystem all processes share (a network or cloud "
        "path), so that process 0 can aggregate the others' records."
      ) from None
    for j in range(n_models):
      records[j] += shard[j]
  return records


def _remove_stale_shards(workdir: str, n_chunks: int) -> int:
  """Deletes the chunk files of an earlier run that this one does not have (fewer classes
  since); returns how many."""
  folder = os.path.join(workdir, "shards")
  ours = {p for c in range(n_chunks) for p in (_shard_path(workdir, c), _concepts_path(workdir, c))}
  removed = 0
  if paths.isdir(folder):
    for name in paths.listdir(folder):
      path = os.path.join(folder, name)
      if name.startswith("chunk_") and path not in ours:
        paths.remove(path)
        removed += 1
  return removed


def _restore_concepts(workdir, index, concepts, descriptors, n_classes, methods, chunk) -> None:
  """Adds a kept chunk's concepts of every model (its table2 file) to Table 2's passes, as
  the run that analysed it added them (`descriptors`: the bank every model's passes share)."""
  with paths.open(_concepts_path(workdir, index), "rb") as f, np.load(f) as arrays:
    for j, concept_pass in enumerate(concepts):
      if concept_pass is None:
        concept_pass = concepts[j] = protocols.ConceptPass.empty(descriptors, n_classes, methods)
      for c, items in enumerate(chunk):
        prefix = f"{j}/{c}/"
        own = {k[len(prefix) :]: arrays[k] for k in arrays.files if k.startswith(prefix)}
        concept_pass.add_arrays(items[0].label, own)


def _table2(pool: ModelPool, kept, concepts, dataset, config, progress: bool) -> dict:
  """{model name: protocols.table2_descriptor_accuracy result}, in config.models' order: each
  model classifies its own images with the descriptors, then with its own concepts added, as
  mutual.evaluate's Table 2 does for one model (the models are fetched from the pool again,
  those still held first)."""
  names, lists = list(dataset.names), dataset.lists()
  out = {}
  for index in pool.order(kept):
    j = kept.index(index)
    bundle = pool.get(index)
    out[pool.models[index].name] = protocols.table2_descriptor_accuracy(
      bundle, concepts[j], names, lists, settings=config.protocols.table2, progress=progress
    )
    del bundle  # the pool alone decides what stays loaded
  return {pool.models[i].name: out[pool.models[i].name] for i in kept}


#: The protocols the sweep runs per model (config.model_protocols): name -> its run on one
#: model, (bundle, its classes (mutual.data.ClassImages, read again at its input size), its
#: encoded text bank, config, progress) -> the protocol's JSON-ready result, exactly as
#: mutual.evaluate's run_protocols calls it for its one model (config.protocols' settings).
MODEL_PROTOCOLS: dict[str, Callable[..., dict]] = {
  "corloc": lambda bundle, classes, bank, config, progress: protocols.corloc(
    bundle, classes, config.analysis, settings=config.protocols.corloc, progress=progress
  ),
  "blur": lambda bundle, classes, bank, config, progress: protocols.blur_accuracy(
    bundle,
    classes,
    bank.class_embeddings,
    config.analysis,
    settings=config.protocols.blur,
    progress=progress,
  ),
}


def _protocol_path(workdir: str, name: str, model: str) -> str:
  """One model's result of a per-model protocol, with the digest of the images it read."""
  return os.path.join(workdir, "protocols", name, f"{model}.json")


def _model_protocols(pool, kept, banks, encode, dataset, sizes, config, workdir, digest, progress):
  """{protocol: {model name: result}} for config.model_protocols, each model in turn (those the
  pool still holds first); a result an earlier run of this sweep wrote for the same images
  (`digest`) is kept, each new one written as it ends."""
  out: dict[str, dict[str, Any]] = {name: {} for name in config.model_protocols}
  for index in pool.order(kept):
    name = pool.models[index].name
    todo = []
    for protocol in config.model_protocols:
      path = _protocol_path(workdir, protocol, name)
      try:
        with paths.open(path) as f:
          stored = json.load(f)
      except (OSError, ValueError):
        stored = None
      if isinstance(stored, dict) and stored.get("images") == digest:
        out[protocol][name] = stored["result"]
      else:
        todo.append(protocol)
    if not todo:
      continue
    bundle = pool.get(index)
    bank = banks[index] if index in banks else banks.setdefault(index, encode(bundle))
    for protocol in todo:
      result = MODEL_PROTOCOLS[protocol](
        bundle, dataset.classes(sizes[index]), bank, config, progress
      )
      path = _protocol_path(workdir, protocol, name)
      paths.makedirs(os.path.dirname(path))
      jsonio.write_json(path, dict(images=digest, result=result), indent=1)
      out[protocol][name] = json.loads(jsonio.dumps_strict(result))
    del bundle  # the pool alone decides what stays loaded
  names = [pool.models[i].name for i in kept]
  return {protocol: {n: out[protocol][n] for n in names} for protocol in out}


def run(config, workdir: str, progress: bool = True, restart: bool = False) -> dict:
  """Runs the sweep; returns results.json's content (also written with table.md and figures).

  The data (descriptor file, classes matched by name, no empty class) and every model's weights
  are checked, and the workdir claimed for this config (`restart` moves another run aside),
  before any image is read.

  In a multi-process run (jax.distributed initialised, see stori_jax.plumbing.multihost) process p
  analyses the class chunks c with c % processes == p through every model and writes their
  slimmed records to workdir/shards; process 0 then reads them back in chunk order (the
  workdir must be on a filesystem all processes share) and writes the same files as one process
  writes. Other processes return {}.

  config.table2: each model's images are also embedded as mutual.evaluate embeds them and its
  concepts kept (`protocols.ConceptPass`) chunk by chunk; after the last chunk each model's
  Table 2 is computed (`_table2`). One process only (ConfigError otherwise).

  config.model_protocols: after the analysis, each model reads the images again for each named
  protocol (MODEL_PROTOCOLS: CorLoc, the blurring of App. A.3) and protocols.md / protocols.json
  hold one table per protocol over the models, in the paper's layout. One process only.
  """
  check_config(config)
  if config.random_weights:  # said first: the log names the trained models throughout
    logging.warning(
      "config.random_weights: the models are instances of their architectures with %s, not "
      "the trained models (an offline check: the numbers carry no meaning).",
      RANDOM_WEIGHTS,
    )
  processes, rank = jax.process_count(), jax.process_index()
  table2 = bool(config.get("table2"))
  model_protocols = tuple(config.get("model_protocols", ()))
  if model_protocols and processes > 1:
    raise ConfigError(
      f"config.model_protocols {model_protocols} run in one process (each model reads every "
      "image again after the sweep). Run without --distributed / --coordinator, or set "
      "--config.model_protocols=()."
    )
  if table2 and processes > 1:
    raise ConfigError(
      "config.table2 runs in one process: Table 2 classifies every image with every class's "
      "concepts, which a multi-process sweep keeps on the process that found them. Run it "
      "without --distributed / --coordinator, or set --config.table2=False."
    )
  dataset = data.prepare(config)  # a data mistake stops before any model loads
  if "corloc" in model_protocols:  # its ground-truth boxes
    protocols.localization.check_inputs(config, dataset)
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

  # Resume: the chunks an earlier run of this sweep finished on the same models and images
  # (their files in workdir/shards) are kept; every class's ids are listed without a read.
  listing = list(dataset.classes(None, read=lambda i: False))
  n_chunks = -(-len(listing) // per_chunk)
  names = [models[i].name for i in kept]
  states = [
    _chunk_state(names, listing[c * per_chunk : (c + 1) * per_chunk], dataset.fingerprints)
    for c in range(n_chunks)
  ]
  done_chunks = {
    c
    for c in range(n_chunks)
    if c % processes == rank and finished.check(_chunk_unit(workdir, c, states[c], table2))
  }
  if done_chunks and progress and rank == 0:
    tqdm.write(
      f"resuming: {len(done_chunks)} of {n_chunks} class chunks were run by an earlier run of "
      f"this sweep in {workdir} (kept; shards/chunk_<index>.json)",
      file=sys.stderr,
    )

  def read(position: int) -> bool:
    return mine(position) and position // per_chunk not in done_chunks

  streams = {size: dataset.classes(size, read=read).prefetched(per_chunk) for size in sizes}
  banks: dict[int, pipeline.TextBank] = {}
  encode = functools.partial(
    pipeline.encode_config_bank, config=config, dataset=dataset, progress=False
  )

  # Table 2's concept pass per model, filled chunk by chunk as mutual.evaluate fills its own.
  concepts: list[protocols.ConceptPass | None] = [None for _ in kept]
  embed_images = protocols.image_embeddings if table2 else None
  across = spectral_across_models(
    config.spectral_across_models, holds_all=pool.max_loaded >= len(kept)
  )
  n_images, start = 0, time.perf_counter()
  chunks = _class_chunks(streams, sizes, per_chunk)
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
    if index in done_chunks:
      if table2:
        bank = tuple(pipeline.bank_descriptors(config, dataset.descriptors))
        _restore_concepts(workdir, index, concepts, bank, len(class_names), methods, chunk)
      continue
    class_images = [[items[sizes.index(sizes_by_model[i])] for items in chunk] for i in kept]
    results = analyze_classes(
      pool,
      kept,
      banks,
      class_images,
      a,
      methods,
      progress and rank == 0,
      encode,
      embed_images,
      spectral_across_models=across,
    )
    chunk_records: list[list[dict]] = [[] for _ in kept]
    chunk_concepts: dict[str, Any] = {}
    outputs: dict[str, str] = {}  # the chunk's files besides its record: their digests
    for j, i in enumerate(kept):
      if table2 and concepts[j] is None:
        concepts[j] = protocols.ConceptPass.empty(banks[i].descriptors, len(class_names), methods)
      for c, cls in enumerate(class_images[j]):
        if table2:
          concepts[j].add(cls.label, results[j][c], results[j][c]["embedded_images"])
          for key, value in (
            concepts[j].class_arrays(results[j][c], results[j][c]["embedded_images"]).items()
          ):
            chunk_concepts[f"{j}/{c}/{key}"] = value
        image_records = report.image_records(
          cls, results[j][c], banks[i].descriptors, class_names, methods
        )
        if config.per_image:
          for k, record in enumerate(image_records):
            relative = workdir_layout.image_record(cls.label, k, model=models[i].name)
            outputs[relative] = report.write_json(paths.join(workdir, relative), record)
        chunk_records[j] += [_slim(r) for r in image_records]
    if table2:  # written first: the record makes the chunk final
      paths.makedirs(paths.parent(_concepts_path(workdir, index)))
      outputs[workdir_layout.sweep_concepts(index)] = jsonio.write_arrays_atomic(
        _concepts_path(workdir, index), chunk_concepts
      )
    finished.finish(
      _chunk_unit(workdir, index, states[index], table2), outputs, payload=chunk_records
    )
  seconds = time.perf_counter() - start
  if not n_images:
    raise ConfigError("No images were analysed: check config.data (classes, images_per_class).")
  if processes > 1:
    multihost.wait_for_all_processes("mutual.sweep: chunks done")
    if rank != 0:
      return {}
  records = _read_shards(workdir, n_chunks, len(kept))
  if _remove_stale_shards(workdir, n_chunks):
    logging.warning("Removed the class chunk files of an earlier run that this one does not have.")

  rows = [
    _model_row(config, models[i].entry, sizes_by_model[i], records[j], methods)
    for j, i in enumerate(kept)
  ]
  fits = auc_accuracy_fits(rows, methods, config.accuracy)
  extra: dict[str, Any] = {}
  if table2:
    extra["table2"] = _table2(pool, kept, concepts, dataset, config, progress)
  if model_protocols:
    digest = hashlib.sha256(jsonio.dumps_strict(states).encode()).hexdigest()
    extra["protocols"] = _model_protocols(
      pool, kept, banks, encode, dataset, sizes_by_model, config, workdir, digest, progress
    )
  results = dict(
    models={r["name"]: r for r in rows},
    order=[r["name"] for r in table_order(rows)],
    fits=fits,
    **extra,
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
