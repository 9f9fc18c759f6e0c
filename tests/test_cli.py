"""stori_jax.plumbing.cli: one flag convention for every command, and commands run in this process
(`run_in_process`) with the handling of `python -m`: exit 2 and one paragraph for a mistake."""

import importlib
import os

import pytest
import test_layering
from absl import flags
from absl import logging as absl_logging

from stori_jax.plumbing import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Every command module (the list docs/design.md's layers name, kept in test_layering).
COMMANDS = sorted(test_layering.COMMANDS)


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_defines_its_flags_only_when_asked(name):
  module = importlib.import_module(name)
  values = flags.FlagValues()
  module.define_flags(values)
  assert list(values), name
  # Importing defined none of them globally (absl's own flags aside).
  assert not set(values) & set(flags.FLAGS), sorted(set(values) & set(flags.FLAGS))


def _error_line(err: str) -> str:
  lines = [line for line in err.splitlines() if line.startswith("error: ")]
  assert len(lines) == 1, err
  return lines[0]


def test_commands_with_the_same_flags_run_one_after_another(capsys, tmp_path):
  from stori_jax import list_models as models  # pylint: disable=import-outside-toplevel
  from stori_jax import retrieve, train  # pylint: disable=import-outside-toplevel

  verbosity = absl_logging.get_verbosity()
  assert cli.run_in_process(train, ["--config=configs/nowhere.py"]) == 2
  assert "--config: no config file configs/nowhere.py" in _error_line(capsys.readouterr().err)
  code = cli.run_in_process(retrieve, ["--config=configs/elsewhere.py", f"--workdir={tmp_path}"])
  assert code == 2
  assert "no config file configs/elsewhere.py" in _error_line(capsys.readouterr().err)
  assert cli.run_in_process(models, [f"--models_dir={tmp_path}", "--verbosity=1"]) == 0
  out, err = capsys.readouterr()
  assert out.startswith("name ") and "openai-rn50" in out and "error" not in err
  assert cli.run_in_process(models, ["--paper=nope"]) == 2  # a bad flag value
  assert "--paper" in _error_line(capsys.readouterr().err)
  assert absl_logging.get_verbosity() == verbosity  # the quiet logs are put back


def test_config_mistakes_are_named(capsys, monkeypatch):
  from stori_jax import train  # pylint: disable=import-outside-toplevel

  monkeypatch.chdir(REPO)
  code = cli.run_in_process(train, ["--config=configs/demo.py", "--config.optim.lrr=1"])
  assert code == 2
  message = _error_line(capsys.readouterr().err)
  assert "no key 'optim.lrr'; did you mean --config.optim.lr" in message
  assert cli.run_in_process(train, ["--config=configs/dtd.py:zz"]) == 2
  message = _error_line(capsys.readouterr().err)
  assert "the config file refused its argument" in message and "'zz'" in message
  assert cli.run_in_process(train, []) == 2  # --config is required
  assert "--config" in _error_line(capsys.readouterr().err)


@pytest.mark.parametrize(
  "name,text,words",
  [
    ("README.md", None, ["README.md is not a config file", "Python file (.py)"]),
    ("run.json", '{"config": {"seed": 0}, "ok": true}\n', ["is the record a run keeps"]),
    ("settings.json", "{}\n", ["settings.json is not a config file"]),
    ("typo.py", "def get_config(:\n  pass\n", ["line 1 (SyntaxError: invalid syntax)"]),
    ("json_words.py", "def get_config():\n  return true\n", ["line 2 (NameError: name 'true'"]),
  ],
)
def test_a_file_that_is_no_config_file_is_named(capsys, monkeypatch, tmp_path, name, text, words):
  """--config given a run record, a README, a JSON file or a Python file that fails: one
  paragraph naming the file and what a config file is, exit 2, nothing run."""
  from stori_jax import train  # pylint: disable=import-outside-toplevel

  monkeypatch.chdir(REPO)
  path = "README.md" if text is None else str(tmp_path / name)
  if text is not None:
    (tmp_path / name).write_text(text, encoding="utf-8")
  workdir = tmp_path / "run"
  assert cli.run_in_process(train, [f"--config={path}", f"--workdir={workdir}"]) == 2
  out, err = capsys.readouterr()
  message = _error_line(err)
  assert "Traceback" not in err and out == "" and not workdir.exists()
  assert path in message and "Nothing was run." in message
  for word in words:
    assert word in message, message


def test_print_outputs_lists_what_exists_and_written_paths_reads_it_back(tmp_path, capsys):
  (tmp_path / "results.json").write_text("{}")
  for name in ("fig_b.png", "fig_a.png"):
    (tmp_path / name).write_bytes(b"png")
  (tmp_path / "per_image" / "0001").mkdir(parents=True)
  for name in ("00000.json", "00001.json"):
    (tmp_path / "per_image" / "0001" / name).write_text("{}")
  shown = cli.print_outputs(
    str(tmp_path), ["results.json", "report.html", "fig_*.png", "per_image", "results.json"]
  )
  out = capsys.readouterr().out
  # Missing names are left out, a pattern is its sorted matches, a path is shown once.
  assert shown == [
    str(tmp_path / n) for n in ("results.json", "fig_a.png", "fig_b.png", "per_image")
  ]
  assert out.splitlines() == [
    "Wrote:",
    f"  {tmp_path / 'results.json'}",
    f"  {tmp_path / 'fig_a.png'}",
    f"  {tmp_path / 'fig_b.png'}",
    f"  {tmp_path / 'per_image'}{os.sep}  (2 files)",
  ]
  assert [os.path.normpath(p) for p in cli.written_paths("table\n" + out)] == shown
  assert cli.print_outputs(str(tmp_path), ["nothing.md"]) == [] and capsys.readouterr().out == ""


def assert_ends_with_outputs(stdout: str, *names: str) -> list[str]:
  """The output ends with a "Wrote:" block; every path in it exists, and `names` (base names)
  are among them. Returns its paths."""
  paths = cli.written_paths(stdout)
  lines = stdout.rstrip("\n").splitlines()
  assert paths and lines[-len(paths) - 1] == cli.WROTE_HEADING, stdout[-2000:]
  assert all(os.path.exists(p) for p in paths), paths
  shown = {os.path.basename(os.path.normpath(p)) for p in paths}
  assert set(names) <= shown, (names, paths)
  return paths


@pytest.mark.slow
def test_commands_end_with_the_files_they_wrote(tmp_path, tiny_random_model, run_command):
  """convert, embed --output, evaluate_world and start_block on a tiny random model."""
  out = tmp_path / "converted"
  done = run_command("stori_jax.convert", f"--input={tiny_random_model}", f"--output={out}")
  assert done.returncode == 0, done.stderr[-3000:]
  assert_ends_with_outputs(done.stdout, "stori_config.json", "params.safetensors")

  done = run_command(
    "stori_jax.embed", f"--source={out}", f"--output={tmp_path / 'emb'}", "a (red:1.5) star"
  )
  assert done.returncode == 0, done.stderr[-3000:]
  assert assert_ends_with_outputs(done.stdout, "emb.npy") == [str(tmp_path / "emb.npy")]

  done = run_command(
    "stori_jax.evaluate_world",
    f"--source={out}",
    f"--output_dir={tmp_path / 'eval'}",
    "--n_images=8",
    "--n_pairs=8",
    "--n_triples=1",
    "--images_per_category=1",
  )
  assert done.returncode == 0, done.stderr[-3000:]
  assert_ends_with_outputs(done.stdout, "synthetic_world_eval.json", "synthetic_world_eval.md")

  probe = tmp_path / "probe.py"
  probe.write_text(
    "from configs import retrieval_synthetic\n\n\n"
    "def get_config():\n"
    "  config = retrieval_synthetic.get_config()\n"
    "  config.data.n_triples, config.data.images_per_category = 2, 2\n"
    "  return config\n"
  )
  done = run_command(
    "stori_jax.start_block",
    f"--model={out}",
    f"--data_config={probe}",
    f"--workdir={tmp_path / 'blocks'}",
  )
  assert done.returncode == 0, done.stderr[-3000:]
  assert_ends_with_outputs(done.stdout, "run.json", "start_block.json", "start_block.png")


@pytest.mark.slow
def test_pretrain_ends_with_the_files_it_wrote(tmp_path, run_command):
  from test_pretrain import SMALL  # pylint: disable=import-outside-toplevel

  done = run_command(
    "stori_jax.pretrain",
    "--config=configs/tiny_clip_pretrain.py",
    *SMALL,
    "--config.total_steps=3",
    "--config.eval_every=3",
    f"--workdir={tmp_path}",
  )
  assert done.returncode == 0, done.stderr[-3000:]
  paths = assert_ends_with_outputs(
    done.stdout, "run.json", "metrics.jsonl", "training_curve.png", "checkpoints", "export"
  )
  assert str(tmp_path / "export") + os.sep in paths  # relative to the workdir, once
