"""Few-shot data: CoOp folders, TFDS (a stand-in module), K-shot sampling, transforms, prompts."""

import io
import json
import os
import random
import sys
import types
import urllib.error
import urllib.request

import numpy as np
import pytest
from PIL import Image

from stori_jax.plumbing.config_files import ConfigError
from stori_jax.data import synthetic_tasks
from stori_jax.fewshot import augment, datasets, prompts
from stori_jax.fewshot.datasets import DatasetMissingError, LabeledImage
from stori_jax.data.preprocess import PreprocessConfig, preprocess

SHARED_DATA = os.environ.get(
  "STORI_SHARED_DATA",
  os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data"),
)
CUPL_DIR = os.path.join(SHARED_DATA, "cupl")


def _png(rng, height=12, width=16, mode="RGB"):
  pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
  buffer = io.BytesIO()
  Image.fromarray(pixels).convert(mode).save(buffer, format="PNG")
  return buffer.getvalue()


# ---------------------------------------------------------------------------------------------
# CoOp image folders.

DTD_CLASSES = ("banded", "polka-dotted", "zig_zagged")


def _write_dtd(root, train_per_class=4):
  """root/dtd/images/<class>/*.png and split_zhou_DescribableTextures.json; 1 val, 2 test each."""
  rng = np.random.default_rng(0)
  split = {"train": [], "val": [], "test": []}
  for label, name in enumerate(DTD_CLASSES):
    os.makedirs(root / "dtd" / "images" / name)
    counts = {"train": train_per_class, "val": 1, "test": 2}
    for part, count in counts.items():
      for i in range(count):
        relpath = f"{name}/{part}_{i}.png"
        (root / "dtd" / "images" / relpath).write_bytes(_png(rng))
        split[part].append([relpath, label, name])
  (root / "dtd" / "split_zhou_DescribableTextures.json").write_text(json.dumps(split))
  return split


def test_coop_split_loads_classes_items_and_paths(tmp_path):
  split = _write_dtd(tmp_path)
  data = datasets.load_coop_split(tmp_path, "dtd")
  assert data.dataset == "dtd" and data.class_names == DTD_CLASSES
  assert (len(data.train), len(data.val), len(data.test)) == (12, 3, 6)
  assert data.train_labels.dtype == np.int32
  np.testing.assert_array_equal(data.train_labels, [row[1] for row in split["train"]])
  for item, (relpath, _, _) in zip(data.test, split["test"]):
    assert item.source == os.path.join(str(tmp_path), "dtd", "images", relpath)
    assert datasets.open_image(item.source).size == (16, 12)
  # CoOp's own spelling of the name works too.
  assert datasets.load_coop_split(tmp_path, "DescribableTextures").class_names == DTD_CLASSES


def test_coop_missing_pieces_name_what_to_download_and_where(tmp_path):
  missing_root = tmp_path / "nowhere"
  with pytest.raises(FileNotFoundError, match="does not exist") as error:
    datasets.load_coop_split(missing_root, "dtd")
  assert str(missing_root) in str(error.value) and "DATASETS.md" in str(error.value)

  os.makedirs(tmp_path / "dtd")
  with pytest.raises(DatasetMissingError) as error:
    datasets.load_coop_split(tmp_path, "dtd")
  message = str(error.value)
  assert os.path.join(str(tmp_path), "dtd", "images") in message
  assert "dtd-r1.0.1.tar.gz" in message

  os.makedirs(tmp_path / "dtd" / "images")
  split_path = os.path.join(str(tmp_path), "dtd", "split_zhou_DescribableTextures.json")
  with pytest.raises(DatasetMissingError) as error:
    datasets.load_coop_split(tmp_path, "dtd")
  message = str(error.value)
  assert f"put it at {split_path}" in message and "drive.google.com" in message


def test_coop_missing_image_file_is_named(tmp_path):
  split = _write_dtd(tmp_path)
  missing = tmp_path / "dtd" / "images" / split["test"][1][0]
  missing.unlink()
  with pytest.raises(DatasetMissingError, match="1 of 21 images") as error:
    datasets.load_coop_split(tmp_path, "dtd")
  assert str(missing) in str(error.value)
  assert len(datasets.load_coop_split(tmp_path, "dtd", check_files=False).test) == 6


def test_coop_inconsistent_labels_are_rejected(tmp_path):
  _write_dtd(tmp_path)
  path = tmp_path / "dtd" / "split_zhou_DescribableTextures.json"
  split = json.loads(path.read_text())
  split["test"][0][2] = "not banded"
  path.write_text(json.dumps(split))
  with pytest.raises(ValueError, match="named both"):
    datasets.load_coop_split(tmp_path, "dtd")


def _write_imagenet(root):
  rng = np.random.default_rng(1)
  wnids = {"n02": "goldfish", "n01": "tench"}
  for split, count in (("train", 3), ("val", 2)):
    for wnid in wnids:
      folder = root / "imagenet" / "images" / split / wnid
      os.makedirs(folder)
      for i in range(count):
        (folder / f"{wnid}_{i}.JPEG").write_bytes(_png(rng))
      (folder / ".DS_Store").write_bytes(b"")  # hidden files are skipped, as in CoOp
  (root / "imagenet" / "classnames.txt").write_text("n01 tench\nn02 goldfish\n")


