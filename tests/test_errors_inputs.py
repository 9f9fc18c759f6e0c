"""User errors (stori_jax.plumbing.errors) from the input readers: datasets matched by name, checkpoints and
images that cannot be used, and the mutual-knowledge command lines. Every failure is a UserError
naming the file, key or class and the fix; the command lines exit 2 with one paragraph; a refused
run leaves the old one intact."""

import io
import json
import logging
import os
import shutil
import subprocess
import sys
import types

import huggingface_hub
import huggingface_hub.constants  # a submodule: imported here, not by whichever test ran first
import numpy as np
from tqdm import tqdm
import pytest
from PIL import Image

import stori_jax
from mutual.analysis import runner as analysis
from mutual import run_flags, data
from stori_jax.clip import loading
from stori_jax.plumbing import run_identity
from stori_jax.checkpoints import CheckpointError, hub, validate
from stori_jax.plumbing.config_files import load_config
from stori_jax.data.files import ClassMismatchError
from stori_jax.plumbing.errors import InputError, NonFiniteError, UserError
from stori_jax.fewshot import datasets as fewshot_datasets
from stori_jax.fewshot import prompts
from stori_jax.fewshot.datasets import LabeledImage
from stori_jax.models import CLIPConfig, TextConfig, VisionConfig, init_params
from stori_jax.retrieval import datasets as retrieval_datasets
from stori_jax.plumbing.run_identity import WorkdirMismatchError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(loading.ASSETS_DIR, "tiny-synthetic")
COLOURS = {"blue circle": (20, 40, 230), "red star": (230, 30, 20), "green square": (20, 200, 40)}
DESCRIPTORS = {  # deliberately not in the folders' (sorted) order
  "red star": ["five points", "red colour"],
  "green square": ["four equal sides", "green colour"],
  "blue circle": ["round outline", "blue colour"],
}


def _folders(root, classes=("blue circle", "red star", "green square"), per_class=2, empty=()):
  """root/<class>/<i>.png, each class's images a flat colour of its own (empty: no files)."""
  for name in classes:
    os.makedirs(root / name)
    if name in empty:
      continue
    colour = COLOURS.get(name.lower().replace("_", " "), (128, 128, 128))
    for i in range(per_class):
      Image.fromarray(np.full((24, 30, 3), colour, np.uint8)).save(root / name / f"{i}.png")
  return root


def _descriptor_file(tmp_path, descriptors=DESCRIPTORS, name="descriptors.json"):
  path = tmp_path / name
  path.write_text(json.dumps(descriptors), encoding="utf-8")
  return path


def _folder_config(tmp_path, **data_overrides):
  config = load_config(os.path.join(ROOT, "configs/mutual_imagenet.py"))
  config.model.source = config.model.name = "tiny-synthetic"
  config.data.root = str(tmp_path / "images")
  config.data.descriptors = str(_descriptor_file(tmp_path))
  config.analysis.top_k, config.analysis.u = 4, 3
  config.figure_classes = 0
  for key, value in data_overrides.items():
    config.data[key] = value
  return config


# ---------------------------------------------------------------------------------------------
# Row 2: image folders pair with the descriptor file's classes by name, never by position.


def test_folders_pair_with_descriptors_by_name_not_position(tmp_path):
  _folders(tmp_path / "images", classes=("Blue_Circle", "red star", "green square"))
  dataset = data.prepare(_folder_config(tmp_path))
  # Labels follow the sorted folders; names are the descriptor file's spelling.
  assert dataset.names == ("blue circle", "green square", "red star")
  assert dataset.keys == ("Blue_Circle", "green square", "red star")
  for cls, lists in zip(dataset.classes(16), dataset.lists()):
    assert lists == DESCRIPTORS[cls.name]  # "blue circle" images get "blue circle" descriptors
    assert dataset.descriptors[cls.name] == DESCRIPTORS[cls.name]
    mean = cls.images.reshape(-1, 3).mean(0)
    np.testing.assert_allclose(mean, COLOURS[cls.name], atol=2)
    assert all(i.startswith(dataset.keys[cls.label] + "/") for i in cls.ids)


