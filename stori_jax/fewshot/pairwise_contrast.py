"""SToRI Fig. 3: two-class text classifiers whose prompts come from the classes' attribute labels.

"Figure 3 shows two text classifiers trained on the CUB dataset for two distinct pairs: Blue
headed Vireo versus Warbling Vireo, and Blue headed Vireo versus White eyed Vireo. The text
prompts for each class are generated with the attribute labels from the dataset." (§4.1.2). One
class (the anchor) is contrasted with each of several others; its prompts are the same texts in
every pairing, so the figure shows how their trained weights change with the class they are told
apart from.

The paper does not say how a prompt is phrased, which of a class's attributes make prompts, or
which training settings Fig. 3 used. Choices (docs/design.md, section 5):
* a class's attributes are those labelled on at least `min_share` of its training images, the
  `per_class` most frequent first (ties in attribute order); one prompt per attribute;
* a prompt is `template.format(name=<class name>, a_name=<"a"/"an" and the name>,
  attribute=<attribute text>)`, the text by `data.cub.attribute_text` (the rule of the paper's
  Table 10: "has_wing_color::grey" -> "grey wing"); CUB's default template is "a photo of
  {a_name}, a type of bird, which has {attribute}." (the class name as CoOp writes class names,
  the attribute as App. A.2 writes its CUB retrieval prompts);
* no Base prompt joins the class embedding: the classifier is the attribute prompts alone;
* training is `fewshot.trainer`'s SToRI step (Adam on the log-weights) on the two classes'
  training images, with the paper's few-shot settings (`base_config`: TaskRes's schedule, a fresh
  augmented view at every step).

Sources: `cub_pairings` (CUB-200-2011's folder: classes, official split and per-image attribute
labels, `data.cub`) and `synthetic_pairings` (the embedded world, offline: a class's images carry
their colour, pattern, shape, size and background as attribute labels, named as CUB names its
attributes, e.g. "has_primary_color::red" -> "red color").
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import ml_collections
import numpy as np

from stori_jax.plumbing import jsonio, paths, run_identity
from stori_jax.clip.bundle import resolve_start_block
from stori_jax.plumbing.config_files import ConfigChecks, ConfigError
from stori_jax.data import synthetic, synthetic_tasks
from stori_jax.data.cub import attribute_text, class_attribute_shares, read_cub
from stori_jax.data.files import ClassMismatchError, nearest, normalise_name, quoted
from stori_jax.data.splits import FewShotSplit, LabeledImage, sample_k_shot
from stori_jax.fewshot import prompts as prompt_text
from stori_jax.fewshot import paper_config, report, trainer
from stori_jax.fewshot.prompt_bank import build_prompt_bank
from stori_jax.fewshot.text_classifier import WeightedTextClassifier, prompt_mesh
from stori_jax.clip.loading import load
from stori_jax.plumbing.plotting import pyplot, save_figure

SOURCES = ("synthetic", "cub")
CUB_TEMPLATE = "a photo of {a_name}, a type of bird, which has {attribute}."
#: The synthetic world's attribute families as CUB-style attribute names (`attribute_text`
#: reads "has_primary_color::red" as "red color", "has_background_color::gray" as "gray
#: background").
SYNTHETIC_ATTRIBUTES = {
  "colour": "has_primary_color",
  "pattern": "has_pattern",
  "shape": "has_shape",
  "size": "has_size",
  "background": "has_background_color",
}
#: Seed stream of the pairwise study's synthetic images (disjoint from the few-shot world's).
_SYNTHETIC_STREAM = 7003
#: Config keys that change how the work is logged, not what it computes.
IDENTITY_IGNORED = ("name", "log_every", "eval_every", "checkpoint_every")


@dataclasses.dataclass(frozen=True, eq=False)
class PairTask:
  """One pairing: the anchor (class 0) against another class (class 1).

  split: the two classes' training and test images; prompts: {class name: its trainable
  prompts}; attributes: {class name: [(attribute name, share of its training images)]}, the
  attributes its prompts state, in prompt order.
  """

  split: FewShotSplit
  prompts: Mapping[str, Sequence[str]]
  attributes: Mapping[str, Sequence[tuple[str, float]]]

  @property
  def name(self) -> str:
    return " vs ".join(self.split.class_names)

  @property
  def folder(self) -> str:
    """The pairing's sub-folder of the workdir: "vs_<other class>"."""
    return "vs_" + "_".join(self.split.class_names[1].replace("/", "_").split())