def test_coop_imagenet_uses_classnames_and_val_as_test(tmp_path):
  _write_imagenet(tmp_path)
  data = datasets.load_coop_split(tmp_path, "imagenet")
  assert data.class_names == ("tench", "goldfish")  # labels follow sorted wnid folders
  assert (len(data.train), len(data.test), len(data.val)) == (6, 4, 0)
  np.testing.assert_array_equal(data.test_labels, [0, 0, 1, 1])
  assert all(f"{os.sep}val{os.sep}" in item.source for item in data.test)

  (tmp_path / "imagenet" / "classnames.txt").unlink()
  with pytest.raises(DatasetMissingError) as error:
    datasets.load_coop_split(tmp_path, "ImageNet")
  assert os.path.join(str(tmp_path), "imagenet", "classnames.txt") in str(error.value)


# ---------------------------------------------------------------------------------------------
# K-shot sampling.


def _pool(per_class=(6, 7, 5), labels_order=(0, 1, 2)):
  return [
    LabeledImage(f"c{label}_{i}", label) for label in labels_order for i in range(per_class[label])
  ]


def test_k_shot_is_balanced_deterministic_and_seed_dependent():
  pool = _pool()
  a = datasets.sample_k_shot(pool, 4, seed=1)
  assert a == datasets.sample_k_shot(pool, 4, seed=1)
  assert a != datasets.sample_k_shot(pool, 4, seed=2)
  assert [item.label for item in a] == [0] * 4 + [1] * 4 + [2] * 4
  assert set(a) <= set(pool) and len(set(a)) == 12


def test_k_shot_matches_dassl_generate_fewshot_dataset():
  """Dassl: seed the global RNG, then random.sample per label in order of first appearance."""
  pool = _pool(labels_order=(2, 0, 1))
  random.seed(3)
  by_label = {}
  for item in pool:
    by_label.setdefault(item.label, []).append(item)
  dassl = [x for items in by_label.values() for x in random.sample(items, 2)]
  assert list(datasets.sample_k_shot(pool, 2, seed=3)) == dassl


def test_k_shot_error_names_short_classes():
  with pytest.raises(ValueError, match=r"'dotted' \(label 2\) has 5") as error:
    datasets.sample_k_shot(_pool(), 6, seed=1, class_names=("a", "b", "dotted"))
  assert "'b'" not in str(error.value)
  with pytest.raises(ValueError, match="shots"):
    datasets.sample_k_shot(_pool(), 0, seed=1)


def test_split_few_shot_replaces_train_only(tmp_path):
  _write_dtd(tmp_path)
  data = datasets.load_coop_split(tmp_path, "dtd")
  small = data.few_shot(2, seed=1)
  assert len(small.train) == 6 and small.test == data.test
  np.testing.assert_array_equal(np.bincount(small.train_labels), [2, 2, 2])


# ---------------------------------------------------------------------------------------------
# Synthetic world.


def test_synthetic_adapter():
  data = datasets.load_synthetic(shots=2, seed=1, n_test_per_class=1)
  reference = synthetic_tasks.fewshot_dataset(2, 1, 1)
  assert data.dataset == "synthetic" and data.class_names == reference.class_names
  assert (len(data.train), len(data.test), data.num_classes) == (24, 12, 12)
  np.testing.assert_array_equal(data.train_labels, reference.train_labels)
  np.testing.assert_array_equal(np.stack([x.source for x in data.train]), reference.train_images)
  assert data.train[0].source.dtype == np.uint8
  views = augment.augmented_views(data.train[0].source, 32, 2, seed=1, image_index=0)
  assert views.shape == (2, 32, 32, 3)


# ---------------------------------------------------------------------------------------------
# Transforms.


class _ReplayTorch:
  """Stands in for `torch` inside torchvision.transforms.transforms so that RandomResizedCrop and
  RandomHorizontalFlip draw from a numpy Generator, one call per draw, as augment.py does."""

  def __init__(self, rng):
    self._rng = rng

  def __getattr__(self, name):
    import torch

    return getattr(torch, name)

  def empty(self, *size):
    import torch

    rng = self._rng
    return types.SimpleNamespace(
      uniform_=lambda low, high: torch.tensor(
        [rng.uniform(float(low), float(high))], dtype=torch.float64
      )
    )

  def randint(self, low, high, size):
    import torch

    return torch.tensor([int(self._rng.integers(low, high))])

  def rand(self, *size):
    import torch

    return torch.tensor([self._rng.random()], dtype=torch.float64)


IMAGE_SHAPES = [(300, 400), (224, 224), (37, 91), (500, 20), (15, 600)]  # last two: fallback


