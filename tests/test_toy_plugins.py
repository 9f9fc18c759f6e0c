"""The extension points from outside the project: tests/toy_plugins.py's toys, each named in a
config as `toy_plugins:<name>` (the registry imports the module, which registers them), run
through the project's own commands: a few-shot method through `python -m stori_jax.train`, an
evaluation protocol through `mutual.evaluate`."""

import json
import os
import sys
import types

import ml_collections
import numpy as np
import pytest

from mutual import evaluate, protocols
from mutual.evaluation import runner as evaluation
from stori_jax import train
from stori_jax.fewshot import methods, trainer
from stori_jax.grid import cells
from stori_jax.plumbing.config_files import ConfigError, load_config
from demo_flags import short_demo_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(ROOT, "configs/mutual_eval_synthetic.py:smoke")


@pytest.fixture
def toy_plugins():
  """Nothing registered before the test; afterwards the toys are unregistered and the module
  forgotten, so that every other test sees the built-in entries alone (their messages list
  them) and a later import registers the toys afresh."""
  assert "toy_plugins" not in sys.modules
  yield
  methods.unregister("class_bias")
  protocols.unregister("zero_shot_topk")
  sys.modules.pop("toy_plugins", None)


def test_a_config_names_a_method_of_its_own_module(toy_plugins):
  config = load_config(os.path.join(ROOT, "configs/demo.py"))
  config.method = "toy_plugins:class_bias"
  trainer.validate_config(config)  # imports the module: the method registers itself
  entry = methods.get("class_bias")
  assert methods.of(config) is entry and entry.block == "optim"
  assert methods.names() == ("stori", "taskres", "class_bias")
  assert entry.learning_rate(config) == config.optim.lr == 0.05
  assert cells.paper_learning_rate(config) is None  # not the paper's: no App. A.1 rate
  config.method = "toy_plugins:no_such_method"
  with pytest.raises(ConfigError) as error:
    trainer.validate_config(config)
  assert "unknown few-shot method" in str(error.value)
  assert "'stori', 'taskres', 'class_bias'" in str(error.value)
  config.method = "no_such_module:class_bias"
  with pytest.raises(ConfigError, match="'no_such_module' cannot be imported"):
    trainer.validate_config(config)


@pytest.mark.slow
def test_the_toy_method_trains_through_the_train_command(
  tmp_path, toy_plugins, tiny_random_model, tiny_random_config, run_command
):
  workdir = tmp_path / "run"
  done = run_command(
    train,
    *short_demo_flags(
      workdir,
      tiny_random_model,
      "--config.method=toy_plugins:class_bias",
      "--config.epochs=4",
    ),
  )
  assert done.returncode == 0, done.stderr[-3000:]
  assert "class_bias accuracy:" in done.stdout
  metrics = json.loads((workdir / "metrics.json").read_text())
  assert metrics["method"] == "class_bias" and metrics["steps"] == 4
  assert metrics["config"]["method"] == "toy_plugins:class_bias"
  assert 0 <= metrics["trained"]["accuracy"] <= 1
  assert "top_words" not in metrics  # SToRI's report, not this method's
  # Its own report: every class's trained bias, moved off 0 by 4 Adam steps of at most
  # lr = 0.05 per coordinate.
  norms = json.loads((workdir / "class_bias.json").read_text())
  assert list(norms) == list(metrics["trained"]["per_class"])
  bound = 4 * 0.05 * np.sqrt(tiny_random_config.embed_dim)
  assert all(0.0 < n <= bound for n in norms.values()), (norms, bound)
  assert not (workdir / "weights.json").exists()  # no token weights to write
  records = [json.loads(line) for line in (workdir / "history.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records] == [1, 2, 3, 4]
  assert records[0]["lr"] == pytest.approx(0.05)  # SToRI's cosine schedule at its first step


def test_the_toy_protocol_reads_its_inputs_and_its_settings(toy_plugins):
  """`run_protocols` on hand-made inputs: the toy's settings come from config.protocols where
  the config has its section, else from its defaults; its result is keyed by its short name."""
  config = load_config(*SMOKE.split(":"))
  config.evaluation.protocols = ("toy_plugins:zero_shot_topk",)
  # Three unit class embeddings; images 0 and 1 nearest their own class, image 2 nearest
  # class 0 although labelled 2 (its second-nearest class is 2).
  classes = np.eye(3, 4, dtype=np.float32)
  images = np.array([[1, 0, 0, 0], [0, 1, 0, 0], [0.8, 0, 0.6, 0]], np.float32)
  concepts = types.SimpleNamespace(image_embeddings=images, labels=np.array([0, 1, 2]))
  bank = types.SimpleNamespace(class_embeddings=classes)
  names = ["a", "b", "c"]
  out = evaluation.run_protocols(None, config, concepts, names, [[]] * 3, 64, bank, False)
  assert out == {"zero_shot_topk": {"k": 2, "images": 3, "accuracy": 100.0}}  # defaults: k 2
  with config.unlocked():
    config.protocols.zero_shot_topk = ml_collections.ConfigDict(dict(k=1))
  out = evaluation.run_protocols(None, config, concepts, names, [[]] * 3, 64, bank, False)
  assert out["zero_shot_topk"]["accuracy"] == pytest.approx(200 / 3)
  assert protocols.section("zero_shot_topk", {"M-1": out["zero_shot_topk"]}).startswith(
    "## Toy: zero-shot top-k (%)"
  )
  assert protocols.names()[-1] == "zero_shot_topk"  # after the paper's six


@pytest.mark.slow
def test_the_toy_protocol_runs_through_the_evaluation(tmp_path, toy_plugins, run_command):
  """configs/mutual_eval_synthetic.py:smoke through `python -m mutual.evaluate` with the toy as
  its one protocol (no baselines, one concept method: the cheapest Table 1 pass)."""
  workdir = tmp_path / "eval"
  done = run_command(
    evaluate,
    f"--config={SMOKE}",
    f"--workdir={workdir}",
    "--config.evaluation.protocols=('toy_plugins:zero_shot_topk',)",
    "--config.analysis.methods=('pca',)",
    "--config.baselines.enabled=False",
  )
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads((workdir / "protocols.json").read_text())
  assert list(result) == ["zero_shot_topk"]
  toy = result["zero_shot_topk"]
  # The smoke size: 2 classes of 4 images; k from the protocol's defaults (the config has no
  # config.protocols.zero_shot_topk section); a share of 8 images.
  assert (toy["k"], toy["images"]) == (2, 8)
  assert 0 <= toy["accuracy"] <= 100 and (toy["accuracy"] / 12.5).is_integer()
  kept = json.loads((workdir / "protocols" / "zero_shot_topk.json").read_text())
  assert kept["payload"] == toy  # the protocol's record of finished work holds its result
  text = (workdir / "protocols.md").read_text()
  assert text.startswith("## Toy: zero-shot top-k (%)")
  assert f"| 8 | 2 | {toy['accuracy']:.2f} |" in text
  assert "## Toy: zero-shot top-k (%)" in done.stdout


def test_an_unknown_protocol_module_is_named_before_any_work(tmp_path):
  config = load_config(*SMOKE.split(":"))
  config.evaluation.protocols = ("no_such_module:zero_shot_topk",)
  with pytest.raises(ConfigError, match="'no_such_module' cannot be imported"):
    evaluation.run(config, str(tmp_path / "eval"), progress=False)
  assert not (tmp_path / "eval").exists()