def test_missing_extra_and_ambiguous_classes_are_listed_with_the_fix(tmp_path):
  _folders(tmp_path / "images", classes=("blue circel", "Red_Star"))
  descriptors = {**DESCRIPTORS, "Red-Star": ["a duplicate spelling"]}
  config = _folder_config(tmp_path)
  config.data.descriptors = str(_descriptor_file(tmp_path, descriptors))
  with pytest.raises(ClassMismatchError) as error:
    data.prepare(config)
  message = str(error.value)
  assert "'blue circel' (nearest: 'blue circle')" in message  # a folder without descriptors
  assert "'green square'" in message and "no images" in message  # descriptor class, no folder
  assert "several descriptor classes for 'Red_Star' ('red star' / 'Red-Star')" in message
  assert "config.data.skip_missing_classes=True" in message and "classnames" in message
  assert isinstance(error.value, UserError)


def test_wnid_folders_need_a_classnames_file(tmp_path):
  _folders(tmp_path / "images", classes=("blue circle", "red star"))
  os.rename(tmp_path / "images" / "blue circle", tmp_path / "images" / "n01")
  os.rename(tmp_path / "images" / "red star", tmp_path / "images" / "n02")
  descriptors = {k: DESCRIPTORS[k] for k in ("red star", "blue circle")}
  config = _folder_config(tmp_path)
  config.data.descriptors = str(_descriptor_file(tmp_path, descriptors))
  with pytest.raises(ClassMismatchError, match=r"None of the 2 classes .*config\.data\.classnames"):
    data.prepare(config)
  (tmp_path / "classnames.txt").write_text("n02 red star\nn01 blue circle\n")
  config.data.classnames = str(tmp_path / "classnames.txt")
  dataset = data.prepare(config)
  assert dataset.names == ("blue circle", "red star") and dataset.keys == ("n01", "n02")
  first = next(dataset.classes(16))
  np.testing.assert_allclose(first.images.reshape(-1, 3).mean(0), COLOURS["blue circle"], atol=2)
  # Two folders may name the same class (CoOp's ImageNet list has two "crane"s).
  shutil.copytree(tmp_path / "images" / "n01", tmp_path / "images" / "n03")
  (tmp_path / "classnames.txt").write_text("n02 red star\nn01 blue circle\nn03 blue circle\n")
  dataset = data.prepare(config)
  assert dataset.names == ("blue circle", "red star", "blue circle")
  assert dataset.lists()[2] == DESCRIPTORS["blue circle"]


# ---------------------------------------------------------------------------------------------
# Row 3: an empty class folder is an error listing it, or skipped with the list printed.


def test_empty_class_folder_is_an_error_or_a_listed_skip(tmp_path, caplog):
  _folders(tmp_path / "images", empty=("green square",))
  config = _folder_config(tmp_path)
  with pytest.raises(ClassMismatchError) as error:
    data.prepare(config)
  message = str(error.value)
  assert "have no images: 'green square'" in message and "Nothing was analysed" in message
  assert "config.data.skip_missing_classes=True" in message
  config.data.skip_missing_classes = True
  with caplog.at_level(logging.WARNING):
    dataset = data.prepare(config)
  assert dataset.skipped == {"green square": "no images"}
  assert "Skipping 1 class(es)" in caplog.text and "'green square': no images" in caplog.text
  assert dataset.names == ("blue circle", "red star")
  assert [c.name for c in dataset.classes(16)] == ["blue circle", "red star"]
  # The stream knows its length: progress bars over the classes show a total.
  assert len(dataset.classes(16)) == 2
  bar = tqdm(dataset.classes(16), disable=True)
  assert bar.total == 2


def test_descriptor_class_with_an_empty_list_is_named(tmp_path):
  path = _descriptor_file(tmp_path, {"red star": ["x"], "blue circle": []})
  with pytest.raises(InputError, match=r"'blue circle'.* have no descriptors") as error:
    data.load_descriptors(path)
  assert str(path) in str(error.value)


def _png_bytes(colour):
  buffer = io.BytesIO()
  Image.fromarray(np.full((8, 8, 3), colour, np.uint8)).save(buffer, format="PNG")
  return buffer.getvalue()