@pytest.mark.parametrize("height, width", IMAGE_SHAPES)
def test_crop_box_equals_torchvision_given_the_same_draws(monkeypatch, height, width):
  transforms = pytest.importorskip("torchvision.transforms.transforms")
  image = Image.new("RGB", (width, height))
  for seed in range(300):
    monkeypatch.setattr(transforms, "torch", _ReplayTorch(np.random.default_rng(seed)))
    theirs = transforms.RandomResizedCrop.get_params(image, [0.08, 1.0], [3 / 4, 4 / 3])
    ours = augment.random_resized_crop_box(height, width, np.random.default_rng(seed))
    assert ours == tuple(theirs), seed


def test_views_equal_torchvision_pipeline_pixel_for_pixel(monkeypatch):
  transforms = pytest.importorskip("torchvision.transforms.transforms")
  config = PreprocessConfig(image_size=24)
  pipeline = transforms.Compose(
    [
      transforms.RandomResizedCrop(24, interpolation=transforms.InterpolationMode.BICUBIC),
      transforms.RandomHorizontalFlip(),
      transforms.ToTensor(),
      transforms.Normalize(config.mean, config.std),
    ]
  )
  image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 60, 3), dtype=np.uint8))
  for seed in range(20):
    monkeypatch.setattr(transforms, "torch", _ReplayTorch(np.random.default_rng(seed)))
    theirs = pipeline(image).numpy().transpose(1, 2, 0)
    ours = augment.train_view(image, 24, np.random.default_rng(seed), config)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5, err_msg=str(seed))


def test_crop_box_statistics_match_torchvision_rng():
  """With each library's own RNG: same distributions of area fraction, aspect ratio and of the
  central-crop fallback (taken ~95% of the time for a 30 x 400 image)."""
  torch = pytest.importorskip("torch")
  transforms = pytest.importorskip("torchvision.transforms")
  torch.manual_seed(0)
  rng = np.random.default_rng(0)
  n = 3000
  for height, width, fallback_box in ((300, 400, (0, 0, 300, 400)), (30, 400, (0, 180, 30, 40))):
    image = Image.new("RGB", (width, height))
    theirs = np.array(
      [
        transforms.RandomResizedCrop.get_params(image, [0.08, 1.0], [3 / 4, 4 / 3])
        for _ in range(n)
      ],
      np.float64,
    )
    ours = np.array(
      [augment.random_resized_crop_box(height, width, rng) for _ in range(n)], np.float64
    )
    quantiles = (0.1, 0.5, 0.9)
    area = lambda boxes: boxes[:, 2] * boxes[:, 3] / (height * width)
    log_aspect = lambda boxes: np.log(boxes[:, 3] / boxes[:, 2])
    for statistic in (area, log_aspect):
      np.testing.assert_allclose(
        np.quantile(statistic(ours), quantiles),
        np.quantile(statistic(theirs), quantiles),
        atol=0.04,
      )
    fallback = lambda boxes: np.mean(np.all(boxes == fallback_box, axis=1))
    assert abs(fallback(ours) - fallback(theirs)) < 0.03
    if height == 30:
      assert 0.8 < fallback(ours) < 0.99


def test_augmented_views_are_deterministic_per_seed_image_and_view():
  source = np.random.default_rng(0).integers(0, 256, (40, 50, 3), dtype=np.uint8)
  views = augment.augmented_views(source, 16, 3, seed=1, image_index=7)
  assert views.shape == (3, 16, 16, 3) and views.dtype == np.float32
  again = augment.augmented_views(source, 16, 3, seed=1, image_index=7)
  np.testing.assert_array_equal(views, again)
  # View v does not depend on how many views are drawn.
  np.testing.assert_array_equal(views[:2], augment.augmented_views(source, 16, 2, 1, 7))
  assert not np.array_equal(views[0], views[1])
  assert not np.array_equal(views, augment.augmented_views(source, 16, 3, seed=2, image_index=7))
  assert not np.array_equal(views, augment.augmented_views(source, 16, 3, seed=1, image_index=8))
  with pytest.raises(ValueError, match="image_size"):
    augment.augmented_views(source, 16, 1, 1, 0, PreprocessConfig(image_size=224))


def test_flip_happens_half_the_time_and_mirrors_the_view():
  pixels = np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8)
  image = Image.fromarray(pixels)
  config = PreprocessConfig(image_size=16)
  plain = preprocess(image, config)
  mirrored = preprocess(Image.fromarray(pixels[:, ::-1]), config)
  flipped = 0
  for seed in range(200):  # a full-image crop, so only the flip varies
    view = augment.train_view(
      image, 16, np.random.default_rng(seed), config, scale=(1.0, 1.0), ratio=(1.0, 1.0)
    )
    is_mirrored = np.allclose(view, mirrored, atol=1e-6)
    assert is_mirrored or np.allclose(view, plain, atol=1e-6)
    flipped += is_mirrored
  assert 70 <= flipped <= 130
  never = augment.train_view(
    image,
    16,
    np.random.default_rng(0),
    config,
    scale=(1.0, 1.0),
    ratio=(1.0, 1.0),
    flip_probability=0.0,
  )
  np.testing.assert_allclose(never, plain, atol=1e-6)


