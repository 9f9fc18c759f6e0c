"""The mutual-knowledge paper's evaluation protocols in one run, the library behind
`python -m mutual.evaluate` (see that module for the outputs it writes): Table 1 (App. D, E:
the analysis's explanations against the trained baselines and a random order of its own
concepts on the XAI metrics) and the protocols of mutual.protocols (Table 2, App. A.1-A.4)."""

from __future__ import annotations

import os
import time
from typing import Any, Mapping

import jax
import ml_collections
import numpy as np
from absl import logging

import stori_jax
from mutual import (
  baselines,
  data,
  features,
  foreground,
  paper_config,
  pipeline,
  protocols,
  report,
  run_flags,
  xai,
)
from mutual.protocols import bottlenecks
from stori_jax.plumbing import paths
from stori_jax.plumbing.config_files import ConfigError
from stori_jax.fewshot.datasets import DatasetMissingError
from stori_jax.plumbing.plotting import pyplot
from stori_jax.clip.preprocess import normalize

# ---------------------------------------------------------------------------------------------
# Data.


def _merged(config, data_overrides: Mapping[str, Any]) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict({"data": {**config.data.to_dict(), **dict(data_overrides)}})


def _load_classes(config, data_overrides: Mapping[str, Any], size: int):
  return data.load(_merged(config, data_overrides), size)


def training_dataset(config, evaluation: data.Dataset) -> data.Dataset:
  """The baselines' training images (config.baselines.data over config.data), checked before
  any work: they must exist and hold the evaluation's classes."""
  try:
    found = data.prepare(_merged(config, config.baselines.data))
  except DatasetMissingError as error:
    raise DatasetMissingError(
      f"The baselines' training images (config.baselines.data): {error} Or set "
      "--config.baselines.enabled=False to evaluate without the baselines."
    ) from None
  if found.names != evaluation.names:
    only_train = sorted(set(found.names) - set(evaluation.names))
    only_eval = sorted(set(evaluation.names) - set(found.names))
    parts = [f"only in training: {only_train[:10]}"] if only_train else []
    parts += [f"only in evaluation: {only_eval[:10]}"] if only_eval else []
    detail = "; ".join(parts) or "the same classes in another order"
    raise ConfigError(
      f"The baselines' training classes (config.baselines.data) differ from the evaluation "
      f"classes ({detail}); point config.baselines.data at the same dataset's training split, "
      "or set --config.baselines.enabled=False."
    )
  return found


def train_baselines(
  bundle, config, train_dataset, class_names, per_class, bank, size, progress=True, workdir=None
):
  """Caches the training images' features (`train_dataset`, a data.Dataset) and trains the
  three baselines (checkpoints under `workdir`, resumed by a rerun: `baselines.train_all`)."""
  b = config.baselines
  train_classes = train_dataset.classes(size)
  cached = baselines.cache_features(
    bundle,
    train_classes,
    kind=config.analysis.feature_kind,
    batch_size=min(64, int(config.evaluation.batch_size)),
    dtype=np.dtype(b.cache_dtype),
    progress=progress,
  )
  targets = baselines.descriptor_targets(class_names, per_class, bank.descriptors)
  trained = baselines.train_all(
    cached, bank.descriptor_embeddings, targets, b, progress, workdir=workdir
  )
  return trained, len(cached)


# ---------------------------------------------------------------------------------------------
# Explanations of one class's images.


