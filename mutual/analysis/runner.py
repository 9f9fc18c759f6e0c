"""The mutual-knowledge analysis of a dataset, class by class: the library behind
`python -m mutual.analyze` (see that module for the outputs it writes)."""

from __future__ import annotations

import concurrent.futures
import io
import json
import os
import sys
import time

import jax
import numpy as np

from absl import logging
from tqdm import tqdm

import stori_jax
from mutual import run_flags, data, pipeline, report, report_html
from stori_jax.plumbing import finished, jsonio, multihost, workdir_layout
from stori_jax.plumbing import paths as storage
from stori_jax.plumbing.errors import UserError


def run(config, workdir: str, progress: bool = True, restart: bool = False) -> dict:
  """Runs the analysis; returns the aggregates (also written to workdir/results.json).

  The data are checked first (descriptor file, classes matched by name, no empty class, every
  image readable) and the workdir claimed for this config (`run_flags.claim_workdir`; `restart`
  moves another run aside), both before the model loads.

  Resume: each class's results are final once its record of finished work
  `classes/<label>.json` is written (`stori_jax.plumbing.finished`: atomically, after its
  per-image records and figures, with their digests). The same command again keeps every
  class whose record says it analysed the same images (ids, and for an image folder the files'
  sizes and times) and whose files are whole, and analyses only the others (a damaged record,
  per-image record or Fig. 5 array is said in one line and its class analysed again); a run
  with nothing left to analyse loads no model and only writes the aggregates again.

  In a multi-process run (jax.distributed initialised, see stori_jax.plumbing.multihost) process p
  analyses the classes i with i % processes == p and writes their per-image records and class
  files; process 0 then reads every record back from the workdir, which must be on a filesystem
  all processes share, and writes the aggregates: the same files as one process writes.
  """
  dataset = data.prepare(config)
  processes, rank = jax.process_count(), jax.process_index()
  run_flags.claim_workdir(config, workdir, restart, "mutual-knowledge analysis")
  # Every class with its ids, no image read (the size only matters to a decode).
  listing = list(dataset.classes(None, read=lambda i: False))
  counts = [(cls.label, len(cls)) for cls in listing]
  position = {cls.label: i for i, cls in enumerate(listing)}
  mine = [i for i in range(len(listing)) if i % processes == rank]
  kept = [
    i
    for i in mine
    if finished.check(
      _class_unit(workdir, listing[i], dataset.fingerprints, i < config.figure_classes)
    )
    is not None
  ]
  todo = sorted(set(mine) - set(kept))
  if kept and progress and rank == 0:
    tqdm.write(
      f"resuming: {len(kept)} of {len(mine)} classes were analysed by an earlier run of this "
      f"command in {workdir} (kept; classes/<label>.json); {len(todo)} to analyse",
      file=sys.stderr,
    )
  methods = tuple(config.analysis.methods)
  start, n_images = time.perf_counter(), 0
  figures = os.path.join(workdir, "figures")
  storage.makedirs(figures)
  computed: dict[int, list[dict]] = {}
  fig5: dict[int, tuple] = {}
  if todo:
    n_images = _analyze(config, workdir, dataset, todo, position, computed, fig5, progress, rank)
  seconds = time.perf_counter() - start
  if processes > 1:
    multihost.wait_for_all_processes("mutual.analyze: classes done")
    if rank != 0:
      return {}
    records = _read_records(workdir, counts)
  else:
    records = []
    for i, (label, count) in enumerate(counts):
      records += computed[i] if i in computed else _read_records(workdir, [(label, count)])
  for i in kept:  # the figure classes an earlier run analysed: their images for Fig. 5
    if i < config.figure_classes:
      fig5[i] = _read_example(workdir, listing[i])
  removed = _remove_stale_records(workdir, counts)
  if removed:
    logging.warning(
      "Removed %d per-image or class files of an earlier run in %s that name images or "
      "classes this run no longer has (the workdir holds exactly this run's images).",
      removed,
      workdir,
    )
  results = report.aggregate(records, methods)
  results["model"] = config.model.get("name", config.model.source)
  if dataset.skipped:  # never a silent disappearance: what was left out, and why
    results["skipped_classes"] = dataset.skipped
  results["config"] = config.to_dict()
  report.write_json(os.path.join(workdir, "results.json"), results)
  table = report.markdown_table(results["dataset"], results["model"], methods)
  jsonio.write_text_atomic(os.path.join(workdir, "table.md"), table)
  report.plot_curves(
    os.path.join(figures, "curves.png"),
    {m: results["dataset"][m]["curve"] for m in methods},
    title=f"{config.name}: dataset",
    model=config.model.get("name", config.model.source),
  )
  _write_fig5(figures, config, results, records, [fig5[i] for i in sorted(fig5)], methods)
  _write_report_html(workdir, results, records, methods)
  logging.info(
    "%d images in %.1f s (%.2f images/s); %d classes kept from an earlier run",
    n_images,
    seconds,
    n_images / seconds,
    len(kept),
  )
  return results