def test_eval_view_is_preprocess_for_every_source_kind(tmp_path):
  rng = np.random.default_rng(0)
  encoded = _png(rng, 30, 50)
  path = tmp_path / "image.png"
  path.write_bytes(encoded)
  array = np.asarray(Image.open(io.BytesIO(encoded)))
  config = PreprocessConfig(image_size=20)
  expected = preprocess(str(path), config)
  for source in (str(path), encoded, array):
    np.testing.assert_array_equal(augment.eval_view(source, config), expected)
  assert np.stack([augment.eval_view(s, config) for s in (encoded, array)]).shape == (2, 20, 20, 3)


# ---------------------------------------------------------------------------------------------
# Prompts.


def test_base_templates():
  assert prompts.base_templates("flowers102") == ("a photo of a {}, a type of flower.",)
  assert prompts.base_templates("DescribableTextures") == ("{} texture.",)
  assert prompts.base_templates("food101") == ("a photo of {}, a type of food.",)
  for name in ("sun397", "caltech101"):
    assert prompts.base_templates(name) == ("a photo of a {}.",)
  imagenet = prompts.base_templates("imagenet")
  assert imagenet[0] == "a photo of a {}." and len(imagenet) == 8
  assert set(imagenet[1:]) == {
    "itap of a {}.",
    "a bad photo of the {}.",
    "a origami {}.",
    "a photo of the large {}.",
    "a {} in a video game.",
    "art of the {}.",
    "a photo of the small {}.",
  }
  assert prompts.base_prompts("food101", ["apple_pie"]) == (
    ("a photo of apple pie, a type of food.",),
  )


def _write_cupl(tmp_path, content, name="texture_prompts_base.json"):
  path = tmp_path / name
  path.write_text(json.dumps(content))
  return path


def test_cupl_matching_exact_normalised_reordered_and_aliases(tmp_path):
  path = _write_cupl(
    tmp_path,
    {
      "banded": ["banded one"],
      "Apple Pie": ["pie one", "pie two"],
      "apartment building (outdoor)": ["apartment one"],
      "yin and yang symbol": ["yy"],
      "strange key": ["aliased"],
    },
  )
  loaded = prompts.load_cupl_prompts(
    path,
    ["banded", "apple_pie", "outdoor apartment_building", "yin_yang", "mine", "banded"],
    dataset="caltech101",
    aliases={"mine": "strange key"},
  )
  assert loaded == (
    ("banded one",),
    ("pie one", "pie two"),
    ("apartment one",),
    ("yy",),
    ("aliased",),
    ("banded one",),
  )


def test_cupl_errors_name_classes_and_file(tmp_path):
  path = _write_cupl(tmp_path, {"banded": ["x"], "Dotted": ["y"], "dotted": ["z"]})
  with pytest.raises(ValueError) as error:
    prompts.load_cupl_prompts(path, ["banded", "lacelike", "DOTTED"])
  message = str(error.value)
  assert str(path) in message and "'lacelike'" in message and "several keys for 'DOTTED'" in message
  bad = _write_cupl(tmp_path, {"banded": "not a list"}, name="bad.json")
  with pytest.raises(ValueError, match="not a CuPL prompt file"):
    prompts.load_cupl_prompts(bad, ["banded"])


def test_missing_cupl_file_says_what_to_download_and_where(tmp_path):
  path = tmp_path / "prompts" / "texture_prompts_base.json"
  with pytest.raises(FileNotFoundError) as error:
    prompts.load_cupl_prompts(path, ["banded"])  # dataset guessed from the file name
  message = str(error.value)
  assert prompts.cupl_url("dtd") in message and f"put it at {path}" in message
  assert "github.com/sarahpratt/CuPL" in message
  with pytest.raises(DatasetMissingError, match="sun_prompts_base.json"):
    prompts.load_cupl_prompts(tmp_path / "x.json", ["abbey"], dataset="sun397")


def test_download_cupl_failure_gives_the_manual_instructions(tmp_path, monkeypatch):
  def offline(url, timeout):
    raise urllib.error.URLError("network is unreachable")

  monkeypatch.setattr(urllib.request, "urlopen", offline)
  with pytest.raises(DatasetMissingError) as error:
    prompts.download_cupl("dtd", tmp_path)
  message = str(error.value)
  assert "network is unreachable" in message and prompts.cupl_url("dtd") in message
  assert str(tmp_path / "texture_prompts_base.json") in message
  assert not os.listdir(tmp_path)


def test_download_cupl_unreachable_host(tmp_path):
  with pytest.raises(DatasetMissingError, match="Could not download"):
    prompts.download_cupl("food101", tmp_path, url="http://127.0.0.1:9/food.json", timeout=2)


def test_download_cupl_writes_a_valid_file_once(tmp_path, monkeypatch):
  calls = []

  def serve(url, timeout):
    calls.append(url)
    return io.BytesIO(json.dumps({"banded": ["a banded texture."]}).encode())

  monkeypatch.setattr(urllib.request, "urlopen", serve)
  path = prompts.download_cupl("dtd", tmp_path / "cupl")
  assert calls == [prompts.cupl_url("dtd")]
  assert prompts.load_cupl_prompts(path, ["banded"]) == (("a banded texture.",),)
  assert prompts.download_cupl("dtd", tmp_path / "cupl") == path and len(calls) == 1
  assert sorted(os.listdir(tmp_path / "cupl")) == ["texture_prompts_base.json"]

  monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout: io.BytesIO(b"<html>"))
  with pytest.raises(DatasetMissingError, match="Could not download"):
    prompts.download_cupl("sun397", tmp_path / "cupl")


