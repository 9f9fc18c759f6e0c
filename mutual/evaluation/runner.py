"""The mutual-knowledge paper's evaluation protocols in one run, the library behind
`python -m mutual.evaluate` (see that module for the outputs it writes): Table 1 (App. D, E:
the analysis's explanations against the trained baselines and a random order of its own
concepts on the XAI metrics) and the protocols of mutual.protocols (Table 2, App. A.1-A.4)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import tempfile
import time
import zipfile
from typing import Any, Callable, Mapping

import jax
import ml_collections
import numpy as np
from absl import logging
from tqdm import tqdm

import stori_jax
from mutual import (
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
from mutual.baselines import cache as baseline_cache
from mutual.baselines import lf_cbm as baseline_lf_cbm
from mutual.baselines import suite as baseline_suite
from mutual.protocols import bottlenecks
from stori_jax.plumbing import jsonio, paths
from stori_jax.plumbing.config_files import ConfigError
from stori_jax.fewshot.datasets import DatasetMissingError
from stori_jax.plumbing.plotting import pyplot, save_figure
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
  three baselines (checkpoints under `workdir`, resumed by a rerun:
  `mutual.baselines.suite.train_all`)."""
  b = config.baselines
  train_classes = train_dataset.classes(size)
  # Every image of a large training set: the patch features on disk, beside the checkpoints;
  # for a workdir in a bucket on this host's local disk (a memory map needs a local file).
  on_disk = workdir is not None and b.get("cache_on_disk", False)
  features = None
  if on_disk:
    features = os.path.join(workdir, "features")
    if paths.is_remote(workdir):
      digest = hashlib.sha256(workdir.encode()).hexdigest()[:16]
      features = os.path.join(tempfile.gettempdir(), "stori_jax_features", digest)
      logging.warning("The baselines' feature cache of %s is on local disk: %s", workdir, features)
  cached = baseline_cache.cache_features(
    bundle,
    train_classes,
    kind=config.analysis.feature_kind,
    batch_size=min(64, int(config.evaluation.batch_size)),
    dtype=np.dtype(b.cache_dtype),
    progress=progress,
    directory=features,
  )
  targets = baseline_cache.descriptor_targets(class_names, per_class, bank.descriptors)
  trained = baseline_suite.train_all(
    cached, bank.descriptor_embeddings, targets, b, progress, workdir=workdir
  )
  return trained, len(cached)


def training_set(config, images: int) -> dict:
  """How the baselines' training set stands to the paper's: §4 and App. D train them "on the full
  ImageNet training set", every image of the training split (config.baselines.data's
  images_per_class 0); a cap per class, or the embedded world's generated images, is not the
  paper's setting, and Table 5 (printed, table1.md, table1.json) says so.

  Returns:
    dict: images (trained on), images_per_class (the cap; None: every image), full_training_set
    (bool; None for the embedded world, whose stream has no end), paper_setting (bool), note
    (the sentence Table 5 prints).
  """
  d = _merged(config, config.baselines.data).data
  cap = int(d.get("images_per_class") or 0) or None
  count = f"{images:,} images"
  if d.source == "synthetic":
    full = None
    note = (
      f"{cap} generated images per class of the embedded world ({count}): not the paper's "
      "setting (App. D trains them on the full ImageNet training set)"
    )
  elif cap:
    full = False
    note = (
      f"at most {cap} images per class of the training split ({count}): not the paper's "
      "setting (App. D trains them on the full training set: "
      "config.baselines.data.images_per_class=0)"
    )
  else:
    full = True
    note = f"every image of the training split ({count}), as App. D"
  return dict(
    images=int(images),
    images_per_class=cap,
    full_training_set=full,
    paper_setting=bool(full),
    note=f"Baselines trained on {note}.",
  )


# ---------------------------------------------------------------------------------------------
# Explanations of one class's images.


