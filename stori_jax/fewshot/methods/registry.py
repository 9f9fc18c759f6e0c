"""Few-shot methods by registration: everything the trainer, the grid and the reports ask of a
method (SToRI, TaskRes, or one of your own) in one `FewShotMethod` entry, looked up by the name
`config.method` gives. Nothing outside a method's own module compares method names.

A method is one module that calls `register(FewShotMethod(...))` at import (the built-ins:
`stori.py`, `taskres.py`, imported by this package). One defined outside the project is named
in its config as `module:name` (`--config.method=toy_plugins:class_bias`,
tests/toy_plugins.py): `get` imports the module, whose import registers it.

The entry holds:

* `build(config, bundle, classifier, total_steps, steps_per_epoch) -> Method`: its parameters
  (`Method.init`), its classifier (`Method.class_embeddings`: the class embeddings, hence the
  logits, from the parameters), its optimiser and the learning rate it applies per step;
* its config block and learning-rate key (`lr_key`, "optim.lr" or "taskres.lr"), the block's
  warm-up (`warmup_block`), the paper's rate for a cell (`paper_learning_rate`, App. A.1) and the
  checks of its settings (`check`);
* its report: the files it writes beside the shared ones and what it adds to metrics.json
  (`report`, `metrics`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import optax

from stori_jax.plumbing import plugins
from stori_jax.plumbing.config_files import ConfigChecks

#: The method of a config without `method` (the pairwise study's): SToRI, the paper's.
DEFAULT = "stori"


@dataclasses.dataclass
class Method:
  """What is trained: init params, the class embeddings they give, and the optimiser.

  class_embeddings(params, context) -> normalised [C, E]; context holds the fixed
  arrays it reads, passed to jitted functions as an argument (multi-host JAX
  forbids closing over global arrays).
  """

  name: str
  init: Callable[[], Any]
  class_embeddings: Callable[[Any, Any], jax.Array]
  context: Any
  optimizer: optax.GradientTransformation
  #: params -> the weights the run reports (SToRI: w = exp(log w), which overflows float32
  #: above log w ~ 88 even while log w is finite).
  reported: Callable[[Any], Any] = lambda params: params
  #: params -> a scalar added to the loss (SToRI: the log-weight penalty; 0 by default).
  penalty: Callable[[Any], jax.Array] = lambda params: jnp.zeros((), jnp.float32)
  #: step (the updates before this one) -> the learning rate the optimiser applies in it, as
  #: the history's "lr" reports it (None: not reported).
  schedule: optax.Schedule | None = None


def _no_check(checks: ConfigChecks, selected: bool) -> None:
  del checks, selected


def _no_paper_rate(config) -> float | None:
  del config
  return None


def _no_report(params, bundle, bank, workdir: str, is_main: bool):
  del params, bundle, bank, workdir, is_main
  return None, None


def _no_metrics(words, bank, split, hooks) -> dict[str, Any]:
  del words, bank, split, hooks
  return {}


@dataclasses.dataclass(frozen=True, eq=False)
class FewShotMethod:
  """One few-shot method.

  Attributes:
    name: its name in `config.method` and in metrics.json ("stori", "taskres").
    label: its name in messages and figures ("SToRI", "TaskRes").
    build: (config, bundle, classifier, total_steps, steps_per_epoch) -> `Method`: its
      parameters, classifier and optimiser over config.epochs epochs of steps_per_epoch steps
      (classifier: the run's `text_classifier.WeightedTextClassifier`, its prompt bank
      `classifier.bank`).
    lr_key: the dotted config key of its learning rate ("optim.lr"); its first part is the
      method's config block, whose `warmup_epochs` / `warmup_lr` its schedule reads.
    warmup_block: config -> the block whose warm-up epochs the schedule spends at a constant
      rate ("optim", "taskres"), or None where it has no warm-up (a warning says when the
      warm-up covers every epoch).
    paper_learning_rate: config -> the paper's (App. A.1) learning rate for the config's
      dataset, shots and backbone, or None where the paper gives none (the grid records whether
      a cell trains at it).
    check: (checks, selected) -> None: records problems of the config (`ConfigChecks`). Called
      for every registered method whose config block the config holds (a config carries the
      blocks of several methods, so that --config.method switches between them), `selected`
      True for the config's own method, which also checks what it needs of the prompts.
    report: (params, bundle, bank, workdir, is_main) -> (weights, words): writes the method's
      own files after training (when is_main) and returns the token weights of every trainable
      prompt (a list of float32 arrays) and their word weights, or (None, None).
    metrics: (words, bank, split, hooks) -> dict added to metrics.json (hooks: {dataset name:
      `world_scoring.ReportHook`}).
  """

  name: str
  label: str
  build: Callable[..., Method]
  lr_key: str = "optim.lr"
  warmup_block: Callable[[Any], str | None] = lambda config: None
  paper_learning_rate: Callable[[Any], float | None] = _no_paper_rate
  check: Callable[[ConfigChecks, bool], None] = _no_check
  report: Callable[..., tuple[Sequence[Any] | None, Any]] = _no_report
  metrics: Callable[..., Mapping[str, Any]] = _no_metrics

  @property
  def block(self) -> str:
    """The method's config block ("optim", "taskres")."""
    return self.lr_key.partition(".")[0]

  def learning_rate(self, config) -> float:
    """The learning rate the config sets at `lr_key` (after `paper_config.resolve_learning_rate`
    where it is the paper's rule)."""
    node = config
    for part in self.lr_key.split("."):
      node = node[part]
    return float(node)


_METHODS: plugins.Registry[FewShotMethod] = plugins.Registry("few-shot method", "config.method")
register = _METHODS.register
unregister = _METHODS.unregister
names = _METHODS.names


def get(name: str) -> FewShotMethod:
  """The method named `name` (`module:name` imports `module` first).

  Raises:
    ConfigError: no such method (the message names the registered ones).
  """
  return _METHODS.get(name)


def of(config) -> FewShotMethod:
  """The method of a few-shot config (`config.method`, DEFAULT where it has none)."""
  return get(config.get("method", DEFAULT))


def registered() -> tuple[FewShotMethod, ...]:
  """Every registered method, in registration order."""
  return tuple(get(name) for name in names())