def test_synthetic_prompts_cover_the_classes():
  table = prompts.synthetic_prompts()
  assert list(table) == list(datasets.load_synthetic(1, 1, 1).class_names)
  assert all(len(sentences) >= 5 for sentences in table.values())
  chosen = ("orange dotted triangle", "red striped star")
  assert list(prompts.synthetic_prompts(chosen)) == list(chosen)


def test_synthetic_task_from_class_names_and_a_clear_error_for_a_bad_one():
  chosen = ("orange dotted triangle", "red striped star", "blue shape")
  data = datasets.load_synthetic(2, 1, 1, class_names=chosen)
  assert data.class_names == chosen and data.num_classes == 3
  with pytest.raises(ConfigError, match="config.data.class_names: .*unknown word 'hexagon'"):
    datasets.load_synthetic(2, 1, 1, class_names=("red hexagon", "red star"))


COOP_CALTECH101 = """accordion airplane anchor ant barrel bass beaver binocular bonsai brain
brontosaurus buddha butterfly camera cannon car_side ceiling_fan cellphone chair chandelier
cougar_body cougar_face crab crayfish crocodile crocodile_head cup dalmatian dollar_bill dolphin
dragonfly electric_guitar elephant emu euphonium ewer face ferry flamingo flamingo_head garfield
gerenuk gramophone grand_piano hawksbill headphone hedgehog helicopter ibis inline_skate
joshua_tree kangaroo ketch lamp laptop leopard llama lobster lotus mandolin mayfly menorah
metronome minaret motorbike nautilus octopus okapi pagoda panda pigeon pizza platypus pyramid
revolver rhino rooster saxophone schooner scissors scorpion sea_horse snoopy soccer_ball stapler
starfish stegosaurus stop_sign strawberry sunflower tick trilobite umbrella watch water_lilly
wheelchair wild_cat windsor_chair wrench yin_yang""".split()


def _coop_sun_name(key):
  """CuPL/CLIP 'apartment building (outdoor)' -> CoOp 'outdoor apartment_building' (CoOp writes
  SUN397's folder /a/apartment_building/outdoor with the qualifier first)."""
  if key.endswith(")"):
    name, qualifier = key[:-1].split(" (")
    return f"{qualifier} {name.replace(' ', '_')}"
  return key.replace(" ", "_")


@pytest.mark.skipif(
  not os.path.isdir(CUPL_DIR),
  reason=f"no CuPL files in {CUPL_DIR} (set STORI_SHARED_DATA or run prompts.download_cupl)",
)
def test_real_cupl_files_match_coop_class_names():
  def load(dataset, names):
    return prompts.load_cupl_prompts(
      os.path.join(CUPL_DIR, prompts.CUPL_FILES[dataset]), names, dataset=dataset
    )

  caltech = load("caltech101", COOP_CALTECH101)
  assert len(caltech) == 100 and all(len(p) == 30 for p in caltech)
  with open(os.path.join(CUPL_DIR, "sun_prompts_base.json")) as f:
    sun_keys = list(json.load(f))
  coop_sun = [_coop_sun_name(key) for key in sun_keys]
  assert "outdoor apartment_building" in coop_sun
  assert load("sun397", coop_sun) == load("sun397", sun_keys)
  with open(os.path.join(CUPL_DIR, "food_prompts_base.json")) as f:
    food_keys = list(json.load(f))
  assert len(load("food101", [k.replace(" ", "_") for k in food_keys])) == 101
  for dataset in ("dtd", "flowers102", "imagenet"):
    with open(os.path.join(CUPL_DIR, prompts.CUPL_FILES[dataset])) as f:
      keys = list(json.load(f))
    assert len(load(dataset, keys)) == len(keys)


# ---------------------------------------------------------------------------------------------
# TFDS, with a stand-in module that implements the few calls load_tfds makes.


class _FakeBuilder:
  def __init__(self, name, data_dir, spec):
    self.data_dir = os.path.join(data_dir or "~/tensorflow_datasets", name, "1.0.0")
    self._spec = spec
    self.info = types.SimpleNamespace(
      splits={split: None for split in spec["splits"]},
      features={"label": types.SimpleNamespace(names=spec["names"])},
    )
    self.reads = []

  def is_prepared(self):
    return self._spec.get("prepared", True)

  def as_dataset(self, split, shuffle_files, decoders):
    assert shuffle_files is False and isinstance(decoders["image"], _SkipDecoding)
    self.reads.append(split)
    return [
      {"image": image, "label": np.int64(label)} for image, label in self._spec["splits"][split]
    ]


class _SkipDecoding:
  pass


