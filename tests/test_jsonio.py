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