# ---------------------------------------------------------------------------------------------
# Prompts from attribute labels.


def class_attributes(
  attribute_names: Sequence[str], shares: np.ndarray, per_class: int, min_share: float
) -> list[tuple[str, float]]:
  """The attributes a class's prompts state: share >= min_share, most frequent first (stable),
  at most `per_class`. shares: float [A], the share of the class's images labelled with each."""
  order = np.argsort(-np.asarray(shares), kind="stable")
  return [(attribute_names[a], float(shares[a])) for a in order if shares[a] >= min_share][
    :per_class
  ]


def attribute_prompts(
  class_name: str,
  attributes: Sequence[tuple[str, float]],
  template: str,
  text: Callable[[str], str] = attribute_text,
) -> list[str]:
  """One prompt per attribute: template with {name} (the class, underscores as spaces), {a_name}
  (the same after "a" or "an") and {attribute} (the attribute's text)."""
  name = prompt_text.class_text(class_name)
  a_name = ("an " if name[:1].lower() in "aeiou" else "a ") + name
  return [template.format(name=name, a_name=a_name, attribute=text(a)) for a, _ in attributes]


def check_template(template: str) -> str | None:
  """None when `template` takes {attribute} (and optionally {name} or {a_name}); else the
  problem."""
  try:
    filled = template.format(name="NAME", a_name="A NAME", attribute="ATTRIBUTE")
  except (KeyError, IndexError, ValueError) as e:
    return (
      f"it must use only the fields {{a_name}}, {{name}} and {{attribute}} "
      f"({type(e).__name__}: {e})"
    )
  if "ATTRIBUTE" not in filled:
    return "it must contain {attribute}, where the attribute's text goes"
  return None


def _pair_task(
  names: Sequence[str],
  train: Sequence[Sequence[Any]],
  test: Sequence[Sequence[Any]],
  attributes: Sequence[Sequence[tuple[str, float]]],
  template: str,
  dataset: str,
  text: Callable[[str], str] = attribute_text,
) -> PairTask:
  """A PairTask of two classes from their image sources (train, test per class)."""
  for name, chosen in zip(names, attributes):
    if not chosen:
      raise ConfigError(
        f"class {name!r} has no attribute labelled on enough of its training images for a "
        "prompt; lower config.prompts.min_share"
      )
  split = FewShotSplit(
    dataset,
    tuple(names),
    tuple(LabeledImage(s, c) for c, sources in enumerate(train) for s in sources),
    tuple(LabeledImage(s, c) for c, sources in enumerate(test) for s in sources),
  )
  return PairTask(
    split,
    {n: attribute_prompts(n, a, template, text) for n, a in zip(names, attributes)},
    {n: list(a) for n, a in zip(names, attributes)},
  )


# ---------------------------------------------------------------------------------------------
# CUB-200-2011.


def _find_class(name: str, class_names: Sequence[str]) -> int:
  """The index of the class `name` names (case, '_', '-' and spaces forgiven)."""
  wanted = normalise_name(name)
  found = [k for k, c in enumerate(class_names) if normalise_name(c) == wanted]
  if len(found) == 1:
    return found[0]
  near = nearest(name, class_names)
  raise ClassMismatchError(
    f"class {name!r} (config.data.anchor / config.data.others) is not a class of CUB"
    + (f"; did you mean {near!r}?" if near else "")
    + f" Classes: {quoted(list(class_names))}."
  )


