"""`python -m stori_jax.embed`: user errors exit 2 with one paragraph, the path
written is the real one, and NaN features are refused, never saved."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from absl import flags

from stori_jax import embed
from stori_jax.clip.bundle import CLIPBundle
from stori_jax.plumbing.errors import InputError, NonFiniteError, UserError
from stori_jax.tokenizer import WeightedPromptError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_main(monkeypatch, bundle, *argv):
  """embed.main in-process on its own flags, with `bundle` as what --source loads (the errors
  raised, not printed: the tests name their types)."""
  values = flags.FlagValues()
  embed.define_flags(values)
  prompts = [a for a in argv if not a.startswith("--")]
  values(["embed", "--source=any", *[a for a in argv if a.startswith("--")]])
  monkeypatch.setattr(embed, "load", lambda *args, **kwargs: bundle)
  return embed.main(["embed", *prompts], values)


def test_prompt_syntax_error_exits_2_with_the_caret_message():
  # the reproducers (rows 8 and 13): a weight of 1e20, a syntax error; the one run of
  # `python -m stori_jax.embed` as a program
  result = subprocess.run(
    [
      sys.executable,
      "-m",
      "stori_jax.embed",
      "--random",
      "test-tiny",
      "--method",
      "prompt_weighting",
      "a (red:1e20) circle",
      "a (blue:2 square",
    ],
    capture_output=True,
    text=True,
    cwd=REPO,
    timeout=300,
    check=False,
  )
  assert result.returncode == 2, result.stderr
  assert "Traceback" not in result.stderr and result.stdout == ""
  assert result.stderr.startswith("error: weight 1e20 is too large: weights must lie in [0, 100]")
  assert result.stderr.rstrip().endswith("a (red:1e20) circle\n           ^")


def test_output_prints_the_real_path(tmp_path, monkeypatch, capsys, tiny_synthetic):
  target = tmp_path / "emb"
  _run_main(monkeypatch, tiny_synthetic, f"--output={target}", "a (red:2) circle", "a square")
  out = capsys.readouterr().out
  dim = tiny_synthetic.config.embed_dim
  assert f"saved (2, {dim}) float32 to {target}.npy" in out
  saved = np.load(f"{target}.npy")
  assert saved.shape == (2, dim) and saved.dtype == np.float32 and np.isfinite(saved).all()
  assert os.listdir(tmp_path) == ["emb.npy"]  # no temporary file left
  _run_main(monkeypatch, tiny_synthetic, f"--output={tmp_path / 'b.npy'}", "x")
  assert f"to {tmp_path / 'b.npy'}\n" in capsys.readouterr().out


def test_user_errors_before_any_work(tmp_path, monkeypatch, tiny_synthetic):
  with pytest.raises(InputError, match=r"the folder .*missing does not exist; create it first"):
    _run_main(monkeypatch, tiny_synthetic, f"--output={tmp_path / 'missing' / 'emb'}", "a circle")
  (tmp_path / "dir.npy").mkdir()
  with pytest.raises(InputError, match=r"dir.npy is a folder; give a file name"):
    _run_main(monkeypatch, tiny_synthetic, f"--output={tmp_path / 'dir'}", "a circle")
  # issue 26 row 16: an existing folder as --output is refused (it once wrote folder.npy
  # beside it and reported success)
  with pytest.raises(
    InputError, match=r"dir.npy is a folder; give a file name, such as .*dir.npy/embeddings.npy"
  ):
    _run_main(monkeypatch, tiny_synthetic, f"--output={tmp_path / 'dir.npy'}", "a circle")
  (tmp_path / "folder").mkdir()
  with pytest.raises(InputError, match=r"folder is a folder; give a file name"):
    _run_main(monkeypatch, tiny_synthetic, f"--output={tmp_path / 'folder'}", "a circle")
  # issue 26 row 10: a folder that takes no files (under /proc) is refused before any work
  with pytest.raises(InputError, match=r"cannot write a file in the folder /proc"):
    _run_main(monkeypatch, tiny_synthetic, "--output=/proc/emb.npy", "a circle")
  with pytest.raises(WeightedPromptError, match="not a number in ASCII digits"):
    _run_main(monkeypatch, tiny_synthetic, "a (red:\uff12) circle")
  with pytest.raises(InputError, match="--start_block/--stop_block: Reweighting blocks 9"):
    _run_main(monkeypatch, tiny_synthetic, "--start_block=9", "a circle")
  with pytest.raises(UserError, match="give one or more prompts"):
    _run_main(monkeypatch, tiny_synthetic)
  assert sorted(os.listdir(tmp_path)) == ["dir.npy", "folder"]
  assert os.listdir(tmp_path / "folder") == [] and os.listdir(tmp_path / "dir.npy") == []


def test_non_finite_features_are_refused_and_not_saved(
  tmp_path, monkeypatch, capsys, tiny_synthetic
):
  params = jax.tree_util.tree_map(lambda x: x * np.nan, tiny_synthetic.params)
  broken = CLIPBundle(config=tiny_synthetic.config, params=params, source="nan")
  target = tmp_path / "emb.npy"
  with pytest.raises(NonFiniteError, match="is not finite .*nothing was printed or saved"):
    _run_main(monkeypatch, broken, f"--output={target}", "a (red:2) circle")
  assert not target.exists() and os.listdir(tmp_path) == []
  assert "norm nan" not in capsys.readouterr().out


def test_huge_layer_count_in_the_checkpoint_config_stops_at_once(tmp_path, measure_command):
  # issue 26 row 4: text.layers 1e9 in stori_config.json, then embed, grew 40 MB/s and hung
  import json
  import shutil

  from stori_jax.clip.loading import ASSETS_DIR

  directory = tmp_path / "ckpt"
  shutil.copytree(os.path.join(ASSETS_DIR, "tiny-synthetic"), directory)
  meta = json.loads((directory / "stori_config.json").read_text())
  meta["config"]["text"]["layers"] = 10**9
  (directory / "stori_config.json").write_text(json.dumps(meta))
  code, stderr, seconds, rss = measure_command("stori_jax.embed", f"--source={directory}", "a cat")
  assert code == 2 and "Traceback" not in stderr, stderr
  assert "text.layers is 1000000000; at most 1024 is accepted" in stderr
  # The memory bound is the check (the bug grew 40 MB/s without end); the time bound only says
  # it returned rather than hung, and allows a loaded machine's start-up (JAX's import alone
  # takes several seconds on 2 busy cores).
  assert seconds < 60 and rss < 1 << 30, (seconds, rss)
