"""Where each command puts its units of work in its workdir: the one place that spells the file
names a resumed run looks for (paths relative to the workdir, "/"-separated; join them with
`stori_jax.plumbing.paths.join` or `finished.Unit.path`). Each unit's record of finished work
(`stori_jax.plumbing.finished`) is named here too.
"""

from __future__ import annotations

#: The folder of the records that are not a unit's own file (evaluated classes, grid cells,
#: trained baselines).
FINISHED = "finished"


def finished_record(*parts: str) -> str:
  """finished/<parts...>.json: a unit's record kept apart from its outputs."""
  return "/".join((FINISHED, *parts[:-1], f"{parts[-1]}.json"))


# ---- python -m stori_jax.run_grid ---------------------------------------------------------------


def grid_cell_record(cell_path: str) -> str:
  """A grid cell's record (its folder, `Cell.path`, is what `stori_jax.train` writes)."""
  return finished_record(*cell_path.replace("\\", "/").split("/"))


#: The file of a cell's folder that finishes it (the trainer's results).
GRID_CELL_METRICS = "metrics.json"


# ---- python -m mutual.analyze -----------------------------------------------------------------


def analysis_class(label: int) -> str:
  """An analysed class's record: written last, once its per-image records (and figures)."""
  return f"classes/{label:04d}.json"


def analysis_example(label: int) -> str:
  """A figure class's first images and their refined foreground, for Fig. 5 on a resume."""
  return f"classes/{label:04d}_fig5.npz"


def image_record(label: int, image: int, model: str | None = None) -> str:
  """One image's per-image record (a sweep's are under the model's name)."""
  head = "per_image" if model is None else f"per_image/{model}"
  return f"{head}/{label:04d}/{image:05d}.json"


# ---- python -m mutual.evaluate ----------------------------------------------------------------


def evaluation_class(label: int) -> str:
  """A class's Table 1 pass (its arrays)."""
  return f"classes/{label:04d}.npz"


def evaluation_class_record(label: int) -> str:
  return finished_record("classes", f"{label:04d}")


def protocol(name: str) -> str:
  """An evaluation protocol's record, its result in the record's payload."""
  return f"protocols/{name}.json"


#: The baselines' folder in an evaluation's workdir, and their training summary there.
BASELINES = "baselines"
BASELINES_SUMMARY = "baselines/summary.json"
#: LF-CBM's trained model, in its own folder (the baselines' folder's lf_cbm/).
LF_CBM_MODEL = "lf_cbm.npz"


def baseline_record(name: str) -> str:
  """A trained baseline's record, relative to the baselines' folder."""
  return finished_record(name)


# ---- python -m mutual.sweep -------------------------------------------------------------------


def sweep_chunk(chunk: int) -> str:
  """One class chunk's record: every model's slimmed records of its images in the payload,
  written once the chunk is through every model."""
  return f"shards/chunk_{chunk:05d}.json"


def sweep_concepts(chunk: int) -> str:
  """With config.table2, one chunk's concepts of every model, written before its record."""
  return f"shards/chunk_{chunk:05d}_table2.npz"
