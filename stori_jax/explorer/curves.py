"""App. B's per-category curves of the explorer: the categories a prompt's words define over
a labelled index, and the shares of each category along a ranking.

The words of a prompt that name an attribute value of the index (a colour, pattern or shape
of the synthetic world) are its attributes, A of them; the 2**A categories are the images
with or without each value ("red, checkered, not heart"). Curve c at n is category c's share
of the top n images, n = 1..N (`metrics.category_curves`).
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

import numpy as np

from stori_jax.data.synthetic import ATTRIBUTE_WORDS
from stori_jax.retrieval import metrics
from stori_jax.retrieval.datasets import RetrievalTask

#: At most this many attribute words of a prompt define categories (2**4 = 16 curves).
MAX_ATTRIBUTES = 4
#: Decimals of the curve points sent to the page (8 x 512 numbers per change by default).
_CURVE_DECIMALS = 5
_ATTRIBUTE_WORD_RE = re.compile(r"(\W*)([^\W\d_]+)(\W*)")


def attribute_words(families: Sequence[str]) -> dict[str, tuple[str, str]]:
  """{prompt word: (family, value)} for the values of `families` (`synthetic.ATTRIBUTE_WORDS`:
  "red" -> ("colour", "red"), and each value's other spellings)."""
  return {
    word: (family, value)
    for (family, value), words in ATTRIBUTE_WORDS.items()
    if family in families
    for word in words
  }


def prompt_categories(
  texts: Sequence[str],
  attributes: Mapping[str, np.ndarray] | None,
  word_values: Mapping[str, tuple[str, str]],
) -> tuple[RetrievalTask | None, str | None]:
  """The categories a prompt's words define over the index, and a note on them.

  The words naming an attribute value of the index (the first mention of each value, at most
  MAX_ATTRIBUTES) are the attributes; label [i, a] says whether image i has attribute a's
  value.

  Args:
    texts: the prompt's words (`Explorer.parse`'s texts), weights left out: a weight, even 0,
      does not change what the prompt asks for.
    attributes: each image's value of each family, {family: str [N]}; None: an index without
      labels (an image folder).
    word_values: `attribute_words` of the families of `attributes`.

  Returns:
    (RetrievalTask over all N images, its 2**A categories named like "red, checkered, not
    heart", or None; a note for the page: why there are no categories, or which words were
    left out, or None).
  """
  if attributes is None:
    return None, (
      "the chart needs attribute labels, and this index (an image folder) has none: the top k only"
    )
  template, phrases, values, seen, dropped = [], [], [], [], []
  for text in texts:
    match = _ATTRIBUTE_WORD_RE.fullmatch(text.strip())
    value = word_values.get(match.group(2).lower()) if match else None
    if value is None or value in seen:
      template.append(text.replace("{", "{{").replace("}", "}}"))
      continue
    if len(phrases) == MAX_ATTRIBUTES:
      dropped.append(match.group(2))
      template.append(text.replace("{", "{{").replace("}", "}}"))
      continue
    lead = text[: len(text) - len(text.lstrip())] + match.group(1)
    trail = match.group(3) + text[len(text.rstrip()) :]
    template.append(f"{lead}{{{len(phrases)}}}{trail}")
    word = match.group(2).lower()
    seen.append(value)
    phrases.append(match.group(2))
    values.append((word, "not " + word))
  if not phrases:
    families = ", ".join(attributes)
    return None, f"the prompt names no {families} of the index, so it defines no categories"
  labels = np.stack([attributes[f] == v for f, v in seen], axis=1)  # [N, A]
  n = len(next(iter(attributes.values())))
  task = RetrievalTask(
    name="prompt",
    template="".join(template),
    phrases=tuple(phrases),
    values=tuple(values),
    images=np.arange(n),
    labels=labels,
    attribute_names=tuple(f for f, _ in seen),
  )
  note = None
  if dropped:
    note = f"only the first {MAX_ATTRIBUTES} attribute words define categories; not {dropped}"
  return task, note


def category_chart(
  scores: np.ndarray, k: int, task: RetrievalTask
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
  """The chart's data for one ranking.

  Args:
    scores: float32 [N], every image's score (higher: earlier).
    k: the top k shown beside the chart, 1 <= k <= N.
    task: `prompt_categories`' task, C = 2**A categories.

  Returns:
    (bars: [{"name", "share"}], each category's share of the top k; curves: {"attributes":
    [A], "names": [C], "sizes": [C], "shares": [C][N], "auc": [C], "n": N}, the /api/rank
    answer's "curves").
  """
  codes, names = task.categories, task.category_names
  shares = metrics.category_curves(scores, codes, task.n_categories)  # [C, N]
  top = shares[:, k - 1]  # the top k's composition
  bars = [{"name": n, "share": float(s)} for n, s in zip(names, top)]
  curves = {
    "attributes": list(task.phrases),
    "names": names,
    "sizes": np.bincount(codes, minlength=task.n_categories).tolist(),
    "shares": np.round(shares, _CURVE_DECIMALS).tolist(),
    # = metrics.category_auc(scores, ...), from the curves at hand
    "auc": shares.mean(axis=-1).tolist(),
    "n": len(scores),
  }
  return bars, curves
