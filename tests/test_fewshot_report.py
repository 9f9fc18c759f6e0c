"""The few-shot reports: which prompts the interpretability PNG shows, and that it is drawn; the
synthetic world's scores of trained words (its report hook, `fewshot.world_scoring`)."""

from __future__ import annotations

import types

import numpy as np

from stori_jax.data import synthetic_tasks
from stori_jax.fewshot import report, world_scoring


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
  assert all(f"<h2><bdi>class {c}</bdi></h2>" in html for c in range(20))  # every class kept
  png = (tmp_path / "interpretability.png").read_bytes()
  assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_words_are_shaded_by_weights_normalised_to_sum_to_1_per_prompt(tmp_path, monkeypatch):
  """Paper Fig. 2: "For visualization, the weights are normalized to sum up 1" per prompt; the
  PNG's boxes, the HTML's shading, the caption and the colour bar all say and do so."""
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  closed, close = [], plt.close
  monkeypatch.setattr(plt, "close", lambda fig=None: (closed.append(fig), close(fig)))
  bank = types.SimpleNamespace(class_names=["banded", "gauzy"], text_class=[0, 1])
  # Raw weights 3 and 1 (shares 0.75, 0.25); 0.5 and 0.5 (shares 0.5, 0.5): the prompt with the
  # smaller raw weights has the larger share of the second word.
  words = [[("multiple", 3.0), ("stripes", 1.0)], [("light", 0.5), ("fabric", 0.5)]]
  assert report.normalized(words[0]) == [("multiple", 0.75), ("stripes", 0.25)]
  assert report.normalized([("a", 0.0), ("b", 0.0)]) == [("a", 0.5), ("b", 0.5)]
  report.write_interpretability(str(tmp_path), bank, words)
  page = (tmp_path / "interpretability.html").read_text()
  assert "normalised to sum to 1 per prompt" in page
  assert "title='w = 0.500, share = 0.500'" in page and "share = 0.750" in page
  assert report._css(report.shade(0.75, 0.75)) in page  # the top share is the darkest
  (fig,) = closed
  assert "normalised to sum to 1 per prompt" in fig._suptitle.get_text()
  bar = [ax for ax in fig.axes if ax.get_xlabel()]
  assert len(bar) == 1 and "sums to 1 per prompt" in bar[0].get_xlabel()
  assert bar[0].get_xlim() == (0.0, 0.75)
  boxes = {
    t.get_text(): t.get_bbox_patch().get_facecolor() for t in fig.texts if t.get_bbox_patch()
  }
  np.testing.assert_allclose(boxes["multiple"][3], 0.85)
  np.testing.assert_allclose(boxes["stripes"][3], 0.85 / 3)
  np.testing.assert_allclose([boxes["light"][3], boxes["fabric"][3]], 0.85 * 0.5 / 0.75)


def _planted_synthetic_run():
  """Three synthetic classes, each prompt's words weighted 2 (the class's own words), 0.5 (the
  nuisance words it states) or 1: (bank, words, top_words, class names)."""
  specs = synthetic_tasks.FEWSHOT_CLASSES[:3]
  names = [spec.name for spec in specs]
  texts = [
    (c, text) for c, spec in enumerate(specs) for text in synthetic_tasks.class_prompts(spec)
  ]
  bank = types.SimpleNamespace(class_names=names, text_class=[c for c, _ in texts])
  words = []
  for c, text in texts:
    own = set().union(*synthetic_tasks.class_words(names[c]).values())
    nuisance = synthetic_tasks.nuisance_words(names[c])
    words.append(
      [(w, 2.0 if w in own else 0.5 if w in nuisance else 1.0) for w in text.rstrip(".").split()]
    )
  return bank, words, report.class_top_words(bank, words), names


def test_the_synthetic_world_scores_trained_words_through_its_report_hook():
  bank, words, top_words, names = _planted_synthetic_run()
  assert world_scoring.REPORT_HOOKS["synthetic"] is world_scoring.synthetic_word_scores
  scores = world_scoring.REPORT_HOOKS["synthetic"](
    bank=bank, words=words, top_words=top_words, class_names=names
  )
  # metrics.json's keys, in the order `trainer.run` has always written them.
  assert list(scores) == ["word_rank_auc", "median_word_weight", "classes_with_discriminating_top3"]
  assert scores["word_rank_auc"]["nuisance"] == 1.0  # every own word outweighs every nuisance one
  assert scores["word_rank_auc"]["other"] > 0.5
  assert scores["median_word_weight"]["nuisance"] == 0.5
  assert scores["classes_with_discriminating_top3"] == names
  prompt_classes = [names[c] for c in bank.text_class]
  assert scores["median_word_weight"] == synthetic_tasks.word_weight_medians(words, prompt_classes)
  assert scores["word_rank_auc"]["other"] == synthetic_tasks.word_rank_auc(
    words, prompt_classes, names, against="other"
  )


def test_training_curve_has_a_title_naming_the_run(tmp_path, monkeypatch):
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  closed, close = [], plt.close
  monkeypatch.setattr(plt, "close", lambda fig=None: (closed.append(fig), close(fig)))
  history = [dict(step=s, loss=1.0 / (s + 1), train_accuracy=0.5) for s in range(3)]
  history[-1]["test_accuracy"] = 0.6
  workdir = tmp_path / "dtd_16shot"
  workdir.mkdir()
  assert report.plot_history(str(workdir), history, 0.4) == str(workdir / "training_curve.png")
  (fig,) = closed
  title = fig._suptitle.get_text()
  assert "Few-shot SToRI training" in title and "dtd_16shot" in title
  assert all(ax.get_ylabel() for ax in fig.axes)
