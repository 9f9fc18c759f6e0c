"""The few-shot interpretability report: which prompts the PNG shows, and that it is drawn."""

from __future__ import annotations

import types

import numpy as np

from stori_jax.fewshot import report


def _bank_and_words(n_classes: int, prompts_per_class: int):
  """Prompt i of class c has log-weights spread by 0.05 (c + 1) (1 + i / 10), shuffled."""
  names = [f"class {c}" for c in range(n_classes)]
  text_class = [c for c in range(n_classes) for _ in range(prompts_per_class)]
  order = np.random.default_rng(0).permutation(len(text_class))
  text_class = [text_class[j] for j in order]
  words = []
  for j, c in zip(order, text_class):
    spread = 0.05 * (c + 1) * (1 + (j % prompts_per_class) / 10)
    words.append([(f"w{j}_{k}", float(np.exp(spread * (k - 2)))) for k in range(5)])
  return types.SimpleNamespace(class_names=names, text_class=text_class), words


def test_png_rows_are_the_prompts_that_moved_most():
  bank, words = _bank_and_words(n_classes=3, prompts_per_class=6)
  # One prompt of class 1 moved far more than any other: it must lead its class's rows.
  decisive = bank.text_class.index(1)
  words[decisive] = [("decisive", 5.0), ("filler", 1.0)]
  classes, rows = report.interpretability_rows(bank, words, per_class=2, max_classes=12)
  assert classes == [0, 1, 2]
  assert [r[0] for r in rows] == [
    "class 0",
    None,
    None,
    "class 1",
    None,
    None,
    "class 2",
    None,
    None,
  ]
  assert rows[4][1] == words[decisive]
  for c in range(3):
    shown = [r[1] for r in rows[3 * c + 1 : 3 * c + 3]]
    moved = sorted(
      (report._movement(w) for w, k in zip(words, bank.text_class) if k == c), reverse=True
    )
    assert [report._movement(w) for w in shown] == moved[:2]


def test_png_of_many_classes_shows_those_that_moved_most(tmp_path):
  # Class c's weights spread with c: the last 4 of 20 classes moved most.
  bank, words = _bank_and_words(n_classes=20, prompts_per_class=3)
  classes, rows = report.interpretability_rows(bank, words, per_class=3, max_classes=4)
  assert classes == [16, 17, 18, 19] and len(rows) == 4 * 4
  report.write_interpretability(str(tmp_path), bank, words, per_class=3, max_classes=4)
  html = (tmp_path / "interpretability.html").read_text()
  assert all(f"<h2>class {c}</h2>" in html for c in range(20))  # the HTML keeps every class
  png = (tmp_path / "interpretability.png").read_bytes()
  assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