def cub_pairings(
  root: str,
  anchor: str,
  others: Sequence[str],
  *,
  shots: int = 0,
  seed: int = 1,
  per_class: int = 10,
  min_share: float = 0.5,
  template: str = CUB_TEMPLATE,
) -> list[PairTask]:
  """The anchor against each of `others` on CUB-200-2011 (`root`: the CUB_200_2011 folder).

  Training images: the official training split of each class (shots 0: all of them, ~30;
  else a K-shot sample, `sample_k_shot`); test images: the official test split. Prompts: from
  each class's attribute labels over its training images (`class_attributes`).

  Raises:
    DatasetMissingError: CUB's files are missing (says what to download and where).
    ClassMismatchError: a class name is not one of CUB's (the nearest named).
  """
  table = read_cub(root)
  classes = [_find_class(n, table.class_names) for n in (anchor, *others)]
  if len(set(classes)) != len(classes):
    raise ConfigError(f"config.data.anchor and config.data.others repeat a class: {classes}")
  train = table.is_training
  shares = class_attribute_shares(table.present[train], table.labels[train], len(table.class_names))
  chosen = {
    c: class_attributes(table.attribute_names, shares[c], per_class, min_share) for c in classes
  }

  def images(c: int, training: bool) -> list[str]:
    return table.image_paths(np.flatnonzero((table.labels == c) & (train == training)))

  tasks = []
  for other in classes[1:]:
    pair = (classes[0], other)
    names = [table.class_names[c] for c in pair]
    train_sources = [images(c, True) for c in pair]
    if shots:
      items = [LabeledImage(s, k) for k, sources in enumerate(train_sources) for s in sources]
      sampled = sample_k_shot(items, shots, seed, class_names=names)
      train_sources = [[s for s, k in sampled if k == c] for c in range(2)]
    tasks.append(
      _pair_task(
        names,
        train_sources,
        [images(c, False) for c in pair],
        [chosen[c] for c in pair],
        template,
        "cub",
      )
    )
  return tasks


# ---------------------------------------------------------------------------------------------
# The synthetic world.


def synthetic_class_images(
  spec: synthetic_tasks.ClassSpec, count: int, seed: int, test: bool, image_size: int = 64
) -> synthetic.SyntheticBatch:
  """`count` single-object images of one class: its colour, pattern and shape, the rest random.
  They depend on the class, the seed and train/test only, so a class shows the same images in
  every pairing."""
  ids = [synthetic.VOCABULARIES[f].index(v) for f, v in spec.attributes().items()]
  return synthetic.generate_with(
    count,
    [_SYNTHETIC_STREAM, int(test), seed, *ids],
    image_size=image_size,
    **spec.attributes(),
  )


def synthetic_attribute_table(batch: synthetic.SyntheticBatch) -> dict[str, np.ndarray]:
  """The images' attribute labels as CUB-style columns {"has_primary_color::red": bool [n]}:
  every value of colour, pattern, shape, size and background (`SYNTHETIC_ATTRIBUTES`)."""
  table = {}
  for family, prefix in SYNTHETIC_ATTRIBUTES.items():
    labels = batch.labels(family)
    labels = labels[:, 0] if labels.ndim == 2 else labels
    for k, value in enumerate(synthetic.VOCABULARIES[family]):
      table[f"{prefix}::{value}"] = labels == k
  return table


def synthetic_pairings(
  anchor: str,
  others: Sequence[str],
  *,
  shots: int = 16,
  seed: int = 1,
  n_test_per_class: int = 50,
  image_size: int = 64,
  per_class: int = 10,
  min_share: float = 0.5,
  template: str = "a photo of {a_name}, which has {attribute}.",
) -> list[PairTask]:
  """The embedded analogue of Fig. 3: the anchor class against each of `others`, classes of
  the synthetic world ("red striped star"); prompts from the attribute labels of each class's
  `shots` training images (`synthetic_attribute_table`)."""
  try:
    specs = synthetic_tasks.resolve_classes([anchor, *others])
  except ValueError as e:
    raise ConfigError(f"config.data.anchor / config.data.others: {e}") from None
  train, test, chosen = {}, {}, {}
  for spec in specs:
    batch = synthetic_class_images(spec, shots, seed, False, image_size)
    table = synthetic_attribute_table(batch)
    names = list(table)
    shares = np.asarray([table[n].mean() for n in names])
    chosen[spec] = class_attributes(names, shares, per_class, min_share)
    train[spec] = list(batch.images)
    test[spec] = list(synthetic_class_images(spec, n_test_per_class, 0, True, image_size).images)
  return [
    _pair_task(
      [specs[0].name, other.name],
      [train[specs[0]], train[other]],
      [test[specs[0]], test[other]],
      [chosen[specs[0]], chosen[other]],
      template,
      "synthetic",
    )
    for other in specs[1:]
  ]


def build_pairings(config) -> list[PairTask]:
  """The config's pairings (config.data, config.prompts)."""
  data, p = config.data, config.prompts
  common = dict(
    shots=int(data.shots),
    seed=int(config.seed),
    per_class=int(p.per_class),
    min_share=float(p.min_share),
    template=str(p.template),
  )
  if data.source == "cub":
    return cub_pairings(data.root, data.anchor, tuple(data.others), **common)
  return synthetic_pairings(
    data.anchor,
    tuple(data.others),
    n_test_per_class=int(data.n_test_per_class),
    image_size=int(data.image_size),
    **common,
  )


