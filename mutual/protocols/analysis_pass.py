"""One pass of the analysis over the classes, kept for Table 2 and App. A.2: `concept_pass` runs
`pipeline.analyze_class` class by class once and keeps only what they need (`ConceptPass`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from mutual import pipeline
from mutual.protocols.progress import stage_bar
from mutual.protocols.zero_shot import image_embeddings


@dataclasses.dataclass
class ConceptPass:
  """What Table 2 and App. A.2 need from `pipeline.analyze_class`, accumulated class by class.

  Attributes:
    descriptors: the bank (D descriptors; ids index it).
    n_classes: C.
    methods: the concept methods analysed.
    counts: method -> int32 [C, D], how many images of class c have descriptor d among their
      visual descriptors D_v.
  Properties (concatenated over the classes added): labels int [N], image_embeddings float32
  [N, E], predicted int [N], entropy / entropy_without_ot: method -> float32 [N].
  """

  descriptors: tuple[str, ...]
  n_classes: int
  methods: tuple[str, ...]
  counts: dict[str, np.ndarray]
  _labels: list = dataclasses.field(default_factory=list)
  _embeddings: list = dataclasses.field(default_factory=list)
  _predicted: list = dataclasses.field(default_factory=list)
  _entropy: dict = dataclasses.field(default_factory=dict)
  _entropy_without_ot: dict = dataclasses.field(default_factory=dict)

  @classmethod
  def empty(cls, descriptors: Sequence[str], n_classes: int, methods: Sequence[str]):
    methods = tuple(methods)
    return cls(
      tuple(descriptors),
      int(n_classes),
      methods,
      {m: np.zeros((n_classes, len(descriptors)), np.int32) for m in methods},
      _entropy={m: [] for m in methods},
      _entropy_without_ot={m: [] for m in methods},
    )

  def add(self, label: int, result: Mapping[str, Any], embeddings) -> None:
    """Adds one class's images.

    Args:
      label: their (true) class.
      result: `pipeline.analyze_class` output for them (B images).
      embeddings: float32 [B, E] unit image embeddings (`image_embeddings`).
    """
    embeddings = np.asarray(embeddings, np.float32)
    batch = len(embeddings)
    if not 0 <= label < self.n_classes:
      raise ValueError(f"label {label} is outside the {self.n_classes} classes")
    if len(result["predicted"]) != batch:
      raise ValueError(f"{len(result['predicted'])} analysed images but {batch} embeddings")
    for m in self.methods:
      if m not in result:
        raise ValueError(f"the analysis has no {m!r} results; run it with methods={self.methods}")
      ids = np.asarray(result[m]["visual_ids"])
      valid = np.asarray(result[m]["visual_valid"], bool)
      for i in range(batch):
        # Visual descriptors are unique per image, so each image counts a descriptor once.
        np.add.at(self.counts[m][label], np.unique(ids[i][valid[i]]), 1)
      self._entropy[m].append(np.asarray(result[m]["entropy"], np.float32))
      self._entropy_without_ot[m].append(np.asarray(result[m]["entropy_without_ot"], np.float32))
    self._labels.append(np.full(batch, label, np.int32))
    self._embeddings.append(embeddings)
    self._predicted.append(np.asarray(result["predicted"], np.int32))

  def class_arrays(self, result: Mapping[str, Any], embeddings) -> dict[str, np.ndarray]:
    """What `add` reads of one class's analysis, as flat numpy arrays (a resumed run keeps
    them in a file and gives them back to `add_arrays`)."""
    out = {
      "embeddings": np.asarray(embeddings, np.float32),
      "predicted": np.asarray(result["predicted"], np.int32),
    }
    for m in self.methods:
      for key in ("visual_ids", "visual_valid", "entropy", "entropy_without_ot"):
        out[f"{m}/{key}"] = np.asarray(result[m][key])
    return out

  def add_arrays(self, label: int, arrays: Mapping[str, np.ndarray]) -> None:
    """`add` from `class_arrays`' output: the same counts and values as adding the analysis."""
    result: dict[str, Any] = {"predicted": arrays["predicted"]}
    for m in self.methods:
      result[m] = {
        key: arrays[f"{m}/{key}"]
        for key in ("visual_ids", "visual_valid", "entropy", "entropy_without_ot")
      }
    self.add(label, result, arrays["embeddings"])

  def _cat(self, parts, dtype, width: int | None = None):
    if parts:
      return np.concatenate(parts).astype(dtype)
    return np.zeros((0,) if width is None else (0, width), dtype)

  @property
  def labels(self) -> np.ndarray:
    return self._cat(self._labels, np.int32)

  @property
  def image_embeddings(self) -> np.ndarray:
    return self._cat(self._embeddings, np.float32, 0)

  @property
  def predicted(self) -> np.ndarray:
    return self._cat(self._predicted, np.int32)

  @property
  def entropy(self) -> dict[str, np.ndarray]:
    return {m: self._cat(v, np.float32) for m, v in self._entropy.items()}

  @property
  def entropy_without_ot(self) -> dict[str, np.ndarray]:
    return {m: self._cat(v, np.float32) for m, v in self._entropy_without_ot.items()}

  def __len__(self) -> int:
    return sum(len(x) for x in self._labels)


def concept_pass(
  bundle,
  classes: Iterable,
  bank: pipeline.TextBank,
  analysis,
  *,
  methods: Sequence[str] | None = None,
  progress: bool = True,
) -> ConceptPass:
  """Runs the analysis on every class's images and keeps their concepts and embeddings.

  Args:
    bundle: a CLIPBundle with a ViT image tower.
    classes: iterable of mutual.data.ClassImages (consumed once).
    bank: pipeline.encode_bank output (the descriptor bank D and the analysis's classifier).
    analysis: config.analysis.
    methods: concept methods; default analysis.methods.
  """
  methods = tuple(methods or analysis.methods)
  out = ConceptPass.empty(bank.descriptors, len(bank.class_names), methods)
  for cls in stage_bar(classes, "concept pass: analyse classes", show=progress):
    result = pipeline.analyze_class(bundle, cls.images, bank, analysis, methods)
    out.add(cls.label, result, image_embeddings(bundle, cls.images))
  return out
