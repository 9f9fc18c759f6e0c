"""User errors (stori_jax.plumbing.errors) on the training side: a workdir belongs to the run that made it,
every config value is checked before any work, a diverged run stops at its first NaN keeping its
last good checkpoint, and every result file is strict JSON. Command lines answer a user's mistake
with one paragraph and exit status 2."""

import dataclasses
import glob
import hashlib
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import optax
import pytest

from stori_jax.plumbing import cli, jsonio
from stori_jax import train
from stori_jax.retrieval import runner as retrieval_runner
from stori_jax.trainloop import metrics_log
from stori_jax.pretraining import contrastive
from stori_jax.plumbing.config_files import ConfigChecks, ConfigError, load_config
from stori_jax.plumbing.errors import NonFiniteError, UserError
from stori_jax.fewshot import trainer
from stori_jax.fewshot.methods import stori
from stori_jax.plumbing.run_identity import WorkdirMismatchError, claim_workdir, release_workdirs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(REPO, "configs", "demo.py")
PRETRAIN = os.path.join(REPO, "configs", "tiny_clip_pretrain.py")
RETRIEVAL = os.path.join(REPO, "configs", "retrieval_synthetic.py")
#: The few-shot runs here: 4 shots of the demo's 12 classes (one step per epoch), checkpoints
#: every 2 steps.
OVERRIDES = {
  "views": 2,
  "shots": 4,
  "data.n_test_per_class": 5,
  "log_every": 1,
  "eval_every": 2,
  "checkpoint_every": 2,
  "epochs": 4,
}


# Helpers ------------------------------------------------------------------------------------


def _set(config, key, value):
  *path, leaf = key.split(".")
  node = config
  for part in path:
    node = node[part]
  node[leaf] = value


def demo_config(model, **changes):
  config = load_config(DEMO)
  for key, value in {"model.source": model, **OVERRIDES, **changes}.items():
    _set(config, key.replace("__", "."), value)
  return config


def _flags(model, **changes):
  """The command-line flags that build demo_config(model, **changes)."""
  values = {"model.source": model, **OVERRIDES, **changes}
  return [f"--config.{k.replace('__', '.')}={v}" for k, v in values.items()]


def snapshot(folder) -> dict[str, str]:
  """{relative path: sha256} of every file under folder."""
  out = {}
  for path in sorted(glob.glob(os.path.join(folder, "**"), recursive=True)):
    if os.path.isfile(path):
      with open(path, "rb") as f:
        out[os.path.relpath(path, folder)] = hashlib.sha256(f.read()).hexdigest()
  return out


def _refuse_constant(name):
  raise AssertionError(f"non-strict JSON constant {name}")


def assert_strict_json(folder) -> int:
  """Every .json / .jsonl file under folder parses as strict JSON (no NaN, no Infinity)."""
  count = 0
  for path in glob.glob(os.path.join(folder, "**", "*.json*"), recursive=True):
    if "checkpoints" in path:
      continue  # orbax's own metadata
    with open(path, encoding="utf-8") as f:
      text = f.read()
    lines = text.splitlines() if path.endswith(".jsonl") else [text]
    for line in lines:
      json.loads(line, parse_constant=_refuse_constant)
    count += 1
  return count


def _run_program(*args, timeout=300):
  """`python -m *args` in a subprocess, from the repository root."""
  return subprocess.run(
    [sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
  )


def assert_user_error(done, *phrases):
  """Exit status 2 and one `error:` paragraph naming the phrases, no traceback."""
  assert done.returncode == 2, done.stderr[-3000:]
  assert "Traceback" not in done.stderr, done.stderr[-3000:]
  message = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
  assert len(message) == 1, done.stderr[-3000:]
  for phrase in phrases:
    assert phrase in message[0], message[0]
  return message[0]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_random_model):
  """A few-shot run of demo_config(tiny_random_model) trained to its end: (workdir, metrics)."""
  workdir = str(tmp_path_factory.mktemp("finished") / "run")
  metrics = trainer.run(demo_config(tiny_random_model), workdir)
  release_workdirs()  # the run ended; its tests start other processes on it
  return workdir, metrics


