"""Evaluation protocols by registration: everything `mutual.evaluate` asks of a protocol (its
run, its table, its paper defaults, its checks and figures) in one `Protocol` entry, looked up
by the names config.evaluation.protocols gives. Nothing outside a protocol's entry compares
protocol names.

A protocol is one module that calls `register(Protocol(...))` at import (the paper's six:
`builtin.py`, over the modules of this package). One defined outside the project is named in
config.evaluation.protocols as `module:name` (`toy_plugins:image_count`, tests/toy_plugins.py):
the registry imports the module, whose import registers it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

import ml_collections

from stori_jax.plumbing import plugins


@dataclasses.dataclass(frozen=True)
class ProtocolInputs:
  """What a protocol's run may read.

  Attributes:
    bundle: the model (a stori_jax CLIPBundle).
    config: the evaluation config.
    concepts: the Table 1 pass's analysis of every image (a `ConceptPass`: concepts, image
      embeddings float32 [N, E], labels int [N]).
    class_names: the classes, in label order; lists: each class's descriptors.
    size: the model's input side in pixels.
    bank: the encoded descriptor bank (`pipeline.encode_config_bank`: class_embeddings
      float32 [C, E], descriptor_embeddings).
    progress: whether to show progress bars.
    images: () -> the evaluation classes again (an iterator of data.ClassImages at `size`),
      for a protocol that reads the images itself.
    settings: config.protocols.<name>, or the protocol's `defaults()` where the config has no
      such section (None for a protocol without settings).
  """

  bundle: Any
  config: Any
  concepts: Any
  class_names: Sequence[str]
  lists: Sequence[Sequence[str]]
  size: int
  bank: Any
  progress: bool
  images: Callable[[], Any]
  settings: Any = None


def _no_defaults():
  return None


def _no_input_check(config, dataset) -> None:
  del config, dataset


def _no_model_check(bundle) -> None:
  del bundle


def _no_figures(path_of: Callable[[str], str], result, title: str) -> None:
  del path_of, result, title


def _no_requirements(settings) -> None:
  del settings


@dataclasses.dataclass(frozen=True, eq=False)
class Protocol:
  """One evaluation protocol.

  Attributes:
    name: its name in config.evaluation.protocols, protocols.json and protocols/<name>.json.
    title: its section heading in protocols.md and the printed output (the paper's table or
      appendix and what it measures).
    run: (ProtocolInputs) -> its JSON-ready result.
    markdown: ({model name: result}) -> its markdown table (one row per model, or per facet).
    defaults: () -> its paper settings (a ConfigDict, config.protocols.<name>'s defaults), or
      None where it reads none.
    check_inputs: (config, dataset) -> None, or a UserError naming a missing input (its ground
      truth boxes), before any work.
    check_model: (bundle) -> None, or a ConfigError where the model cannot run it.
    figures: (path_of, result, title) -> None: draws its figures, each at path_of(file name)
      (in the workdir), titled after `title` (the run and model).
    requirements: (settings) -> what it lacks on this machine for its settings (an optional
      package or file), one sentence, or None: checked before any work.
  """

  name: str
  title: str
  run: Callable[[ProtocolInputs], Any]
  markdown: Callable[[Mapping[str, Mapping]], str]
  defaults: Callable[[], ml_collections.ConfigDict | None] = _no_defaults
  check_inputs: Callable[[Any, Any], None] = _no_input_check
  check_model: Callable[[Any], None] = _no_model_check
  figures: Callable[[Callable[[str], str], Any, str], None] = _no_figures
  requirements: Callable[[Any], str | None] = _no_requirements

  def settings(self, config) -> Any:
    """config.protocols.<name> where the config has it, else `defaults()`."""
    sections = config.get("protocols")
    section = sections.get(self.name) if sections is not None else None
    return section if section is not None else self.defaults()


_PROTOCOLS: plugins.Registry[Protocol] = plugins.Registry("protocol", "config.evaluation.protocols")
register = _PROTOCOLS.register
unregister = _PROTOCOLS.unregister
names = _PROTOCOLS.names


def get(name: str) -> Protocol:
  """The protocol named `name` (`module:name` imports `module` first).

  Raises:
    ConfigError (a ValueError): no such protocol (the message names the registered ones).
  """
  return _PROTOCOLS.get(name)


def wanted(config) -> tuple[Protocol, ...]:
  """The protocols config.evaluation.protocols names, in registration order (the paper's six
  first, in paper_config.PROTOCOLS' order, whatever the config's order); a ConfigError for an
  unknown one before any work."""
  chosen = {get(name).name for name in config.evaluation.protocols}
  return tuple(get(name) for name in names() if name in chosen)


def missing_requirements(config) -> list[str]:
  """What the protocols of config.evaluation.protocols lack on this machine, one sentence
  each ("App. A.4's diversity needs ..."): checked before any work."""
  return [
    problem for p in wanted(config) if (problem := p.requirements(p.settings(config))) is not None
  ]
