"""The record of finished work (stori_jax.plumbing.finished) and the streaming atomic writer
(paths.AtomicWrite): a unit is kept only when its record and every output are whole and name the
same inputs; a damaged one (garbage, cut short, emptied, missing) is redone with one line."""

import hashlib
import logging
import os

import numpy as np
import pytest

from stori_jax.plumbing import finished, jsonio, paths

DAMAGE = {
  "garbage": lambda data: bytes(range(256)) * 3,
  "truncated": lambda data: data[: len(data) // 2],
  "empty": lambda data: b"",
}


def _unit(workdir, inputs=None) -> finished.Unit:
  return finished.Unit(str(workdir), "class 0003", "classes/0003.json", inputs or {"ids": [1, 2]})


def _finish(workdir) -> finished.Unit:
  unit = _unit(workdir)
  os.makedirs(workdir / "per_image")
  os.makedirs(workdir / "classes")
  outputs = {
    "per_image/00000.json": jsonio.write_json(str(workdir / "per_image/00000.json"), {"a": 1}),
    "classes/0003_fig5.npz": jsonio.write_arrays_atomic(
      str(workdir / "classes/0003_fig5.npz"), {"images": np.arange(12).reshape(3, 4)}
    ),
  }
  finished.finish(unit, outputs, payload={"records": [1, 2]})
  return unit


def test_the_writers_return_the_sha256_of_what_they_wrote(tmp_path):
  path = tmp_path / "a.json"
  digest = jsonio.write_json(str(path), {"x": [1, 2]})
  assert digest == hashlib.sha256(path.read_bytes()).hexdigest() == paths.file_sha256(path)
  writer = paths.AtomicWrite(str(tmp_path / "b.npy"))
  with writer as f:
    np.save(f, np.arange(1000, dtype=np.int64))
  assert writer.sha256 == hashlib.sha256((tmp_path / "b.npy").read_bytes()).hexdigest()
  np.testing.assert_array_equal(np.load(tmp_path / "b.npy"), np.arange(1000))
  assert sorted(os.listdir(tmp_path)) == ["a.json", "b.npy"]  # no temporary file left


def test_an_exception_in_the_block_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
  path = tmp_path / "weights.npy"
  path.write_bytes(b"old")
  with pytest.raises(RuntimeError, match="stopped"):
    with paths.AtomicWrite(str(path)) as f:
      f.write(b"half of the new")
      raise RuntimeError("stopped")
  assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["weights.npy"]


def test_a_finished_unit_is_kept_with_its_payload(tmp_path):
  unit = _finish(tmp_path)
  kept = finished.check(unit)
  assert kept is not None and kept.payload == {"records": [1, 2]}
  assert sorted(kept.outputs) == ["classes/0003_fig5.npz", "per_image/00000.json"]
  assert finished.check(_unit(tmp_path, {"ids": [1, 3]})) is None  # other images: not kept


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize(
  "name", ["classes/0003.json", "classes/0003_fig5.npz", "per_image/00000.json"]
)
def test_a_damaged_record_or_output_is_redone_with_one_line(tmp_path, caplog, name, damage):
  unit = _finish(tmp_path)
  path = tmp_path / name
  path.write_bytes(DAMAGE[damage](path.read_bytes()))
  with caplog.at_level(logging.WARNING):
    assert finished.check(unit) is None
  lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
  assert len(lines) == 1 and str(path) in lines[0] and "class 0003 is done again" in lines[0]


def test_a_missing_output_is_redone_and_an_absent_record_is_silent(tmp_path, caplog):
  unit = _finish(tmp_path)
  os.remove(tmp_path / "classes/0003_fig5.npz")
  with caplog.at_level(logging.WARNING):
    assert finished.check(unit) is None
  assert "it is missing" in caplog.text
  caplog.clear()
  os.remove(tmp_path / "classes/0003.json")
  with caplog.at_level(logging.WARNING):
    assert finished.check(unit) is None
  assert caplog.text == ""


def test_a_record_on_a_bucket_is_kept_and_a_damaged_output_redone(gcs_bucket, gcs_emulator):
  workdir = f"gs://{gcs_bucket}/run"
  unit = finished.Unit(workdir, "chunk 0", "shards/chunk_00000.json", {"models": ["a"]})
  written = jsonio.write_arrays_atomic(f"{workdir}/shards/c.npz", {"x": np.ones(5)})
  finished.finish(unit, {"shards/c.npz": written}, payload=[[1]])
  assert finished.check(unit).payload == [[1]]
  paths.write_bytes_atomic(f"{workdir}/shards/c.npz", b"")
  assert finished.check(unit) is None
