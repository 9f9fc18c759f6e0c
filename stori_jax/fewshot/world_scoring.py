"""What a dataset knows about a trained run's words, scored after training: the report hooks.

`trainer.run` trains the same way on every dataset; a dataset that knows which words tell its
classes apart adds its scores of the trained word weights to metrics.json through a hook,
looked up by the split's dataset name in `REPORT_HOOKS` (`run` takes another mapping). The
synthetic world knows them (`stori_jax.data.synthetic_tasks`): `synthetic_word_scores`.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from stori_jax.data import synthetic_tasks
from stori_jax.fewshot.prompt_bank import PromptBank

#: (bank, words, top_words, class_names) -> metrics added to metrics.json after "top_words":
#: bank, the run's PromptBank; words, per trainable prompt its (word, weight) pairs
#: (`report.prompt_word_weights`); top_words, {class: [(word, mean weight)]}
#: (`report.class_top_words`); class_names, the split's classes in task order.
ReportHook = Callable[..., dict[str, Any]]


def synthetic_word_scores(
  *,
  bank: PromptBank,
  words: Sequence[Sequence[tuple[str, float]]],
  top_words: Mapping[str, Sequence[tuple[str, float]]],
  class_names: Sequence[str],
) -> dict[str, Any]:
  """The synthetic world's scores of trained SToRI weights.

  Returns:
    word_rank_auc: {"nuisance": float, "other": float}, how often a class's discriminating
      words outweigh its nuisance words, or every other word (`synthetic_tasks.word_rank_auc`);
    median_word_weight: {word kind: float} (`synthetic_tasks.word_weight_medians`);
    classes_with_discriminating_top3: the classes with a discriminating word among their 3
      top-weighted words.
  """
  prompt_classes = [bank.class_names[c] for c in bank.text_class]
  return {
    "word_rank_auc": {
      against: synthetic_tasks.word_rank_auc(words, prompt_classes, class_names, against=against)
      for against in ("nuisance", "other")
    },
    "median_word_weight": synthetic_tasks.word_weight_medians(words, prompt_classes),
    "classes_with_discriminating_top3": synthetic_tasks.classes_with_discriminating_top_words(
      top_words, class_names, top=3
    ),
  }


#: The hooks `trainer.run` uses by default, by dataset name (`FewShotSplit.dataset`).
REPORT_HOOKS: Mapping[str, ReportHook] = {"synthetic": synthetic_word_scores}