def fake_finished_run(workdir, config) -> str:
  """A workdir as a finished run of `config` leaves it (run.json as the trainer writes it, and
  result files), made without training: the refusals below happen before any work."""
  claim_workdir(workdir, trainer.identity(config))
  release_workdirs()  # made, not running: the commands below may be other processes
  os.makedirs(os.path.join(workdir, "checkpoints", "4"))
  for name, text in (
    ("metrics.json", '{"trained": {"accuracy": 0.9}}\n'),
    ("weights.json", "[]\n"),
    ("history.jsonl", '{"step": 4, "loss": 0.1}\n'),
    ("checkpoints/4/state", "weights"),
  ):
    with open(os.path.join(workdir, name), "w", encoding="utf-8") as f:
      f.write(text)
  return workdir


class _NotReached(Exception):
  """Raised by a patched loader: the run got past its checks to the first real work."""


def _not_reached(*args, **kwargs):
  raise _NotReached()


# Config values, before any work ---------------------------------------------------------------


@pytest.mark.parametrize(
  "key, value, expected",
  [
    ("method", "foo", "config.method must be one of 'stori', 'taskres', got 'foo'"),
    ("epochs", -1, "config.epochs must be an integer >= 1, got -1"),
    ("batch_size", 0, "config.batch_size must be an integer >= 1, got 0"),
    ("views", -1, "config.views must be an integer >= 0 and <= 1000, got -1"),
    ("image_dtype", "float16", "config.image_dtype must be one of 'float32', 'bfloat16'"),
    ("optim.lr", float("nan"), "config.optim.lr must be a finite number > 0, got nan"),
    ("optim.lr", -0.1, "config.optim.lr must be a finite number > 0"),
    (
      "optim.schedule",
      "linear",
      "config.optim.schedule must be one of 'taskres', 'cosine', got 'linear'",
    ),
    ("shots", 0, "config.shots must be an integer >= 1"),
    ("start_block", 0, "config.start_block must be an integer >= 1 (or None), got 0"),
    ("augment_scale", (0.5, 0.2), "config.augment_scale must be (low, high)"),
    ("data.source", "coop", "config.data.source is 'coop' but config.data.name is 'synthetic'"),
  ],
)
def test_fewshot_config_values_are_checked_before_any_work(
  tmp_path, monkeypatch, key, value, expected
):
  monkeypatch.setattr(trainer, "load", lambda *a, **k: pytest.fail("the run started"))
  config = demo_config("tiny-synthetic", **{key: value})
  with pytest.raises(ConfigError, match="invalid config") as error:
    trainer.run(config, str(tmp_path / "run"))
  assert expected in str(error.value) and "Nothing was run" in str(error.value)
  assert not (tmp_path / "run").exists()  # not even the workdir


def test_every_bad_value_is_named_at_once():
  config = demo_config("tiny-synthetic", method="foo", epochs=-1, batch_size=0, views=-1)
  with pytest.raises(ConfigError) as error:
    trainer.validate_config(config)
  for key in ("config.method", "config.epochs", "config.batch_size", "config.views"):
    assert key in str(error.value)


def test_a_huge_learning_rate_is_warned_about(caplog):
  trainer.validate_config(demo_config("tiny-synthetic", **{"optim.lr": 1000.0}))
  assert "far above the paper's Adam learning rates" in caplog.text


def test_config_checks_know_types_and_ranges():
  config = {"a": True, "b": 2.5, "c": (1, 2), "d": "x", "e": float("inf"), "f": (0.1, "y")}
  checks = ConfigChecks(config)
  assert checks.integer("a") is None  # a bool is not an integer
  assert checks.number("b", maximum=3) == 2.5
  assert checks.integers("c", count=2, distinct=True) == (1, 2)
  assert checks.choice("d", ("xy", "z")) is None
  assert checks.number("e") is None
  assert checks.numbers("f") is None
  assert checks.text("missing") is None
  problems = " | ".join(checks.problems)
  assert "config.a must be an integer, got True" in problems
  assert "did you mean 'xy'" in problems and "config.e must be a finite number" in problems
  assert "config.missing is missing" in problems
  with pytest.raises(ConfigError):
    checks.raise_if_any()