def _fake_tfds(names, examples):
  """A stand-in for tensorflow_datasets with one prepared dataset "fake" (split validation)."""
  builder = types.SimpleNamespace(
    is_prepared=lambda: True,
    data_dir="/fake",
    info=types.SimpleNamespace(features={"label": types.SimpleNamespace(names=names)}),
    as_dataset=lambda split, shuffle_files, decoders: [
      {"image": image, "label": np.int64(label)} for image, label in examples
    ],
  )
  return types.SimpleNamespace(
    builder=lambda name, data_dir=None: builder,
    as_numpy=iter,
    decode=types.SimpleNamespace(SkipDecoding=object),
  )


def test_tfds_labels_match_descriptors_by_name_and_empty_labels_are_listed(tmp_path, monkeypatch):
  names = ["red_star", "Blue_Circle", "green_square"]
  examples = [(_png_bytes(COLOURS["blue circle"]), 1), (_png_bytes(COLOURS["red star"]), 0)]
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", _fake_tfds(names, examples))
  config = _folder_config(tmp_path, source="tfds", tfds_name="fake")
  with pytest.raises(
    ClassMismatchError, match=r"TFDS fake \(validation\) have no images: 'green_square'"
  ):
    data.prepare(config)
  config.data.skip_missing_classes = True
  dataset = data.prepare(config)
  assert dataset.names == ("red star", "blue circle") and dataset.skipped == {
    "green_square": "no images"
  }
  for cls in dataset.classes(8):
    np.testing.assert_allclose(cls.images.reshape(-1, 3).mean(0), COLOURS[cls.name], atol=2)


@pytest.mark.slow
def test_analysis_labels_descriptors_and_skips_by_name(tmp_path):
  """The reproducers end to end: folders in another order than the descriptor file's keys, one
  folder empty. results.json lists the skipped class; every record is its folder's class."""
  _folders(tmp_path / "images", empty=("green square",))
  config = _folder_config(tmp_path, skip_missing_classes=True)
  results = analysis.run(config, str(tmp_path / "out"), progress=False)
  assert results["skipped_classes"] == {"green square": "no images"}
  written = json.loads((tmp_path / "out" / "results.json").read_text())
  assert written["skipped_classes"] == {"green square": "no images"}
  assert set(written["classes"]) == {"blue circle", "red star"}
  for label, folder in enumerate(("blue circle", "red star")):
    for i in range(2):
      record = json.loads((tmp_path / f"out/per_image/{label:04d}/{i:05d}.json").read_text())
      assert record["id"] == f"{folder}/{i}.png" and record["class_name"] == folder


# ---------------------------------------------------------------------------------------------
# Row 16: malformed or Latin-1 descriptor files name the path, the line and the column.


def test_malformed_and_latin1_descriptor_files_name_path_line_and_column(tmp_path):
  bad = tmp_path / "bad.json"
  bad.write_text('{"red star": ["x"],\n "blue circle": [y]}', encoding="utf-8")
  with pytest.raises(InputError) as error:
    data.load_descriptors(bad)
  assert f"{bad} is not valid JSON" in str(error.value)
  assert "line 2, column 18" in str(error.value) and "UTF-8 JSON" in str(error.value)
  latin = tmp_path / "latin.json"
  latin.write_bytes('{"red star": ["x"],\n "caf\xe9": ["y"]}'.encode("latin-1"))
  with pytest.raises(InputError) as error:
    data.load_descriptors(latin)
  message = str(error.value)
  assert str(latin) in message and "not UTF-8" in message and "line 2, column 6" in message


# ---------------------------------------------------------------------------------------------
# Few-shot (CoOp splits, K-shot sampling, CuPL) and retrieval loaders.


def test_coop_split_with_a_class_without_training_images_is_named(tmp_path):
  images = tmp_path / "dtd" / "images"
  split = {"train": [], "val": [], "test": []}
  for label, name in enumerate(("banded", "dotted")):
    os.makedirs(images / name)
    for part in ("train", "test"):
      if name == "dotted" and part == "train":
        continue
      Image.new("RGB", (4, 4)).save(images / name / f"{part}.png")
      split[part].append([f"{name}/{part}.png", label, name])
  (tmp_path / "dtd" / "split_zhou_DescribableTextures.json").write_text(json.dumps(split))
  with pytest.raises(ClassMismatchError, match=r"no train images for 1 class\(es\): 'dotted'"):
    fewshot_datasets.load_coop_split(tmp_path, "dtd")
  (tmp_path / "dtd" / "split_zhou_DescribableTextures.json").write_bytes(b'{"train": [\n  oops')
  with pytest.raises(InputError, match=r"not valid JSON.*line 2, column 3"):
    fewshot_datasets.load_coop_split(tmp_path, "dtd")


