"""Concept methods by registration: everything the analysis asks of one way of splitting the
prominent patches into visual concepts (PCA, K-means, ...) in one frozen `ConceptMethod` entry,
found by its name (config.analysis.methods).

Nothing outside a method's own module compares a method's name: the pipeline calls the entry's
`fit`, tables and pages print its `title`, mutual.paper_config merges its settings into
config.analysis and runs its `check`, and the PyTorch reference (mutual.reference) runs its
`reference` twin. Adding a method is one module that calls `register(ConceptMethod(...))`,
registered when its module is imported (the built-in ones by mutual/concept_methods/__init__.py),
and its name in config.analysis.methods; a method of one's own is named there as `module:name`
(`toy_plugins:toy_bands`, tests/toy_plugins.py), and the registry imports `module`, whose import
registers it (stori_jax.plumbing.plugins, the registry every extension point shares).
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Callable, Mapping

from stori_jax.plumbing import plugins
from stori_jax.plumbing.config_files import ConfigError


def _no_check(settings: Mapping[str, Any]) -> None:
  del settings


@dataclasses.dataclass(frozen=True)
class ConceptMethod:
  """One concept method.

  Attributes:
    name: its name in config.analysis.methods and in the records ("pca").
    title: its name in tables, figures and pages ("PCA").
    fit: (features float32 [B, h, w, D], mask bool [B, h, w], n_concepts, settings) -> int32
      [B, h, w], each foreground patch's concept in [0, n_concepts) and -1 on background, fitted
      jointly over the B images; settings: `concept_settings`'s dict (the resolved stage keys
      and the `defaults` keys of config.analysis). Called on device arrays; may be jitted.
    stages: the config.analysis keys that config.analysis.mode sets: {key: {mode: value}} for
      every mode of mutual.paper_config.ANALYSIS_MODES (a key set in the config overrides it).
    choices: {stage key: the values it accepts}.
    defaults: the other config.analysis keys it reads, with their paper values.
    check: (settings) -> None, or raises ConfigError naming a bad value and its fix (run by
      mutual.paper_config.check_analysis before any work).
    reference: its twin in the authors' libraries, or None where it has none:
      (reference module, fg_tokens torch.Tensor float32 [N, D], n_concepts, settings, stats)
      -> int numpy [N] labels of the foreground tokens (in image, row, column order). It is
      handed mutual.reference (which imports nothing of mutual, and whose torch is an extra)
      rather than importing it; stats: a dict it may count into.
  """

  name: str
  title: str
  fit: Callable[..., Any]
  stages: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
  choices: Mapping[str, tuple] = dataclasses.field(default_factory=dict)
  defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  check: Callable[[Mapping[str, Any]], None] = _no_check
  reference: Callable[..., Any] | None = None

  def __post_init__(self):
    for field in ("stages", "choices", "defaults"):
      object.__setattr__(self, field, types.MappingProxyType(dict(getattr(self, field))))
    unchosen = sorted(set(self.stages) - set(self.choices))
    if unchosen:
      raise ValueError(f"Concept method {self.name!r}: stage keys {unchosen} have no choices.")


_METHODS: plugins.Registry[ConceptMethod] = plugins.Registry(
  "concept method", "config.analysis.methods"
)
unregister = _METHODS.unregister
names = _METHODS.names


def register(method: ConceptMethod) -> ConceptMethod:
  """Adds a method; refuses a name already registered or a settings key another method reads.
  Returns the method."""
  keys = set(method.stages) | set(method.defaults)
  for other in _METHODS.entries():
    shared = sorted(keys & (set(other.stages) | set(other.defaults)))
    if shared and other.name != method.name:
      raise ValueError(
        f"Concept method {method.name!r}: config.analysis keys {shared} are already "
        f"{other.name!r}'s; name them after the method."
      )
  return _METHODS.register(method)


def get(name: str) -> ConceptMethod:
  """The method named `name` (`module:name` imports `module` first); a ConfigError naming the
  registered ones where none is."""
  return _METHODS.get(name)


def title(name: str) -> str:
  """A method's title; its name where no method of this run has it (a record written by a
  method whose module is not imported)."""
  found = _METHODS.find(name)
  return found.title if found is not None else name


def mode_stages(mode: str) -> dict[str, Any]:
  """{stage key: value} that config.analysis.mode `mode` gives every registered method."""
  return {key: values[mode] for m in _METHODS.entries() for key, values in m.stages.items()}


def stage_choices() -> dict[str, tuple]:
  """{stage key: accepted values} of every registered method."""
  return {key: tuple(values) for m in _METHODS.entries() for key, values in m.choices.items()}


def defaults() -> dict[str, Any]:
  """{config.analysis key: paper value} of every registered method's other settings."""
  return {key: value for m in _METHODS.entries() for key, value in m.defaults.items()}


def reference_labelers(reference, methods, settings: Mapping[str, Any]) -> dict[str, Callable]:
  """{name: (fg_tokens, n_concepts, stats) -> labels} for mutual.reference.analyze_class: each
  method's `reference` twin bound to the reference module and the settings
  (`paper_config.concept_settings`). A ConfigError for a method without a twin."""
  out = {}
  for name in methods:
    method = get(name)
    if method.reference is None:
      raise ConfigError(
        f"Concept method {name!r} has no reference twin, so the PyTorch reference cannot run "
        f"it; leave it out of the methods compared (registered twins: "
        f"{[m.name for m in _METHODS.entries() if m.reference is not None]})."
      )

    def label(fg_tokens, n_concepts, stats, _twin=method.reference):
      return _twin(reference, fg_tokens, n_concepts, settings, stats)

    out[name] = label
  return out
