"""App. A.2 of the mutual-knowledge paper: the diversity (entropy) of the descriptors chosen for an
image's concepts, with and without optimal transport (`ot_entropy`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from mutual.protocols.analysis_pass import ConceptPass


def ot_entropy(concepts: ConceptPass) -> dict[str, Any]:
  """App. A.2: the entropy of the descriptors chosen across an image's concepts.

  `transport.choice_entropy` per image (nats; log n when the n picks all differ), averaged over
  the images, with optimal transport (the pipeline's choice) and without it (each concept's top
  descriptors by raw score over the whole bank, the paper's baseline "without any
  post-processing"). The paper does not define the entropy further; this one counts each of the
  L x top picks (mutual.transport).

  Returns:
    dict: methods {method: {with_ot, without_ot, gain}} (gain = with_ot - without_ot); images.
    Every pick different gives log(L * top) (2.71 for the paper's 5 x 3).
  """
  if len(concepts) == 0:
    raise ValueError("no image in the concept pass: analyse at least one class first")
  with_ot, without = concepts.entropy, concepts.entropy_without_ot
  methods = {}
  for m in concepts.methods:
    a, b = float(np.mean(with_ot[m])), float(np.mean(without[m]))
    methods[m] = dict(with_ot=round(a, 4), without_ot=round(b, 4), gain=round(a - b, 4))
  return dict(methods=methods, images=len(concepts))