def test_start_block_beyond_the_tower_stops_before_the_images_are_encoded(tmp_path, monkeypatch):
  monkeypatch.setattr(trainer, "encode_images", lambda *a, **k: pytest.fail("the run started"))
  with pytest.raises(ConfigError, match=r"start_block = 9 is outside .*blocks 1\.\.6"):
    trainer.run(demo_config("tiny-synthetic", start_block=9), str(tmp_path / "run"))
  # the refused run leaves only its run.json: the corrected command may take the folder over
  assert sorted(os.listdir(tmp_path / "run")) == [".lock", "run.json"]
  monkeypatch.setattr(trainer, "encode_images", _not_reached)
  with pytest.raises(_NotReached):
    trainer.run(demo_config("tiny-synthetic", start_block=2), str(tmp_path / "run"))


# Workdirs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
  "change, difference",
  [
    ({"seed": 2}, "config.seed: 1 then, 2 now"),
    ({"start_block": 1}, "config.start_block: None then, 1 now"),
    ({"epochs": 200}, "config.epochs: 4 then, 200 now"),
    ({"method": "taskres"}, "config.method: 'stori' then, 'taskres' now"),
  ],
)
def test_another_config_never_resumes_a_finished_run(tmp_path, monkeypatch, change, difference):
  workdir = fake_finished_run(str(tmp_path / "run"), demo_config("tiny-synthetic"))
  before = snapshot(workdir)
  monkeypatch.setattr(trainer, "load", lambda *a, **k: pytest.fail("the run started"))
  with pytest.raises(WorkdirMismatchError) as error:
    trainer.run(demo_config("tiny-synthetic", **change), workdir)
  message = str(error.value)
  assert difference in message and "--restart" in message and "another --workdir" in message
  assert snapshot(workdir) == before  # nothing lost, nothing touched


@pytest.mark.slow
def test_the_same_config_resumes_and_reports_the_same_result(finished_run, tiny_random_model):
  workdir, metrics = finished_run
  weights = snapshot(workdir)["weights.json"]
  # log_every only chooses which steps are logged: it may change on resume
  again = trainer.run(demo_config(tiny_random_model, log_every=2), workdir)
  assert again["trained"] == metrics["trained"] and again["steps"] == metrics["steps"]
  assert snapshot(workdir)["weights.json"] == weights
  assert assert_strict_json(workdir) >= 4  # run.json, metrics.json, weights.json, history


def test_restart_moves_the_old_run_aside(monkeypatch, tmp_path):
  workdir = fake_finished_run(str(tmp_path / "run"), demo_config("tiny-synthetic"))
  before = snapshot(workdir)
  monkeypatch.setattr(trainer, "load", _not_reached)
  with pytest.raises(_NotReached):
    trainer.run(demo_config("tiny-synthetic", seed=2), workdir, restart=True)
  (moved,) = glob.glob(workdir + ".old-*")
  assert snapshot(moved) == before
  assert sorted(os.listdir(workdir)) == [".lock", "run.json"]
  with open(os.path.join(workdir, "run.json"), encoding="utf-8") as f:
    assert json.load(f)["config"]["seed"] == 2


def test_a_workdir_that_is_a_file_or_read_only_fails_before_any_work(tmp_path, monkeypatch):
  monkeypatch.setattr(trainer, "load", lambda *a, **k: pytest.fail("the run started"))
  path = tmp_path / "a_file"
  path.write_text("keep me")
  with pytest.raises(WorkdirMismatchError, match="is a file, not a folder"):
    trainer.run(demo_config("tiny-synthetic"), str(path))
  assert path.read_text() == "keep me"
  read_only = tmp_path / "read_only"
  read_only.mkdir()
  if os.geteuid() == 0:  # root writes through permission bits: a read-only mount, as EROFS
    real = os.access
    monkeypatch.setattr(
      os, "access", lambda p, mode, **k: False if str(p) == str(read_only) else real(p, mode, **k)
    )
  else:
    read_only.chmod(0o555)
  with pytest.raises(WorkdirMismatchError, match="not writable"):
    trainer.run(demo_config("tiny-synthetic"), str(read_only))


