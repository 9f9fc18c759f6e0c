"""What a few-shot run leaves in its workdir: history, weights, curves, word-shading report."""

from __future__ import annotations

import collections
import html
import os
from typing import Any, Sequence

import numpy as np

from stori_jax import jsonio
from stori_jax.training import metrics_log
from stori_jax.fewshot.prompt_bank import PromptBank
from stori_jax.plotting import pyplot
from stori_jax.tokenizer import Tokenizer, word_weights

HISTORY_FILE = "history.jsonl"


def read_history(workdir: str, up_to_step: int) -> list[dict[str, Any]]:
  """Logged records of steps <= up_to_step (a resumed run drops what it will redo)."""
  return metrics_log.read_records(os.path.join(workdir, HISTORY_FILE), up_to_step)


def append_history(workdir: str, record: dict[str, Any]) -> None:
  metrics_log.append_record(os.path.join(workdir, HISTORY_FILE), record)


def prompt_word_weights(
  tokenizer: Tokenizer, bank: PromptBank, weights: Sequence[np.ndarray]
) -> list[list[tuple[str, float]]]:
  """Per trainable prompt, its words with their weights (mean over a word's tokens)."""
  out = []
  for text, row in zip(bank.texts, weights):
    ids = tokenizer([text], context_length=len(row), truncate=True)[0]
    out.append(word_weights(tokenizer, ids, row))
  return out


def class_top_words(
  bank: PromptBank, words: Sequence[Sequence[tuple[str, float]]], top: int = 5
) -> dict[str, list[tuple[str, float]]]:
  """Per class, the words with the highest mean weight over the class's prompts."""
  result = {}
  for c, name in enumerate(bank.class_names):
    pooled = collections.defaultdict(list)
    for prompt_words, cls in zip(words, bank.text_class):
      if cls == c:
        for word, weight in prompt_words:
          pooled[word].append(weight)
    means = sorted(((w, float(np.mean(v))) for w, v in pooled.items()), key=lambda x: -x[1])
    result[name] = means[:top]
  return result


def write_weights(
  workdir: str,
  tokenizer: Tokenizer,
  bank: PromptBank,
  weights: Sequence[np.ndarray],
  words: Sequence[Sequence[tuple[str, float]]],
) -> None:
  """weights.json: every prompt's tokens, token weights and word weights."""
  records = []
  for text, cls, row, prompt_words in zip(bank.texts, bank.text_class, weights, words):
    ids = tokenizer([text], context_length=len(row), truncate=True)[0]
    end = int(np.argmax(ids == tokenizer.eot_token_id)) + 1
    records.append(
      {
        "class": bank.class_names[cls],
        "prompt": text,
        "tokens": tokenizer.token_strings(ids[:end]),
        "token_weights": [float(w) for w in row[:end]],
        "word_weights": prompt_words,
      }
    )
  # Strict JSON: a NaN or infinite weight raises NonFiniteError instead of writing "NaN".
  jsonio.write_json(os.path.join(workdir, "weights.json"), records, indent=1)


def _shade(weight: float, low: float, high: float) -> str:
  """Red for emphasis (w > 1), blue for de-emphasis (w < 1), white for 1."""
  if weight >= 1:
    t = min(1.0, (weight - 1) / max(high - 1, 1e-6))
    return f"rgba(220, 40, 40, {0.75 * t:.3f})"
  t = min(1.0, (1 - weight) / max(1 - low, 1e-6))
  return f"rgba(40, 90, 220, {0.75 * t:.3f})"


def write_interpretability(
  workdir: str,
  bank: PromptBank,
  words: Sequence[Sequence[tuple[str, float]]],
  per_class: int = 4,
  max_classes: int = 12,
) -> str:
  """interpretability.html (every prompt) and .png (the prompts that matter): prompts with every
  word shaded by its trained weight.

  words: per trainable prompt, (word, weight) pairs (see prompt_word_weights). The PNG shows, for
  at most `max_classes` classes, the `per_class` prompts whose weights moved most from 1; a task
  with more classes shows those whose prompts moved most (the HTML has them all).
  """
  values = [w for prompt in words for _, w in prompt] or [1.0]
  low, high = min(values), max(values)
  parts = [
    "<html><head><meta charset='utf-8'><title>SToRI trained weights</title><style>"
    "body{font-family:sans-serif;max-width:60em;margin:2em auto}"
    "span.w{padding:1px 3px;border-radius:3px}</style></head><body>",
    "<h1>Trained token weights</h1><p>Red: emphasised (w &gt; 1), blue: "
    f"de-emphasised (w &lt; 1); weights range {low:.2f} to {high:.2f}. Hover a word for "
    "its weight.</p>",
  ]
  for c, name in enumerate(bank.class_names):
    parts.append(f"<h2>{html.escape(name)}</h2>")
    for prompt_words, cls in zip(words, bank.text_class):
      if cls != c:
        continue
      spans = " ".join(
        f"<span class='w' title='{w:.3f}' style='background:{_shade(w, low, high)}'>"
        f"{html.escape(word)}</span>"
        for word, w in prompt_words
      )
      parts.append(f"<p>{spans}</p>")
  parts.append("</body></html>")
  path = os.path.join(workdir, "interpretability.html")
  jsonio.write_text_atomic(path, "\n".join(parts))
  _interpretability_png(
    os.path.join(workdir, "interpretability.png"),
    bank,
    words,
    (low, high),
    per_class,
    max_classes,
  )
  return path