def explanations(cls, result, config, baseline_explanations=None) -> dict:
  """{row name: (masks bool [B, L, S, S], valid bool [B, L], descriptor ids int [B, L],
  descriptor_valid bool [B, L])}.

  Args:
    cls: a data.ClassImages; result: pipeline.analyze_class's output for its images.
    config: the evaluation config.
    baseline_explanations: `baselines.Baselines.explain` output for the same images, or None.

  The method's concepts are the analysis's pixel regions with their first (largest transport
  mass) descriptor; the baselines' are their regions, upsampled nearest from the patch grid.
  A concept whose region holds no pixel is not valid (there is nothing to blur); a region the
  analysis found no descriptor for (no candidate survived the filters) stays a concept with a
  textual similarity of 0 in the importance ranking.
  """
  size = cls.images.shape[1]
  n = int(config.analysis.n_concepts)
  out = {}
  for method in config.analysis.methods:
    r = result[method]
    masks = np.asarray(xai.label_masks(r["pixel_maps"], n))
    valid = np.asarray(r["concept_valid"]) & masks.any(axis=(2, 3))
    ids, ids_valid = r["concept_ids"][:, :, 0], r["concept_ids_valid"][:, :, 0]
    out[f"Ours ({pipeline.METHOD_TITLES.get(method, method)})"] = (masks, valid, ids, ids_valid)
  for name, e in (baseline_explanations or {}).items():
    regions = e["regions"]
    flat = regions.reshape(-1, *regions.shape[2:])
    masks = np.asarray(foreground.upsample_mask(flat, size)).reshape(*regions.shape[:2], size, size)
    valid = e["valid"] & masks.any(axis=(2, 3))
    out[name] = (masks, valid, e["ids"], np.ones_like(valid))
  return out


def first_image_steps(images, ordered, ordered_valid, blur) -> dict[str, np.ndarray]:
  """The perturbed images of the first image's curves (App. E, Fig. 7): {"deletion",
  "insertion": float32 [L + 1, S, S, 3] in [0, 1]}, as `xai.perturbation_curves` scores them
  (`ordered`: bool [B, L, S, S] regions in importance order, `ordered_valid`: bool [B, L])."""
  x = np.asarray(images[:1], np.float32) / 255.0
  steps = xai.cumulative_masks(ordered[:1], ordered_valid[:1])
  blurred = xai.blur_images(x, blur[0], blur[1])
  return {
    mode: np.asarray(xai.perturbed_images(x, blurred, steps, mode))[0]
    for mode in ("deletion", "insertion")
  }


def class_curves(
  bundle, cls, result, bank, config, score_fn, blur, trained=None, image_embeddings=None, steps=None
):
  """Perturbation curves of every explanation of one class: ({row: xai.Curves}, the trained
  baselines' class and labeler scores, `baselines.Baselines.classify`, {} without them).
  image_embeddings: float32 [B, E] unit, computed if None.
  steps: a dict to receive, per row of the method ("Ours (...)"), the first image's perturbed
  images (`first_image_steps`), or None."""
  e = config.evaluation
  images = cls.images
  batch = len(images)
  labels = np.full(batch, cls.label, np.int64)
  predicted = np.asarray(result["predicted"])
  if image_embeddings is None:
    image_embeddings = features.image_embeddings(
      bundle, normalize(images, bundle.preprocess_config.mean, bundle.preprocess_config.std)
    )
  ex, extra = None, {}
  if trained is not None:
    raw, tokens = baselines.encode_features(bundle, images, config.analysis.feature_kind)
    ex = trained.explain(tokens, bank.descriptor_embeddings, predicted, config.baselines)
    extra = trained.classify(tokens, raw, bank.descriptor_embeddings)  # Table 5
  rows = explanations(cls, result, config, ex)
  stages = paper_config.analysis_stages(config.analysis)  # the analysis mode's prompts
  curves = {}
  for name, (masks, valid, ids, ids_valid) in rows.items():
    embedded = xai.region_embeddings(
      bundle, images, masks, batch_size=int(e.batch_size), ellipse=stages["ellipse"]
    )
    textual = np.where(ids_valid[..., None], bank.descriptor_embeddings[ids], 0.0)
    order, _ = xai.importance(image_embeddings, embedded, textual, valid)
    ordered, ordered_valid = xai.reorder(order, masks, valid)
    curves[name] = xai.perturbation_curves(
      score_fn,
      images,
      ordered,
      ordered_valid,
      predicted,
      labels,
      blur_size=blur[0],
      blur_sigma=blur[1],
    )
    if name.startswith("Ours"):
      if steps is not None:
        steps[name] = first_image_steps(images, ordered, ordered_valid, blur)
      draws = []
      for draw in range(int(e.random_draws)):
        key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(e.seed), cls.label), draw)
        shuffled, shuffled_valid = xai.reorder(xai.random_order(key, valid), masks, valid)
        draws.append(
          xai.perturbation_curves(
            score_fn,
            images,
            shuffled,
            shuffled_valid,
            predicted,
            labels,
            blur_size=blur[0],
            blur_sigma=blur[1],
          )
        )
      curves[name.replace("Ours", "Random order")] = xai.Curves.concatenate(draws)
  return curves, extra