# Divergence --------------------------------------------------------------------------------


def nan_from_update(first_bad: int) -> optax.GradientTransformation:
  """Turns every update from the `first_bad`-th one (1-based) into NaN."""

  def init(params):
    del params
    return {"count": jnp.zeros((), jnp.int32)}

  def update(updates, state, params=None):
    del params
    scale = jnp.where(state["count"] + 1 >= first_bad, jnp.nan, 1.0)
    return jax.tree_util.tree_map(lambda u: u * scale, updates), {"count": state["count"] + 1}

  return optax.GradientTransformation(init, update)


@pytest.mark.slow
def test_a_diverged_run_stops_at_its_first_nan_and_keeps_the_last_good_checkpoint(
  tmp_path, monkeypatch, tiny_random_model
):
  workdir = str(tmp_path / "run")
  stori_method = stori.stori_method
  first_bad = {"update": 3}

  def diverging(config, classifier, total_steps):
    method = stori_method(config, classifier, total_steps)
    nan = nan_from_update(first_bad["update"])
    return dataclasses.replace(method, optimizer=optax.chain(method.optimizer, nan))

  monkeypatch.setattr(stori, "stori_method", diverging)
  config = demo_config(tiny_random_model, epochs=6)
  with pytest.raises(NonFiniteError) as error:
    trainer.run(config, workdir)
  message = str(error.value)
  assert "training stopped at step 3 of 6: the weights became NaN or infinite" in message
  assert "config.optim.lr = 0.05" in message
  assert "last good checkpoint (step 2)" in message
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["2"]
  records = metrics_log.read_records(os.path.join(workdir, "history.jsonl"))
  assert [r["step"] for r in records] == [1, 2]
  assert not os.path.exists(os.path.join(workdir, "metrics.json"))
  assert not os.path.exists(os.path.join(workdir, "weights.json"))
  assert_strict_json(workdir)
  # With the cause gone the same command resumes from the good checkpoint and finishes.
  first_bad["update"] = 10**6
  metrics = trainer.run(config, workdir)
  assert metrics["steps"] == 6
  assert [r["step"] for r in metrics_log.read_records(os.path.join(workdir, "history.jsonl"))] == [
    1,
    2,
    3,
    4,
    5,
    6,
  ]
  assert assert_strict_json(workdir) >= 4


@pytest.mark.slow
def test_an_absurd_learning_rate_stops_at_the_first_step_with_the_cause(
  tmp_path, tiny_random_model
):
  workdir = str(tmp_path / "run")
  with pytest.raises(NonFiniteError) as error:
    trainer.run(demo_config(tiny_random_model, **{"optim.lr": 1000.0}), workdir)
  message = str(error.value)
  # log w = +-1000 overflows w = exp(log w): the weights that weights.json would hold
  assert "stopped at step 1 of 4" in message and "config.optim.lr = 1000" in message
  assert "no checkpoint had been saved yet" in message
  assert sorted(os.listdir(workdir)) == [".lock", "checkpoints", "run.json"]


def test_the_watch_names_the_first_bad_step_and_what_broke(tmp_path):
  from stori_jax.trainloop.checkpointer import NonFiniteWatch, nonfinite_code

  watch = NonFiniteWatch("training", "Lower the learning rate.")
  finite = nonfinite_code(jnp.float32(1.0), {"g": jnp.ones(3)}, [jnp.zeros(2)])
  watch.add(1, finite)
  watch.check(10, str(tmp_path))  # all finite: nothing happens
  watch.last_saved = 1
  watch.add(2, finite)
  watch.add(3, nonfinite_code(jnp.float32(jnp.nan), {"g": jnp.array([jnp.inf])}, [jnp.zeros(2)]))
  watch.add(4, nonfinite_code(jnp.float32(1.0), {"g": jnp.ones(3)}, [jnp.full(2, jnp.nan)]))
  with pytest.raises(NonFiniteError) as error:
    watch.check(10, str(tmp_path))
  message = str(error.value)
  assert "training stopped at step 3 of 10: the loss and the gradients became NaN" in message
  assert "Lower the learning rate." in message and "checkpoint (step 1) is kept" in message


