"""Table 2 (App. K) of the mutual-knowledge paper: zero-shot accuracy of the descriptor classifier,
then with the textual concepts found for the classes nearest the prediction added
(`table2_descriptor_accuracy`)."""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mutual import paper_config
from mutual.protocols.analysis_pass import ConceptPass
from mutual.protocols.progress import stage_bar
from mutual.protocols.zero_shot import hits_at_k, percent, prompt_sums, topk_hits
from stori_jax.clip.encoding import l2_normalize

RECIPIENTS = ("prediction", "neighbours")


def nearest_classes(class_weights, n: int = 2) -> np.ndarray:
  """int [C, n]: each class's n most similar other classes (cosine of the class embeddings),
  most similar first; ties go to the lower index."""
  w = l2_normalize(class_weights, axis=1)
  if not 1 <= n < len(w):
    raise ValueError(f"need 1 <= neighbours < number of classes ({len(w)}), got {n}")
  sim = w @ w.T
  np.fill_diagonal(sim, -np.inf)
  return np.argsort(-sim, axis=1, kind="stable")[:, :n]


def concepts_to_add(
  counts: np.ndarray,
  sources: np.ndarray,
  descriptors: Sequence[str],
  own: Sequence[Sequence[str]],
  limit: int = 10,
) -> list[list[str]]:
  """The concepts each class receives.

  Args:
    counts: int [C, D] images of class c with descriptor d among their visual descriptors.
    sources: int [C, S] the classes whose images' concepts class c receives (-1: none).
    descriptors: the D bank descriptors.
    own: the classes' own descriptor lists; those are not added again.
    limit: at most this many per class, the ones found in most source images first (ties: bank
      order); 0 keeps all.

  Returns:
    C lists of descriptors.
  """
  out = []
  for c, src in enumerate(np.asarray(sources)):
    total = np.zeros(counts.shape[1], np.int64)
    for s in src:
      if s >= 0:
        total += counts[s]
    order = np.argsort(-total, kind="stable")
    have = set(own[c])
    picked = [descriptors[d] for d in order if total[d] > 0 and descriptors[d] not in have]
    out.append(picked[:limit] if limit else picked)
  return out


@functools.partial(jax.jit, static_argnames=("recipient",))
def _augmented_scores(x, base_w, aug_w, neighbours, recipient: str):
  base = x @ base_w.T
  augmented = x @ aug_w.T
  predicted = jnp.argmax(base, axis=1)
  n_classes = base_w.shape[0]
  if recipient == "prediction":
    use = jax.nn.one_hot(predicted, n_classes, dtype=bool)
  else:
    use = jnp.any(jax.nn.one_hot(neighbours[predicted], n_classes, dtype=bool), axis=1)
  return jnp.where(use, augmented, base), predicted


def augmented_hits(
  image_embeddings,
  labels,
  base_weights,
  augmented_weights,
  neighbours,
  recipient: str = "neighbours",
  chunk: int = 4096,
):
  """Per-image zero-shot with the classes concerned by each image's prediction augmented.

  For each image the base classifier predicts p; the rows used for it are augmented_weights for
  the recipients of p (recipient "prediction": p itself; "neighbours": p's nearest classes
  neighbours[p]) and base_weights for every other class.

  Args:
    image_embeddings: float32 [N, E]; labels int [N].
    base_weights, augmented_weights: float32 [C, E]; neighbours: int [C, n].

  Returns:
    (bool [N] top-1 hits, bool [N] top-5 hits, int [N] base predictions, int [N] new predictions).
  """
  if recipient not in RECIPIENTS:
    raise ValueError(f"recipient must be one of {RECIPIENTS}, got {recipient!r}.")
  x = np.asarray(image_embeddings, np.float32)
  labels = np.asarray(labels, np.int32)
  bw, aw = jnp.asarray(base_weights), jnp.asarray(augmented_weights)
  nb = jnp.asarray(neighbours, jnp.int32)
  hits, base_pred, new_pred = [], [], []
  for i in range(0, len(x), chunk):
    scores, p = _augmented_scores(jnp.asarray(x[i : i + chunk]), bw, aw, nb, recipient)
    hits.append(np.asarray(hits_at_k(scores, labels[i : i + chunk], (1, 5))))
    base_pred.append(np.asarray(p))
    new_pred.append(np.asarray(jnp.argmax(scores, axis=1)))
  if not hits:
    empty = np.zeros(0, bool)
    return empty, empty, np.zeros(0, np.int32), np.zeros(0, np.int32)
  hits = np.concatenate(hits)
  return hits[:, 0], hits[:, 1], np.concatenate(base_pred), np.concatenate(new_pred)


def guarded_accuracy(base_hit, new_hit, base_predicted, n_classes: int):
  """Footnote 4 of the paper: classes whose neighbours' concepts hurt are left unaugmented.

  The augmentation of an image depends only on its base prediction p, so the choice separates
  by p: class p keeps its augmentation when, over the images predicted p, it does not lower the
  number of correct predictions. This uses the labels (an oracle, as the footnote's choice is).

  Returns:
    (accuracy in [0, 1], number of classes kept augmented among those that are predicted).
  """
  base_hit = np.asarray(base_hit, np.int64)
  new_hit = np.asarray(new_hit, np.int64)
  base_per = np.bincount(base_predicted, weights=base_hit, minlength=n_classes)
  new_per = np.bincount(base_predicted, weights=new_hit, minlength=n_classes)
  predicted_classes = np.bincount(base_predicted, minlength=n_classes) > 0
  keep = (new_per >= base_per) & predicted_classes
  correct = np.where(keep, new_per, base_per).sum()
  return float(correct / max(len(base_hit), 1)), int(keep.sum())