def _fake_tfds(specs):
  builders = {}

  class DatasetNotFoundError(Exception):
    pass

  def builder(name, data_dir=None):
    if name not in specs:
      raise DatasetNotFoundError(name)
    return builders.setdefault(name, _FakeBuilder(name, data_dir, specs[name]))

  return types.SimpleNamespace(
    builder=builder,
    as_numpy=lambda dataset: iter(dataset),
    builders=builders,
    decode=types.SimpleNamespace(SkipDecoding=_SkipDecoding),
    core=types.SimpleNamespace(DatasetNotFoundError=DatasetNotFoundError),
  )


def _examples(labels, seed):
  rng = np.random.default_rng(seed)
  return [(_png(rng, 8, 8), label) for label in labels]


@pytest.fixture
def fake_tfds(monkeypatch):
  module = _fake_tfds(
    {
      "dtd": {
        "names": ["banded", "dotted"],
        "splits": {
          "train": _examples([0, 1, 0, 1, 0, 1], 0),
          "validation": _examples([0, 1], 1),
          "test": _examples([1, 0, 1], 2),
        },
      },
      "food101": {
        "names": ["apple_pie", "bibimbap"],
        "splits": {"train": _examples([0, 1], 3), "validation": _examples([1], 4)},
      },
      "sun397": {
        "names": ["/a/abbey", "/a/apartment_building/outdoor"],
        "splits": {"train": _examples([0, 1], 5), "test": _examples([1], 6)},
      },
      "caltech101": {
        "names": ["accordion", "background_google", "faces", "faces_easy"],
        "splits": {"train": _examples([0, 1, 2, 3, 2], 7), "test": _examples([3, 2, 1, 0], 8)},
      },
      "imagenet2012": {
        "names": ["n01", "n02"],
        "splits": {"train": _examples([0, 1], 9), "validation": _examples([1], 9)},
      },
      "oxford_flowers102": {
        "names": ["pink primrose"],
        "prepared": False,
        "splits": {"train": [], "test": []},
      },
    }
  )
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", module)
  return module


def test_tfds_splits_names_and_encoded_items(fake_tfds):
  data = datasets.load_tfds("dtd", "/data/tfds")
  assert data.dataset == "dtd" and data.class_names == ("banded", "dotted")
  assert (len(data.train), len(data.val), len(data.test)) == (6, 2, 3)
  np.testing.assert_array_equal(data.test_labels, [1, 0, 1])
  assert isinstance(data.train[0].source, bytes)
  assert augment.eval_view(data.train[0].source, PreprocessConfig(8)).shape == (8, 8, 3)

  food = datasets.load_tfds("food101")  # no "test" split: its validation split is the test set
  assert food.test_labels.tolist() == [1] and food.val == ()
  sun = datasets.load_tfds("sun397")
  assert sun.class_names == ("abbey", "outdoor apartment_building")


def test_tfds_caltech_follows_coop_classes(fake_tfds):
  data = datasets.load_tfds("caltech101")
  assert data.class_names == ("accordion", "face")  # background and the cropped faces dropped
  assert data.train_labels.tolist() == [0, 1, 1] and data.test_labels.tolist() == [1, 0]


def test_tfds_k_shot_reads_only_the_sample(fake_tfds):
  data = datasets.load_tfds("dtd", shots=2, seed=3)
  full = datasets.load_tfds("dtd")
  expected = datasets.sample_k_shot(full.train, 2, seed=3)
  assert [item.source for item in data.train] == [item.source for item in expected]
  assert data.train_labels.tolist() == [0, 0, 1, 1]


def test_tfds_errors(fake_tfds, tmp_path):
  with pytest.raises(DatasetMissingError, match="tfds build oxford_flowers102"):
    datasets.load_tfds("oxford_flowers102", "/data/tfds")
  with pytest.raises(DatasetMissingError, match="no dataset 'nope'"):
    datasets.load_tfds("nope")
  with pytest.raises(DatasetMissingError, match="classnames.txt"):
    datasets.load_tfds("imagenet2012")
  names = tmp_path / "classnames.txt"
  names.write_text("n01 tench\nn02 goldfish\n")
  data = datasets.load_tfds("imagenet2012", class_names=names)
  assert data.dataset == "imagenet" and data.class_names == ("tench", "goldfish")