# ---------------------------------------------------------------------------------------------
# Outputs.


def plot_curves(path: str, summaries: Mapping[str, Mapping], title: str = "") -> None:
  """The four mean curves, one line per explanation (its area, the Table 1 number, in the
  legend)."""
  plt = pyplot()
  fig, axes = plt.subplots(1, 4, figsize=(16, 5.2))
  score = "predicted class's score\n(scaled cosine)"
  panels = (
    ("deletion", "Deletion (lower is better)", "concepts blurred", score),
    ("insertion", "Insertion (higher is better)", "concepts restored", score),
    ("acc_drop", "AccDrop (lower is better)", "concepts blurred", "accuracy (fraction)"),
    ("acc_increase", "AccIncrease (higher is better)", "concepts restored", "accuracy (fraction)"),
  )
  for ax, (key, label, xlabel, ylabel) in zip(axes, panels):
    for name, s in summaries.items():
      curve = np.asarray(s["curves"][key])
      style = "--" if name.startswith("Random") else "-"
      ax.plot(np.arange(len(curve)), curve, style, marker="o", ms=3, label=f"{name} ({s[key]:.2f})")
    ax.set_title(label, fontsize=9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel, fontsize=8)
    # Below the panel: inside, the seven entries covered the curves.
    ax.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)
  fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  paths.save_figure(fig, path, dpi=120)
  plt.close(fig)


def _plot_steps(workdir: str, config, cls, steps, curves) -> None:
  """fig7_<method>.png: the deletion and insertion steps of the first image with its two score
  curves (App. E, Fig. 7), per concept method."""
  model = config.model.get("name", config.model.source)
  for method in config.analysis.methods:
    name = f"Ours ({pipeline.METHOD_TITLES.get(method, method)})"
    if name not in steps:
      continue
    report.plot_perturbation_steps(
      os.path.join(workdir, f"fig7_{method}.png"),
      steps[name]["deletion"],
      steps[name]["insertion"],
      curves[name].deletion[0],
      curves[name].insertion[0],
      title=f"{config.name}: {model}, {cls.ids[0]} ({cls.name}): deletion and insertion steps "
      f"of its {pipeline.METHOD_TITLES.get(method, method)} concepts (App. E, Fig. 7)",
    )


