"""Data for the mutual-knowledge analysis: classes, their images, and the descriptor bank.

Sources (config.data.source):
  - "synthetic": the embedded attribute world (`stori_jax.data.synthetic_tasks`): its 12 few-shot
    classes, fresh images per class, and its descriptor bank with known attributes (offline).
  - "folder": an image folder `<root>/<class folder>/<images>` (ImageNet val arranged by wnid,
    Places365 val, Food101 ...); a folder is matched to the descriptor file's class of the same
    name (case, '_', '-' and spaces ignored), or to the name a CoOp `classnames.txt` gives it
    (`<wnid> <name>` per line: ImageNet's wnid folders need it); never by position. Labels
    follow the sorted folder names.
  - "tfds": a prepared TFDS dataset's evaluation split ("imagenet2012", "places365_small",
    "food101"); its label names are matched like the folders.
Folders without descriptors, descriptor classes without images, and empty classes are listed
before any work: an error, or left out with the list logged (and recorded in the results) under
config.data.skip_missing_classes. Every image the run will read is checked then too, cheaply
(`stori_jax.data.images.check_images`: header and last bytes), and every bad one named.
Descriptors: Menon & Vondrick's JSON {class name: [descriptor, ...]}. They carry no licence and
are never shipped: `download_descriptors` fetches them where the network allows; a missing file
stops with a message naming the URL and where to put it.

Images are yielded class by class as uint8 [B, S, S, 3] at the model's input size (resize of the
shorter side and centre crop, bicubic, as CLIP's preprocessing).

The folders, class-name files, TFDS splits and image decoding are read by the data layer
(`stori_jax.data`: `folders`, `coop`, `tfds`, `images`, `files`); this module pairs the classes
with the descriptors and streams their images.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import queue
import threading
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
from absl import logging

from stori_jax.plumbing import paths as storage
from stori_jax.plumbing.config_files import ConfigError
from stori_jax.data import synthetic, synthetic_tasks
from stori_jax.data.coop import COOP_LAYOUTS, read_classnames_txt
from stori_jax.data.download import fetch_json
from stori_jax.data.files import (
  ClassMismatchError,
  DatasetMissingError,
  check_name_lists,
  match_names,
  nearest,
  normalise_name,
  quoted,
  read_json,
)
from stori_jax.data.folders import image_files, subfolders
from stori_jax.data.images import check_images, model_input
from stori_jax.data.tfds import encoded_examples, import_tfds, label_names, prepared_builder
from stori_jax.plumbing.errors import InputError

DESCRIPTORS_REPOSITORY = "https://github.com/sachit-menon/classify_by_description_release"
_DESCRIPTORS_RAW = (
  "https://raw.githubusercontent.com/sachit-menon/classify_by_description_release/HEAD/descriptors/"
)
#: dataset -> Menon & Vondrick's descriptor file name.
DESCRIPTOR_FILES = {
  "imagenet": "descriptors_imagenet.json",
  "places365": "descriptors_places365.json",
  "food101": "descriptors_food101.json",
}
_TFDS_ALTERNATIVE = "an image folder (config.data.source='folder')"
# The readers call these module names, which tests replace (a decode counter, a stand-in TFDS).
_as_model_input = model_input
_import_tfds = functools.partial(import_tfds, _TFDS_ALTERNATIVE)

#: Seed stream of the synthetic world's analysis images (disjoint from pretraining's (0, k) and
#: the evaluation's (2024, k) namespaces).
SYNTHETIC_STREAM = 2025


@dataclasses.dataclass(frozen=True)
class ClassImages:
  """The images of one class.

  Attributes:
    label: the class index; name: its name.
    images: uint8 [B, S, S, 3]; None where the stream was told not to read the class (another
      process analyses it; `Dataset.classes`' `read`).
    ids: B image identifiers (file names, or "synthetic/<class>/<i>"), read or not.
    truth: for the synthetic world, the SyntheticBatch with masks and attributes; else None.
  """

  label: int
  name: str
  images: np.ndarray | None
  ids: tuple[str, ...]
  truth: synthetic.SyntheticBatch | None = None

  def __len__(self) -> int:
    """B, the class's images (known without reading them)."""
    return len(self.ids)


#: One class of a source before its images are read: (label, name, ids, load), where load()
#: returns (images uint8 [B, S, S, 3], truth or None).
ClassEntry = tuple[int, str, tuple[str, ...], Callable[[], tuple[np.ndarray, Any]]]


def read_classes(
  entries: Iterable[ClassEntry], read: Callable[[int], bool] | None = None
) -> Iterator[ClassImages]:
  """ClassImages of a source's classes in order; a class's images are loaded only where
  `read(position)` (None: every class) says so, the others come with `images=None`."""
  for position, (label, name, ids, load) in enumerate(entries):
    if read is not None and not read(position):
      yield ClassImages(label, name, None, ids)
      continue
    images, truth = load()
    yield ClassImages(label, name, images, ids, truth)


# ---------------------------------------------------------------------------------------------
# Descriptors.


def descriptors_url(dataset: str) -> str:
  """The raw GitHub URL of Menon & Vondrick's descriptor file for `dataset`."""
  if dataset not in DESCRIPTOR_FILES:
    raise ValueError(f"no known descriptor file for {dataset!r}; known: {sorted(DESCRIPTOR_FILES)}")
  return _DESCRIPTORS_RAW + DESCRIPTOR_FILES[dataset]


def _missing_message(path: str, dataset: str | None) -> str:
  path = storage.absolute(path)
  if dataset in DESCRIPTOR_FILES:
    where = f"Download {descriptors_url(dataset)}"
    helper = (
      f', or run `python -c "from mutual.data import download_descriptors; '
      f"download_descriptors('{dataset}', '{storage.parent(path)}')\"` where the network allows"
    )
  else:
    where = f"Download the dataset's descriptors_<dataset>.json from {DESCRIPTORS_REPOSITORY} (folder descriptors/)"
    helper = ""
  return (
    f"Descriptor file {path} does not exist. {where} and put it at {path}{helper}. "
    "The file has no licence, so it is not shipped with this project."
  )


def _validated(descriptors, where: str) -> dict[str, list[str]]:
  return check_name_lists(descriptors, where, what="descriptor file", entry="descriptor")


def load_descriptors(path: str | os.PathLike, dataset: str | None = None) -> dict[str, list[str]]:
  """Menon & Vondrick's descriptors {class name: [descriptor, ...]}, in the file's order.

  Raises:
    DatasetMissingError: the file is missing (the message names the URL and where to put it).
    InputError: the file is not UTF-8 JSON (line and column named) or not in that layout.
  """
  path = os.fspath(path)
  if not storage.isfile(path):
    raise DatasetMissingError(_missing_message(path, dataset))
  return _validated(read_json(path, "descriptor file"), path)


def download_descriptors(
  dataset: str, directory: str | os.PathLike, *, url: str | None = None, timeout: float = 30.0
) -> str:
  """Fetches `dataset`'s descriptor file into `directory` (kept if present); returns its path.

  Raises:
    DatasetMissingError: the download failed; the message says what to fetch by hand.
  """
  path = os.path.join(
    os.fspath(directory), DESCRIPTOR_FILES.get(dataset, f"descriptors_{dataset}.json")
  )
  url = url or descriptors_url(dataset)
  return fetch_json(
    url,
    path,
    validate=_validated,
    on_error=lambda error: DatasetMissingError(
      f"Could not download {url} ({error}). " + _missing_message(path, dataset)
    ),
    timeout=timeout,
  )


# ---------------------------------------------------------------------------------------------
# The synthetic world.


def synthetic_descriptors() -> dict[str, list[str]]:
  """The synthetic world's descriptor bank, {class name: descriptors} like a Menon file."""
  return synthetic_tasks.descriptor_bank(synthetic_tasks.FEWSHOT_CLASSES)


def synthetic_classes(
  images_per_class: int,
  seed: int = 0,
  image_size: int = 64,
  classes: Sequence[int] | None = None,
  read: Callable[[int], bool] | None = None,
) -> Iterator[ClassImages]:
  """The synthetic few-shot classes' images, class by class, with ground truth (`read`: see
  `Dataset.classes`)."""
  specs = synthetic_tasks.FEWSHOT_CLASSES

  def generate(label):
    batch = synthetic.generate_with(
      images_per_class,
      (SYNTHETIC_STREAM, seed, label),
      image_size=image_size,
      **specs[label].attributes(),
    )
    return batch.images, batch

  entries = (
    (
      label,
      specs[label].name,
      tuple(f"synthetic/{specs[label].name}/{i}" for i in range(images_per_class)),
      functools.partial(generate, label),
    )
    for label in (classes if classes is not None else range(len(specs)))
  )
  return read_classes(entries, read)


def descriptor_hits(truth: synthetic.SyntheticBatch, descriptors: Sequence[str], ids, valid):
  """How often chosen descriptors name an attribute of the image's object, against chance.

  Args:
    truth: the class's SyntheticBatch (single-object images).
    descriptors: the bank (index -> phrase).
    ids: int [B, N] chosen descriptor indices; valid: bool [B, N].

  Returns:
    (hit rate of the chosen descriptors, chance rate: the bank's fraction of descriptors naming
    one of the object's attributes, averaged over the same picks).
  """
  names = [synthetic_tasks.descriptor_attribute(d) for d in descriptors]
  hits, chance = [], []
  for i in range(len(truth)):
    obj = truth.objects(i)[0]
    own = {(f, getattr(obj, f)) for f in ("colour", "pattern", "shape", "size")}
    named = np.array([n in own for n in names])
    for j in np.flatnonzero(np.asarray(valid[i])):
      hits.append(named[int(ids[i][j])])
      chance.append(named.mean())
  if not hits:
    return 0.0, 0.0
  return float(np.mean(hits)), float(np.mean(chance))


def object_overlap(truth: synthetic.SyntheticBatch, pixel_maps) -> tuple[float, float]:
  """(fraction of concept pixels on an object, the objects' fraction of the image: chance)."""
  on_object = np.asarray(truth.masks) >= 0
  concept = np.asarray(pixel_maps) >= 0
  return float(on_object[concept].mean()) if concept.any() else 0.0, float(on_object.mean())


# ---------------------------------------------------------------------------------------------
# Real datasets.


class ClassStream:
  """An iterator over a dataset's chosen classes (ClassImages, read lazily) that knows how many
  it yields: `len()` is the total, so progress bars over it show one."""

  def __init__(self, classes: Iterator[ClassImages], count: int):
    self._classes, self._count = classes, count

  def __iter__(self) -> "ClassStream":
    return self

  def __next__(self) -> ClassImages:
    return next(self._classes)

  def __len__(self) -> int:
    return self._count

  def prefetched(self, ahead: int = 1) -> "ClassStream":
    """The same classes, read up to `ahead` classes in advance on a background thread, so that
    reading and decoding the next class's images overlaps the analysis of this one. An error
    while reading is raised where that class would have been yielded."""
    if ahead < 1:
      return self
    items: queue.Queue = queue.Queue(maxsize=ahead)
    done = object()

    def read():
      try:
        for item in self._classes:
          items.put((item, None))
      except BaseException as error:  # pylint: disable=broad-exception-caught
        items.put((None, error))
      items.put((done, None))

    threading.Thread(target=read, daemon=True).start()

    def take():
      while True:
        item, error = items.get()
        if error is not None:
          raise error
        if item is done:
          return
        yield item

    return ClassStream(take(), self._count)


@dataclasses.dataclass(frozen=True, eq=False)
class Dataset:
  """A dataset's classes, matched by name to the descriptor file before any image is read.

  Attributes:
    names: the class name of each label (the descriptor file's spelling), labels 0..C-1.
    descriptors: {class name: descriptors}, in label order.
    keys: the data-side key of each label (folder name, TFDS label name, or the class name).
    skipped: {folder or class: why} for classes left out under
      config.data.skip_missing_classes (empty otherwise: a mismatch is an error).
    classes: `classes(image_size, read=None)` iterates over the chosen classes' ClassImages
      (a ClassStream, whose len() is their count). `read(position) -> bool`, given a class's
      0-based place in the stream, says whether to read its images: a class not read is
      yielded with `images=None` and its ids (so its image count), and costs no file read or
      decode (a process of a multi-process run reads only the classes it analyses).
    fingerprints: label -> a digest of the class's image files (names, sizes, modification
      times; `files_fingerprint`) for an image folder, where the same file names can hold other
      pixels; empty for the synthetic world (a function of the config) and a prepared TFDS
      split (its ids name its examples). A resumed run redoes a class whose ids or
      fingerprint changed.
  """

  names: tuple[str, ...]
  descriptors: dict[str, list[str]]
  keys: tuple[str, ...]
  skipped: dict[str, str]
  classes: Callable[..., ClassStream]
  fingerprints: Mapping[int, str] = dataclasses.field(default_factory=dict)

  def lists(self) -> list[list[str]]:
    """The descriptors of each label, [C][n_c] (classes that share a name share them)."""
    return [list(self.descriptors[n]) for n in self.names]


def _matched_dataset(
  names, descriptors, keys, skipped, iterate, count: int, fingerprints=None
) -> Dataset:
  """The Dataset of a real dataset's classes matched to the descriptor file (`names` in label
  order; `iterate(image_size, read)` yields the `count` chosen classes)."""
  return Dataset(
    names,
    {n: list(descriptors[n]) for n in names},
    keys,
    skipped,
    lambda size, read=None: ClassStream(iterate(size, read), count),
    dict(fingerprints or {}),
  )


def files_fingerprint(paths: Sequence[str]) -> str:
  """A digest of image files' names, sizes and versions (modification times; an object's
  generation): another value means the class's images changed since a run kept its results (a
  resumed run then redoes the class)."""
  h = hashlib.sha256()
  for path in paths:
    size, version = storage.version(path)  # an object's generation on gs://
    h.update(f"{os.path.basename(path)}\0{size}\0{version}\n".encode())
  return h.hexdigest()


def _skip_fix(option: str) -> str:
  return f"or set {option}=True to leave these classes out (they are listed when the run starts)"


def match_classes(
  keys: Sequence[str],
  descriptors: Mapping[str, Sequence[str]],
  *,
  counts: Mapping[str, int] | None = None,
  classnames: str | None = None,
  skip_missing: bool = False,
  where: str = "the data",
  descriptors_path: str = "the descriptor file",
  dataset: str | None = None,
) -> tuple[list[tuple[str, str]], dict[str, str]]:
  """Pairs data-side class keys with the descriptor file's classes by name, never by position.

  A key (a folder name, a TFDS label name) names its class itself, or through a CoOp
  `classnames.txt` ("<key> <class name>" per line); names are compared up to case, '_', '-'
  and spaces. Keys without descriptors, descriptor classes without data, ambiguous names and
  classes without images (`counts`) are all listed at once.

  Args:
    keys: the data's class keys, in label order.
    descriptors: {class name: descriptors} (Menon & Vondrick's layout).
    counts: images per key, to find empty classes; None: not checked here.
    classnames: path of a classnames.txt mapping keys to class names.
    skip_missing: leave the mismatched and empty classes out (logged) instead of failing.
    where, descriptors_path, dataset: for messages.

  Returns:
    ([(key, descriptor class name)] of the kept classes in `keys` order, {key or class: why
    skipped}).

  Raises:
    ClassMismatchError: a mismatch and not skip_missing, or no class is left.
  """
  keys = list(keys)
  problems: list[str] = []
  skipped: dict[str, str] = {}
  names = {k: k for k in keys}
  if classnames:
    table = read_classnames_txt(classnames)
    unnamed = [k for k in keys if k not in table]
    if unnamed:
      problems.append(f"{classnames} names no class for the keys {quoted(unnamed)}")
      skipped.update({k: f"not in {classnames}" for k in unnamed})
    names = {k: table[k] for k in keys if k in table}
  # Unique names: two keys may share a class name (CoOp's ImageNet list has two "crane"s).
  match = match_names(list(dict.fromkeys(names[k] for k in keys if k in names)), list(descriptors))
  key_of = {}
  for k in keys:
    key_of.setdefault(names.get(k), k)
  name_to_keys: dict[str, list[str]] = {}
  for k in keys:
    if k in names:
      name_to_keys.setdefault(names[k], []).append(k)
  pairs = [(k, ref) for name, ref in match.pairs for k in name_to_keys[name]]
  pairs.sort(key=lambda p: keys.index(p[0]))
  if not pairs and not match.ambiguous and not skipped:
    sample = quoted(keys, 5)
    how = (
      f"CoOp's classnames.txt ({COOP_LAYOUTS['imagenet'].split_url})"
      if dataset == "imagenet"
      else "a classnames.txt"
    )
    raise ClassMismatchError(
      f"None of the {len(keys)} classes of {where} ({sample}) names a class of "
      f"{descriptors_path} ({quoted(list(descriptors), 5)}); classes are matched by name, "
      f"never by position. If the folders are named by ids (ImageNet's wnids), pass "
      f"config.data.classnames=<{how}, one '<folder> <class name>' line per class>; else "
      "rename the folders or the file's keys so that they agree."
    )
  if match.extra:
    extra = [
      f"{e!r}" + (f" (nearest: {near!r})" if (near := nearest(e, match.missing)) else "")
      for e in match.extra
    ]
    problems.append(
      f"no descriptors in {descriptors_path} for {len(extra)} class(es) of {where}: "
      + ", ".join(extra[:12])
      + (f" (and {len(extra) - 12} more)" if len(extra) > 12 else "")
    )
    skipped.update({key_of[e]: f"no descriptors in {descriptors_path}" for e in match.extra})
  if match.ambiguous:
    problems.append(
      "several descriptor classes for "
      + ", ".join(f"{n!r} ({' / '.join(map(repr, c))})" for n, c in match.ambiguous)
    )
    skipped.update({key_of[n]: "several descriptor classes match it" for n, _ in match.ambiguous})
  if match.missing:
    problems.append(
      f"no images in {where} for {len(match.missing)} descriptor class(es): "
      + quoted(list(match.missing))
    )
    skipped.update({m: f"no images in {where}" for m in match.missing})
  if counts is not None:
    empty = [k for k, _ in pairs if not counts.get(k)]
    if empty:
      problems.append(f"{len(empty)} class(es) of {where} have no images: {quoted(empty)}")
      skipped.update({k: "no images" for k in empty})
      pairs = [(k, n) for k, n in pairs if counts.get(k)]
  if problems and not skip_missing:
    fixes = []
    if len(skipped) > sum(why == "no images" for why in skipped.values()):
      fixes.append(
        "make the names agree (or pass config.data.classnames=<classnames.txt> naming each "
        "folder's class)"
      )
    if "no images" in skipped.values():
      fixes.append("put images in the empty class folders or remove them")
    raise ClassMismatchError(
      f"The classes of {where} and {descriptors_path} do not match (classes are matched by "
      "name, ignoring case, '_', '-' and spaces): " + "; ".join(problems) + ". Nothing was "
      "analysed. Either "
      + ", ".join(fixes)
      + ", "
      + _skip_fix("config.data.skip_missing_classes")
      + "."
    )
  if not pairs:
    raise ClassMismatchError(
      f"No class of {where} is left to analyse: " + "; ".join(problems) + "."
    )
  if skipped:
    logging.warning(
      "Skipping %d class(es) (config.data.skip_missing_classes): %s",
      len(skipped),
      "; ".join(f"{k!r}: {why}" for k, why in skipped.items()),
    )
  return pairs, skipped


def _selected(names: Sequence[str], classes: Sequence[int | str] | None) -> list[int]:
  """The labels `classes` picks, in its order: each a label index, or a class name (compared
  up to case, '_', '-' and spaces, as the descriptor file's names are: MK Fig. 5 names its
  classes, `configs/mutual_imagenet.py:fig5`); None: every label."""
  if classes is None:
    return list(range(len(names)))
  by_name: dict[str, list[int]] = {}
  for label, name in enumerate(names):
    by_name.setdefault(normalise_name(name), []).append(label)
  chosen, bad, unknown, ambiguous = [], [], [], []
  for c in classes:
    if isinstance(c, str):
      labels = by_name.get(normalise_name(c), [])
      if len(labels) == 1:
        chosen.append(labels[0])
      else:
        (ambiguous if labels else unknown).append(c)
    elif not 0 <= int(c) < len(names):
      bad.append(c)
    else:
      chosen.append(int(c))
  problems = []
  if bad:
    problems.append(f"{bad} are not class indices 0..{len(names) - 1}")
  if unknown:
    hints = [f"{u!r}" + (f" (nearest: {n!r})" if (n := nearest(u, names)) else "") for u in unknown]
    problems.append(f"{', '.join(hints)} name no class of the data")
  if ambiguous:
    problems.append(f"{quoted(ambiguous)} name several classes (give their indices instead)")
  if problems:
    raise ConfigError(
      f"config.data.classes: {'; '.join(problems)} (after matching the data's classes to the "
      "descriptor file). Name each class by its index or by its name."
    )
  if len(set(chosen)) != len(chosen):
    raise ConfigError(
      f"config.data.classes {list(classes)} picks a class more than once (by index and by "
      "name); each class is analysed once. List each class once."
    )
  return chosen


def folder_dataset(
  root: str,
  descriptors: Mapping[str, Sequence[str]],
  *,
  classnames: str | None = None,
  images_per_class: int | None = None,
  classes: Sequence[int | str] | None = None,
  skip_missing: bool = False,
  descriptors_path: str = "the descriptor file",
  dataset: str | None = None,
) -> Dataset:
  """An image folder `<root>/<class folder>/<images>`, its folders matched to the descriptors.

  Labels follow the sorted folder names of the matched classes; `classes` picks labels.
  """
  if not storage.isdir(root):
    raise DatasetMissingError(
      f"Image folder {storage.absolute(root)} does not exist: put the evaluation images there as "
      "<root>/<class folder>/<image files> (ImageNet: the ILSVRC2012 val images from "
      "https://image-net.org sorted into one folder per wnid)."
    )
  keys = subfolders(root)
  if not keys:
    raise InputError(
      f"Image folder {storage.absolute(root)} has no class folders: put the images there as "
      "<root>/<class folder>/<image files>."
    )
  files = {k: image_files(os.path.join(root, k)) for k in keys}
  pairs, skipped = match_classes(
    keys,
    descriptors,
    counts={k: len(v) for k, v in files.items()},
    classnames=classnames,
    skip_missing=skip_missing,
    where=f"the image folder {root}",
    descriptors_path=descriptors_path,
    dataset=dataset,
  )
  names = tuple(n for _, n in pairs)
  kept_keys = tuple(k for k, _ in pairs)
  chosen = _selected(names, classes)
  some = {
    label: files[k][:images_per_class] if images_per_class else files[k]
    for label in chosen
    for k in (kept_keys[label],)
  }
  # Every image the run will read, checked now (header and last bytes): a bad file anywhere
  # stops the run before the model loads, with every bad file named.
  paths = {
    label: [os.path.join(root, kept_keys[label], f) for f in some[label]] for label in chosen
  }
  check_images(
    ((p, p) for label in chosen for p in paths[label]),
    what=f"images of the image folder {root}",
  )

  def decode(key: str, some: Sequence[str], image_size: int):
    paths = [os.path.join(root, key, f) for f in some]
    return np.stack([_as_model_input(p, image_size, p) for p in paths]), None

  def iterate(image_size: int, read=None) -> Iterator[ClassImages]:
    entries = []
    for label in chosen:
      key = kept_keys[label]
      ids = tuple(f"{key}/{f}" for f in some[label])
      entries.append(
        (label, names[label], ids, functools.partial(decode, key, some[label], image_size))
      )
    return read_classes(entries, read)

  return _matched_dataset(
    names,
    descriptors,
    kept_keys,
    skipped,
    iterate,
    len(chosen),
    {label: files_fingerprint(paths[label]) for label in chosen},
  )


def tfds_dataset(
  name: str,
  descriptors: Mapping[str, Sequence[str]],
  *,
  data_dir: str | None = None,
  split: str = "validation",
  classnames: str | None = None,
  images_per_class: int | None = None,
  classes: Sequence[int | str] | None = None,
  skip_missing: bool = False,
  descriptors_path: str = "the descriptor file",
  dataset: str | None = None,
) -> Dataset:
  """A prepared TFDS split, its label names matched to the descriptors. Nothing is downloaded.

  The split is read once and the chosen classes' encoded images kept in memory (ImageNet val:
  about 6.4 GB for all 1,000 classes; choose `classes` to bound it).
  """
  tfds = _import_tfds()
  builder = prepared_builder(tfds, name, data_dir, alternative=_TFDS_ALTERNATIVE)
  raw = label_names(builder)
  where = f"TFDS {name} ({split})"
  if not skip_missing:  # names first (cheap): a mismatch stops before the split is read
    match_classes(
      raw,
      descriptors,
      classnames=classnames,
      where=where,
      descriptors_path=descriptors_path,
      dataset=dataset,
    )
  counts = np.zeros(len(raw), np.int64)
  encoded: dict[int, list] = {label: [] for label in range(len(raw))}
  for index, example in encoded_examples(tfds, builder, split):
    label = int(example["label"])
    counts[label] += 1
    if not images_per_class or len(encoded[label]) < images_per_class:
      encoded[label].append((f"{name}/{split}/{index}", bytes(example["image"])))
  pairs, skipped = match_classes(
    raw,
    descriptors,
    counts={k: int(c) for k, c in zip(raw, counts)},
    classnames=classnames,
    skip_missing=skip_missing,
    where=where,
    descriptors_path=descriptors_path,
    dataset=dataset,
  )
  names = tuple(n for _, n in pairs)
  kept_keys = tuple(k for k, _ in pairs)
  chosen = _selected(names, classes)
  index_of = {k: i for i, k in enumerate(raw)}
  kept = {label: encoded[index_of[kept_keys[label]]] for label in chosen}
  del encoded
  check_images(  # every image the run will read, before the model loads
    (item for label in chosen for item in kept[label]), what=f"images of {where}"
  )

  def decode(items, image_size: int):
    return np.stack([_as_model_input(b, image_size, i) for i, b in items]), None

  def iterate(image_size: int, read=None) -> Iterator[ClassImages]:
    entries = (
      (
        label,
        names[label],
        tuple(i for i, _ in items),
        functools.partial(decode, items, image_size),
      )
      for label, items in kept.items()
    )
    return read_classes(entries, read)

  return _matched_dataset(names, descriptors, kept_keys, skipped, iterate, len(chosen))


DATA_SOURCES = ("synthetic", "folder", "tfds")


def prepare(config) -> Dataset:
  """config.data's classes, descriptors and images (read lazily), checked before any work.

  The descriptor file is read, and a real dataset's classes matched to it by name, here: a
  missing file, a mismatch or an empty class stops the run before a model loads.
  """
  data = config.data
  if data.source not in DATA_SOURCES:
    raise ConfigError(f"config.data.source must be one of {DATA_SOURCES}, got {data.source!r}.")
  classes = list(data.classes) if data.get("classes") else None
  if classes is not None and len(set(classes)) != len(classes):
    repeated = sorted({c for c in classes if classes.count(c) > 1})
    raise ConfigError(
      f"config.data.classes names {repeated} more than once; each class is analysed once, so "
      "a repeat would count its images twice. List each class once."
    )
  count = data.get("images_per_class")
  # 0 / None: every image of a folder; the synthetic world draws a number of images.
  lowest = 1 if data.source == "synthetic" else 0
  if count is not None and (
    isinstance(count, bool) or not isinstance(count, int) or count < lowest
  ):
    raise ConfigError(
      f"config.data.images_per_class must be an integer >= {lowest}"
      f"{'' if lowest else ' (0 or None: every image of each class)'}, got {count!r}."
    )
  seed = data.get("seed", 0)
  if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
    raise ConfigError(f"config.data.seed must be an integer >= 0, got {seed!r}.")
  if data.source == "synthetic":
    specs = synthetic_tasks.FEWSHOT_CLASSES
    names = tuple(c.name for c in specs)
    chosen = _selected(names, classes)
    return Dataset(
      names,
      synthetic_descriptors(),
      names,
      {},
      lambda size, read=None: ClassStream(
        synthetic_classes(data.images_per_class, data.seed, size, chosen, read), len(chosen)
      ),
    )
  path = data.descriptors
  descriptors = load_descriptors(path, data.get("dataset"))
  options = dict(
    classnames=data.get("classnames") or None,
    images_per_class=data.get("images_per_class") or None,
    classes=classes,
    skip_missing=bool(data.get("skip_missing_classes", False)),
    descriptors_path=path,
    dataset=data.get("dataset"),
  )
  if data.source == "folder":
    return folder_dataset(data.root, descriptors, **options)
  return tfds_dataset(
    data.tfds_name,
    descriptors,
    data_dir=data.get("root") or None,
    split=data.get("split", "validation"),
    **options,
  )


def descriptor_set_lists(config, source: str, names: Sequence[str]) -> list[list[str]]:
  """One descriptor set's lists for the classes `names` (label order), for App. A.4's Table 4
  (config.protocols.bank_quality.descriptor_sets): on the embedded world `source` names one of
  its sets (synthetic_tasks.DESCRIPTOR_SETS); else it is a descriptor file in Menon & Vondrick's
  layout whose classes are matched to `names` by name, as config.data.descriptors' are.

  Raises:
    ConfigError: an unknown embedded set; ClassMismatchError: a class of the data that the file
      does not describe; DatasetMissingError / InputError: as `load_descriptors`.
  """
  if config.data.source == "synthetic":
    if source not in synthetic_tasks.DESCRIPTOR_SETS:
      raise ConfigError(
        f"config.protocols.bank_quality.descriptor_sets names {source!r}, which is not one of "
        f"the embedded world's descriptor sets {tuple(synthetic_tasks.DESCRIPTOR_SETS)} (on the "
        "embedded world the sets are named; on real data they are descriptor files)."
      )
    per_class = synthetic_tasks.DESCRIPTOR_SETS[source](synthetic_tasks.FEWSHOT_CLASSES)
  else:
    per_class = load_descriptors(source, config.data.get("dataset"))
  match = match_names(list(names), list(per_class))
  found = dict(match.pairs)
  missing = [n for n in names if n not in found]
  if missing:
    raise ClassMismatchError(
      f"The descriptor set {source} describes no class (matched by name, ignoring case, '_', "
      f"'-' and spaces) for {len(missing)} class(es) of the data: {quoted(missing)}. Every row "
      "of App. A.4's table scores the same classes: give a file with descriptors for each, or "
      "leave it out of config.protocols.bank_quality.descriptor_sets."
    )
  return [list(per_class[found[n]]) for n in names]


def load(config, image_size: int):
  """(class names, descriptors {class: [..]} in label order, iterator of ClassImages)."""
  found = prepare(config)
  return list(found.names), found.descriptors, found.classes(image_size)