def _analyze(config, workdir, dataset, todo, position, computed, fig5, progress, rank) -> int:
  """Loads the model and analyses the classes at the stream positions `todo`, writing each
  one's records, figures and class file; fills `computed` (position -> records) and `fig5`
  (position -> the figure classes' examples); returns the number of images analysed."""
  bundle = stori_jax.load(config.model.source)
  size = int(bundle.config.vision.image_size)
  class_names = list(dataset.names)
  wanted = set(todo)
  # The next class is read during this one; a process reads only the classes it analyses.
  stream = dataset.classes(size, read=lambda i: i in wanted).prefetched()
  classes = data.ClassStream((c for i, c in enumerate(stream) if i in wanted), len(todo))
  a = config.analysis
  bank = pipeline.encode_config_bank(bundle, config, dataset, progress)
  methods = tuple(a.methods)
  n_images = 0
  # A class's records and figures are written on one background thread while the device runs
  # the next class: the host's per-image work stays off the device's critical path.
  written = []
  with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mutual-writer") as writer:
    for cls in _progress(classes, progress and rank == 0):
      index = position[cls.label]
      result = pipeline.analyze_class(bundle, cls.images, bank, a, methods)
      n_images += len(cls.images)
      example = None
      if index < config.figure_classes:  # Fig. 5 overlays these classes; their first images
        k = min(config.figures_per_class, len(cls.images))  # show the shared concept
        example = (cls.name, cls.images[:k].copy(), np.array(result["refined"][:k]))
        fig5[index] = example
      fingerprint = dataset.fingerprints.get(cls.label)
      written.append(
        (
          index,
          writer.submit(
            _write_class,
            workdir,
            config,
            cls,
            result,
            bank,
            class_names,
            methods,
            example,
            fingerprint,
          ),
        )
      )
      # Errors surface at the next class, not at the end of the run.
      if len(written) > 1:
        written[-2][1].result()
    for index, future in written:
      computed[index] = future.result()
  return n_images


def _progress(classes, show: bool):
  """Yields `classes` under a progress bar whose clock starts after the first class: that one
  compiles the pipeline (about a minute for the paper's models), which would make the rate and
  ETA of the bar many times too long (as training.loop keeps its step's compile out)."""
  bar = None
  start = time.perf_counter()
  try:
    for index, cls in enumerate(classes):
      if index == 0 and show:
        tqdm.write("compiling (first class)...", file=sys.stderr)
      yield cls
      if bar is None:
        if show:
          tqdm.write(
            f"first class done in {time.perf_counter() - start:.1f} s, compilation included "
            "(left out of the ETA)",
            file=sys.stderr,
          )
        bar = tqdm(
          total=len(classes),
          initial=index + 1,
          desc="classes",
          disable=not show,
          dynamic_ncols=True,
        )
      else:
        bar.update(1)
  finally:
    if bar is not None:
      bar.close()


def _write_class(
  workdir, config, cls, result, bank, class_names, methods, example, fingerprint
) -> list[dict]:
  """Writes one class's per-image records, with `example` (a figure class: (name, images,
  refined foreground) of its first images) its figures and Fig. 5's example, and last its class
  file, which makes the class final for a resumed run; returns the records."""
  class_records = report.image_records(cls, result, bank.descriptors, class_names, methods)
  outputs = {}
  for i, record in enumerate(class_records):
    relative = workdir_layout.image_record(cls.label, i)
    outputs[relative] = report.write_json(storage.join(workdir, relative), record)
  if example is not None:
    figures = os.path.join(workdir, "figures")
    k = min(config.figures_per_class, len(cls.images))
    for method in methods:
      report.plot_concepts(
        os.path.join(figures, f"concepts_{method}_{cls.label:04d}.png"),
        cls.images[:k],
        class_records[:k],
        method,
        result["refined"][:k],
        model=config.model.get("name", config.model.source),
      )
      report.plot_mutual(
        os.path.join(figures, f"mutual_{method}_{cls.label:04d}.png"),
        cls.images[0],
        class_records[0],
        method,
        model=config.model.get("name", config.model.source),
      )
      report.plot_ot_diversity(  # App. A.2's Fig. 2, on the class's first image
        os.path.join(figures, f"ot_{method}_{cls.label:04d}.png"),
        cls.images[0],
        class_records[0],
        method,
        result["refined"][0],
        model=config.model.get("name", config.model.source),
      )
    summary = report.aggregate(class_records, methods)["dataset"]
    report.plot_curves(
      os.path.join(figures, f"curves_{cls.label:04d}.png"),
      {m: summary[m]["curve"] for m in methods},
      title=cls.name,
      model=config.model.get("name", config.model.source),
    )
    _, images, refined = example
    relative = workdir_layout.analysis_example(cls.label)
    storage.makedirs(storage.parent(storage.join(workdir, relative)))
    outputs[relative] = jsonio.write_arrays_atomic(
      storage.join(workdir, relative), {"images": images, "refined": refined}
    )
  unit = _class_unit(workdir, cls, {cls.label: fingerprint}, example is not None)
  finished.finish(unit, outputs)
  return class_records


