"""Image pools with binary attributes for preference retrieval (paper section 4.2, App. A.2).

A `RetrievalData` holds the images of every task (identified by string keys, loaded on
demand at any size) and its `RetrievalTask`s. A task is one prompt built from a template
and one phrase per attribute, plus its image pool with bool labels [N, A]: label [i, a]
says whether image i has the prompt's value of attribute a. The 2**A label combinations
are the categories of the paper's Figures 4-6 and App. B.

Sources:
* `synthetic_data`: the synthetic world (offline, the default): per attribute triple of
  `synthetic_tasks.emphasis_triples`, its 8 categories rendered as there.
* `celeba_data`: CelebA from a folder holding `list_attr_celeba.txt` (the official
  format) and the aligned JPEGs (in `img_align_celeba/` or next to the file), or from TFDS
  `celeb_a` when tensorflow-datasets (and TensorFlow) are installed and prepared.
* `cub_data`: CUB-200-2011 from its folder (`images.txt`, `images/`,
  `attributes/image_attribute_labels.txt` and `attributes.txt` at the root, in
  `attributes/` or in the parent folder, as the archive unpacks).
The files, folders and TFDS splits are read by the data layer (`stori_jax.data.attributes`,
`folders`, `images`, `tfds`); this module builds the tasks and their image pools.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import os
import warnings
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from stori_jax.plumbing import paths as storage
from stori_jax.plumbing.config_files import ConfigError
from stori_jax.data import synthetic
from stori_jax.data import synthetic_tasks as sw
from stori_jax.data.attributes import celeba_split_rows, read_celeba_attributes, read_cub_attributes
from stori_jax.data.files import ClassMismatchError, match_names, nearest, quoted
from stori_jax.data.folders import IMAGE_EXTENSIONS, images_under
from stori_jax.data.images import model_input, resize_images
from stori_jax.data.tfds import TfdsMissingError, encoded_examples, import_tfds, prepared_builder
from stori_jax.plumbing.errors import InputError
from stori_jax.retrieval.metrics import category_codes

#: uint8 images [n, size, size, 3] of the given image indices.
ImageLoader = Callable[[np.ndarray, int], np.ndarray]


def weight_text(weight: float) -> str:
  """A weight as the prompt syntax writes it: 1.5 -> "1.5", 2.0 -> "2"."""
  return f"{float(weight):g}"


def _escape(text: str) -> str:
  for char in "\\():":
    text = text.replace(char, "\\" + char)
  return text


@dataclasses.dataclass(frozen=True, eq=False)
class RetrievalTask:
  """One prompt and its labelled image pool.

  Attributes:
    name: short identifier.
    template: the prompt with placeholders {0}, {1}, ... for the attribute phrases.
    phrases: A phrases, the words that a weight applies to (e.g. "with blond hair").
    values: A pairs (name if present, name if absent), for category names.
    images: int64 [N] rows of the data's image keys.
    labels: bool [N, A].
    attribute_names: A names shared by tasks of the same kind (e.g. "colour"), for
      category names of results averaged over tasks; default the phrases.
  """

  name: str
  template: str
  phrases: tuple[str, ...]
  values: tuple[tuple[str, str], ...]
  images: np.ndarray
  labels: np.ndarray
  attribute_names: tuple[str, ...] = ()

  def __post_init__(self):
    a = len(self.phrases)
    if len(self.values) != a or self.labels.shape != (len(self.images), a):
      raise ValueError(
        f"task {self.name!r}: {a} phrases need {a} value pairs and labels [N, {a}], got "
        f"{len(self.values)} and {self.labels.shape} for {len(self.images)} images"
      )
    try:
      self.template.format(*self.phrases)
    except (IndexError, KeyError) as e:
      raise ValueError(f"template {self.template!r} needs placeholders {{0}}..{{{a - 1}}}") from e

  @property
  def n_attributes(self) -> int:
    return len(self.phrases)

  @property
  def n_categories(self) -> int:
    return 2**self.n_attributes

  @property
  def categories(self) -> np.ndarray:
    """int64 [N]: category code of each image (see metrics.category_codes)."""
    return category_codes(self.labels)

  def category_name(self, code: int) -> str:
    bits = [(code >> (self.n_attributes - 1 - a)) & 1 for a in range(self.n_attributes)]
    return ", ".join(v[0] if b else v[1] for v, b in zip(self.values, bits))

  @property
  def category_names(self) -> list[str]:
    return [self.category_name(c) for c in range(self.n_categories)]

  @property
  def generic_category_names(self) -> list[str]:
    """Names valid across tasks: the attribute name, primed where absent ("colour'")."""
    names = self.attribute_names or self.phrases
    return [
      " ".join(
        n if (c >> (self.n_attributes - 1 - a)) & 1 else n + "'" for a, n in enumerate(names)
      )
      for c in range(self.n_categories)
    ]

  def code(self, present: Sequence[bool]) -> int:
    """Category code of a label row."""
    return int(category_codes(np.asarray([present], bool))[0])

  def prompt(self, weights: Sequence[float] | None = None) -> str:
    """The prompt with `(phrase:w)` on every attribute whose weight differs from 1."""
    weights = [1.0] * self.n_attributes if weights is None else [float(w) for w in weights]
    if len(weights) != self.n_attributes:
      raise ValueError(f"task {self.name!r} takes {self.n_attributes} weights, got {weights}")
    parts = [
      _escape(p) if w == 1.0 else f"({_escape(p)}:{weight_text(w)})"
      for p, w in zip(self.phrases, weights)
    ]
    return self.template.format(*parts)


@dataclasses.dataclass(frozen=True, eq=False)
class RetrievalData:
  """Images (keys and a loader) and the tasks that rank them.

  `spec` is a JSON-able description of the images (source, root, selection), part of the
  index cache key together with `keys`.
  """

  name: str
  spec: Mapping[str, Any]
  keys: tuple[str, ...]
  load: ImageLoader
  tasks: tuple[RetrievalTask, ...]

  def keys_digest(self) -> str:
    return hashlib.sha256("\n".join(self.keys).encode()).hexdigest()


def source_loader(sources: Sequence[Any]) -> ImageLoader:
  """The loader of images kept as paths or encoded bytes (`images.model_input`)."""

  def load(indices, size):
    return np.stack([model_input(sources[int(i)], size) for i in np.asarray(indices).reshape(-1)])

  return load


# ---------------------------------------------------------------------------------------------
# Synthetic world.


def synthetic_data(
  n_triples: int = 24,
  images_per_category: int = 8,
  seed: Sequence[int] = sw.EMPHASIS_SEED,
  image_size: int = 64,
  values: Mapping[str, Sequence[str]] | None = None,
) -> RetrievalData:
  """The triples of `emphasis_triples(n_triples, seed)` as tasks, rendered as in
  `emphasis_effect` (triple t with seed (*seed, t)), so both measure the same images.

  Task t: prompt `emphasis_prompt(triple)` ("a photo of a red striped circle"), attributes
  colour, pattern, shape; an image's label is True where it has the prompt's value, False
  where it has the triple's alternative.

  values: {family: the values a prompt may name} (the attributes chosen by zero-shot AUROC,
  `attribute_selection`): the first n_triples triples of the seed's sequence whose prompt
  values are all allowed (None: every value, `emphasis_triples(n_triples, seed)` itself, since
  the sequence's first n triples are those).
  """
  seed = tuple(int(s) for s in np.atleast_1d(seed))
  if values is None:
    triples = sw.emphasis_triples(n_triples, seed)
  else:
    every = sw.emphasis_triples(
      len(synthetic.COLOURS) * len(sw.EMPHASIS_PATTERNS) * len(synthetic.SHAPES), seed
    )
    triples = [t for t in every if all(t[f][0] in values[f] for f in sw.EMPHASIS_FAMILIES)]
    if len(triples) < n_triples:
      raise ConfigError(
        f"the allowed prompt values {dict(values)} form {len(triples)} distinct prompts, fewer "
        f"than data.n_triples = {n_triples}; lower it"
      )
    triples = triples[:n_triples]
  pool = 8 * images_per_category
  tasks = []
  for t, triple in enumerate(triples):
    _, positives = sw.emphasis_scenes(triple, images_per_category)
    words = [synthetic.attribute_words(f, triple[f][0])[0] for f in sw.EMPHASIS_FAMILIES]
    article = "an" if words[0][0] in "aeiou" else "a"
    tasks.append(
      RetrievalTask(
        name="_".join(words),
        template=f"a photo of {article} {{0}} {{1}} {{2}}",
        phrases=tuple(words),
        values=tuple((triple[f][0], triple[f][1]) for f in sw.EMPHASIS_FAMILIES),
        images=np.arange(t * pool, (t + 1) * pool),
        labels=np.stack([positives[f] for f in sw.EMPHASIS_FAMILIES], axis=1),
        attribute_names=sw.EMPHASIS_FAMILIES,
      )
    )

  @functools.lru_cache(maxsize=None)
  def rendered(t: int) -> np.ndarray:
    scenes, _ = sw.emphasis_scenes(triples[t], images_per_category)
    return synthetic.render(scenes, (*seed, t), image_size=image_size).images

  def load(indices, size):
    indices = np.asarray(indices).reshape(-1)
    images = np.stack([rendered(int(i) // pool)[int(i) % pool] for i in indices])
    return resize_images(images, size)

  keys = tuple(f"{t}/{j}" for t in range(n_triples) for j in range(pool))
  spec = {
    "source": "synthetic",
    "n_triples": int(n_triples),
    "images_per_category": int(images_per_category),
    "seed": list(seed),
    "render_size": int(image_size),
  }
  if values is not None:
    spec["prompt_values"] = {f: list(v) for f, v in values.items()}
  return RetrievalData("synthetic", spec, keys, load, tuple(tasks))


# ---------------------------------------------------------------------------------------------
# Tasks from attribute tables (CelebA, CUB).


@dataclasses.dataclass(frozen=True)
class PromptSpec:
  """A task's prompt: template with {0}.. and per attribute (column, phrase, present, absent).

  column names an attribute of the table; "not X" means the absence of X (e.g. "not Male"
  for a woman).
  """

  template: str
  attributes: tuple[tuple[str, str, str, str], ...]


def _column(table: Mapping[str, np.ndarray], column: str) -> np.ndarray:
  """The bool column an attribute names, matched by name ("blond hair" ~ "Blond_Hair"), never
  by position; "not X" is its negation."""
  negate = column.startswith("not ")
  name = column[4:] if negate else column
  if name not in table:
    match = match_names([name], list(table))
    if len(match.pairs) != 1:
      near = nearest(name, table)
      raise ClassMismatchError(
        f"attribute {name!r} (in config.data.prompts) is not a column of the attribute table"
        + (f"; did you mean {near!r}?" if near else "")
        + f" Known: {quoted(sorted(table), 50)}."
      )
    name = match.pairs[0][1]
  return ~table[name] if negate else table[name]


def tasks_from_table(
  table: Mapping[str, np.ndarray],
  prompts: Sequence[PromptSpec],
  images_per_category: int | None,
  seed: int,
) -> tuple[np.ndarray, list[RetrievalTask], list[dict[str, Any]]]:
  """Samples each prompt's pool from a bool attribute table {column: [M]}.

  images_per_category: images drawn (without replacement, seeded) from each of the 2**A
  categories; a category with fewer images contributes all it has (reported); None takes
  every image (the paper's CUB setup).

  Returns:
    (rows int64 [K]: the table rows used by any task, sorted; tasks whose `images` index
    those rows; per task {"name", "category_sizes"}).
  """
  rng = np.random.default_rng(seed)
  chosen, notes = [], []
  for spec in prompts:
    labels = np.stack([_column(table, c[0]) for c in spec.attributes], axis=1)
    codes = category_codes(labels)
    a = labels.shape[1]
    if images_per_category is None:
      rows = np.arange(len(codes))
    else:
      rows = np.concatenate(
        [
          np.sort(rng.permutation(np.flatnonzero(codes == c))[:images_per_category])
          for c in range(2**a)
        ]
      )
    sizes = np.bincount(codes[rows], minlength=2**a)
    name = spec.template.format(*(c[1] for c in spec.attributes))
    if (sizes == 0).any():
      warnings.warn(f"task {name!r}: categories {np.flatnonzero(sizes == 0).tolist()} are empty")
    chosen.append((spec, rows, labels[rows]))
    notes.append({"name": name, "category_sizes": sizes.tolist()})
  used = np.unique(np.concatenate([rows for _, rows, _ in chosen]))
  tasks = [
    RetrievalTask(
      name=note["name"],
      template=spec.template,
      phrases=tuple(c[1] for c in spec.attributes),
      values=tuple((c[2], c[3]) for c in spec.attributes),
      images=np.searchsorted(used, rows),
      labels=labels,
    )
    for (spec, rows, labels), note in zip(chosen, notes)
  ]
  return used, tasks, notes


# ---------------------------------------------------------------------------------------------
# CelebA.


def celeba_data(
  root: str,
  prompts: Sequence[PromptSpec],
  images_per_category: int = 100,
  seed: int = 0,
  split: str = "all",
) -> RetrievalData:
  """CelebA from a folder with list_attr_celeba.txt and the JPEGs (see the module doc)."""
  attr_path = os.path.join(root, "list_attr_celeba.txt")
  if not storage.isfile(attr_path):
    raise InputError(
      f"{attr_path} does not exist; point data.root at the CelebA folder holding "
      "list_attr_celeba.txt and img_align_celeba/"
    )
  files, table = read_celeba_attributes(attr_path)
  keep = celeba_split_rows(root, files, split)
  files = [f for f, k in zip(files, keep) if k]
  table = {n: v[keep] for n, v in table.items()}
  image_dir = os.path.join(root, "img_align_celeba")
  if not storage.isdir(image_dir):
    image_dir = root
  used, tasks, notes = tasks_from_table(table, prompts, images_per_category, seed)
  paths = [os.path.join(image_dir, files[i]) for i in used]
  missing = [p for p in paths if not storage.isfile(p)]
  if missing:
    raise InputError(
      f"{len(missing)} of the {len(paths)} CelebA images chosen are missing under {image_dir}, "
      f"e.g. {missing[:3]}; unpack img_align_celeba.zip there."
    )
  keys = tuple(files[i] for i in used)
  spec = {
    "source": "celeba",
    "root": storage.absolute(root),
    "split": split,
    "images_per_category": images_per_category,
    "seed": seed,
    "tasks": notes,
  }
  return RetrievalData("celeba", spec, keys, source_loader(paths), tuple(tasks))


def celeba_tfds_data(
  prompts: Sequence[PromptSpec],
  images_per_category: int = 100,
  seed: int = 0,
  split: str = "test",
  data_dir: str | None = None,
) -> RetrievalData:
  """CelebA from a prepared TFDS `celeb_a` (never downloads: TFDS needs the manual files)."""
  alternative = "data.source='celeba' with a folder holding list_attr_celeba.txt"
  try:
    tfds = import_tfds(alternative)
  except TfdsMissingError as e:  # the config chose this source: a config error
    raise ConfigError(f"data.source='celeba_tfds': {e}") from e
  split = {"all": "train+validation+test", "valid": "validation"}.get(split, split)
  builder = prepared_builder(tfds, "celeb_a", data_dir, alternative=alternative)
  # Pass 1: the attributes only (images left encoded); pass 2: the chosen images' bytes.
  attributes = [ex["attributes"] for _, ex in encoded_examples(tfds, builder, split)]
  table = {n: np.asarray([a[n] for a in attributes], bool) for n in attributes[0]}
  used, tasks, notes = tasks_from_table(table, prompts, images_per_category, seed)
  wanted = set(used.tolist())
  images = {
    i: bytes(ex["image"]) for i, ex in encoded_examples(tfds, builder, split) if i in wanted
  }
  load = source_loader([images[i] for i in used])

  spec = {
    "source": "celeba_tfds",
    "split": split,
    "images_per_category": images_per_category,
    "seed": seed,
    "tasks": notes,
  }
  keys = tuple(f"{split}/{i}" for i in used)
  return RetrievalData("celeba", spec, keys, load, tuple(tasks))


# ---------------------------------------------------------------------------------------------
# CUB-200-2011.


def cub_prompts(
  attributes: Sequence[tuple[str, str]], template: str, size: int = 3
) -> list[PromptSpec]:
  """Combinations of `size` attributes (Table 10 order) whose colours all differ.

  attributes: (CUB attribute name, text) pairs; an attribute "has_X_color::c" has colour
  c, others none (the paper forms "combinations of three attributes that do not share the
  same color").
  """

  def colour(name: str) -> str | None:
    part, _, value = name.partition("::")
    return value if part.endswith("_color") else None

  specs = []
  for combo in itertools.combinations(attributes, size):
    colours = [colour(n) for n, _ in combo if colour(n) is not None]
    if len(colours) == len(set(colours)):
      specs.append(PromptSpec(template, tuple((n, t, t, "no " + t) for n, t in combo)))
  return specs


def cub_data(
  root: str, prompts: Sequence[PromptSpec], images_per_category: int | None = None, seed: int = 0
) -> RetrievalData:
  """CUB-200-2011 (all images by default, as in the paper)."""
  files, table = read_cub_attributes(root)
  used, tasks, notes = tasks_from_table(table, prompts, images_per_category, seed)
  paths = [os.path.join(root, "images", files[i]) for i in used]
  spec = {
    "source": "cub",
    "root": storage.absolute(root),
    "images_per_category": images_per_category,
    "seed": seed,
    "tasks": notes,
  }
  keys = tuple(files[i] for i in used)
  return RetrievalData("cub", spec, keys, source_loader(paths), tuple(tasks))


def folder_data(root: str, extensions=IMAGE_EXTENSIONS) -> RetrievalData:
  """Every image under a folder (sorted relative paths), without tasks (the explorer)."""
  if not storage.isdir(root):
    raise InputError(f"{root} is not a folder of images")
  files = images_under(root, extensions)
  if not files:
    raise InputError(f"no images ({', '.join(extensions)}) under {root}")
  spec = {"source": "folder", "root": storage.absolute(root)}
  loader = source_loader([os.path.join(root, f) for f in files])
  return RetrievalData("folder", spec, tuple(files), loader, ())


def build_data(config, image_size: int) -> RetrievalData:
  """RetrievalData from a config's `data` block (see configs/retrieval_*.py)."""
  source = config.source
  if source == "synthetic":
    values = config.get("prompt_values")
    return synthetic_data(
      config.n_triples,
      config.images_per_category,
      tuple(config.seed),
      image_size,
      None if values is None else {f: tuple(v) for f, v in values.items()},
    )
  if source in ("celeba", "celeba_tfds", "cub"):
    prompts = [
      PromptSpec(p["template"], tuple(tuple(a) for a in p["attributes"])) for p in config.prompts
    ]
    if source == "celeba":
      return celeba_data(
        config.root, prompts, config.images_per_category, config.seed, config.split
      )
    if source == "celeba_tfds":
      return celeba_tfds_data(
        prompts,
        config.images_per_category,
        config.seed,
        config.split,
        config.get("data_dir") or None,
      )
    return cub_data(config.root, prompts, config.get("images_per_category"), config.seed)
  raise ValueError(
    f"data.source must be 'synthetic', 'celeba', 'celeba_tfds' or 'cub', got {source!r}"
  )