def _rounded(x):
  if isinstance(x, float):
    return round(x, 6)
  if isinstance(x, dict):
    return {k: _rounded(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_rounded(v) for v in x]
  return x


def beats_random(summaries: Mapping[str, Mapping]) -> dict[str, dict[str, bool]]:
  """Per concept method, whether the method's order beats the random order on each metric."""
  out = {}
  for name, s in summaries.items():
    if name.startswith("Ours"):
      r = summaries.get(name.replace("Ours", "Random order"))
      if r is not None:
        out[name] = {m: bool(xai.BETTER[m] * (s[m] - r[m]) > 0) for m in xai.METRICS}
  return out


# ---------------------------------------------------------------------------------------------
# Protocols (mutual.protocols).


def run_protocols(
  bundle, config, concepts, class_names, lists, size, bank, progress=True, dataset=None
) -> dict:
  """Runs the protocols named in config.evaluation.protocols (mutual.protocols); {name: result}.

  Table 2, App. A.2 and App. A.4 reuse the analysis of the Table 1 pass (`concepts`, a
  protocols.ConceptPass); App. A.1 (CorLoc, layer similarity) and App. A.3 read the evaluation
  images again (from `dataset`, a data.Dataset, else from config.data).
  """
  wanted = tuple(config.evaluation.protocols)
  unknown = set(wanted) - set(protocols.PROTOCOLS)
  if unknown:
    raise ConfigError(
      f"unknown protocols {sorted(unknown)} in config.evaluation.protocols; known: "
      f"{protocols.PROTOCOLS}"
    )
  p = config.protocols
  out = {}
  if "table2" in wanted:
    out["table2"] = protocols.table2_descriptor_accuracy(
      bundle, concepts, class_names, lists, settings=p.table2, progress=progress
    )
  # Another pass over the evaluation images.
  again = lambda: dataset.classes(size) if dataset is not None else data.load(config, size)[2]
  if "corloc" in wanted:
    out["corloc"] = protocols.corloc(
      bundle, again(), config.analysis, settings=p.corloc, progress=progress
    )
  if "layer_similarity" in wanted:
    out["layer_similarity"] = protocols.layer_similarity(
      bundle, again(), config.analysis, progress=progress
    )
  if "ot_entropy" in wanted:
    out["ot_entropy"] = protocols.ot_entropy(concepts)
  if "blur" in wanted:
    classes = again()
    out["blur"] = protocols.blur_accuracy(
      bundle, classes, bank.class_embeddings, config.analysis, settings=p.blur, progress=progress
    )
  if "bank_quality" in wanted:
    out["bank_quality"] = protocols.bank_quality(
      class_names,
      lists,
      settings=p.bank_quality,
      bundle=bundle,
      image_embeddings=concepts.image_embeddings,
      labels=concepts.labels,
      progress=progress,
    )
  return out


# ---------------------------------------------------------------------------------------------
# The run.


def run(config, workdir: str, progress: bool = True, restart: bool = False) -> dict:
  """Runs Table 1 and the protocols; returns the results (also written to workdir).

  The evaluation and training data are checked (descriptor file, classes matched by name, no
  empty class) and the workdir claimed for this config (`restart` moves another run aside)
  before the model loads.
  """
  start = time.perf_counter()
  _check_config(config)
  dataset = data.prepare(config)
  train_dataset = training_dataset(config, dataset) if config.baselines.enabled else None
  if "corloc" in config.evaluation.protocols:  # its ground-truth boxes
    protocols.localization.check_inputs(config, dataset)
  run_flags.claim_workdir(config, workdir, restart, "mutual-knowledge evaluation")
  bundle = stori_jax.load(config.model.source)
  if "layer_similarity" in config.evaluation.protocols:  # a ViT tower
    protocols.layers.check_model(bundle)
  size = int(bundle.config.vision.image_size)
  class_names = list(dataset.names)
  classes = dataset.classes(size)
  lists = dataset.lists()
  a = config.analysis
  bank = pipeline.encode_config_bank(bundle, config, dataset, progress)
  methods = tuple(a.methods)
  trained, n_train = None, 0
  if config.baselines.enabled:
    trained, n_train = train_baselines(
      bundle,
      config,
      train_dataset,
      class_names,
      {n: l for n, l in zip(class_names, lists)},
      bank,
      size,
      progress,
      workdir=os.path.join(workdir, "baselines"),
    )
  e = config.evaluation
  score_fn = xai.clip_scorer(bundle, bank.class_embeddings, float(e.score_scale), int(e.batch_size))
  blur = xai.blur_kernel(size, float(e.blur_sigma))
  concepts = protocols.ConceptPass.empty(bank.descriptors, len(class_names), methods)
  parts: dict[str, list] = {}
  scores: dict[str, list] = {bottlenecks.ZERO_SHOT: []}  # Table 5's logits, and the labeler's
  labels: list = []
  for cls in protocols.stage_bar(classes, "Table 1: analyse and perturb classes", show=progress):
    result = pipeline.analyze_class(bundle, cls.images, bank, a, methods)
    embeddings = protocols.image_embeddings(bundle, cls.images)
    concepts.add(cls.label, result, embeddings)
    steps = {} if not parts else None  # Fig. 7: the first image's steps
    curves, predictions = class_curves(
      bundle, cls, result, bank, config, score_fn, blur, trained, embeddings, steps
    )
    if steps:
      _plot_steps(workdir, config, cls, steps, curves)
    for name, c in curves.items():
      parts.setdefault(name, []).append(c)
    scores[bottlenecks.ZERO_SHOT].append(np.asarray(result["class_scores"]))
    labels.append(np.full(len(cls.images), cls.label))
    for name, p in predictions.items():
      scores.setdefault(name, []).append(p)
  if not parts:
    raise ConfigError("No images were evaluated: check config.data (classes, images_per_class).")
  order = [n for n in baselines.NAMES if n in parts]
  order += [n for n in parts if n.startswith("Ours")] + [n for n in parts if n.startswith("Random")]
  summaries = {name: xai.summarize(xai.Curves.concatenate(parts[name])) for name in order}
  n_images = len(concepts)
  for name in summaries:
    summaries[name]["images"] = n_images
  model = config.model.get("name", config.model.source)
  labeler = scores.pop(baselines.LABELER, None)
  table5 = bottlenecks.table5(
    {k: np.concatenate(v) for k, v in scores.items()},
    np.concatenate(labels),
    None if labeler is None else np.concatenate(labeler),
    baselines.descriptor_targets(class_names, dict(zip(class_names, lists)), bank.descriptors),
    int(config.baselines.feature_maps.get("accuracy_top_k", 10)),
  )
  top1 = {k: r["top1"] for k, r in table5["rows"].items()}
  results: dict[str, Any] = dict(
    model=model,
    images=n_images,
    explanations=summaries,
    requires_training={n: n in baselines.NAMES for n in summaries},
    beats_random=beats_random(summaries),
    top1=top1,
    table5=table5,
    blur=dict(kernel=blur[0], sigma=blur[1]),
  )
  if trained is not None:
    results["baselines"] = dict(training_images=n_train, training=trained.training_summary())
  paths.makedirs(workdir, exist_ok=True)
  table = xai.table_rows(summaries, results["requires_training"])
  text = (
    f"## Table 1 (App. D, E): explanations on the XAI metrics ({model}, {n_images} images)\n\n"
    f"{table}\n## Table 5 (App. D): Top-1 / Top-5 (%) of the trained baselines on the same images"
    "\n\n"
  )
  text += bottlenecks.table5_markdown(table5, model)
  paths.write_text_atomic(os.path.join(workdir, "table1.md"), text)
  plot_curves(
    os.path.join(workdir, "curves.png"),
    summaries,
    title=f"{config.name}: {model}, {n_images} images: perturbation curves of each explanation "
    "(concept method in brackets; legend: area under the curve)",
  )

  if tuple(e.protocols):
    proto = run_protocols(
      bundle, config, concepts, class_names, lists, size, bank, progress, dataset
    )
    results["protocols"] = proto
    md = "".join(f"{protocols.section(name, {model: r})}\n" for name, r in proto.items())
    paths.write_text_atomic(os.path.join(workdir, "protocols.md"), md)
    report.write_json(os.path.join(workdir, "protocols.json"), _rounded(proto))
    if "layer_similarity" in proto:
      protocols.plot_layer_similarity(
        os.path.join(workdir, "layer_similarity.png"),
        proto["layer_similarity"],
        title=f"{config.name}: {model}, [CLS] token across layers, mean over "
        f"{proto['layer_similarity']['images']} images (App. A.1, Fig. 1)",
      )
  results["seconds"] = round(time.perf_counter() - start, 1)
  if dataset.skipped:  # never a silent disappearance: what was left out, and why
    results["skipped_classes"] = dataset.skipped
  results["config"] = config.to_dict()
  report.write_json(os.path.join(workdir, "table1.json"), _rounded(results))
  logging.info("%d images in %.1f s", n_images, results["seconds"])
  return results


def _check_config(config) -> None:
  """Settings that would fail late, checked before any work."""
  unknown = set(config.evaluation.protocols) - set(protocols.PROTOCOLS)
  if unknown:
    raise ConfigError(
      f"unknown protocols {sorted(unknown)} in config.evaluation.protocols; known: "
      f"{protocols.PROTOCOLS}"
    )
  if config.baselines.enabled:
    baselines.lf_cbm_settings(config.baselines)  # LF-CBM's recipe, before any work
  if config.baselines.enabled and int(config.baselines.n_concepts) != int(
    config.analysis.n_concepts
  ):
    raise ConfigError(
      f"config.baselines.n_concepts ({config.baselines.n_concepts}) must equal "
      f"config.analysis.n_concepts ({config.analysis.n_concepts}): the same number of "
      "perturbation steps for every explanation."
    )