def test_k_shot_names_classes_without_any_training_item():
  items = [LabeledImage(f"a{i}", 0) for i in range(4)]
  with pytest.raises(ClassMismatchError, match=r"'dotted' \(label 1\) has 0"):
    fewshot_datasets.sample_k_shot(items, 2, seed=1, class_names=("banded", "dotted"))


def test_cupl_prompts_match_by_name_and_name_empty_and_missing_classes(tmp_path):
  path = tmp_path / "cupl.json"
  path.write_text(json.dumps({"Zig-Zagged": ["z"], "banded": [], "polka dotted": ["p"]}))
  got = prompts.load_cupl_prompts(path, ["polka_dotted", "zig zagged"])
  assert got == (("p",), ("z",))  # in the classes' order, not the file's
  with pytest.raises(ClassMismatchError) as error:
    prompts.load_cupl_prompts(path, ["banded", "polka-dot"])
  message = str(error.value)
  assert str(path) in message and "an empty prompt list for 'banded'" in message
  assert "'polka-dot' (nearest key: 'polka dotted')" in message and "aliases=" in message


def test_retrieval_attributes_match_by_name_and_suggest_the_nearest():
  table = {"Blond_Hair": np.array([True, False]), "Male": np.array([False, True])}
  spec = retrieval_datasets.PromptSpec("a {0}", (("blond hair", "blond", "blond", "dark"),))
  _, tasks, _ = retrieval_datasets.tasks_from_table(table, [spec], None, seed=0)
  np.testing.assert_array_equal(tasks[0].labels[:, 0], [True, False])
  spec = retrieval_datasets.PromptSpec("a {0}", (("Blonde_Hair", "blond", "blond", "dark"),))
  with pytest.raises(ClassMismatchError, match="did you mean 'Blond_Hair'"):
    retrieval_datasets.tasks_from_table(table, [spec], None, seed=0)


# ---------------------------------------------------------------------------------------------
# Rows 12, 14, 8, 17: checkpoints. Every failure names the path and what is wrong.


def _copy_tiny(tmp_path, name="ckpt"):
  return shutil.copytree(TINY, tmp_path / name)


def test_truncated_and_empty_params_safetensors_name_the_file(tmp_path):
  directory = _copy_tiny(tmp_path)
  params = directory / "params.safetensors"
  params.write_bytes(params.read_bytes()[:5000])
  with pytest.raises(CheckpointError) as error:
    stori_jax.load(directory)
  assert f"{params} is not a readable safetensors file" in str(error.value)
  assert "truncated" in str(error.value)
  params.write_bytes(b"")
  with pytest.raises(CheckpointError, match=r"params\.safetensors is empty \(0 bytes\)"):
    stori_jax.load(directory)


def test_zero_byte_and_text_pt_files_name_the_file(tmp_path):
  path = tmp_path / "model.pt"
  path.write_bytes(b"")
  with pytest.raises(CheckpointError, match=f"{path} is empty"):
    stori_jax.load(path)
  path.write_text("<!DOCTYPE html><html>Not found</html>\n")
  with pytest.raises(CheckpointError) as error:
    stori_jax.load(path)
  assert f"Cannot read {path} as a PyTorch checkpoint" in str(error.value)
  assert "HTML page" in str(error.value)
  path.write_text("just some notes\n")
  with pytest.raises(CheckpointError, match="it is a text file"):
    stori_jax.load(path)


def test_config_value_of_the_wrong_type_names_the_key_and_the_type(tmp_path):
  directory = _copy_tiny(tmp_path)
  meta_path = directory / "stori_config.json"
  meta = json.loads(meta_path.read_text())
  meta["config"]["text"]["layers"] = "six"
  meta_path.write_text(json.dumps(meta))
  with pytest.raises(CheckpointError) as error:
    stori_jax.load(directory)
  assert str(meta_path) in str(error.value)
  assert "text.layers is 'six' (str); it must be an integer" in str(error.value)
  meta["config"]["text"]["layers"] = 6
  meta["config"]["vision"]["widht"] = 96
  meta_path.write_text(json.dumps(meta))
  with pytest.raises(CheckpointError, match="'vision.widht' \\(did you mean 'vision.width'\\?\\)"):
    stori_jax.load(directory)
  # transformers' config.json: the file's own key names.
  hf_dir = tmp_path / "hf"
  hf_dir.mkdir()
  (hf_dir / "config.json").write_text(
    json.dumps({"model_type": "clip", "text_config": {"num_hidden_layers": "six"}})
  )
  with pytest.raises(CheckpointError, match="text_config.num_hidden_layers is 'six'"):
    stori_jax.load(hf_dir)