# ---------------------------------------------------------------------------------------------
# Config.


def base_config() -> ml_collections.ConfigDict:
  """The study's settings, the paper's few-shot ones where they apply (App. A.1: Adam, no weight
  decay, batch 256, TaskRes's training scheme: one warm-up epoch at 1e-5, then a cosine stepped
  per epoch; a fresh augmented view of every image at every step; 5e-2, CLIP's rate for the
  datasets it does not name; 200 epochs, its rate beyond 4 shots; reweighting from block 7 of
  ViT-L/14, the model's default) and this project's where the paper is silent (one prompt per
  attribute of a class, no Base prompt, no log-weight penalty). configs/pairwise_*.py fill in
  the model and data."""
  c = ml_collections.ConfigDict()
  c.name = "pairwise"
  c.seed = 1
  c.model = ml_collections.ConfigDict(dict(source="openai/clip-vit-large-patch14", arch=""))
  c.data = ml_collections.ConfigDict()
  c.prompts = ml_collections.ConfigDict(dict(template=CUB_TEMPLATE, per_class=10, min_share=0.5))
  # None: the model's default first reweighted block (7 of ViT-L/14's 12, the paper's).
  c.start_block = ml_collections.config_dict.placeholder(int)
  # 0: a fresh augmented view of every training image at every step, as the paper configs;
  # N > 0: N views per image encoded once and drawn from (the fast approximation, docs/fewshot.md).
  c.views = 0
  c.image_dtype = "float32"
  c.augment_scale = (0.08, 1.0)
  c.batch_size = 256
  c.epochs = 200
  c.optim = ml_collections.ConfigDict(
    dict(
      lr=0.05,
      log_weight_penalty=0.0,
      schedule="taskres",
      warmup_epochs=paper_config.TASKRES_WARMUP_EPOCHS,
      warmup_lr=paper_config.TASKRES_WARMUP_LR,
    )
  )
  c.chunk = 64
  c.log_every = 10
  c.eval_every = 50
  c.checkpoint_every = 100
  return c


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Checks every value for type and range before any work; one ConfigError names them all."""
  checks = ConfigChecks(config)
  checks.text("name")
  checks.integer("seed", minimum=0)
  checks.text("model.source", nonempty=True)
  checks.text("model.arch")
  source = checks.choice("data.source", SOURCES)
  checks.text("data.anchor", nonempty=True)
  others = checks.get("data.others", ())
  if (
    not isinstance(others, (tuple, list))
    or not others
    or not all(isinstance(o, str) and o for o in others)
  ):
    checks.problem(
      f"config.data.others must name the classes the anchor is contrasted with (a tuple of "
      f"class names, at least one), got {others!r}"
    )
  if source == "cub":
    checks.text("data.root", nonempty=True)
    checks.integer("data.shots", minimum=0)
  else:
    checks.integer("data.shots", minimum=1)
    checks.integer("data.n_test_per_class", minimum=1, maximum=trainer.MAX_TEST_PER_CLASS)
    checks.integer("data.image_size", minimum=8, maximum=trainer.MAX_SYNTHETIC_IMAGE_SIZE)
  template = checks.text("prompts.template", nonempty=True)
  if template:
    problem = check_template(template)
    if problem:
      checks.problem(f"config.prompts.template {template!r}: {problem}")
  checks.integer("prompts.per_class", minimum=1)
  checks.number("prompts.min_share", minimum=0, maximum=1)
  trainer.check_training(checks)
  checks.number("optim.lr", above=0)
  checks.raise_if_any()


def identity(config) -> dict[str, Any]:
  """What decides the results: the config, the model's contents and the data folder."""
  return {
    "config": config,
    "model": run_identity.content_identity(config.model.source),
    "data": {"root": run_identity.absolute_path(config.data.get("root") or "")},
  }


# ---------------------------------------------------------------------------------------------
# Training one pairing.


