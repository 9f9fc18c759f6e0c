"""SToRI (Kim et al.): the token weights of the CuPL prompts, trained as log-weights with Adam
(paper §3.2, §4.1, App. A.1), registered as the few-shot method "stori"."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from stori_jax.fewshot import paper_config, report
from stori_jax.fewshot.methods.registry import FewShotMethod, Method, register
from stori_jax.fewshot.prompt_bank import gather_token_weights
from stori_jax.fewshot.schedules import stori_schedule
from stori_jax.fewshot.text_classifier import WeightedTextClassifier, to_host
from stori_jax.plumbing.config_files import ConfigChecks, ConfigError


def log_weight_penalty(classifier: WeightedTextClassifier, strength: float):
  """log-weights -> strength * mean over the prompts' tokens of (log w)^2.

  Beyond the paper (its objective is the cross-entropy alone, `strength` 0): an L2 prior on
  the log-weights centred on w = 1, the plain prompt. With Adam, whose steps have about the
  same size whatever the gradient's, every weight otherwise drifts to the end of its range
  along the sign of a small gradient; the prior keeps a word's weight at 1 unless the data
  keep pushing it, so the words that decide the classes are the ones that move.
  """
  # The learned tokens of real prompts: padding rows (added so prompts split evenly over the
  # devices) must not count, or the penalty would depend on the number of devices.
  masks = [
    np.asarray(b.trainable & (b.prompt_index >= 0)[:, None], np.float32)
    for b in classifier.bank.buckets
  ]
  count = max(sum(float(m.sum()) for m in masks), 1.0)

  def penalty(log_weights):
    total = sum(jnp.sum(m * jnp.square(lw)) for m, lw in zip(masks, log_weights))
    return strength * total / count

  return penalty


def stori_method(config, classifier: WeightedTextClassifier, total_steps: int) -> Method:
  """SToRI: Adam on the log-weights (paper App. A.1: no weight decay) on `stori_schedule`;
  optionally the log-weight prior (`log_weight_penalty`)."""
  strength = float(config.optim.get("log_weight_penalty", 0.0))
  schedule = stori_schedule(config, total_steps)
  return Method(
    "stori",
    classifier.init_log_weights,
    classifier.class_embeddings,
    classifier.data,
    optax.adam(schedule),
    reported=lambda log_weights: jax.tree_util.tree_map(jnp.exp, log_weights),
    penalty=(
      log_weight_penalty(classifier, strength)
      if strength > 0
      else (lambda params: jnp.zeros((), jnp.float32))
    ),
    schedule=schedule,
  )


def _build(config, bundle, classifier, total_steps, steps_per_epoch) -> Method:
  del bundle, steps_per_epoch
  # The module's global at call time: a test may wrap it (tests/test_errors_training.py).
  return stori_method(config, classifier, total_steps)


def _check(checks: ConfigChecks, selected: bool) -> None:
  """config.optim.lr: a rate > 0, or None for the paper's rule, which must have a rate for the
  run; with SToRI selected, CuPL prompts to train."""
  if selected and checks.get("prompts.use_cupl", True) is False:
    checks.problem(
      "config.prompts.use_cupl is False but SToRI trains the token weights of the CuPL "
      "prompts (paper §4.1.3), so it has nothing to train: the Base-prompt row is TaskRes's "
      "(--config.method=taskres), or set --config.prompts.use_cupl=True"
    )
  if checks.get("optim.lr", 0) is None:
    # The paper's rule, which `run` fills in: check that it has a rate for this run.
    try:
      paper_config.resolve_learning_rate(checks.config)
    except ConfigError as error:
      checks.problem(str(error).rstrip("."))
  else:
    checks.number("optim.lr", above=0)


def _paper_learning_rate(config) -> float | None:
  """App. A.1's rate by dataset, shots and backbone; None for a backbone it has none for."""
  try:
    return paper_config.learning_rate(
      str(config.data.name), int(config.shots), paper_config.run_backbone(config)
    )
  except ConfigError:
    return None


def _report(params, bundle, bank, workdir, is_main):
  """weights.json and interpretability.html/.png: every trainable prompt's token and word
  weights."""
  weights = gather_token_weights(bank, [to_host(w) for w in params])
  words = report.prompt_word_weights(bundle.tokenizer, bank, weights)
  if is_main:
    report.write_weights(workdir, bundle.tokenizer, bank, weights, words)
    report.write_interpretability(workdir, bank, words)
  return weights, words


def _metrics(words, bank, split, hooks):
  """Every class's top words, then the scores of the dataset's report hook (a dataset that
  knows which words tell its classes apart scores the trained weights)."""
  metrics = {"top_words": report.class_top_words(bank, words)}
  if split.dataset in hooks:
    metrics.update(
      hooks[split.dataset](
        bank=bank, words=words, top_words=metrics["top_words"], class_names=split.class_names
      )
    )
  return metrics


STORI = register(
  FewShotMethod(
    name="stori",
    label="SToRI",
    build=_build,
    lr_key="optim.lr",
    warmup_block=lambda config: (
      "optim" if config.optim.get("schedule", "cosine") == "taskres" else None
    ),
    paper_learning_rate=_paper_learning_rate,
    check=_check,
    report=_report,
    metrics=_metrics,
  )
)