def test_checkpoint_with_nan_params_names_the_file_and_parameter(tmp_path):
  config = CLIPConfig(
    embed_dim=16,
    text=TextConfig(width=32, layers=1, heads=1, context_length=16),
    vision=VisionConfig(image_size=16, patch_size=8, width=32, layers=1, heads=1),
  )
  params = init_params(config, seed=0)
  flat = {k: np.array(v) for k, v in validate.flatten(params).items()}
  flat["vision/proj"][0, 0] = np.nan
  bundle = stori_jax.CLIPBundle(config=config, params=validate.unflatten(flat))
  directory = stori_jax.save(bundle, tmp_path / "nan")
  with pytest.raises(NonFiniteError) as error:
    stori_jax.load(directory)
  assert os.path.join(directory, "params.safetensors") in str(error.value)
  assert "vision/proj has 1 NaN or infinite value(s)" in str(error.value)


def test_arch_that_contradicts_or_is_unknown_is_an_error_naming_both():
  with pytest.raises(CheckpointError) as error:
    stori_jax.load("tiny-synthetic", arch="ViT-Q-99")
  assert "arch='ViT-Q-99', given for tiny-synthetic, is not a known architecture" in str(
    error.value
  )
  with pytest.raises(CheckpointError) as error:
    stori_jax.load("tiny-synthetic", arch="ViT-B-32")
  message = str(error.value)
  assert "arch='ViT-B-32' contradicts the architecture that tiny-synthetic records" in message
  assert "embed_dim: 64 in the checkpoint, 512 in arch" in message
  loaded = stori_jax.load("tiny-synthetic")
  same = loaded.config.replace(name="my name for it")
  assert stori_jax.load("tiny-synthetic", arch=same).config == loaded.config


def test_a_path_that_exists_but_is_no_checkpoint_does_not_say_missing():
  with pytest.raises(CheckpointError) as error:
    stori_jax.load("/dev/null")
  assert "/dev/null exists but is not a regular file" in str(error.value)
  assert "does not exist" not in str(error.value)


@pytest.mark.parametrize("how", ["offline flag", "unreachable host"])
def test_unknown_hub_id_fails_fast_naming_the_id_and_a_local_path(tmp_path, monkeypatch, how):
  monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
  if how == "offline flag":
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  else:  # nothing listens on port 9 of loopback: the probe is refused at once
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    for proxy in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
      monkeypatch.delenv(proxy, raising=False)
    hub._probe.cache_clear()
  # Fast means no download is even tried (huggingface_hub's retries would take many seconds).
  monkeypatch.setattr(
    huggingface_hub, "hf_hub_download", lambda *a, **k: pytest.fail("a download was tried")
  )
  with pytest.raises(CheckpointError) as error:
    stori_jax.load("no-such-org/no-such-clip")
  message = str(error.value)
  assert "no-such-org/no-such-clip" in message and "is not a local path either" in message
  assert "stori_jax.load('checkpoints/no-such-org__no-such-clip')" in message
  hub._probe.cache_clear()


# ---------------------------------------------------------------------------------------------
# Rows 10, 16: images.


def test_empty_batches_and_zero_sized_images_are_rejected_with_the_shapes(tiny_synthetic):
  with pytest.raises(InputError, match=r"empty batch of shape \(0, 64, 64, 3\)"):
    tiny_synthetic.encode_image(np.zeros((0, 64, 64, 3), np.float32))
  with pytest.raises(InputError, match=r"Zero-sized images of shape \(2, 0, 0, 3\)"):
    tiny_synthetic.encode_image(np.zeros((2, 0, 0, 3), np.float32))
  with pytest.raises(InputError, match="size 5x0 has no pixels"):
    tiny_synthetic.preprocess(np.zeros((0, 5, 3), np.uint8))
  with pytest.raises(InputError, match="the list is empty"):
    tiny_synthetic.preprocess([])
  with pytest.raises(InputError, match=r"token ids have shape \(0, 64\)"):
    tiny_synthetic.encode_text(np.zeros((0, 64), np.int32))