def table2_descriptor_accuracy(
  bundle,
  concepts: ConceptPass,
  class_names: Sequence[str],
  class_descriptors: Sequence[Sequence[str]],
  settings=None,
  *,
  progress: bool = True,
) -> dict[str, Any]:
  """Table 2: zero-shot accuracy with descriptors, then with the concepts found added.

  Base: each class's descriptors in App. K's prompt (settings.prompt), aggregated per class
  (settings.aggregate; "scores" is Menon & Vondrick's mean of per-descriptor cosines, the
  baseline [36] the paper compares with). Ours, per concept method: for an image predicted p,
  the `neighbours` classes nearest p (cosine of the base class embeddings) are taken; the
  textual concepts (visual descriptors D_v) found on their images are added as descriptors, in
  the same prompt, and the image is classified again.

  Choices the paper leaves open:
    - who receives the concepts (settings.recipient): "neighbours" (default), each of p's nearest
      classes gets the concepts found on its own images, so that an image of a neighbour that
      was mistaken for p can move to it (footnote 4 then reads: for a very discriminative p, the
      neighbours' explanations only add noise, so they are not added); "prediction": p gets the
      concepts found on its neighbours' images (the other literal reading of the footnote). Only
      the recipients' rows change for that image; the rest stay base.
    - how many (settings.added_per_class): the concepts found on most of the source images first,
      10 by default (0: all), excluding the class's own descriptors;
    - footnote 4's exclusion of "overly discriminative" classes is reported separately as
      `guarded_top1` (see `guarded_accuracy`: it uses the labels).
  The images are those in `concepts` (the classes analysed); concepts of classes that were not
  analysed are unknown, so nothing is added from them.

  Args:
    bundle: the CLIPBundle of the analysis.
    concepts: `concept_pass` output.
    class_names: C names in label order; class_descriptors: C descriptor lists (aligned).
    settings: config.protocols.table2 (prompt, aggregate, neighbours, recipient,
      added_per_class, batch_size); None: the defaults.

  Returns:
    dict: base {top1, top5}; methods {method: {top1, top5, delta, guarded_top1, guarded_delta,
    guarded_classes, changed}}; added {method: {class: [descriptors]}}; neighbours {class:
    [names]}; images, classes, settings. Accuracies in percent.
  """
  s = settings if settings is not None else paper_config.protocols_config().table2
  if s.recipient not in RECIPIENTS:
    raise ValueError(f"table2.recipient must be one of {RECIPIENTS}, got {s.recipient!r}.")
  if len(concepts) == 0:
    raise ValueError("no image in the concept pass: analyse at least one class first")
  n_classes = len(class_names)
  if concepts.n_classes != n_classes:
    raise ValueError(f"the concept pass has {concepts.n_classes} classes, not {n_classes}")
  x, labels = concepts.image_embeddings, concepts.labels
  # One bar for the stage: the base prompts, then each method's added prompts (no inner bars).
  bar = stage_bar(
    desc="Table 2: encode the class prompts", total=1 + len(concepts.methods), show=progress
  )
  base = prompt_sums(bundle, class_names, class_descriptors, s.prompt, s.batch_size)
  bar.update(1)
  base_w = base.weights(s.aggregate)
  neighbours = nearest_classes(base.weights("embedding"), int(s.neighbours))
  base_hits = topk_hits(x, labels, base_w, (1, 5))
  result: dict[str, Any] = dict(
    base=dict(top1=percent(base_hits[:, 0].mean()), top5=percent(base_hits[:, 1].mean())),
    methods={},
    added={},
    neighbours={class_names[c]: [class_names[j] for j in row] for c, row in enumerate(neighbours)},
    images=len(labels),
    classes=n_classes,
    settings=dict(s.to_dict() if hasattr(s, "to_dict") else s),
  )
  for method in concepts.methods:
    if s.recipient == "prediction":
      sources = neighbours
    else:
      sources = np.arange(n_classes)[:, None]
    added = concepts_to_add(
      concepts.counts[method],
      sources,
      concepts.descriptors,
      class_descriptors,
      int(s.added_per_class),
    )
    extra = prompt_sums(
      bundle,
      class_names,
      added,
      s.prompt,
      s.batch_size,
      dim=base.sums.shape[1],
    )
    bar.update(1)
    top1, top5, base_pred, new_pred = augmented_hits(
      x, labels, base_w, (base + extra).weights(s.aggregate), neighbours, s.recipient
    )
    guarded, kept = guarded_accuracy(base_hits[:, 0], top1, base_pred, n_classes)
    result["methods"][method] = dict(
      top1=percent(top1.mean()),
      top5=percent(top5.mean()),
      delta=round(percent(top1.mean()) - result["base"]["top1"], 4),
      guarded_top1=percent(guarded),
      guarded_delta=round(percent(guarded) - result["base"]["top1"], 4),
      guarded_classes=kept,
      changed=percent(np.mean(base_pred != new_pred)),
    )
    result["added"][method] = {class_names[c]: a for c, a in enumerate(added) if a}
  bar.close()
  return result