def test_tfds_not_installed_says_what_to_install(monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # import now raises ImportError
  with pytest.raises(ImportError, match="pip install tensorflow-datasets"):
    datasets.load_tfds("dtd")


# ---------------------------------------------------------------------------------------------
# Issue 26 rows 4 and 10: bounds before allocation, bad split rows named.


def test_a_stray_huge_label_is_named_without_building_the_range(tmp_path):
  import tracemalloc

  _write_dtd(tmp_path)
  path = tmp_path / "dtd" / "split_zhou_DescribableTextures.json"
  split = json.loads(path.read_text())
  split["test"][0][1:] = [10**9, "huge"]
  split["test"][1][1:] = [-2, "negative"]
  path.write_text(json.dumps(split))
  tracemalloc.start()
  try:
    with pytest.raises(ValueError, match=r"negative: \[-2\]; missing: 3..999999999\)") as e:
      datasets.load_coop_split(tmp_path, "dtd")
    peak = tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()
  assert peak < 50 << 20, peak  # a range of 10**9 labels once took 14.5 GB
  assert "number the classes 0, 1, 2" in str(e.value)


@pytest.mark.parametrize(
  "row, match",
  [
    ([7, 0, "banded"], "the image path of [7, 0, 'banded'] is not a non-empty string"),
    ([None, 0, "banded"], "the image path of [None, 0, 'banded']"),
    (["banded/x.png", 0, 3], "the class name of ['banded/x.png', 0, 3] is not a string"),
    (["banded/x.png", float("inf"), "banded"], "is not an integer"),
  ],
)
def test_split_rows_of_the_wrong_type_are_named(tmp_path, row, match):
  from stori_jax.plumbing.errors import InputError

  _write_dtd(tmp_path)
  path = tmp_path / "dtd" / "split_zhou_DescribableTextures.json"
  split = json.loads(path.read_text())
  split["train"].append(row)
  path.write_text(json.dumps(split))
  with pytest.raises(InputError) as e:
    datasets.load_coop_split(tmp_path, "dtd")
  assert match in str(e.value) and str(path) in str(e.value)


def test_synthetic_world_too_large_for_memory_is_refused_before_drawing(monkeypatch):
  monkeypatch.setattr(datasets, "_memory_bytes", lambda: 4 << 30)
  monkeypatch.setattr(
    synthetic_tasks, "fewshot_dataset", lambda *a, **k: pytest.fail("drew images anyway")
  )
  with pytest.raises(ConfigError, match=r"about 4.3 GiB in memory, more than half .* 4.0 GiB"):
    datasets.load_synthetic(1, 0, 100_000, image_size=36)


@pytest.mark.slow
def test_row4_sizes_stop_with_exit_2_before_work_and_under_1_gb(tmp_path, measure_command):
  # the reproducers, as commands: each once took 14.5 to 19 GB or hung
  _write_dtd(tmp_path)
  path = tmp_path / "dtd" / "split_zhou_DescribableTextures.json"
  split = json.loads(path.read_text())
  split["train"].append(["banded/train_0.png", 10**9, "huge"])
  path.write_text(json.dumps(split))
  train = ("--config", "configs/demo.py")
  cases = [
    (("--config", "configs/dtd.py", f"--config.data.root={tmp_path}"), "missing: 3..999999999"),
    ((*train, "--config.views=1000000"), "config.views must be an integer >= 0 and <= 1000"),
    ((*train, "--config.data.n_test_per_class=100000000"), "n_test_per_class must be"),
    ((*train, "--config.data.image_size=100000"), "config.data.image_size must be"),
  ]
  for i, (args, phrase) in enumerate(cases):
    code, stderr, _, rss = measure_command(
      "stori_jax.train", *args, f"--workdir={tmp_path / f'w{i}'}"
    )
    assert code == 2 and "Traceback" not in stderr, stderr[-2000:]
    assert phrase in stderr and stderr.count("error: ") == 1, stderr
    assert rss < 1 << 30, (args, rss)  # a hang is the fixture's timeout


# Fresh views, drawn on the device -------------------------------------------------------------


def _keys(n, seed=0):
  import jax  # noqa: PLC0415

  return jax.vmap(lambda i: jax.random.fold_in(jax.random.key(seed), i))(np.arange(n))


def test_device_crop_boxes_follow_torchvisions_algorithm():
  """`augment.crop_boxes` (JAX random numbers) against `random_resized_crop_box` (torchvision's
  algorithm, tested draw for draw above): boxes inside the image, the same distributions of area
  fraction and aspect ratio, the same central-crop fallback and how often it is taken."""
  import jax  # noqa: PLC0415

  n = 3000
  rng = np.random.default_rng(0)
  # Jitted, as the train step runs it (eager, its ops compiled one by one: 89 programs).
  crop_boxes = jax.jit(augment.crop_boxes)
  for height, width, fallback_box in ((300, 400, (0, 0, 300, 400)), (30, 400, (0, 180, 30, 40))):
    sizes = np.tile(np.asarray([[height, width]], np.int32), (n, 1))
    ours = np.asarray(crop_boxes(_keys(n), sizes), np.float64)
    host = np.array(
      [augment.random_resized_crop_box(height, width, rng) for _ in range(n)], np.float64
    )
    assert np.all(ours[:, :2] >= 0) and np.all(ours[:, 2:] >= 1)
    assert np.all(ours[:, 0] + ours[:, 2] <= height) and np.all(ours[:, 1] + ours[:, 3] <= width)
    quantiles = (0.1, 0.5, 0.9)
    area = lambda boxes: boxes[:, 2] * boxes[:, 3] / (height * width)
    log_aspect = lambda boxes: np.log(boxes[:, 3] / boxes[:, 2])
    for statistic in (area, log_aspect):
      np.testing.assert_allclose(
        np.quantile(statistic(ours), quantiles), np.quantile(statistic(host), quantiles), atol=0.04
      )
    fallback = lambda boxes: np.mean(np.all(boxes == fallback_box, axis=1))
    assert abs(fallback(ours) - fallback(host)) < 0.03
  # A box that cannot hold any attempt: the central crop, its aspect ratio clamped.
  tall = crop_boxes(_keys(4), np.tile(np.asarray([[400, 30]], np.int32), (4, 1)))
  np.testing.assert_array_equal(
    np.asarray(tall), [augment.random_resized_crop_box(400, 30, _NeverFits())] * 4
  )


class _NeverFits:
  """A Generator whose draws make every crop attempt too large (the fallback)."""

  def uniform(self, low, high):
    return high

  def integers(self, low, high):
    return low


def test_device_resize_is_pillows_bicubic_resize_of_the_crop():
  """`augment.resample_weights`, as `device_views` applies it, against Pillow's
  `crop(box).resize(size, BICUBIC)` (what `train_view` does) on the world's images and random
  boxes: all but a few pixels in 100,000 within a level (Pillow's fixed-point weights)."""
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415

  # Jitted, as device_views runs it inside the train step (eager: 85 programs).
  resample_weights = jax.jit(augment.resample_weights, static_argnums=(2, 3))
  data = datasets.load_synthetic(1, 1, 1, image_size=64)
  images = [np.asarray(datasets.open_image(i.source).convert("RGB")) for i in data.train[:4]]
  smooth = np.asarray(
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (12, 9, 3), dtype=np.uint8)).resize(
      (90, 120), Image.BICUBIC
    )
  )
  rng = np.random.default_rng(0)
  differing = total = 0
  for image in [*images, smooth]:
    height, width = image.shape[:2]
    canvas = np.zeros((128, 128, 3), np.uint8)
    canvas[:height, :width] = image
    for _ in range(10):
      size = int(rng.choice([16, 24, 64]))
      crop_h, crop_w = int(rng.integers(1, height + 1)), int(rng.integers(1, width + 1))
      top, left = (
        int(rng.integers(0, height - crop_h + 1)),
        int(rng.integers(0, width - crop_w + 1)),
      )
      theirs = np.asarray(
        Image.fromarray(image)
        .crop((left, top, left + crop_w, top + crop_h))
        .resize((size, size), Image.BICUBIC),
        np.float64,
      )
      rows = np.asarray(resample_weights(jnp.int32(top), jnp.int32(crop_h), size, 128))
      cols = np.asarray(resample_weights(jnp.int32(left), jnp.int32(crop_w), size, 128))
      across = np.clip(np.round(np.einsum("pw,hwc->hpc", cols, canvas.astype(np.float64))), 0, 255)
      ours = np.clip(np.round(np.einsum("oh,hpc->opc", rows, across)), 0, 255)
      # A few levels at most: Pillow rounds each of its two passes to 8 bits, and the installed
      # one runs the vertical pass first for some shapes (measured: at most 4).
      assert np.abs(ours - theirs).max() <= 6, (top, left, crop_h, crop_w, size)
      differing += int(np.sum(np.abs(ours - theirs) > 1))
      total += ours.size
  assert differing / total < 1e-3, differing / total  # measured 4e-5