def test_corrupt_and_truncated_jpegs_name_the_file(tmp_path, tiny_synthetic):
  path = tmp_path / "photo.jpg"
  Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), np.uint8)).save(path)
  path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
  with pytest.raises(InputError) as error:
    tiny_synthetic.preprocess(str(path))
  assert f"Cannot read the image {path}" in str(error.value)
  assert "truncated" in str(error.value)
  path.write_bytes(b"not a jpeg at all")
  with pytest.raises(InputError, match=f"Cannot read the image {path}"):
    tiny_synthetic.preprocess([str(path)])
  with pytest.raises(FileNotFoundError, match="does not exist"):  # and a UserError
    tiny_synthetic.preprocess(str(tmp_path / "nowhere.jpg"))


def test_corrupt_image_in_a_class_folder_names_the_file(tmp_path):
  _folders(tmp_path / "images", classes=("blue circle", "red star"))
  broken = tmp_path / "images" / "red star" / "1.png"
  intact = broken.read_bytes()
  broken.write_bytes(intact[:40])
  config = _folder_config(tmp_path)
  config.data.descriptors = str(
    _descriptor_file(tmp_path, {k: DESCRIPTORS[k] for k in ("blue circle", "red star")})
  )
  # Checked before any work: the file starts as a PNG but its header is cut.
  with pytest.raises(InputError, match=rf"{broken}: truncated or corrupt \(PNG"):
    data.prepare(config)
  # A file that breaks after the check is still named where its class is read.
  broken.write_bytes(intact)
  classes = data.prepare(config).classes(16)
  broken.write_bytes(intact[:40])
  next(classes)
  with pytest.raises(InputError, match=f"Cannot read the image {broken}"):
    next(classes)


