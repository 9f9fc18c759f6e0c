r"""Mutual-knowledge analysis of a CLIP model on a dataset, class by class.

  python -m mutual.analyze --config configs/mutual_synthetic.py --workdir workdirs/mutual
  python -m mutual.analyze --config configs/mutual_imagenet.py --workdir DIR \
      --config.data.root=/data/imagenet/val --config.data.descriptors=/data/descriptors_imagenet.json

Writes to the workdir:
  per_image/<class index>/<image index>.json   concepts, descriptors, mutual concepts, MI curve, AUC
  results.json                                 per-class and dataset aggregates (Table 3 columns)
  table.md                                     the dataset row of Table 3
  figures/concepts_<method>_<class>.png        Fig. 4: concept overlays with their descriptors
  figures/curves_<class>.png, curves.png       Fig. 3 / 5: MI curves
  figures/mutual_<method>_<class>.png          Fig. 6: vision / language / mutual descriptors
Same config and seed, same JSON.
"""

from __future__ import annotations

import os
import time

import ml_collections
from absl import logging
from tqdm import tqdm

import stori_jax
from mutual import cli, data, descriptors, pipeline, report
from stori_jax import cli as stori_cli
from stori_jax.data import synthetic_tasks


def analysis_config(**overrides) -> ml_collections.ConfigDict:
  """The analysis settings (config.analysis) at the paper / reference values (App. K)."""
  values = dict(
    methods=("pca", "kmeans"),
    feature_kind="tokens",  # or "keys" (App. A.1)
    joint_foreground=True,  # one spectral split over the B images (reference); False: per image
    center_features=False,  # centre the patch features before the split (not in the reference)
    n_concepts=5,  # L
    kmeans_seed=0,
    crf=True,
    top_k=500,  # k: per-concept top descriptors intersected
    relevance="mean",  # reference: > mean - offset; "median": paper, > median + offset
    relevance_offset=0.02,
    solver="ott",  # or "reference": 1,000 plain row / column normalisations
    ot_scale=2.5,  # P = exp(2.5 * scores / epsilon)
    ot_epsilon=1.0,  # 1 / tau, tau = 1
    ot_iterations=1000,
    ot_threshold=1e-6,
    ot_max_iterations=2000,
    top_descriptors=3,  # per concept
    u=50,  # language-side descriptors of the predicted class
    mi_formula="reference",  # "eq1" or "table": see mutual.information
    class_prompts="descriptors",  # or "templates" (paper Table 8)
    templates=("a photo of a {c}.",),
    descriptor_template="{c}, which has {d}.",
  )
  values.update(overrides)
  return ml_collections.ConfigDict(values)


def real_config(
  dataset: str, tfds_name: str, templates, root: str = "", descriptors_path: str = ""
):
  """Config for a real dataset with OpenAI's ViT-B/16 (the reference's model)."""
  config = ml_collections.ConfigDict()
  config.name = f"mutual_{dataset}"
  config.model = ml_collections.ConfigDict(
    dict(source="openai/clip-vit-base-patch16", name="ViT-B/16")
  )
  config.data = ml_collections.ConfigDict(
    dict(
      source="folder",  # or "tfds"
      dataset=dataset,
      root=root,  # image folder <root>/<class>/<images>, or the TFDS data_dir
      tfds_name=tfds_name,
      split="validation",
      descriptors=descriptors_path or f"data/descriptors/{data.DESCRIPTOR_FILES[dataset]}",
      # CoOp classnames.txt (<folder> <name> per line): needed where folders are ids
      # (ImageNet's wnids); default: folders are matched to the descriptor keys by name.
      classnames="",
      # Leave out (and list) folders without descriptors, descriptor classes without images
      # and empty classes, instead of stopping.
      skip_missing_classes=False,
      images_per_class=0,  # 0: all
      classes=(),  # class indices to analyse (after matching); empty: all
    )
  )
  config.analysis = analysis_config(class_prompts="templates", templates=tuple(templates))
  config.batch_size = 256  # text encoding
  config.figures_per_class = 4
  config.figure_classes = 3
  return config


