"""What a few-shot run leaves in its workdir: history, weights, curves, word-shading report."""

from __future__ import annotations

import collections
import os
from typing import Any, Sequence

import jinja2
import numpy as np

from stori_jax.plumbing import jsonio
from stori_jax.trainloop import metrics_log
from stori_jax.fewshot.prompt_bank import PromptBank
from stori_jax.plumbing.plotting import pyplot, save_figure
from stori_jax.tokenizer import Tokenizer, word_weights

HISTORY_FILE = "history.jsonl"
#: interpretability.html's template (templates/ beside this module, package data), autoescaped:
#: a class name or prompt word is escaped by the template engine.
_TEMPLATES = jinja2.Environment(
  loader=jinja2.PackageLoader("stori_jax.fewshot", "templates"),
  autoescape=True,
  undefined=jinja2.StrictUndefined,
)


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


#: What the shading shows, for every caption, colour bar and page that uses it.
NORMALISATION_NOTE = (
  "For visualization, the weights are normalised to sum to 1 per prompt (w / sum of the "
  "prompt's w), as in the paper's Fig. 2: the darker the red, the larger the word's share."
)


def normalized(prompt_words: Sequence[tuple[str, float]]) -> list[tuple[str, float]]:
  """A prompt's (word, weight) pairs with the weights divided by their sum (paper Fig. 2:
  "For visualization, the weights are normalized to sum up 1"); the words of a prompt whose
  weights are all 0 share equally."""
  total = float(sum(w for _, w in prompt_words))
  if total <= 0:
    return [(word, 1.0 / len(prompt_words)) for word, _ in prompt_words]
  return [(word, float(w) / total) for word, w in prompt_words]


def shade(share: float, top: float) -> tuple[float, float, float, float]:
  """Matplotlib RGBA of a normalised weight: red, from transparent at 0 to 85 % at `top`
  (the largest share on the page or figure)."""
  return (220 / 255, 40 / 255, 40 / 255, 0.85 * min(1.0, max(share, 0.0) / max(top, 1e-12)))


def _css(colour: tuple[float, float, float, float]) -> str:
  r, g, b, a = colour
  return f"rgba({round(255 * r)}, {round(255 * g)}, {round(255 * b)}, {a:.3f})"


def write_interpretability(
  workdir: str,
  bank: PromptBank,
  words: Sequence[Sequence[tuple[str, float]]],
  per_class: int = 4,
  max_classes: int = 12,
) -> str:
  """interpretability.html (every prompt) and .png (the prompts that matter): prompts with every
  word shaded by its trained weight, normalised to sum to 1 per prompt (`normalized`), as the
  paper's Fig. 2 shows them; hovering a word in the HTML shows its weight w and its share.

  words: per trainable prompt, (word, weight) pairs (see prompt_word_weights). The PNG shows, for
  at most `max_classes` classes, the `per_class` prompts whose weights moved most from 1; a task
  with more classes shows those whose prompts moved most (the HTML has them all).
  """
  shares = [normalized(prompt) for prompt in words]
  values = [w for prompt in words for _, w in prompt] or [1.0]
  top = max((s for prompt in shares for _, s in prompt), default=1.0)
  classes = [
    dict(
      name=name,
      prompts=[
        [
          dict(text=word, w=w, share=s, colour=_css(shade(s, top)))
          for (word, w), (_, s) in zip(prompt_words, prompt_shares)
        ]
        for prompt_words, prompt_shares, cls in zip(words, shares, bank.text_class)
        if cls == c
      ],
    )
    for c, name in enumerate(bank.class_names)
  ]
  page = _TEMPLATES.get_template("interpretability.html").render(
    note=NORMALISATION_NOTE, top=top, lowest=min(values), highest=max(values), classes=classes
  )
  path = os.path.join(workdir, "interpretability.html")
  jsonio.write_text_atomic(path, page)
  _interpretability_png(
    os.path.join(workdir, "interpretability.png"), bank, words, per_class, max_classes
  )
  return path