def test_a_checkpoint_holding_nan_is_not_resumed(tmp_path):
  """A NaN checkpoint (written before these checks existed) is refused, not trained on."""
  from stori_jax.trainloop import checkpointer

  good = {"params": [jnp.ones((2,))], "step": jnp.int32(2)}
  checkpointer.require_finite_checkpoint(good, 2, str(tmp_path))
  bad = {"params": [jnp.array([1.0, jnp.inf])], "step": jnp.int32(2)}
  with pytest.raises(NonFiniteError, match="step 2 in .* holds NaN or infinite values") as error:
    checkpointer.require_finite_checkpoint(bad, 2, str(tmp_path))
  assert "--restart" in str(error.value)


@pytest.mark.slow
def test_pretraining_stops_at_its_first_nan(tmp_path, monkeypatch):
  from test_pretrain import small_config

  config = small_config()
  config.total_steps, config.checkpoint_every, config.log_every = 6, 2, 1
  config.eval_every = 1000
  make_optimizer = contrastive.make_optimizer
  monkeypatch.setattr(
    contrastive,
    "make_optimizer",
    lambda c: optax.chain(make_optimizer(c), nan_from_update(4)),
  )
  workdir = str(tmp_path / "pretrain")
  with pytest.raises(NonFiniteError, match="pretraining stopped at step 4 of 6") as error:
    contrastive.train(config, workdir)
  assert "config.learning_rate" in str(error.value)
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["2"]
  records = metrics_log.read_records(os.path.join(workdir, "metrics.jsonl"))
  assert [r["step"] for r in records] == [1, 2, 3]
  assert not os.path.exists(os.path.join(workdir, "export"))
  assert_strict_json(workdir)


# Pretraining and retrieval configs and workdirs ------------------------------------------------


@pytest.mark.parametrize(
  "key, value, expected",
  [
    ("batch_size", 0, "config.batch_size must be an integer >= 2, got 0"),
    ("learning_rate", float("inf"), "config.learning_rate must be a finite number > 0"),
    ("total_steps", 0, "config.total_steps must be an integer >= 1"),
    ("text_length", 100, "config.text_length must be an integer >= 2 and <= 64"),
    ("export_dtype", "float8", "config.export_dtype must be one of"),
    ("data.hard_negative_fraction", 0.75, "must be at most 1, got 0.75 + 0.5"),
    ("model.vision.patch_size", 7, "config.model does not describe a CLIP model"),
  ],
)
def test_pretraining_config_values_are_checked(key, value, expected):
  config = load_config(PRETRAIN)
  _set(config, key, value)
  with pytest.raises(ConfigError) as error:
    contrastive.validate_config(config)
  assert expected in str(error.value)


def test_pretraining_refuses_a_workdir_of_another_config(tmp_path, monkeypatch):
  workdir = str(tmp_path / "pretrain")
  config = load_config(PRETRAIN)
  claim_workdir(workdir, {"config": config})
  (tmp_path / "pretrain" / "metrics.jsonl").write_text('{"step": 50, "loss": 1.0}\n')
  before = snapshot(workdir)
  monkeypatch.setattr(contrastive, "make_optimizer", lambda c: pytest.fail("the run started"))
  config.learning_rate = 3e-3
  with pytest.raises(WorkdirMismatchError, match="config.learning_rate: 0.0015 then, 0.003 now"):
    contrastive.train(config, workdir)
  assert snapshot(workdir) == before
  config.learning_rate, config.log_every = 1.5e-3, 7  # the log cadence may change on resume
  monkeypatch.setattr(contrastive, "make_optimizer", _not_reached)
  with pytest.raises(_NotReached):
    contrastive.train(config, workdir)