def bank_descriptors(config, per_class) -> list[str]:
  """The descriptor bank D of a config: the synthetic vocabulary, or the unique descriptors of
  the classes (`per_class`: {class name: descriptors})."""
  if config.data.source == "synthetic" and config.data.get("bank", "classes") == "vocabulary":
    return list(synthetic_tasks.DESCRIPTOR_ATTRIBUTES)
  return descriptors.unique_descriptors(per_class)


def run(config, workdir: str, progress: bool = True, restart: bool = False) -> dict:
  """Runs the analysis; returns the aggregates (also written to workdir/results.json).

  The data are checked first (descriptor file, classes matched by name, no empty class) and the
  workdir claimed for this config (`cli.claim_workdir`; `restart` moves another run aside),
  both before the model loads.
  """
  dataset = data.prepare(config)
  cli.claim_workdir(config, workdir, restart, "mutual-knowledge analysis")
  bundle = stori_jax.load(config.model.source)
  size = int(bundle.config.vision.image_size)
  class_names, per_class = list(dataset.names), dataset.descriptors
  classes = dataset.classes(size)
  lists = dataset.lists()
  bank_list = bank_descriptors(config, per_class)
  a = config.analysis
  bank = pipeline.encode_bank(
    bundle,
    class_names,
    lists,
    bank_list,
    mode=a.class_prompts,
    templates=tuple(a.templates),
    descriptor_template=a.descriptor_template,
    batch_size=config.batch_size,
    progress=progress,
  )
  methods = tuple(a.methods)
  records, figured = [], 0
  start, n_images = time.perf_counter(), 0
  figures = os.path.join(workdir, "figures")
  os.makedirs(figures, exist_ok=True)
  for cls in tqdm(classes, desc="classes", disable=not progress, dynamic_ncols=True):
    result = pipeline.analyze_class(bundle, cls.images, bank, a, methods)
    class_records = report.image_records(cls, result, bank.descriptors, class_names, methods)
    for i, record in enumerate(class_records):
      report.write_json(
        os.path.join(workdir, "per_image", f"{cls.label:04d}", f"{i:05d}.json"), record
      )
    records += class_records
    n_images += len(cls.images)
    if figured < config.figure_classes:
      figured += 1
      k = min(config.figures_per_class, len(cls.images))
      for method in methods:
        report.plot_concepts(
          os.path.join(figures, f"concepts_{method}_{cls.label:04d}.png"),
          cls.images[:k],
          class_records[:k],
          method,
          result["refined"][:k],
        )
        report.plot_mutual(
          os.path.join(figures, f"mutual_{method}_{cls.label:04d}.png"),
          cls.images[0],
          class_records[0],
          method,
        )
      summary = report.aggregate(class_records, methods)["dataset"]
      report.plot_curves(
        os.path.join(figures, f"curves_{cls.label:04d}.png"),
        {m: summary[m]["curve"] for m in methods},
        title=cls.name,
      )
  seconds = time.perf_counter() - start
  results = report.aggregate(records, methods)
  results["model"] = config.model.get("name", config.model.source)
  if dataset.skipped:  # never a silent disappearance: what was left out, and why
    results["skipped_classes"] = dataset.skipped
  results["config"] = config.to_dict()
  report.write_json(os.path.join(workdir, "results.json"), results)
  table = report.markdown_table(results["dataset"], results["model"], methods)
  with open(os.path.join(workdir, "table.md"), "w", encoding="utf-8") as f:
    f.write(table)
  report.plot_curves(
    os.path.join(figures, "curves.png"),
    {m: results["dataset"][m]["curve"] for m in methods},
    title=f"{config.name}: dataset",
  )
  logging.info("%d images in %.1f s (%.2f images/s)", n_images, seconds, n_images / seconds)
  return results


def main(argv):
  config, workdir, results = cli.run_from_flags(
    argv, run, "python -m mutual.analyze --config configs/mutual_synthetic.py --workdir DIR"
  )
  print(report.markdown_table(results["dataset"], results["model"], tuple(config.analysis.methods)))
  print(f"Wrote {os.path.join(workdir, 'results.json')}")


if __name__ == "__main__":
  cli.define_flags("Analysis")
  stori_cli.run(main)
