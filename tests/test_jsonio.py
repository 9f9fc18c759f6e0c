"""Result files (stori_jax.plumbing.jsonio): a full disk while writing one is a user-facing paragraph
(exit 2 through the commands), the earlier file kept and no temporary file left."""

import errno
import os

import pytest

from stori_jax.plumbing import jsonio


def test_a_full_disk_keeps_the_old_file_and_says_so(tmp_path, monkeypatch):
  path = tmp_path / "weights.json"
  jsonio.write_json(str(path), {"old": True})

  def full(src, dst):
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(os, "replace", full)
  with pytest.raises(jsonio.DiskFullError, match="the disk \\(or quota\\) is full") as error:
    jsonio.write_json(str(path), {"new": True})
  assert str(path) in str(error.value)
  monkeypatch.undo()
  assert path.read_text() == '{"old": true}\n'
  assert os.listdir(tmp_path) == ["weights.json"]


def _figure():
  from stori_jax.plumbing.plotting import pyplot

  plt = pyplot()
  fig, ax = plt.subplots(figsize=(2, 2))
  ax.plot([0, 1], [1, 0])
  return plt, fig


def test_a_figure_is_written_whole_and_readable(tmp_path):
  from stori_jax.plumbing import plotting

  plt, fig = _figure()
  old = os.umask(0o022)
  try:
    plotting.save_figure(fig, str(tmp_path / "curve.png"), dpi=50)
  finally:
    os.umask(old)
    plt.close(fig)
  data = (tmp_path / "curve.png").read_bytes()
  assert data.startswith(b"\x89PNG\r\n\x1a\n")
  assert os.stat(tmp_path / "curve.png").st_mode & 0o777 == 0o644
  assert os.listdir(tmp_path) == ["curve.png"]


def test_a_full_disk_while_writing_a_figure_keeps_the_old_one_and_says_so(tmp_path, monkeypatch):
  """Issue 36 row 8: matplotlib's (PIL's) OSError ENOSPC was a traceback; now DiskFullError, a
  UserError (exit 2 through the commands), the earlier figure kept, no temporary file left."""
  from stori_jax.plumbing import errors, plotting

  path = tmp_path / "interpretability.png"
  path.write_bytes(b"old")
  plt, fig = _figure()

  def full(*_, **__):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  monkeypatch.setattr(os, "fsync", full)
  with pytest.raises(errors.DiskFullError, match="the disk \\(or quota\\) is full") as error:
    plotting.save_figure(fig, str(path), dpi=50)
  plt.close(fig)
  assert isinstance(error.value, errors.UserError) and jsonio.DiskFullError is errors.DiskFullError
  assert f"cannot write the figure {path}" in str(error.value)
  assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["interpretability.png"]