def token_units(tokenizer, text: str, row: np.ndarray) -> list[tuple[str, float]]:
  """A prompt's tokens between SOT and EOT with their weights: [(token, weight)], a word-final
  token's text ending with a space (`report.draw_shaded_text` leaves a gap after it)."""
  ids = tokenizer([text], context_length=len(row), truncate=True)[0]
  end = int(np.argmax(ids == tokenizer.eot_token_id))
  strings = tokenizer.token_strings(ids[1:end], word_end=" ")
  return [(s, float(w)) for s, w in zip(strings, row[1:end])]


def train_pair(bundle, task: PairTask, config, workdir: str, announce: bool = True) -> dict:
  """Trains the SToRI weights of one pairing's prompts in `workdir` (resumed from its
  checkpoint when there is one) and writes the few-shot run's files there (history.jsonl,
  weights.json, interpretability.html/.png, training_curve.png): `trainer.train_method` on the
  pairing's images and attribute prompts.

  Returns:
    {"classes", "zero_shot", "trained" (accuracy reports), "steps", "prompts": [{"class",
    "prompt", "attribute", "share", "tokens": [(token, weight)], "words": [(word, weight)]}]}.
  """
  paths.makedirs(workdir, exist_ok=True)
  split = task.split
  train_features, test_features = trainer.encode_split(bundle, split, config)
  mesh = prompt_mesh()
  bank = build_prompt_bank(
    bundle.tokenizer,
    split.class_names,
    task.prompts,
    None,
    bundle.config.text.context_length,
    chunk=config.chunk,
    num_shards=mesh.size,
  )
  classifier = WeightedTextClassifier(bundle, bank, config.start_block, mesh)
  result = trainer.train_method(
    config,
    bundle,
    classifier,
    split,
    train_features,
    test_features,
    workdir,
    is_main=announce,
    keep_checkpoints=1,
    desc=f"train {task.name}",
  )
  stated = [a for name in split.class_names for a in task.attributes[name]]
  return {
    "classes": list(split.class_names),
    "train_images": [int(np.sum(split.train_labels == c)) for c in range(2)],
    "test_images": [int(np.sum(split.test_labels == c)) for c in range(2)],
    "steps": result.steps,
    "zero_shot": result.zero_shot,
    "trained": result.trained,
    "prompts": [
      {
        "class": split.class_names[int(c)],
        "prompt": text,
        "attribute": attribute,
        "share": share,
        "tokens": token_units(bundle.tokenizer, text, row),
        "words": list(prompt_words),
      }
      for text, c, row, prompt_words, (attribute, share) in zip(
        bank.texts, bank.text_class, result.weights, result.words, stated
      )
    ],
  }


# ---------------------------------------------------------------------------------------------
# Comparing the pairings, and the figure.