def test_device_views_crop_resize_flip_and_normalise():
  """A full-image box is the image itself, flipped for about half the keys, normalised as
  `preprocess` normalises; images of other sizes share one canvas (`image_canvas`), the larger
  ones shrunk to its side."""
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415

  rng = np.random.default_rng(0)
  pixels = [rng.integers(0, 256, (16, 16, 3), dtype=np.uint8) for _ in range(2)]
  large = rng.integers(0, 256, (20, 50, 3), dtype=np.uint8)
  canvas = augment.image_canvas([*pixels, large], max_side=40)
  assert canvas.pixels.shape == (3, 16, 40, 3) and canvas.pixels.dtype == np.uint8
  np.testing.assert_array_equal(canvas.sizes, [[16, 16], [16, 16], [16, 40]])
  np.testing.assert_array_equal(canvas.pixels[0, :, :16], pixels[0])
  assert not canvas.pixels[0, :, 16:].any()
  config = PreprocessConfig(image_size=16)
  n = 200
  rows = np.arange(n) % 2
  # Jitted, as the train step runs it (eager, its ops compiled one by one: 111 programs).
  device_views = jax.jit(augment.device_views, static_argnums=(3, 4, 5), static_argnames="scale")
  views = np.asarray(
    device_views(
      jnp.asarray(canvas.pixels[rows]),
      jnp.asarray(canvas.sizes[rows]),
      _keys(n),
      16,
      config.mean,
      config.std,
      scale=(1.0, 1.0),
    )
  )
  flipped = 0
  for view, row in zip(views, rows):
    plain = preprocess(Image.fromarray(pixels[row]), config)
    mirrored = preprocess(Image.fromarray(pixels[row][:, ::-1]), config)
    if np.allclose(view, mirrored, atol=1e-5):
      flipped += 1
    else:
      np.testing.assert_allclose(view, plain, atol=1e-5)
  assert 70 < flipped < 130, flipped
