"""The mutual-knowledge pipeline end to end: the embedded world (ground truth), reports, the CLI
(run in this process; tests/test_errors_inputs.py runs it as a program)."""

import json
import os
import types

import jax.numpy as jnp
import numpy as np
import pytest

from mutual.analysis import runner as analysis
from mutual import analyze, data, descriptors, information, pipeline, report, transport
from stori_jax.plumbing.config_files import load_config
from test_cli import assert_ends_with_outputs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(path="configs/mutual_synthetic.py", argument=None):
  return load_config(os.path.join(ROOT, path), argument)


def test_language_stages_compose_the_stage_functions():
  """The jitted batch equals the stages called one by one (and their invariants hold)."""
  rng = np.random.default_rng(0)
  b, l, d, e, c = 3, 5, 50, 16, 4
  unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
  desc = unit(rng.normal(size=(d, e))).astype(np.float32)
  image = unit(rng.normal(size=(b, e)) + desc[:3].sum(0)).astype(np.float32)
  concepts = (0.7 * image[:, None] + 0.3 * unit(rng.normal(size=(b, l, e)))).astype(np.float32)
  valid = np.ones((b, l), bool)
  valid[2, 4] = False
  classes = unit(rng.normal(size=(c, e))).astype(np.float32)
  predicted = jnp.array([1, 3, 1])
  out = pipeline.language_stages(
    concepts, valid, image, desc, classes, predicted, top_k=20, u=10, solver="reference"
  )
  scores = np.einsum("ble,de->bld", concepts, desc)
  cand = descriptors.select_candidates(scores, valid, image @ desc.T, k=20)
  np.testing.assert_array_equal(out["candidates"], cand)
  ids, ok = transport.concept_descriptors(scores, valid, cand, solver="reference")
  np.testing.assert_array_equal(out["concept_ids"], ids)
  for i in range(b):
    chosen = set(np.asarray(ids[i])[np.asarray(ok[i])].tolist())
    n = int(out["n_visual"][i])
    visual = np.asarray(out["visual_ids"][i][:n])
    assert set(visual.tolist()) == chosen and len(visual) == len(chosen)
    assert np.all(np.asarray(cand[i])[visual])
    relevance = (image[i] @ desc.T)[visual]
    assert np.all(np.diff(relevance) <= 1e-6)  # importance order
    want_lang = np.argsort(-(desc @ classes[int(predicted[i])]))[:10]
    np.testing.assert_array_equal(out["language_ids"][i], want_lang)
    k = len(set(visual.tolist()) & set(want_lang.tolist()))
    expect = np.log(n * 10 * k) if k else 0.0
    assert float(out["curve"][i, 0]) == pytest.approx(expect, abs=1e-5)


def test_aggregate_zero_pads_curves_and_formats_table_3():
  def record(name, correct, curve):
    m = dict(
      mi=curve[0],
      curve=curve,
      auc=float(np.mean(curve)),
      visual_descriptors=["x"] * (len(curve) - 1),
      mutual_descriptors=[],
      entropy=1.0,
      entropy_without_ot=0.5,
    )
    return dict(class_name=name, correct=correct, methods=dict(pca=m, kmeans=m))

  records = [
    record("a", True, [3.0, 2.0, 0.0]),
    record("a", False, [4.0, 1.0, 1.0, 0.0]),
    record("b", True, [2.0, 0.0]),
  ]
  out = report.aggregate(records, ("pca", "kmeans"))
  a = out["classes"]["a"]["pca"]
  np.testing.assert_allclose(a["curve"], [3.5, 1.5, 0.5, 0.0])
  assert a["auc"] == pytest.approx(5.5 / 4)
  assert a["mean_image_auc"] == pytest.approx((5 / 3 + 1.5) / 2)
  ds = out["dataset"]
  np.testing.assert_allclose(ds["pca"]["curve"], [3.0, 1.0, 1 / 3, 0.0], atol=1e-6)
  assert ds["top1"] == pytest.approx(200 / 3, abs=1e-4) and ds["pca"]["mi"] == pytest.approx(3.0)
  table = report.markdown_table(ds, "tiny", ("pca", "kmeans"))
  assert "| Model | Top-1 (%) | MI PCA | MI K-means | AUC PCA | AUC K-means |" in table
  assert "| tiny | 66.67 | 3.000 | 3.000 | 1.083 | 1.083 |" in table