def anchor_word_changes(pairings: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
  """The anchor's words across pairings: per (prompt, word position) of the anchor's prompts
  (the same texts in every pairing), the word's weight normalised to sum to 1 per prompt in each
  pairing, and the spread (max - min) over pairings, largest first."""
  anchor = pairings[0]["classes"][0]
  per_pair = [
    [report.normalized(p["words"]) for p in pairing["prompts"] if p["class"] == anchor]
    for pairing in pairings
  ]
  rows = []
  for k, prompt in enumerate(per_pair[0]):
    for j, (word, _) in enumerate(prompt):
      shares = [pairs[k][j][1] for pairs in per_pair]
      rows.append(
        {
          "prompt": k,
          "word": word,
          "shares": {p["classes"][1]: s for p, s in zip(pairings, shares)},
          "spread": max(shares) - min(shares),
        }
      )
  return sorted(rows, key=lambda r: -r["spread"])


def pairwise_figure(path: str, pairings: Sequence[Mapping[str, Any]]) -> None:
  """Fig. 3: one column per pairing (the anchor vs another class); in each, the anchor's prompts
  then the other class's, every token shaded by its trained weight normalised to sum to 1 per
  prompt, on one colour scale for the whole figure (so a prompt reads the same across columns)."""
  plt = pyplot()
  columns = []
  for pairing in pairings:
    rows = [(f"{pairing['classes'][0]} vs {pairing['classes'][1]}", None, "pair")]
    rows.append(
      (
        f"test accuracy {100 * pairing['trained']['accuracy']:.1f}% (zero-shot "
        f"{100 * pairing['zero_shot']['accuracy']:.1f}%)",
        None,
        "note",
      )
    )
    for name in pairing["classes"]:
      rows.append((f"{name}'s prompts", None, "class"))
      for p in pairing["prompts"]:
        if p["class"] == name:
          tokens = [t for t, _ in p["tokens"]]
          shares = report.normalized(p["tokens"])
          rows.append((None, [(t, s) for t, (_, s) in zip(tokens, shares)], "prompt"))
    columns.append(rows)
  top = max((s for rows in columns for _, u, _ in rows if u for _, s in u), default=1.0)
  header, step = 1.5, 0.28  # inches
  height = header + step * max(len(rows) for rows in columns) + 0.3
  width = 8.0 * len(columns)
  fig = plt.figure(figsize=(width, height))
  anchor = pairings[0]["classes"][0]
  fig.suptitle(
    f"SToRI two-class text classifiers (paper Fig. 3): {anchor} against "
    f"{' and '.join(p['classes'][1] for p in pairings)}\n"
    "The prompts come from each class's attribute labels; the anchor's prompts are the same in "
    "every column, and the darker the red, the higher the trained weight.\n"
    "For visualization, the weights are normalised to sum to 1 per prompt (one colour scale "
    "for the whole figure).",
    fontsize=10,
    y=1 - 0.1 / height,
    va="top",
  )
  report.share_colorbar(fig, (0.35, 1 - 1.05 / height, 0.3, 0.14 / height), top)
  fonts = {"pair": (11, "bold"), "class": (9.5, "bold"), "note": (8.5, "normal")}
  for c, rows in enumerate(columns):
    left = c / len(columns)
    y = 1 - header / height
    for title, units, kind in rows:
      y -= step / height
      if units is None:
        size, weight = fonts[kind]
        fig.text(left + 0.01, y, title, fontsize=size, weight=weight, va="center")
      else:
        report.draw_shaded_text(fig, left + 0.02, y, units, top, fontsize=8.5)
  save_figure(fig, path, dpi=110)
  plt.close(fig)


# ---------------------------------------------------------------------------------------------
# The run.


def run(config, workdir: str, restart: bool = False) -> dict[str, Any]:
  """The pairwise study of a config: every pairing trained in <workdir>/vs_<class>/ (resumed when
  interrupted), then pairwise.json and fig3_pairwise.png in the workdir.

  Raises:
    ConfigError: a bad config value (before any work).
    WorkdirMismatchError: the workdir holds another config's study (before any work).
    DatasetMissingError / ClassMismatchError: the data or a class is not there (before the model
      loads).
  """
  validate_config(config)
  run_identity.claim_run(
    workdir, identity(config), what="pairwise study", restart=restart, ignore=IDENTITY_IGNORED
  )
  started = time.time()
  tasks = build_pairings(config)  # a missing dataset is named before a missing model
  bundle = load(config.model.source, arch=config.model.get("arch") or None)
  resolve_start_block(bundle, config.start_block, "config.start_block")
  announce = jax.process_index() == 0
  pairings = [
    train_pair(bundle, task, config, os.path.join(workdir, task.folder), announce) for task in tasks
  ]
  results = {
    "anchor": tasks[0].split.class_names[0],
    "others": [t.split.class_names[1] for t in tasks],
    "source": str(config.data.source),
    "model": str(config.model.source),
    "template": str(config.prompts.template),
    "pairings": pairings,
    "anchor_word_changes": anchor_word_changes(pairings)[:20],
    "seconds": round(time.time() - started, 1),
  }
  pairwise_figure(os.path.join(workdir, "fig3_pairwise.png"), pairings)
  jsonio.write_json(os.path.join(workdir, "pairwise.json"), results, indent=1)
  return results


def summary(results: Mapping[str, Any], top: int = 8) -> str:
  """The study in a few lines: each pairing's accuracy, and the anchor's words whose share of
  their prompt's weight changed most between pairings."""
  lines = [f"Anchor: {results['anchor']}"]
  for p in results["pairings"]:
    lines.append(
      f"  vs {p['classes'][1]}: test accuracy {100 * p['trained']['accuracy']:.1f}% "
      f"(zero-shot {100 * p['zero_shot']['accuracy']:.1f}%), {len(p['prompts'])} prompts"
    )
  if len(results["pairings"]) > 1:
    lines.append("The anchor's words whose normalised weight changes most between pairings:")
    for row in results["anchor_word_changes"][:top]:
      shares = ", ".join(f"vs {k}: {v:.3f}" for k, v in row["shares"].items())
      lines.append(f"  prompt {row['prompt']} {row['word']!r}: {shares}")
  return "\n".join(lines)
