"""stori_jax.cli: one flag convention for every command, and commands run in this process
(`run_in_process`) with the handling of `python -m`: exit 2 and one paragraph for a mistake."""

import importlib
import os

import pytest
from absl import flags
from absl import logging as absl_logging

from stori_jax import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = (
  "stori_jax.train",
  "stori_jax.pretrain",
  "stori_jax.retrieve",
  "stori_jax.explore",
  "stori_jax.embed",
  "stori_jax.convert",
  "stori_jax.parity",
  "stori_jax.start_block",
  "stori_jax.list_models",
  "stori_jax.evaluate_world",
  "mutual.analyze",
  "mutual.evaluate",
  "mutual.sweep.__main__",
)


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
  from stori_jax import retrieve, train  # pylint: disable=import-outside-toplevel
  from stori_jax import list_models as models  # pylint: disable=import-outside-toplevel

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
