"""Per-step metrics as JSON lines (one record with a "step" key per line), kept consistent
across a killed and resumed run. Records are strict JSON: a NaN or infinity raises
NonFiniteError instead of being written."""

from __future__ import annotations

import json
from typing import Any

from stori_jax.plumbing import jsonio, paths


def read_records(path: str, up_to_step: int | None = None) -> list[dict[str, Any]]:
  """The records in `path` (none if it does not exist).

  With `up_to_step` (the step a run resumes from) the file is rewritten without the records
  after it, which the resumed run will log again; the rewrite is atomic (a kill during it
  leaves the old file or the new one, never a truncated history). A line cut short by a
  killed run is dropped.
  """
  if not paths.exists(path):
    return []
  records = []
  with paths.open(path) as f:
    for line in f:
      try:
        records.append(json.loads(line))
      except json.JSONDecodeError:
        continue
  if up_to_step is not None:
    records = [r for r in records if r["step"] <= up_to_step]
    jsonio.write_text_atomic(path, "".join(jsonio.dumps_strict(r) + "\n" for r in records))
  return records


def append_record(path: str, record: dict[str, Any]) -> None:
  line = jsonio.dumps_strict(record) + "\n"  # before opening: a refused record leaves no trace
  paths.append_text(path, line)  # an object (gs://) is rewritten with the line