@pytest.mark.parametrize(
  "key, value, expected",
  [
    ("methods", ("foo",), "config.methods must be a tuple of one or more distinct items"),
    ("batch_size", 0, "config.batch_size must be an integer >= 1"),
    ("sweep.ws", (0.0, 2.0), "config.sweep.ws must be a tuple of one or more finite numbers"),
    ("weights", (float("nan"),), "config.weights must be a tuple"),
    ("sweep.attributes", (1, 1), "config.sweep.attributes must be a tuple of 2 distinct"),
    ("sweep.normalize", "shares", "did you mean 'share'"),
  ],
)
def test_retrieval_config_values_are_checked(tmp_path, key, value, expected):
  config = load_config(RETRIEVAL)
  _set(config, key, value)
  with pytest.raises(ConfigError) as error:
    retrieval_runner.run(config, str(tmp_path / "out"), bundle=object())
  assert expected in str(error.value)
  assert not (tmp_path / "out").exists()


def test_retrieval_refuses_results_of_another_config(tmp_path, monkeypatch):
  import stori_jax

  out = str(tmp_path / "out")
  config = load_config(RETRIEVAL)
  claim_workdir(out, retrieval_runner.identity(config))
  (tmp_path / "out" / "retrieval_metrics.json").write_text("{}\n")
  before = snapshot(out)
  monkeypatch.setattr(stori_jax, "load", lambda *a, **k: pytest.fail("the run started"))
  config.methods = ("stori",)
  with pytest.raises(WorkdirMismatchError, match="config.methods"):
    retrieval_runner.run(config, out)
  assert snapshot(out) == before
  # batch size and table digits change how the work is done or printed: accepted
  config.methods, config.batch_size, config.table_digits = ("stori", "prompt_weighting"), 8, 2
  monkeypatch.setattr(stori_jax, "load", _not_reached)
  with pytest.raises(_NotReached):
    retrieval_runner.run(config, out)


def test_retrieval_block_numbers_are_checked_against_the_model(tmp_path, tiny_synthetic):
  config = load_config(RETRIEVAL)
  config.sweep.start_blocks = "(1,9)"
  with pytest.raises(ConfigError, match=r"config.sweep.start_blocks: blocks \[9\] are outside"):
    retrieval_runner.run(config, str(tmp_path / "out"), bundle=tiny_synthetic)
  assert sorted(os.listdir(tmp_path / "out")) == [".lock", "run.json"]  # no index, no result


# Metrics log and result files ---------------------------------------------------------------


def test_the_history_rewrite_is_atomic(tmp_path, monkeypatch):
  path = str(tmp_path / "history.jsonl")
  for step in (1, 2, 3):
    metrics_log.append_record(path, {"step": step, "loss": 1.0 / step})
  before = (tmp_path / "history.jsonl").read_bytes()

  def killed(src, dst):
    raise KeyboardInterrupt  # a kill between writing the new file and renaming it

  monkeypatch.setattr(os, "replace", killed)
  with pytest.raises(KeyboardInterrupt):
    metrics_log.read_records(path, up_to_step=1)
  assert (tmp_path / "history.jsonl").read_bytes() == before  # the history survives whole
  assert os.listdir(tmp_path) == ["history.jsonl"]  # and no temporary file is left
  monkeypatch.undo()
  assert [r["step"] for r in metrics_log.read_records(path, up_to_step=1)] == [1]


def test_a_nan_record_is_never_written(tmp_path):
  path = str(tmp_path / "history.jsonl")
  metrics_log.append_record(path, {"step": 1, "loss": 0.5})
  with pytest.raises(NonFiniteError):
    metrics_log.append_record(path, {"step": 2, "loss": float("nan")})
  assert [r["step"] for r in metrics_log.read_records(path)] == [1]
  with pytest.raises(NonFiniteError):
    jsonio.write_json(str(tmp_path / "weights.json"), [{"token_weights": [float("inf")]}])
  assert not (tmp_path / "weights.json").exists()


# Command lines: one paragraph, exit status 2 -------------------------------------------------