def explanations(cls, result, config, baseline_explanations=None) -> dict:
  """{row name: (masks bool [B, L, S, S], valid bool [B, L], descriptor ids int [B, L],
  descriptor_valid bool [B, L])}.

  Args:
    cls: a data.ClassImages; result: pipeline.analyze_class's output for its images.
    config: the evaluation config.
    baseline_explanations: `mutual.baselines.suite.Baselines.explain` output for the same
      images, or None.

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
  bundle,
  cls,
  result,
  bank,
  config,
  score_fn,
  blur,
  trained=None,
  image_embeddings=None,
  steps=None,
  feature_maps=None,
):
  """Perturbation curves of every explanation of one class: ({row: xai.Curves}, the trained
  baselines' class and labeler scores, `mutual.baselines.suite.Baselines.classify`, {} without
  them).
  image_embeddings: float32 [B, E] unit, computed if None.
  steps: a dict to receive, per row of the method ("Ours (...)"), the first image's perturbed
  images (`first_image_steps`), or None.
  feature_maps: a list to receive the Fig. 6 rows (`feature_map_rows`) of the class's first
  images, or None."""
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
    raw, tokens = baseline_cache.encode_features(bundle, images, config.analysis.feature_kind)
    ex = trained.explain(tokens, bank.descriptor_embeddings, predicted, config.baselines)
    extra = trained.classify(tokens, raw, bank.descriptor_embeddings)  # Table 5
    if feature_maps is not None:
      feature_maps += feature_map_rows(cls, tokens, trained, bank, config.baselines)
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


def feature_map_rows(cls, tokens, trained, bank, settings) -> list[dict]:
  """App. D.2's Fig. 6 rows of the class's first images (settings.feature_maps.figure_images at
  most; settings: config.baselines): each image, its object channel and Feature Maps concepts
  (`Baselines.feature_map_figure`: the labeler of Table 5's top-all / top-10), their normalised
  maps and regions, and the descriptors the labeler names them by."""
  count = min(int(settings.feature_maps.get("figure_images", 6)), len(cls.images))
  if count == 0:
    return []
  fig = trained.feature_map_figure(tokens[:count], settings)
  return [
    dict(
      image=cls.images[i],
      caption=cls.name,
      class_name=cls.name,
      index=i,
      channels=fig["channels"][i],
      maps=fig["maps"][i],
      regions=fig["regions"][i],
      valid=fig["valid"][i],
      ids=fig["ids"][i],
      labels=[bank.descriptors[j] for j in fig["ids"][i]],
      threshold=float(settings.feature_maps.threshold),
    )
    for i in range(count)
  ]


def first_rows(per_class: list[list], count: int) -> list:
  """Up to `count` rows, one image of each class in turn (the classes' first images, then
  their second ...)."""
  rows = []
  for i in range(max((len(c) for c in per_class), default=0)):
    rows += [c[i] for c in per_class if i < len(c)]
  return rows[:count]


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
  save_figure(fig, path, dpi=120)
  plt.close(fig)


def _plot_feature_maps(workdir: str, config, rows: list[dict], table5: Mapping) -> list[dict]:
  """fig6_feature_maps.png (App. D.2, Fig. 6) from `feature_map_rows`' rows; returns what it
  shows per image (table1.json's "fig6")."""
  model = config.model.get("name", config.model.source)
  fm = config.baselines.feature_maps
  title = (
    f"{config.name}: {model}, Feature Maps (App. D.2, Fig. 6): per image the "
    f"{len(rows[0]['channels'])} neurons of largest spatial norm, the first the main object; "
    f"each map normalised to [0, 1] and shown >= {float(fm.threshold):g}, labelled by the "
    "concept labeler of Table 5's top-all / top-10"
  )
  setting = table5.get("training_set") or {}
  if setting and not setting["paper_setting"]:
    title += f"\n{setting['note']}"
  report.plot_feature_maps(os.path.join(workdir, "fig6_feature_maps.png"), rows, title=title)
  return [
    dict(
      class_name=r["class_name"],
      image=int(r["index"]),
      object_neuron=int(r["channels"][0]),
      neurons=[int(c) for c in r["channels"]],
      descriptors=[label if v else None for label, v in zip(r["labels"], r["valid"])],
    )
    for r in rows
  ]


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
  bundle,
  config,
  concepts,
  class_names,
  lists,
  size,
  bank,
  progress=True,
  dataset=None,
  done: Mapping[str, Any] | None = None,
  keep: Callable[[str, Any], Any] | None = None,
) -> dict:
  """Runs the protocols named in config.evaluation.protocols (mutual.protocols); {name: result}.

  Table 2, App. A.2 and App. A.4 reuse the analysis of the Table 1 pass (`concepts`, a
  protocols.ConceptPass); App. A.1 (CorLoc, layer similarity) and App. A.3 read the evaluation
  images again (from `dataset`, a data.Dataset, else from config.data).

  done: {name: result} of protocols an earlier run finished (taken as they are, not run);
  keep(name, result): called with each protocol run here as soon as it ends (a resumed run
  keeps it), returns the result to report.
  """
  wanted = tuple(config.evaluation.protocols)
  unknown = set(wanted) - set(protocols.PROTOCOLS)
  if unknown:
    raise ConfigError(
      f"unknown protocols {sorted(unknown)} in config.evaluation.protocols; known: "
      f"{protocols.PROTOCOLS}"
    )
  p = config.protocols
  done = dict(done or {})
  out = {}

  def take(name: str, compute: Callable[[], Any]) -> None:
    if name not in wanted:
      return
    if name in done:
      out[name] = done[name]
      return
    result = compute()
    out[name] = keep(name, result) if keep is not None else result

  take(
    "table2",
    lambda: protocols.table2_descriptor_accuracy(
      bundle, concepts, class_names, lists, settings=p.table2, progress=progress
    ),
  )
  # Another pass over the evaluation images.
  again = lambda: dataset.classes(size) if dataset is not None else data.load(config, size)[2]
  take(
    "corloc",
    lambda: protocols.corloc(
      bundle, again(), config.analysis, settings=p.corloc, progress=progress
    ),
  )
  take(
    "layer_similarity",
    lambda: protocols.layer_similarity(bundle, again(), config.analysis, progress=progress),
  )
  take("ot_entropy", lambda: protocols.ot_entropy(concepts))
  take(
    "blur",
    lambda: protocols.blur_accuracy(
      bundle, again(), bank.class_embeddings, config.analysis, settings=p.blur, progress=progress
    ),
  )
  take(
    "bank_quality",
    lambda: protocols.bank_quality(
      class_names,
      lists,
      settings=p.bank_quality,
      bundle=bundle,
      image_embeddings=concepts.image_embeddings,
      labels=concepts.labels,
      progress=progress,
    ),
  )
  return out


# ---------------------------------------------------------------------------------------------
# The run.


def run(config, workdir: str, progress: bool = True, restart: bool = False) -> dict:
  """Runs Table 1 and the protocols; returns the results (also written to workdir).

  The evaluation and training data are checked (descriptor file, classes matched by name, no
  empty class, every image readable) and the workdir claimed for this config (`restart` moves
  another run aside) before the model loads.

  Resume, per class and per protocol: a class's Table 1 pass (its analysis's concepts, every
  explanation's perturbation curves, Table 5's scores) is kept in `classes/<label>.npz`, and a
  protocol's result in `protocols/<name>.json`, each written atomically when it ends. The same
  command again takes every class file of the same images (ids, and for an image folder the
  files' sizes and times) and every protocol file of the same classes, and runs only the rest;
  the baselines resume from their checkpoints, and are not trained again (nor their training
  images encoded) when no class is left to evaluate.
  """
  start = time.perf_counter()
  _check_config(config)
  dataset = data.prepare(config)
  train_dataset = training_dataset(config, dataset) if config.baselines.enabled else None
  if "corloc" in config.evaluation.protocols:  # its ground-truth boxes
    protocols.localization.check_inputs(config, dataset)
  run_flags.claim_workdir(config, workdir, restart, "mutual-knowledge evaluation")
  class_names = list(dataset.names)
  lists = dataset.lists()
  # Every class with its ids, no image read: which an earlier run of this command finished.
  listing = list(dataset.classes(None, read=lambda i: False))
  states = [_class_state(cls, dataset.fingerprints) for cls in listing]
  kept = {i for i, cls in enumerate(listing) if _kept_class(workdir, cls, states[i])}
  classes_digest = hashlib.sha256(jsonio.dumps_strict(states).encode()).hexdigest()
  wanted = tuple(config.evaluation.protocols)
  done_protocols = {
    name: result
    for name in wanted
    if (result := _kept_protocol(workdir, name, classes_digest)) is not None
  }
  if (kept or done_protocols) and progress:
    tqdm.write(
      f"resuming: {len(kept)} of {len(listing)} classes and {len(done_protocols)} of "
      f"{len(wanted)} protocols were evaluated by an earlier run of this command in {workdir} "
      "(kept; classes/<label>.npz, protocols/<name>.json)",
      file=sys.stderr,
    )
  bundle = stori_jax.load(config.model.source)
  if "layer_similarity" in wanted:  # a ViT tower
    protocols.layers.check_model(bundle)
  size = int(bundle.config.vision.image_size)
  a = config.analysis
  methods = tuple(a.methods)
  descriptors = tuple(pipeline.bank_descriptors(config, dataset.descriptors))
  todo = [i for i in range(len(listing)) if i not in kept]
  trained, baselines_summary = None, None
  summary_path = os.path.join(workdir, "baselines", "summary.json")
  # The baselines explain the classes left; their training summary is kept once trained.
  train = config.baselines.enabled and (todo or not paths.isfile(summary_path))
  bank = None
  if todo or train or len(done_protocols) < len(wanted):
    bank = pipeline.encode_config_bank(bundle, config, dataset, progress)
  if config.baselines.enabled:
    if not train:
      with paths.open(summary_path) as f:
        baselines_summary = json.load(f)
    else:
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
      baselines_summary = dict(
        training_images=n_train,
        training_set=training_set(config, n_train),
        training=trained.training_summary(),
      )
      report.write_json(summary_path, baselines_summary)
  e = config.evaluation
  blur = xai.blur_kernel(size, float(e.blur_sigma))
  score_fn = None
  if todo:
    score_fn = xai.clip_scorer(
      bundle, bank.class_embeddings, float(e.score_scale), int(e.batch_size)
    )
  concepts = protocols.ConceptPass.empty(descriptors, len(class_names), methods)
  parts: dict[str, list] = {}
  scores: dict[str, list] = {bottlenecks.ZERO_SHOT: []}  # Table 5's logits, and the labeler's
  labels: list = []
  fig6_count = int(config.baselines.feature_maps.get("figure_images", 6))
  fig6: list[list] = []  # Fig. 6's candidate rows, per class, of the first fig6_count classes
  wanted_classes = set(todo)
  stream = dataset.classes(size, read=lambda i: i in wanted_classes)
  for index, cls in enumerate(
    protocols.stage_bar(stream, "Table 1: analyse and perturb classes", show=progress)
  ):
    if index in kept:
      arrays = _read_class(workdir, cls)
    else:
      arrays = _evaluate_class(
        bundle,
        cls,
        bank,
        config,
        score_fn,
        blur,
        trained,
        concepts,
        steps=index == 0,
        feature_maps=trained is not None and index < fig6_count,
      )
      if index == 0:  # Fig. 7: the first image's steps
        _plot_steps(workdir, config, cls, arrays.pop("steps"), _curves_of(arrays))
      paths.makedirs(os.path.join(workdir, "classes"))
      jsonio.write_arrays_atomic(
        _class_path(workdir, cls.label),
        {**arrays, "state": np.array(jsonio.dumps_strict(states[index]))},
      )
    rows = _fig6_rows(arrays, cls)
    if rows:
      fig6.append(rows)
    concepts.add_arrays(cls.label, _prefixed(arrays, "concepts/"))
    for name, c in _curves_of(arrays).items():
      parts.setdefault(name, []).append(c)
    for name, p in _prefixed(arrays, "scores/").items():
      scores.setdefault(name, []).append(p)
    labels.append(np.full(len(cls), cls.label))
  if not parts:
    raise ConfigError("No images were evaluated: check config.data (classes, images_per_class).")
  order = [n for n in baseline_suite.NAMES if n in parts]
  order += [n for n in parts if n.startswith("Ours")] + [n for n in parts if n.startswith("Random")]
  summaries = {name: xai.summarize(xai.Curves.concatenate(parts[name])) for name in order}
  n_images = len(concepts)
  for name in summaries:
    summaries[name]["images"] = n_images
  model = config.model.get("name", config.model.source)
  labeler = scores.pop(baseline_suite.LABELER, None)
  table5 = bottlenecks.table5(
    {k: np.concatenate(v) for k, v in scores.items()},
    np.concatenate(labels),
    None if labeler is None else np.concatenate(labeler),
    baseline_cache.descriptor_targets(class_names, dict(zip(class_names, lists)), descriptors),
    int(config.baselines.feature_maps.get("accuracy_top_k", 10)),
  )
  if baselines_summary is not None:
    table5["training_set"] = baselines_summary["training_set"]
  top1 = {k: r["top1"] for k, r in table5["rows"].items()}
  results: dict[str, Any] = dict(
    model=model,
    images=n_images,
    explanations=summaries,
    requires_training={n: n in baseline_suite.NAMES for n in summaries},
    beats_random=beats_random(summaries),
    top1=top1,
    table5=table5,
    blur=dict(kernel=blur[0], sigma=blur[1]),
  )
  if fig6:
    results["fig6"] = _plot_feature_maps(workdir, config, first_rows(fig6, fig6_count), table5)
  if baselines_summary is not None:
    results["baselines"] = baselines_summary
  paths.makedirs(workdir, exist_ok=True)
  table = xai.table_rows(summaries, results["requires_training"])
  text = (
    f"## Table 1 (App. D, E): explanations on the XAI metrics ({model}, {n_images} images)\n\n"
    + (f"{table5['training_set']['note']}\n\n" if "training_set" in table5 else "")
    + f"{table}\n## Table 5 (App. D): Top-1 / Top-5 (%) of the trained baselines on the same images"
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

  if wanted:

    def keep(name, result):
      """Writes a protocol's result as it ends; reports it as a resumed run will read it."""
      path = _protocol_path(workdir, name)
      paths.makedirs(os.path.dirname(path))
      # In the result's own key order (not sorted): the tables list methods in that order.
      jsonio.write_json(path, dict(classes=classes_digest, result=result), indent=1)
      return json.loads(jsonio.dumps_strict(result))

    proto = run_protocols(
      bundle,
      config,
      concepts,
      class_names,
      lists,
      size,
      bank,
      progress,
      dataset,
      done=done_protocols,
      keep=keep,
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
  logging.info(
    "%d images in %.1f s (%d classes and %d protocols kept from an earlier run)",
    n_images,
    results["seconds"],
    len(kept),
    len(done_protocols),
  )
  return results


# ---------------------------------------------------------------------------------------------
# Resume: a class's Table 1 pass, a protocol's result.

_CURVE_FIELDS = tuple(f.name for f in dataclasses.fields(xai.Curves))


def _evaluate_class(
  bundle, cls, bank, config, score_fn, blur, trained, concepts, steps: bool, feature_maps: bool
):
  """One class's Table 1 pass as flat arrays (what `run` keeps in its class file): its
  analysis's concepts ("concepts/..."), every explanation's curves ("curves/<row>/<field>", the
  rows in order in "rows"), Table 5's scores ("scores/<row>", the zero-shot logits first);
  with `steps`, also "steps": the first image's perturbed images (Fig. 7, not kept); with
  `feature_maps`, Fig. 6's rows of the class's first images ("fig6/<field>", `_fig6_arrays`)."""
  a = config.analysis
  result = pipeline.analyze_class(bundle, cls.images, bank, a, tuple(a.methods))
  embeddings = protocols.image_embeddings(bundle, cls.images)
  first = {} if steps else None
  maps = [] if feature_maps else None
  curves, predictions = class_curves(
    bundle, cls, result, bank, config, score_fn, blur, trained, embeddings, first, maps
  )
  out: dict[str, Any] = {
    f"concepts/{k}": v for k, v in concepts.class_arrays(result, embeddings).items()
  }
  out["rows"] = np.array(list(curves))
  for name, c in curves.items():
    for field in _CURVE_FIELDS:
      out[f"curves/{name}/{field}"] = np.asarray(getattr(c, field))
  out[f"scores/{bottlenecks.ZERO_SHOT}"] = np.asarray(result["class_scores"])
  for name, p in predictions.items():
    out[f"scores/{name}"] = np.asarray(p)
  if steps:
    out["steps"] = first
  out.update(_fig6_arrays(maps or []))
  return out


#: The array fields of a Fig. 6 row (`feature_map_rows`), kept in the class file by image.
_FIG6_ARRAYS = ("image", "channels", "maps", "regions", "valid", "ids", "labels")


def _fig6_arrays(rows: list[dict]) -> dict[str, np.ndarray]:
  """A class's Fig. 6 rows as stacked arrays ("fig6/<field>", one entry per row)."""
  if not rows:
    return {}
  out = {f"fig6/{f}": np.stack([np.asarray(r[f]) for r in rows]) for f in _FIG6_ARRAYS}
  out["fig6/index"] = np.array([r["index"] for r in rows])
  out["fig6/threshold"] = np.array(rows[0]["threshold"])
  return out


def _fig6_rows(arrays, cls) -> list[dict]:
  """The Fig. 6 rows `_fig6_arrays` kept (none when the class has none)."""
  if "fig6/index" not in arrays:
    return []
  rows = []
  for i, index in enumerate(arrays["fig6/index"]):
    row = {f: arrays[f"fig6/{f}"][i] for f in _FIG6_ARRAYS}
    row["labels"] = [str(x) for x in row["labels"]]
    row.update(
      caption=cls.name,
      class_name=cls.name,
      index=int(index),
      threshold=float(arrays["fig6/threshold"]),
    )
    rows.append(row)
  return rows


def _curves_of(arrays) -> dict[str, xai.Curves]:
  """The class's curves per explanation, in their rows' order."""
  return {
    str(name): xai.Curves(**{f: arrays[f"curves/{name}/{f}"] for f in _CURVE_FIELDS})
    for name in arrays["rows"]
  }


def _prefixed(arrays, prefix: str) -> dict[str, np.ndarray]:
  """{key without `prefix`: array} of the keys that start with it, in the arrays' order."""
  return {k[len(prefix) :]: arrays[k] for k in arrays if k.startswith(prefix)}


def _class_state(cls, fingerprints) -> dict:
  """Which images a class's results are of (ids, and an image folder's files' fingerprint)."""
  return dict(
    label=int(cls.label), name=cls.name, ids=list(cls.ids), fingerprint=fingerprints.get(cls.label)
  )


def _class_path(workdir: str, label: int) -> str:
  return os.path.join(workdir, "classes", f"{label:04d}.npz")


def _protocol_path(workdir: str, name: str) -> str:
  return os.path.join(workdir, "protocols", f"{name}.json")


def _kept_class(workdir: str, cls, state: dict) -> bool:
  """Whether an earlier run of this command left the class's Table 1 pass for these images."""
  try:
    with paths.open(_class_path(workdir, cls.label), "rb") as f, np.load(f) as arrays:
      return json.loads(str(arrays["state"])) == state
  except (OSError, ValueError, KeyError, zipfile.BadZipFile):
    return False


def _read_class(workdir: str, cls) -> dict[str, np.ndarray]:
  """A kept class's arrays, in the order they were written."""
  with paths.open(_class_path(workdir, cls.label), "rb") as f, np.load(f) as arrays:
    return {k: arrays[k] for k in arrays.files if k != "state"}


def _kept_protocol(workdir: str, name: str, classes_digest: str):
  """An earlier run's result of protocol `name` on the same classes' images, else None."""
  try:
    with paths.open(_protocol_path(workdir, name)) as f:
      stored = json.load(f)
  except (OSError, ValueError):
    return None
  if not isinstance(stored, dict) or stored.get("classes") != classes_digest:
    return None
  return stored.get("result")


def _check_config(config) -> None:
  """Settings that would fail late, checked before any work."""
  unknown = set(config.evaluation.protocols) - set(protocols.PROTOCOLS)
  if unknown:
    raise ConfigError(
      f"unknown protocols {sorted(unknown)} in config.evaluation.protocols; known: "
      f"{protocols.PROTOCOLS}"
    )
  missing = protocols.missing_requirements(config)
  if missing:  # found now, not after the classes and the protocols before it
    raise ConfigError(
      "; ".join(missing) + ". Install it, or leave the protocol out of "
      "config.evaluation.protocols (e.g. --config.evaluation.protocols=\"('table2',)\"). "
      "Nothing was run."
    )
  if config.baselines.enabled:
    baseline_lf_cbm.lf_cbm_settings(config.baselines)  # LF-CBM's recipe, before any work
  if config.baselines.enabled and int(config.baselines.n_concepts) != int(
    config.analysis.n_concepts
  ):
    raise ConfigError(
      f"config.baselines.n_concepts ({config.baselines.n_concepts}) must equal "
      f"config.analysis.n_concepts ({config.analysis.n_concepts}): the same number of "
      "perturbation steps for every explanation."
    )