def _figures(monkeypatch):
  """The figures the plot functions close (their texts stay readable)."""
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  closed, close = [], plt.close
  monkeypatch.setattr(plt, "close", lambda fig=None: (closed.append(fig), close(fig)))
  return closed


def test_concept_outlines_and_labels_stand_out_on_red_orange_and_yellow_objects(
  tmp_path, monkeypatch
):
  """Fig. 4: every concept's outline (its colour on a black halo) contrasts by >= 3:1 (WCAG's
  minimum for graphics) with every object and background colour of the world, red, orange and
  yellow included; its label is black on its colour (>= 7:1); captions are black on the white
  page, and no text falls outside the figure; the title names the model and the method."""
  from matplotlib.colors import to_rgb  # pylint: disable=C0415

  from stori_jax.data.synthetic import BACKGROUND_RGB, COLOUR_RGB  # pylint: disable=C0415

  assert report.contrast_ratio((1, 1, 1), (0, 0, 0)) == pytest.approx(21.0)
  # The measure catches the old drawing: a red concept on a red object.
  assert report.contrast_ratio((1, 0, 0), np.array(COLOUR_RGB["red"]) / 255) < 1.5
  for concept in range(len(report.COLOURS)):
    for name, rgb in {**COLOUR_RGB, **BACKGROUND_RGB}.items():
      assert report.outline_contrast(concept, np.array(rgb) / 255) >= 3.0, (concept, name)
    assert report.contrast_ratio((0, 0, 0), report.COLOURS[concept]) >= 7.0

  size, grid = 64, 4
  images, records = [], []
  long = "a bright and glossy surface with many small speckles all over it"
  for colour in ("red", "orange", "yellow"):
    image = np.full((size, size, 3), 238, np.uint8)
    image[8:56, 8:56] = COLOUR_RGB[colour]
    images.append(image)
    concept_map = np.arange(grid * grid).reshape(grid, grid) % 5
    concepts = [dict(concept=c, descriptors=[long, f"{colour} colour"]) for c in range(5)]
    method = dict(concept_map=concept_map.tolist(), concepts=concepts)
    records.append(dict(class_name=colour, predicted_name=colour, methods=dict(pca=method)))
  figures = _figures(monkeypatch)
  report.plot_concepts(str(tmp_path / "c.png"), np.stack(images), records, "pca", model="M-1")
  (fig,) = figures
  assert "M-1" in fig._suptitle.get_text() and "PCA" in fig._suptitle.get_text()
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=C0415

  canvas = FigureCanvasAgg(fig)  # a closed figure has lost its canvas
  canvas.draw()
  renderer = canvas.get_renderer()
  page = fig.bbox
  texts = [t for ax in fig.axes for t in ax.texts]
  lines = [t for t in texts if len(t.get_text()) > 3]
  assert len(lines) >= 3 * 5 * 2  # every concept's descriptors, wrapped
  for text in texts + [fig._suptitle]:
    box = text.get_window_extent(renderer)
    assert page.x0 - 1 <= box.x0 and box.x1 <= page.x1 + 1, text.get_text()
    assert page.y0 - 1 <= box.y0 and box.y1 <= page.y1 + 1, text.get_text()
  for text in lines:
    assert report.contrast_ratio(to_rgb(text.get_color()), (1, 1, 1)) >= 7.0


