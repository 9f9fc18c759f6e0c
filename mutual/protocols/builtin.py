"""The paper's six protocols registered (Table 2, App. A.1-A.4): each entry's run over this
package's functions, its table (`tables.py`), its paper settings
(`mutual.paper_config.protocols_config`) and its checks and figures."""

from __future__ import annotations

# The package's names, read when a protocol runs (not bound at import): a test may wrap one
# (tests/test_mutual_evaluate.py counts the calls of protocols.blur_accuracy).
from mutual import paper_config, protocols
from mutual.protocols import tables
from mutual.protocols.registry import Protocol, ProtocolInputs, register


def _paper_settings(name: str):
  return lambda: paper_config.protocols_config()[name]


def _table2(x: ProtocolInputs):
  return protocols.table2_descriptor_accuracy(
    x.bundle, x.concepts, x.class_names, x.lists, settings=x.settings, progress=x.progress
  )


def _corloc(x: ProtocolInputs):
  return protocols.corloc(
    x.bundle, x.images(), x.config.analysis, settings=x.settings, progress=x.progress
  )


def _layer_similarity(x: ProtocolInputs):
  return protocols.layer_similarity(x.bundle, x.images(), x.config.analysis, progress=x.progress)


def _layer_similarity_figures(path_of, result, title: str) -> None:
  protocols.plot_layer_similarity(
    path_of("layer_similarity.png"),
    result,
    title=f"{title}, [CLS] token across layers, mean over {result['images']} images "
    "(App. A.1, Fig. 1)",
  )


def _ot_entropy(x: ProtocolInputs):
  return protocols.ot_entropy(x.concepts)


def _blur(x: ProtocolInputs):
  return protocols.blur_accuracy(
    x.bundle,
    x.images(),
    x.bank.class_embeddings,
    x.config.analysis,
    settings=x.settings,
    progress=x.progress,
  )


def _bank_quality(x: ProtocolInputs):
  # App. Table 4's rows where the settings list descriptor sets, else the run's own bank.
  sets = protocols.bank.descriptor_sets(x.config, x.class_names)
  return protocols.bank.bank_quality_rows(
    x.bundle, x.concepts, x.class_names, x.lists, x.settings, sets, x.progress
  )


# In paper_config.PROTOCOLS' order: the order they run in and protocols.md lists them.
for _protocol in (
  Protocol(
    "table2",
    tables.TITLES["table2"],
    _table2,
    tables.table2_markdown,
    defaults=_paper_settings("table2"),
  ),
  Protocol(
    "corloc",
    tables.TITLES["corloc"],
    _corloc,
    tables.corloc_markdown,
    defaults=_paper_settings("corloc"),
    check_inputs=lambda config, dataset: protocols.localization.check_inputs(config, dataset),
  ),
  Protocol(
    "layer_similarity",
    tables.TITLES["layer_similarity"],
    _layer_similarity,
    tables.layer_similarity_markdown,
    check_model=lambda bundle: protocols.layers.check_model(bundle),
    figures=_layer_similarity_figures,
  ),
  Protocol("ot_entropy", tables.TITLES["ot_entropy"], _ot_entropy, tables.ot_entropy_markdown),
  Protocol(
    "blur", tables.TITLES["blur"], _blur, tables.blur_markdown, defaults=_paper_settings("blur")
  ),
  Protocol(
    "bank_quality",
    tables.TITLES["bank_quality"],
    _bank_quality,
    tables.bank_quality_markdown,
    defaults=_paper_settings("bank_quality"),
    # The descriptor sets read and matched to the classes before the model loads.
    check_inputs=lambda config, dataset: protocols.bank.descriptor_sets(config, dataset.names),
    requirements=lambda settings: protocols.bank.missing_requirements(settings),
  ),
):
  register(_protocol)