def _movement(prompt_words: Sequence[tuple[str, float]]) -> float:
  """How far a prompt's weights moved from 1: the largest |log w| of its words."""
  return max((abs(np.log(max(w, 1e-6))) for _, w in prompt_words), default=0.0)


def _rgba(color: str) -> tuple[float, float, float, float]:
  """'rgba(r, g, b, a)' (0-255 channels) -> matplotlib's 0-1 tuple."""
  r, g, b, a = (float(v) for v in color[5:-1].split(","))
  return r / 255, g / 255, b / 255, a


def interpretability_rows(
  bank: PromptBank,
  words: Sequence[Sequence[tuple[str, float]]],
  per_class: int,
  max_classes: int,
) -> tuple[list[int], list[tuple[str | None, Sequence[tuple[str, float]] | None]]]:
  """What the PNG shows: (the classes shown, in task order; rows of (class name, None) or
  (None, a prompt's (word, weight) pairs)). Per class the `per_class` prompts whose weights
  moved most; of more than `max_classes` classes those whose shown prompts moved most."""
  by_class = [
    sorted((w for w, cls in zip(words, bank.text_class) if cls == c), key=_movement, reverse=True)[
      :per_class
    ]
    for c in range(len(bank.class_names))
  ]
  classes = list(range(len(bank.class_names)))
  if len(classes) > max_classes:
    classes = sorted(classes, key=lambda c: -max(map(_movement, by_class[c]), default=0.0))
    classes = sorted(classes[:max_classes])
  rows: list = []
  for c in classes:
    rows.append((bank.class_names[c], None))
    rows += [(None, w) for w in by_class[c]]
  return classes, rows


def _interpretability_png(path, bank, words, value_range, per_class, max_classes):
  plt = pyplot()
  # lazy: matplotlib loads when a figure is drawn
  from matplotlib.colors import ListedColormap, Normalize

  low, high = value_range
  classes, rows = interpretability_rows(bank, words, per_class, max_classes)
  header = 1.4  # inches for the title and the colour bar
  height = 0.3 * len(rows) + header + 0.25  # and a bottom margin
  fig = plt.figure(figsize=(12, height))
  shown = (
    f"{len(classes)} of {len(bank.class_names)} classes, "
    if len(classes) < len(bank.class_names)
    else ""
  )
  fig.suptitle(
    "SToRI trained token weights: red = emphasised (w > 1), blue = turned down (w < 1)\n"
    f"{shown}the {per_class} prompts per class whose weights moved most "
    "(every prompt: interpretability.html)",
    fontsize=11,
    y=1 - 0.1 / height,
    va="top",
  )
  samples = np.linspace(low, high, 256)
  colormap = ListedColormap([_rgba(_shade(float(v), low, high)) for v in samples])
  bar = fig.add_axes((0.3, 1 - 1.05 / height, 0.4, 0.18 / height))
  fig.colorbar(
    plt.cm.ScalarMappable(Normalize(low, high), colormap), cax=bar, orientation="horizontal"
  ).set_label("trained weight w (1: unchanged)", fontsize=9)
  renderer = fig.canvas.get_renderer()
  step = 0.3 / height
  y = 1 - header / height
  for title, prompt_words in rows:
    y -= step
    if title is not None:
      fig.text(0.01, y, title, fontsize=10, weight="bold", va="center")
      continue
    x = 0.03
    for word, weight in prompt_words:
      text = fig.text(
        x,
        y,
        word,
        fontsize=9,
        va="center",
        bbox=dict(boxstyle="round,pad=0.15", lw=0, fc=_rgba(_shade(weight, low, high))),
      )
      x += text.get_window_extent(renderer).width / fig.bbox.width + 0.006
  fig.savefig(path, dpi=110)
  plt.close(fig)


def plot_history(workdir: str, history: Sequence[dict[str, Any]], zero_shot_accuracy: float):
  """training_curve.png: loss and accuracies over steps."""
  if not history:
    return None
  plt = pyplot()
  steps = [r["step"] for r in history]
  fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 3.5))
  ax_loss.plot(steps, [r["loss"] for r in history])
  ax_loss.set(xlabel="step", ylabel="train loss", title="loss")
  ax_acc.plot(steps, [r["train_accuracy"] for r in history], label="train batch")
  tested = [r for r in history if "test_accuracy" in r]
  ax_acc.plot([r["step"] for r in tested], [r["test_accuracy"] for r in tested], "o-", label="test")
  ax_acc.axhline(zero_shot_accuracy, color="gray", ls="--", label="zero-shot")
  ax_acc.set(xlabel="step", ylabel="accuracy", title="accuracy")
  ax_acc.legend()
  # The run's folder names which run the curve is of.
  name = os.path.basename(os.path.normpath(workdir))
  fig.suptitle(f"Few-shot SToRI training ({name}): loss and accuracy over steps", fontsize=10)
  fig.tight_layout()
  path = os.path.join(workdir, "training_curve.png")
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path