@pytest.mark.slow
def test_embedded_world_concepts_land_on_objects_and_name_their_attributes(tiny_synthetic):
  """Ground truth of the generator: concept regions lie on the objects far more than the
  objects' share of the image, and the chosen descriptors name the object's attributes
  (colour, pattern, shape, size) more often than the bank's share of such descriptors."""
  config = _config()
  bundle = tiny_synthetic
  per_class = data.synthetic_descriptors()
  names = list(per_class)
  bank_list = pipeline.bank_descriptors(config, per_class)
  bank = pipeline.encode_bank(bundle, names, list(per_class.values()), bank_list, progress=False)
  overlap, hits, correct = [], [], []
  for cls in data.synthetic_classes(8, seed=1, classes=(0, 3, 6, 9)):
    result = pipeline.analyze_class(bundle, cls.images, bank, config.analysis)
    correct += list(result["predicted"] == cls.label)
    for method in ("pca", "kmeans"):
      r = result[method]
      overlap.append(data.object_overlap(cls.truth, r["pixel_maps"]))
      hits.append(
        data.descriptor_hits(cls.truth, bank.descriptors, r["visual_ids"], r["visual_valid"])
      )
      lengths = r["n_visual"] + 1
      assert np.all(lengths <= config.analysis.n_concepts * config.analysis.top_descriptors + 1)
      for curve, n in zip(r["curve"], lengths):
        assert np.all(np.diff(curve[:n]) <= 1e-6)  # removing descriptors never adds matches
        assert curve[n - 1] == 0.0  # all removed: no match left
  on_object, chance = np.mean(overlap, axis=0)
  hit, hit_chance = np.mean(hits, axis=0)
  assert on_object > 3 * chance, (on_object, chance)
  assert hit > 1.5 * hit_chance, (hit, hit_chance)
  assert np.mean(correct) > 0.5