def test_nearest_config_key_is_suggested():
  known = ["optim.lr", "taskres.lr", "epochs", "batch_size", "data.root"]
  assert cli._nearest_keys("lr", known) == ["optim.lr", "taskres.lr"]
  assert cli._nearest_keys("optim.lrr", known)[0] == "optim.lr"
  assert cli._nearest_keys("epoch", known) == ["epochs"]


def test_train_cli_names_an_unknown_key_and_its_nearest(tmp_path, run_command):
  done = run_command(train, f"--config={DEMO}", f"--workdir={tmp_path / 'run'}", "--config.lr=abc")
  assert_user_error(done, "--config.lr=abc", "no key 'lr'", "did you mean --config.optim.lr")
  assert not (tmp_path / "run").exists()


def test_train_cli_refuses_the_readme_seed_command_on_a_finished_run(tmp_path, run_command):
  workdir = fake_finished_run(str(tmp_path / "run"), demo_config("tiny-synthetic"))
  before = snapshot(workdir)
  done = run_command(
    train,
    f"--config={DEMO}",
    f"--workdir={workdir}",
    *_flags("tiny-synthetic"),
    "--config.seed=2",
  )
  assert_user_error(done, "config.seed: 1 then, 2 now", "--restart", "another --workdir")
  assert snapshot(workdir) == before


#: Commands run as programs below (the deprecated synthetic_world path), the others in this
#: process.
AS_PROGRAM = {"stori_jax.evaluation.synthetic_world"}


@pytest.mark.parametrize(
  "args, phrases",
  [
    (
      ["stori_jax.train", f"--config={DEMO}", "--config.method=foo", "--workdir=WORKDIR"],
      ["config.method must be one of 'stori', 'taskres', got 'foo'"],
    ),
    (
      ["stori_jax.train", f"--config={DEMO}", "--config.epochs=abc", "--workdir=WORKDIR"],
      ["--config.epochs=abc"],
    ),
    (
      ["stori_jax.train", "--config=configs/nowhere.py", "--workdir=WORKDIR"],
      ["no config file configs/nowhere.py"],
    ),
    (
      ["stori_jax.pretrain", f"--config={PRETRAIN}", "--config.batch_size=0", "--workdir=WORKDIR"],
      ["config.batch_size must be an integer >= 2, got 0"],
    ),
    (
      ["stori_jax.retrieve", f"--config={RETRIEVAL}", "--workdir=FILE"],
      ["is a file, not a folder"],
    ),
    (["stori_jax.convert", "--input=tiny-synthetic", "--output=FILE"], ["--output", "is a file"]),
    (["stori_jax.list_models", "extra"], ["unexpected arguments ['extra']"]),
    (
      ["stori_jax.parity", "--source=tiny-synthetic", "--random=test-tiny"],
      ["exactly one of --source PATH or --random ARCH"],
    ),
    (
      ["stori_jax.evaluate_world", "--n_images=0", "--output_dir=WORKDIR"],
      ["--n_images must be >= 1, got 0"],
    ),
  ],
  ids=[
    "train-method",
    "train-type",
    "train-no-file",
    "pretrain",
    "retrieve",
    "convert",
    "models",
    "parity",
    "synthetic-eval",
  ],
)
def test_cli_user_errors_are_one_paragraph_and_exit_2(tmp_path, run_command, args, phrases):
  afile = tmp_path / "a_file"
  afile.write_text("keep me")
  name, *args = [
    a.replace("WORKDIR", str(tmp_path / "run")).replace("FILE", str(afile)) for a in args
  ]
  if name in AS_PROGRAM:
    done = _run_program(name, *args)
  else:
    done = run_command(name, *args)
  assert_user_error(done, *phrases)
  assert afile.read_text() == "keep me"
  assert not (tmp_path / "run").exists() or os.listdir(tmp_path / "run") == []


def test_user_error_is_the_base_of_the_training_errors():
  assert issubclass(ConfigError, UserError) and issubclass(NonFiniteError, UserError)
  assert issubclass(WorkdirMismatchError, UserError)