def _class_path(workdir: str, label: int) -> str:
  return storage.join(workdir, workdir_layout.analysis_class(label))


def _example_path(workdir: str, label: int) -> str:
  return storage.join(workdir, workdir_layout.analysis_example(label))


def _class_unit(workdir: str, cls, fingerprints, figures: bool) -> finished.Unit:
  """A class as a unit of work: its inputs are which images it is of (ids, and an image
  folder's files' fingerprint) and whether it is a figure class."""
  inputs = dict(
    label=int(cls.label),
    name=cls.name,
    images=len(cls),
    ids=list(cls.ids),
    fingerprint=fingerprints.get(cls.label),
    figures=bool(figures),
  )
  return finished.Unit(
    workdir, f"class {cls.label:04d} ({cls.name})", workdir_layout.analysis_class(cls.label), inputs
  )


def _read_example(workdir: str, cls) -> tuple:
  """A kept figure class's (name, images, refined foreground), as the run that analysed it
  held them."""
  with np.load(io.BytesIO(storage.read_bytes(_example_path(workdir, cls.label)))) as arrays:
    return cls.name, arrays["images"], arrays["refined"]


def _write_fig5(figures: str, config, results, records, examples, methods) -> None:
  """figures/fig5_<method>.png: the figure classes' MI curves overlaid, with their shared
  concept on their first images (`report.plot_classes`); `examples`: (class name, images,
  refined foreground) of the figure classes this process analysed."""
  if not examples:
    return
  for method in methods:
    classes = []
    for name, images, refined in examples:
      own = [r for r in records if r["class_name"] == name][: len(images)]
      curve = results["classes"][name][method]["curve"]
      classes.append(dict(name=name, curve=curve, images=images, records=own, refined=refined))
    report.plot_classes(
      os.path.join(figures, f"fig5_{method}.png"),
      classes,
      method,
      model=config.model.get("name", config.model.source),
    )


def _remove_stale_records(workdir: str, counts) -> int:
  """Deletes the per-image files under workdir/per_image, and the class files under
  workdir/classes, that this run did not write or keep (an earlier run of the same config on a
  folder that has since lost images or classes); returns how many."""
  kept = {_record_path(workdir, label, i) for label, count in counts for i in range(count)}
  classes = os.path.join(workdir, "classes")
  removed = 0
  if storage.isdir(classes):
    ours = {
      p for label, _ in counts for p in (_class_path(workdir, label), _example_path(workdir, label))
    }
    for name in storage.listdir(classes):
      path = os.path.join(classes, name)
      if not name.startswith(".") and path not in ours and storage.isfile(path):
        storage.remove(path)
        removed += 1
  root = os.path.join(workdir, "per_image")
  for folder, _, names in storage.walk(root, topdown=False):
    for name in names:
      path = os.path.join(folder, name)
      if name.endswith(".json") and path not in kept:
        storage.remove(path)
        removed += 1
    if folder != root and not storage.is_remote(folder) and not os.listdir(folder):
      os.rmdir(folder)
  return removed


def _record_path(workdir: str, label: int, image: int) -> str:
  return storage.join(workdir, workdir_layout.image_record(label, image))


def _read_records(workdir: str, counts) -> list[dict]:
  """Every class's per-image records, in class order, read back from the workdir (`counts`:
  (label, images) per class)."""
  records = []
  for label, count in counts:
    for i in range(count):
      path = _record_path(workdir, label, i)
      try:
        with storage.open(path) as f:
          records.append(json.load(f))
      except FileNotFoundError:
        raise UserError(
          f"{path} was not found after every process finished its classes: in a multi-process "
          "analysis the workdir must be on a filesystem all processes share (a network or "
          "cloud path), so that process 0 can aggregate the others' records."
        ) from None
  return records


def _write_report_html(workdir: str, results, records, methods) -> None:
  """Writes workdir/report.html (mutual.report_html): the figures that exist and the per-image
  JSON files are linked by their paths relative to the workdir."""
  figures = os.path.join(workdir, "figures")
  found = storage.listdir(figures) if storage.isdir(figures) else []
  names = [f"figures/{name}" for name in sorted(found) if name.endswith(".png")]
  seen: dict[int, int] = {}
  paths = []
  for record in records:  # records are in class order, images in order within a class
    i = seen.get(record["label"], 0)
    seen[record["label"]] = i + 1
    paths.append(os.path.relpath(_record_path(workdir, record["label"], i), workdir))
  page = report_html.render(results, records, methods, record_paths=paths, figures=names)
  jsonio.write_text_atomic(os.path.join(workdir, "report.html"), page)