def _truncated_jpeg(path):
  pixels = np.random.default_rng(1).integers(0, 255, (48, 40, 3), np.uint8)
  Image.fromarray(pixels).save(path, format="JPEG")
  path.write_bytes(path.read_bytes()[: path.stat().st_size * 2 // 3])


def test_analyze_checks_every_image_before_the_model_loads(tmp_path, run_command, monkeypatch):
  """Issue 36: a directory named x.png in the second class and a truncated JPEG in the third
  stop `mutual.analyze` with exit 2 before the model loads or any class is analysed, both
  named in one paragraph with their own reasons."""
  _folders(tmp_path / "images", per_class=2)  # blue circle, green square, red star (sorted)
  folder = tmp_path / "images" / "green square" / "x.png"
  folder.mkdir()
  jpeg = tmp_path / "images" / "red star" / "2.jpg"
  _truncated_jpeg(jpeg)
  monkeypatch.setattr(stori_jax, "load", lambda *a, **k: pytest.fail("the model loaded"))
  monkeypatch.setattr(
    analysis.pipeline, "analyze_class", lambda *a, **k: pytest.fail("a class was analysed")
  )
  done = run_command(
    "mutual.analyze",
    "--config",
    os.path.join(ROOT, "configs/mutual_imagenet.py"),
    f"--workdir={tmp_path / 'out'}",
    f"--config.data.root={tmp_path / 'images'}",
    f"--config.data.descriptors={_descriptor_file(tmp_path)}",
    "--config.model.source=tiny-synthetic",
  )
  _assert_user_error(
    done,
    "2 of the 8 images",
    f"{folder}: is a directory",
    f"{jpeg}: truncated (JPEG",
    "nothing was done",
  )
  assert not (tmp_path / "out").exists()  # before the claim: no workdir, no class


# ---------------------------------------------------------------------------------------------
# Build 1 and 6 for mutual analyze / evaluate / sweep: run identity and exit code 2.


def test_a_workdir_of_another_run_is_refused_before_work_and_kept(tmp_path):
  _folders(tmp_path / "images")
  old = _folder_config(tmp_path)
  workdir = tmp_path / "out"
  run_flags.claim_workdir(old, str(workdir), False, "mutual-knowledge analysis")
  (workdir / "results.json").write_text('{"old": true}\n')
  new = _folder_config(tmp_path)
  new.analysis.top_k = 5
  with pytest.MonkeyPatch.context() as patch:  # refused before the model loads
    patch.setattr(stori_jax, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(WorkdirMismatchError) as error:
      analysis.run(new, str(workdir), progress=False)
  message = str(error.value)
  assert "config.analysis.top_k: 4 then, 5 now" in message and "--restart" in message
  assert (workdir / "results.json").read_text() == '{"old": true}\n'
  # Editing the descriptor file changes the identity too.
  _descriptor_file(tmp_path, {**DESCRIPTORS, "red star": ["six points"]})
  with pytest.raises(WorkdirMismatchError, match="data.descriptors_sha256"):
    run_flags.claim_workdir(old, str(workdir), False, "mutual-knowledge analysis")
  moved = run_flags.claim_workdir(new, str(workdir), True, "mutual-knowledge analysis")
  assert moved and os.path.basename(moved).startswith("out.old-")
  assert open(os.path.join(moved, "results.json")).read() == '{"old": true}\n'
  assert sorted(os.listdir(workdir)) == [".lock", "run.json"]


def _run_cli(module, *args, timeout=300):
  """`python -m module *args` as a program: the one such run of each mutual command (their
  other tests run them in-process)."""
  return subprocess.run(
    [sys.executable, "-m", module, *args],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=timeout,
    env=dict(os.environ, HF_HUB_OFFLINE="1"),
  )


def _assert_user_error(done, *expected):
  assert done.returncode == 2, done.stderr[-3000:]
  assert "Traceback" not in done.stderr
  error = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
  assert len(error) == 1, done.stderr[-3000:]  # one paragraph
  for text in expected:
    assert text in error[0], error[0]


def test_analyze_cli_mismatched_classes_exit_2_before_any_work(tmp_path):
  _folders(tmp_path / "images", empty=("green square",))
  done = _run_cli(
    "mutual.analyze",
    "--config",
    os.path.join(ROOT, "configs/mutual_imagenet.py"),
    f"--workdir={tmp_path / 'out'}",
    f"--config.data.root={tmp_path / 'images'}",
    f"--config.data.descriptors={_descriptor_file(tmp_path)}",
  )
  _assert_user_error(done, "'green square'", "skip_missing_classes=True")
  assert not (tmp_path / "out").exists()


def test_evaluate_cli_refuses_a_workdir_of_another_run_and_keeps_it(tmp_path):
  workdir = tmp_path / "out"
  other = load_config(os.path.join(ROOT, "configs/mutual_eval_synthetic.py"))
  other.data.seed = 7
  run_flags.claim_workdir(other, str(workdir), False, "mutual-knowledge evaluation")
  run_identity.release_workdirs()  # that run ended; the command below is another process
  (workdir / "table1.json").write_text("{}\n")
  before = {p: (workdir / p).read_bytes() for p in os.listdir(workdir)}
  done = _run_cli(
    "mutual.evaluate",
    "--config",
    os.path.join(ROOT, "configs/mutual_eval_synthetic.py"),
    f"--workdir={workdir}",
  )
  _assert_user_error(done, "config.data.seed: 7 then, 0 now", "--restart")
  assert {p: (workdir / p).read_bytes() for p in os.listdir(workdir)} == before


def test_sweep_cli_refuses_an_analysis_workdir_and_keeps_it(tmp_path):
  workdir = tmp_path / "out"
  analysis = load_config(os.path.join(ROOT, "configs/mutual_synthetic.py"))
  run_flags.claim_workdir(analysis, str(workdir), False, "mutual-knowledge analysis")
  run_identity.release_workdirs()  # that run ended; the command below is another process
  (workdir / "results.json").write_text('{"analysis": 1}\n')
  done = _run_cli(
    "mutual.sweep",
    "--config",
    os.path.join(ROOT, "configs/mutual_sweep.py:random"),
    f"--workdir={workdir}",
  )
  _assert_user_error(
    done, "command: 'mutual-knowledge analysis' then, 'mutual-knowledge sweep' now"
  )
  assert (workdir / "results.json").read_text() == '{"analysis": 1}\n'