@pytest.mark.slow
def test_cli_outputs_are_complete_and_deterministic(tmp_path, run_command):
  """configs/mutual_synthetic.py:smoke (class 2, 4 images, 2 figures) through the CLI twice."""
  smoke = _config("configs/mutual_synthetic.py", "smoke")
  assert tuple(smoke.data.classes) == (2,) and smoke.data.images_per_class == 4
  assert smoke.figures_per_class == 2
  config = os.path.join(ROOT, "configs/mutual_synthetic.py:smoke")
  outputs = []
  for run in ("a", "b"):
    workdir = tmp_path / run
    done = run_command(analyze, "--config", config, f"--workdir={workdir}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| Model | Top-1 (%)" in done.stdout
    # Issue 29: the compile is named before the first class, and kept out of the ETA.
    compiling = done.stderr.index("compiling (first class)...")
    assert compiling < done.stderr.index("first class done in") < done.stderr.rindex("classes:")
    paths = assert_ends_with_outputs(done.stdout, "run.json", "results.json", "table.md")
    assert {str(workdir / "figures") + os.sep, str(workdir / "per_image") + os.sep} <= set(paths)
    outputs.append(workdir)
  a, b = outputs
  for name in (
    "results.json",
    "table.md",
    "per_image/0002/00000.json",
    "per_image/0002/00003.json",
  ):
    assert (a / name).read_bytes() == (b / name).read_bytes(), name
  for name in (
    "concepts_pca_0002.png",
    "concepts_kmeans_0002.png",
    "mutual_pca_0002.png",
    "curves_0002.png",
    "curves.png",
  ):
    assert (a / "figures" / name).stat().st_size > 1000
  record = json.loads((a / "per_image/0002/00000.json").read_text())
  pca = record["methods"]["pca"]
  assert pca["concepts"] and all(c["descriptors"] for c in pca["concepts"])
  assert set(pca["mutual_descriptors"]) <= set(pca["visual_descriptors"])
  assert set(pca["mutual_descriptors"]) <= set(pca["language_descriptors"])
  assert len(pca["curve"]) == len(pca["visual_descriptors"]) + 1
  assert pca["auc"] == pytest.approx(np.mean(pca["curve"]), abs=1e-5)
  results = json.loads((a / "results.json").read_text())
  assert results["dataset"]["images"] == 4 and set(results["classes"]) == {record["class_name"]}
  curve = results["dataset"]["pca"]["curve"]
  assert results["dataset"]["pca"]["auc"] == pytest.approx(information.curve_auc(curve), abs=1e-5)


#: Four classes of the embedded world, two images each, the first a figure class: the resume
#: tests' command (`mutual.analyze`).
RESUME_FLAGS = (
  "--config",
  os.path.join(ROOT, "configs/mutual_synthetic.py"),
  "--config.data.classes=(0, 1, 2, 3)",
  "--config.data.images_per_class=2",
  "--config.figure_classes=1",
  "--config.figures_per_class=2",
)


def _counting_classes(monkeypatch) -> list:
  """Counts the classes `mutual.analyze` analyses in this process (their labels)."""
  analysed = []
  analyze_class = pipeline.analyze_class

  def counting(bundle, images, *args, **kwargs):
    analysed.append(len(images))
    return analyze_class(bundle, images, *args, **kwargs)

  monkeypatch.setattr(analysis.pipeline, "analyze_class", counting)
  return analysed


def _outputs(workdir) -> dict:
  """results.json and every per-image record of a workdir, parsed."""
  found = {"results.json": json.loads((workdir / "results.json").read_text())}
  for path in sorted((workdir / "per_image").rglob("*.json")):
    found[str(path.relative_to(workdir))] = json.loads(path.read_text())
  return found


@pytest.mark.slow
def test_rerun_keeps_the_finished_classes(tmp_path, run_command, monkeypatch, capsys):
  """Issue 36: the same `mutual.analyze` command on a finished 4-class run analyses no class
  and loads no model (a fraction of the first run's time), and writes the same results; a
  class whose file is gone, or whose images changed, is analysed again, alone."""
  import time  # pylint: disable=import-outside-toplevel

  import stori_jax  # pylint: disable=import-outside-toplevel

  analysed = _counting_classes(monkeypatch)
  workdir = tmp_path / "run"
  start = time.perf_counter()
  done = run_command(analyze, *RESUME_FLAGS, f"--workdir={workdir}")
  first = time.perf_counter() - start
  assert done.returncode == 0, done.stderr[-3000:]
  assert analysed == [2, 2, 2, 2]
  assert sorted(os.listdir(workdir / "classes")) == [
    "0000.json",
    "0000_fig5.npz",
    "0001.json",
    "0002.json",
    "0003.json",
  ]
  before = _outputs(workdir)
  load = stori_jax.load
  monkeypatch.setattr(stori_jax, "load", lambda *a, **k: pytest.fail("the model was loaded"))
  start = time.perf_counter()
  again = run_command(analyze, *RESUME_FLAGS, f"--workdir={workdir}")
  second = time.perf_counter() - start
  assert again.returncode == 0, again.stderr[-3000:]
  with capsys.disabled():  # the times, for the record (asserted: no class analysed again)
    print(f"\nmutual.analyze, 4 classes: first run {first:.1f} s, the same command {second:.1f} s")
  assert analysed == [2, 2, 2, 2]  # no class analysed again
  assert "resuming: 4 of 4 classes" in again.stderr and "compiling" not in again.stderr
  assert _outputs(workdir) == before
  assert (workdir / "figures" / "fig5_pca.png").stat().st_size > 1000
  # A class file gone (a run killed between its records and its file): that class alone.
  monkeypatch.setattr(stori_jax, "load", load)
  os.remove(workdir / "classes" / "0002.json")
  third = run_command(analyze, *RESUME_FLAGS, f"--workdir={workdir}")
  assert third.returncode == 0, third.stderr[-3000:]
  assert analysed == [2, 2, 2, 2, 2] and "resuming: 3 of 4 classes" in third.stderr
  assert _outputs(workdir) == before
  # Another config is refused, as before (run.json).
  other = run_command(analyze, *RESUME_FLAGS, "--config.data.seed=1", f"--workdir={workdir}")
  assert other.returncode == 2 and "data.seed" in other.stderr


@pytest.mark.slow
def test_a_killed_analysis_resumes_to_the_uninterrupted_results(tmp_path, run_command, monkeypatch):
  """Issue 36: `mutual.analyze` SIGKILLed after its first class and started again with the
  same command analyses only the classes left and writes the same results.json (and records)
  as a run that was never interrupted."""
  import signal  # pylint: disable=import-outside-toplevel
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  import time  # pylint: disable=import-outside-toplevel

  whole = run_command(analyze, *RESUME_FLAGS, f"--workdir={tmp_path / 'whole'}")
  assert whole.returncode == 0, whole.stderr[-3000:]
  workdir = tmp_path / "killed"
  process = subprocess.Popen(
    [sys.executable, "-m", "mutual.analyze", *RESUME_FLAGS, f"--workdir={workdir}"],
    cwd=ROOT,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    env=dict(os.environ, HF_HUB_OFFLINE="1"),
  )
  deadline = time.monotonic() + 600
  while not (workdir / "classes" / "0000.json").exists():
    assert process.poll() is None, process.stderr.read().decode()[-3000:]
    assert time.monotonic() < deadline, "no class finished in 10 minutes"
    time.sleep(0.02)
  process.send_signal(signal.SIGKILL)
  process.wait()
  process.stderr.close()
  assert not (workdir / "results.json").exists()
  finished = [n for n in os.listdir(workdir / "classes") if n.endswith(".json")]
  assert 1 <= len(finished) < 4, finished
  analysed = _counting_classes(monkeypatch)
  resumed = run_command(analyze, *RESUME_FLAGS, f"--workdir={workdir}")
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert len(analysed) == 4 - len(finished)
  assert _outputs(workdir) == _outputs(tmp_path / "whole")


def test_progress_names_the_compile_before_the_first_class(capsys):
  """The first class compiles the pipeline: said before it starts, and its time kept out of
  the bar's rate and ETA (the bar starts after it, at 1 of 3)."""
  import sys  # pylint: disable=import-outside-toplevel

  for cls in analysis._progress([0, 1, 2], show=True):  # pylint: disable=protected-access
    print(f"body {cls}", file=sys.stderr)
  err = capsys.readouterr().err
  order = [err.index(s) for s in ("compiling (first class)...", "body 0", "first class done")]
  assert order == sorted(order) and order[-1] < err.index("body 1"), err
  assert "left out of the ETA" in err and "1/3" in err and "3/3" in err
  assert " 0/3" not in err  # no bar while the first class runs
  for _ in analysis._progress([0, 1], show=False):  # pylint: disable=protected-access
    pass
  assert capsys.readouterr().err == ""


def test_cli_missing_descriptors_names_the_url(tmp_path, run_command):
  missing = tmp_path / "descriptors_imagenet.json"
  done = run_command(
    analyze,
    "--config",
    os.path.join(ROOT, "configs/mutual_imagenet.py"),
    f"--workdir={tmp_path / 'out'}",
    f"--config.data.descriptors={missing}",
    f"--config.data.root={tmp_path}",
  )
  assert done.returncode != 0
  assert data.descriptors_url("imagenet") in done.stderr and str(missing) in done.stderr
  assert "Traceback" not in done.stderr


@pytest.mark.parametrize("name", ["mutual_imagenet", "mutual_places365", "mutual_food101"])
def test_real_dataset_configs(name):
  config = _config(f"configs/{name}.py")
  assert config.data.dataset in data.DESCRIPTOR_FILES
  assert config.analysis.top_k == 500 and config.analysis.u == 50
  assert config.analysis.n_concepts == 5 and config.analysis.top_descriptors == 3
  assert all("{c}" in t for t in config.analysis.templates)


def _image_folder(root, classes=("b_class", "a_class"), per_class=3):
  from PIL import Image

  batch = data.synthetic_classes(per_class * len(classes), seed=5, classes=(0,))
  images = next(batch).images
  for c, name in enumerate(classes):
    os.makedirs(root / name)
    for i in range(per_class):
      Image.fromarray(images[c * per_class + i]).save(root / name / f"{i}.png")
  return images


def test_folder_source_names_classes_from_the_descriptor_file(tmp_path):
  _image_folder(tmp_path / "images", classes=("second_class", "First-Class"))
  per_class = {"second class": ["striped"], "first class": ["round", "red"]}
  found = data.folder_dataset(str(tmp_path / "images"), per_class, images_per_class=2)
  names, it = list(found.names), found.classes(32)
  # Matched by name (case, '_' and '-' ignored); labels follow the sorted folders.
  assert names == ["first class", "second class"]
  got = list(it)
  assert [c.label for c in got] == [0, 1] and got[1].name == "second class"
  assert got[0].images.shape == (2, 32, 32, 3) and got[0].images.dtype == np.uint8
  assert got[0].ids == ("First-Class/0.png", "First-Class/1.png")
  with pytest.raises(ValueError, match="classnames"):
    data.folder_dataset(str(tmp_path / "images"), {"only one": ["x"]})
  with pytest.raises(FileNotFoundError, match="does not exist"):
    data.folder_dataset(str(tmp_path / "missing"), per_class)


def test_classes_are_picked_by_index_or_by_name_in_the_given_order(tmp_path):
  """config.data.classes takes names (MK Fig. 5's sock, siamang, crayfish): matched as the
  descriptor file's names are, in the order given; an unknown name names the nearest class, a
  name that two classes share (CoOp's two ImageNet "crane"s) asks for indices, and a class
  picked twice is refused."""
  _image_folder(tmp_path / "images", classes=("n01", "n02", "n03", "n04"), per_class=1)
  (tmp_path / "classnames.txt").write_text("n01 sock\nn02 siamang\nn03 crane\nn04 crane\n")
  per_class = {n: ["x"] for n in ("sock", "siamang", "crane")}
  (tmp_path / "descriptors.json").write_text(json.dumps(per_class))
  config = _config("configs/mutual_imagenet.py", "fig5")
  config.data.root = str(tmp_path / "images")
  config.data.classnames = str(tmp_path / "classnames.txt")
  config.data.descriptors = str(tmp_path / "descriptors.json")

  def picked(classes):
    config.data.classes = classes
    return [(c.label, c.name) for c in data.prepare(config).classes(None, read=lambda i: False)]

  assert picked(("siamang", "sock")) == [(1, "siamang"), (0, "sock")]
  assert picked((3, "Sock")) == [(3, "crane"), (0, "sock")]
  with pytest.raises(data.ConfigError, match="'sok' \\(nearest: 'sock'\\) name no class"):
    picked(("siamang", "sok"))
  with pytest.raises(data.ConfigError, match="'crane' name several classes"):
    picked(("crane",))
  with pytest.raises(data.ConfigError, match="picks a class more than once"):
    picked(("sock", 0))


def _fake_tfds_module(names, examples):
  """The few tensorflow_datasets calls mutual.data.tfds_dataset makes, over (png bytes, label)
  examples."""

  class SkipDecoding:
    pass

  class Builder:
    data_dir = "/fake"
    info = types.SimpleNamespace(features={"label": types.SimpleNamespace(names=names)})

    def is_prepared(self):
      return True

    def as_dataset(self, split, shuffle_files, decoders):
      return [{"image": image, "label": np.int64(label)} for image, label in examples]

  return types.SimpleNamespace(
    builder=lambda name, data_dir=None: Builder(),
    as_numpy=iter,
    decode=types.SimpleNamespace(SkipDecoding=SkipDecoding),
  )


def test_streams_decode_only_the_classes_a_process_reads(tmp_path, monkeypatch):
  """`Dataset.classes(size, read)`: every class comes in order with its label and ids (so its
  image count), and only the classes `read` picks are decoded, with the same pixels as a
  stream that reads them all. Synthetic, folder and TFDS sources."""
  decoded = []
  as_model_input = data._as_model_input

  def counting(source, image_size, where=""):
    decoded.append(where)
    return as_model_input(source, image_size, where)

  monkeypatch.setattr(data, "_as_model_input", counting)
  generate_with = data.synthetic.generate_with

  def generating(*args, **options):
    decoded.append("synthetic")
    return generate_with(*args, **options)

  monkeypatch.setattr(data.synthetic, "generate_with", generating)
  _image_folder(tmp_path / "images", classes=("a", "b", "c"), per_class=2)
  bank = {"a": ["round"], "b": ["square"], "c": ["striped"]}
  pngs = []
  for name in ("a", "b", "c"):
    for i in range(2):
      pngs.append(((tmp_path / "images" / name / f"{i}.png").read_bytes(), len(pngs) // 2))
  monkeypatch.setattr(data, "_import_tfds", lambda: _fake_tfds_module(["a", "b", "c"], pngs))
  config = _config("configs/mutual_synthetic.py")
  config.data.classes = (0, 1, 2)
  config.data.images_per_class = 2
  sources = {
    "synthetic": data.prepare(config),
    "folder": data.folder_dataset(str(tmp_path / "images"), bank),
    "tfds": data.tfds_dataset("fake", bank),
  }
  for source, dataset in sources.items():
    every = list(dataset.classes(32))
    decoded.clear()
    stream = dataset.classes(32, read=lambda position: position % 2 == 1)
    assert len(stream) == 3
    got = list(stream)
    assert [c.label for c in got] == [c.label for c in every] == [0, 1, 2], source
    assert [c.ids for c in got] == [c.ids for c in every] and [len(c) for c in got] == [2] * 3
    assert got[0].images is None and got[2].images is None, source
    np.testing.assert_array_equal(got[1].images, every[1].images)
    if source == "synthetic":  # generated, one call per class read
      assert decoded == ["synthetic"]
    else:
      assert len(decoded) == 2, (source, decoded)
      assert all(any(w.endswith(i) for i in got[1].ids) for w in decoded), (source, decoded)


@pytest.mark.slow
def test_real_data_path_runs_on_an_image_folder(tmp_path, monkeypatch):
  """configs/mutual_imagenet.py's path (folder + descriptor JSON + template class embeddings),
  with the tiny model standing in for ViT-B/16."""
  _image_folder(tmp_path / "images", classes=("n01", "n02"), per_class=3)
  path = tmp_path / "descriptors.json"
  names = list(data.synthetic_descriptors())[:2]
  path.write_text(json.dumps({n: data.synthetic_descriptors()[n] for n in names}))
  # Folders named by ids (ImageNet's wnids) are named through a classnames.txt.
  (tmp_path / "classnames.txt").write_text(f"n01 {names[0]}\nn02 {names[1]}\n")
  config = _config("configs/mutual_imagenet.py")
  config.model.source = config.model.name = "tiny-synthetic"
  config.data.root = str(tmp_path / "images")
  config.data.descriptors = str(path)
  config.data.classnames = str(tmp_path / "classnames.txt")
  config.analysis.top_k, config.analysis.u = 8, 5
  config.figure_classes = 1
  results = analysis.run(config, str(tmp_path / "out"), progress=False)
  assert results["dataset"]["images"] == 6 and set(results["classes"]) == set(names)
  record = json.loads((tmp_path / "out/per_image/0001/00002.json").read_text())
  assert record["id"] == "n02/2.png" and record["class_name"] == names[1]
  assert len(record["methods"]["kmeans"]["language_descriptors"]) == 5
  # An image deleted from the folder: the rerun's files are exactly its images, and only that
  # class is analysed again (its ids changed; the other is kept).
  analysed = _counting_classes(monkeypatch)
  os.remove(tmp_path / "images/n02/2.png")
  results = analysis.run(config, str(tmp_path / "out"), progress=False)
  assert results["dataset"]["images"] == 5 and analysed == [2]
  assert sorted(os.listdir(tmp_path / "out/per_image/0001")) == ["00000.json", "00001.json"]
  # An image replaced under the same name: its class is analysed again (the fingerprint).
  first = tmp_path / "images/n01/0.png"
  from PIL import Image  # pylint: disable=import-outside-toplevel

  Image.fromarray(np.asarray(Image.open(first))[::-1].copy()).save(first)
  results = analysis.run(config, str(tmp_path / "out"), progress=False)
  assert results["dataset"]["images"] == 5 and analysed == [2, 3]


def test_vision_side_takes_defaults_from_the_one_home_and_checks_nothing_again(
  tiny_synthetic, monkeypatch
):
  """Per class, vision_side resolves the stages but leaves the check to the run (once, before
  its claim); keys a config lacks come from paper_config.ANALYSIS_DEFAULTS."""
  import ml_collections  # pylint: disable=import-outside-toplevel

  from mutual import paper_config  # pylint: disable=import-outside-toplevel

  monkeypatch.setattr(
    paper_config, "check_analysis", lambda a: pytest.fail("checked again for a class")
  )
  seen = {}

  def embeddings(bundle, images, maps_per_method, n_concepts, **kwargs):
    seen.update(dtype=bundle.dtype, chunk=kwargs["chunk"], seed=kwargs["ellipse_seed"])
    b = maps_per_method[0].shape[0]
    return [(jnp.zeros((b, n_concepts, 4)), jnp.ones((b, n_concepts), bool))] * len(maps_per_method)

  monkeypatch.setattr(pipeline.visual_prompts, "concept_embeddings_of_maps", embeddings)
  for key, value in (("compute_dtype", "bfloat16"), ("prompt_chunk", 8), ("ellipse_seed", 3)):
    monkeypatch.setitem(paper_config.ANALYSIS_DEFAULTS, key, value)
  values = paper_config.analysis_config(joint_foreground=False, crf=False).to_dict()
  for key in ("compute_dtype", "prompt_chunk", "ellipse_seed", "tower_batch", "mode"):
    del values[key]
  bundle = tiny_synthetic
  size = bundle.preprocess_config.image_size
  images = np.random.default_rng(0).integers(0, 256, (2, size, size, 3), dtype=np.uint8)
  e = bundle.config.embed_dim
  bank = pipeline.TextBank(("a",), np.ones((1, e), np.float32), ("x", "y"), np.eye(2, e))
  pipeline.vision_side(bundle, images, bank, ml_collections.ConfigDict(values))
  assert seen == dict(dtype=jnp.bfloat16, chunk=8, seed=3)


# Issue 41 item 1: App. L's descriptor prompt, "a photo showing [DES]".


def test_a_bank_row_is_the_text_encoders_a_photo_showing_descriptor(tiny_synthetic):
  """Each row of D is the text encoder's unit output for "a photo showing <descriptor>" (the
  MK paper configs' default bank_template), not the raw descriptor's."""
  from stori_jax.clip.encoding import l2_normalize  # pylint: disable=import-outside-toplevel

  config = _config()
  assert config.analysis.bank_template == "a photo showing {d}"
  dataset = data.prepare(config)
  bank = pipeline.encode_config_bank(tiny_synthetic, config, dataset, progress=False)
  for row in (0, 17, len(bank.descriptors) - 1):
    tokens = tiny_synthetic.tokenize([f"a photo showing {bank.descriptors[row]}"])
    direct = l2_normalize(np.asarray(tiny_synthetic.encode_text(tokens), np.float32))[0]
    np.testing.assert_allclose(bank.descriptor_embeddings[row], direct, atol=1e-6)
  with config.unlocked():
    config.analysis.bank_template = "{d}"  # the descriptors encoded as they are
  raw = pipeline.encode_config_bank(tiny_synthetic, config, dataset, progress=False)
  assert raw.descriptors == bank.descriptors
  cosine = np.sum(bank.descriptor_embeddings * raw.descriptor_embeddings, axis=1)
  # Measured on the tiny model: cosines 0.863 to 0.9992, mean 0.958; every row moves.
  assert np.all(cosine < 0.9995) and cosine.min() < 0.9
  assert 0.93 < cosine.mean() < 0.98
  # The class embeddings do not use the bank's template.
  np.testing.assert_array_equal(raw.class_embeddings, bank.class_embeddings)


@pytest.mark.parametrize(
  "template, message",
  [
    ("a photo showing", r"has no \{d\} field"),
    ("a photo of a {c} showing {d}", r"has the fields \['c'\] besides \{d\}"),
    ("a photo showing {}", r"has the fields \[''\] and no \{d\}"),
    ("a photo showing {d", r"cannot be filled with a descriptor"),
    ("a photo showing {d!x}", r"cannot be filled with a descriptor \(ValueError"),
  ],
  ids=["no_field", "class_field", "positional", "unclosed", "conversion"],
)
def test_a_bad_bank_template_is_refused_before_any_work(tmp_path, run_command, template, message):
  workdir = tmp_path / "run"
  done = run_command(
    "mutual.analyze",
    "--config=configs/mutual_synthetic.py:smoke",
    f"--config.analysis.bank_template={template}",
    f"--workdir={workdir}",
  )
  assert done.returncode == 2, done.stderr[-2000:]
  assert "Traceback" not in done.stderr
  import re  # pylint: disable=import-outside-toplevel

  assert re.search(r"config.analysis.bank_template .*" + message, done.stderr), done.stderr
  assert "a photo showing {d}" in done.stderr  # the fix names the paper's template
  assert not workdir.exists()


def test_every_mk_config_encodes_the_bank_in_app_l_prompt():
  """Every configs/mutual_*.py (the paper's and the embedded world's) sets App. L's template."""
  import glob  # pylint: disable=import-outside-toplevel

  found = sorted(glob.glob(os.path.join(ROOT, "configs", "mutual_*.py")))
  assert len(found) >= 9
  for path in found:
    config = load_config(path)
    assert config.analysis.bank_template == "a photo showing {d}", path