def _movement(prompt_words: Sequence[tuple[str, float]]) -> float:
  """How far a prompt's weights moved from 1: the largest |log w| of its words."""
  return max((abs(np.log(max(w, 1e-6))) for _, w in prompt_words), default=0.0)


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


def share_colorbar(fig, rect: tuple[float, float, float, float], top: float) -> None:
  """A horizontal colour bar of `shade` from 0 to `top` in `rect` (figure coordinates), whose
  label says that the weights are normalised to sum to 1 per prompt."""
  plt = pyplot()
  # lazy: matplotlib loads when a figure is drawn
  from matplotlib.colors import ListedColormap, Normalize

  colormap = ListedColormap([shade(float(v), top) for v in np.linspace(0, top, 256)])
  fig.colorbar(
    plt.cm.ScalarMappable(Normalize(0, top), colormap),
    cax=fig.add_axes(rect),
    orientation="horizontal",
  ).set_label("normalised weight: w / sum of the prompt's w (sums to 1 per prompt)", fontsize=8)


def draw_shaded_text(fig, x: float, y: float, units, top: float, fontsize: float = 9) -> float:
  """Draws `units` [(text, share)] left to right from (x, y) (figure coordinates), each on a
  box shaded by `shade(share, top)`; a unit whose text ends with a space is followed by a gap,
  others touch the next one (the tokens of one word). Returns the x where the row ends."""
  renderer = fig.canvas.get_renderer()
  for text, share in units:
    box = fig.text(
      x,
      y,
      text.strip() or text,
      fontsize=fontsize,
      va="center",
      bbox=dict(boxstyle="round,pad=0.15", lw=0, fc=shade(share, top)),
    )
    x += box.get_window_extent(renderer).width / fig.bbox.width
    x += 0.006 if text.endswith(" ") else 0.001
  return x


def _interpretability_png(path, bank, words, per_class, max_classes):
  plt = pyplot()
  classes, rows = interpretability_rows(bank, words, per_class, max_classes)
  rows = [(title, None if w is None else normalized(w)) for title, w in rows]
  top = max((s for _, w in rows if w for _, s in w), default=1.0)
  header = 1.55  # inches for the title and the colour bar
  height = 0.3 * len(rows) + header + 0.25  # and a bottom margin
  fig = plt.figure(figsize=(12, height))
  shown = (
    f"{len(classes)} of {len(bank.class_names)} classes, "
    if len(classes) < len(bank.class_names)
    else ""
  )
  fig.suptitle(
    "SToRI trained token weights: the darker the red, the higher the weight\n"
    f"{shown}the {per_class} prompts per class whose weights moved most from 1 "
    "(every prompt: interpretability.html)\n"
    "For visualization, the weights are normalised to sum to 1 per prompt (as in the paper's "
    "Fig. 2)",
    fontsize=10,
    y=1 - 0.1 / height,
    va="top",
  )
  share_colorbar(fig, (0.3, 1 - 1.0 / height, 0.4, 0.16 / height), top)
  step = 0.3 / height
  y = 1 - header / height
  for title, prompt_shares in rows:
    y -= step
    if title is not None:
      fig.text(0.01, y, title, fontsize=10, weight="bold", va="center")
      continue
    draw_shaded_text(fig, 0.03, y, [(word + " ", s) for word, s in prompt_shares], top)
  save_figure(fig, path, dpi=110)
  plt.close(fig)


def plot_history(
  workdir: str, history: Sequence[dict[str, Any]], zero_shot_accuracy: float, label: str = "SToRI"
):
  """training_curve.png: loss and accuracies over steps of the method `label` (its
  `FewShotMethod.label`)."""
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
  fig.suptitle(f"Few-shot {label} training ({name}): loss and accuracy over steps", fontsize=10)
  fig.tight_layout()
  path = os.path.join(workdir, "training_curve.png")
  save_figure(fig, path, dpi=110)
  plt.close(fig)
  return path
