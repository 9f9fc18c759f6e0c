"""The mutual-knowledge paper's evaluation protocols (Sammani & Deligiannis, NeurIPS 2024).

One module per protocol:
  table2.py         `table2_descriptor_accuracy` (Table 2, App. K): zero-shot accuracy of the
                    descriptor classifier, then with the textual concepts found for the classes
                    nearest the prediction.
  localization.py   `corloc` (App. A.1, its Table 1): CorLoc of the most prominent region for
                    the token, key and ensemble facets, split by GDC or PCA.
  layers.py         `layer_similarity` (App. A.1, its Fig. 1): cosine similarity of the [CLS]
                    token across layers, tokens and keys; `plot_layer_similarity`.
  entropy.py        `ot_entropy` (App. A.2): diversity of the descriptors chosen for an image's
                    concepts, with and without optimal transport.
  blur.py           `blur_accuracy` (App. A.3): zero-shot accuracy after blurring the
                    non-prominent regions of the nearest-neighbour importance map, then of its
                    largest component, then after the CRF.
  bank.py           `bank_quality` (App. A.4): zero-shot top-1 / top-5 with the descriptor bank
                    and the bank's inter- and intra-class diversity under a sentence encoder.
  bottlenecks.py    `table5` (Table 5, App. D): top-1 / top-5 of the trained baselines
                    (mutual.baselines) and the concept labeler's top-all / top-10 (App. D.2),
                    from mutual.evaluate's Table 1 pass.
and what they share:
  zero_shot.py      top-k hits of a classifier and App. K's descriptor classifier (`prompt_sums`).
  analysis_pass.py  Table 2 and A.2 read the concepts of every image; `concept_pass` runs
                    `pipeline.analyze_class` class by class once and keeps only what they need
                    (`ConceptPass`).
  tables.py         the markdown tables: `markdown(name, {model: result})`, one row per model;
                    `section` adds the protocol's heading (`TITLES`).
  progress.py       `stage_bar`: one progress bar per stage, named and with its total.

Every protocol returns a JSON-ready dict. Their settings are `mutual.paper_config.protocols_config`
(config.protocols). The public reference code has none of these protocols; where the paper leaves
a choice open the docstring of the function says which one is made (and the settings offer the
alternatives).
"""

from mutual.paper_config import PROTOCOLS
from mutual.protocols.analysis_pass import ConceptPass, concept_pass
from mutual.protocols.bank import INTER_MODES, bank_quality, diversity, load_sentence_encoder
from mutual.protocols.blur import blur_accuracy, blur_outside, importance_masks
from mutual.protocols.localization import corloc
from mutual.protocols.layers import layer_similarity, plot_layer_similarity
from mutual.protocols.entropy import ot_entropy
from mutual.protocols.table2 import (
  RECIPIENTS,
  augmented_hits,
  concepts_to_add,
  guarded_accuracy,
  nearest_classes,
  table2_descriptor_accuracy,
)
from mutual.protocols.progress import stage_bar
from mutual.protocols.tables import (
  MARKDOWN,
  TITLES,
  bank_quality_markdown,
  blur_markdown,
  corloc_markdown,
  layer_similarity_markdown,
  markdown,
  ot_entropy_markdown,
  section,
  table2_markdown,
)
from mutual.protocols.bank import missing_requirements as _bank_quality_requirements
from mutual.protocols.zero_shot import (
  AGGREGATES,
  PromptSums,
  descriptor_prompts,
  image_embeddings,
  prompt_sums,
  topk_hits,
)

#: protocol -> what it lacks on this machine (its optional packages or files) for its settings
#: (config.protocols.<name>), or None; the protocols not named need nothing beyond the install.
REQUIREMENTS = {"bank_quality": _bank_quality_requirements}


def missing_requirements(config) -> list[str]:
  """What the protocols of config.evaluation.protocols lack on this machine, one sentence
  each ("App. A.4's diversity needs ..."): checked before any work."""
  return [
    problem
    for name in config.evaluation.protocols
    if name in REQUIREMENTS and (problem := REQUIREMENTS[name](config.protocols[name]))
  ]
