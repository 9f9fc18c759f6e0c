"""`python -m mutual.explain`: one image through the whole mutual-knowledge analysis, on the
embedded world's tiny CLIP; the same numbers as the pipeline gives the image alone, one model
load for several images, and a user's mistake stopped before the model loads."""

import json
import os

import numpy as np
import pytest
from PIL import Image

import stori_jax
from configs import mutual_synthetic
from mutual import data, explain, explanation, pipeline

METHODS = ("pca", "kmeans")


def _write_images(folder, classes=(2, 5), per_class=1, seed=7):
  """Embedded-world images as PNG files; returns {path: uint8 image}."""
  os.makedirs(folder, exist_ok=True)
  written = {}
  for cls in data.synthetic_classes(per_class, seed=seed, image_size=64, classes=classes):
    for i, image in enumerate(cls.images):
      path = os.path.join(folder, f"{cls.name.replace(' ', '_')}_{i}.png")
      Image.fromarray(image).save(path)
      written[path] = image
  return written


@pytest.fixture
def counted_loads(monkeypatch):
  """How many times the command loads a model."""
  loads = []
  real = stori_jax.load

  def load(*args, **kwargs):
    loads.append(args)
    return real(*args, **kwargs)

  monkeypatch.setattr(stori_jax, "load", load)
  return loads


def test_explains_each_image_as_the_pipeline_does_with_one_model_load(
  tmp_path, run_command, counted_loads, tiny_synthetic
):
  folder = tmp_path / "photos"
  images = _write_images(str(folder))
  extra = _write_images(str(tmp_path / "more"), classes=(9,))  # same stem as none above
  single = next(iter(extra))
  workdir = tmp_path / "out"
  done = run_command(explain, f"--image={folder}", f"--image={single}", f"--workdir={workdir}")
  assert done.returncode == 0, done.stderr
  assert len(counted_loads) == 1  # three images, one model load
  every = {**images, **extra}
  assert sorted(os.listdir(workdir)) == sorted(
    f"{os.path.splitext(os.path.basename(p))[0]}{ending}"
    for p in every
    for ending in (".png", ".json")
  )
  config = mutual_synthetic.get_config()
  names, per_class, bank_words = explanation.class_bank(config)
  bank = pipeline.encode_bank(
    tiny_synthetic,
    names,
    per_class,
    bank_words,
    progress=False,
    mode=config.analysis.class_prompts,
    templates=tuple(config.analysis.templates),
    descriptor_template=config.analysis.descriptor_template,
  )
  for path, image in every.items():
    stem = os.path.splitext(os.path.basename(path))[0]
    with open(workdir / f"{stem}.json") as f:
      record = json.load(f)
    # The image alone through the pipeline: the command's numbers, exactly.
    alone = pipeline.analyze_class(tiny_synthetic, image[None], bank, config.analysis, METHODS)
    predicted = int(alone["predicted"][0])
    assert record["predicted"] == predicted
    assert record["ranking"][0]["class_name"] == names[predicted]
    assert len(record["ranking"]) == 1 + explanation.RUNNERS_UP
    cosines = [r["cosine"] for r in record["ranking"]]
    assert cosines == sorted(cosines, reverse=True)
    assert cosines[0] == pytest.approx(float(alone["class_scores"][0].max()), abs=1e-6)
    for method in METHODS:
      summary = pipeline.summarise(alone, method)
      m = record["methods"][method]
      assert m["mi"] == pytest.approx(float(summary["mi"][0]), abs=1e-6)
      assert m["auc"] == pytest.approx(float(summary["auc"][0]), abs=1e-6)
      assert len(m["curve"]) == int(summary["lengths"][0])
      # Concepts with descriptors, each named by the bank.
      assert 1 <= len(m["concepts"]) <= config.analysis.n_concepts
      assert all(set(c["descriptors"]) <= set(bank_words) for c in m["concepts"])
      assert set(m["mutual_descriptors"]) <= set(m["language_descriptors"])
    assert "label" not in record and "correct" not in record  # an image given alone has none
    with Image.open(workdir / f"{stem}.png") as figure:
      width, height = figure.size
    assert width > 1500 and height > 600  # a row per method, six panels wide
    # One screen per image: the prediction and each method's concepts.
    assert f"{path}: predicted {names[predicted]!r}" in done.stdout
  assert done.stdout.count("PCA concepts: MI") == len(every)
  assert done.stdout.count("K-means concepts: MI") == len(every)


def test_descriptor_file_and_classes_choose_the_competing_classes(tmp_path, run_command):
  path, _ = next(iter(_write_images(str(tmp_path / "in"), classes=(2,)).items()))
  per_class = data.synthetic_descriptors()
  chosen = list(per_class)[2:5]
  descriptor_file = tmp_path / "descriptors.json"
  descriptor_file.write_text(json.dumps(per_class))
  done = run_command(
    explain,
    f"--image={path}",
    f"--workdir={tmp_path / 'out'}",
    f"--descriptors={descriptor_file}",
    f"--classes={','.join(chosen)}",
  )
  assert done.returncode == 0, done.stderr
  stem = os.path.splitext(os.path.basename(path))[0]
  record = json.loads((tmp_path / "out" / f"{stem}.json").read_text())
  # Three classes compete: the predicted one and its two runners-up, nothing else.
  assert sorted(r["class_name"] for r in record["ranking"]) == sorted(chosen)
  assert record["predicted_name"] == chosen[0]  # the image is of class 2, the first chosen
  bank = set(w for c in chosen for w in per_class[c])
  for method in METHODS:
    for concept in record["methods"][method]["concepts"]:
      assert set(concept["descriptors"]) <= bank


@pytest.mark.parametrize(
  "make, expected",
  [
    (lambda d: os.path.join(d, "missing.png"), "does not exist"),
    (lambda d: _text_file(d), "not an image"),
    (lambda d: _empty_folder(d), "holds no image file"),
    (lambda d: _truncated_png(d), "truncated"),
  ],
  ids=["missing", "not-an-image", "empty-folder", "truncated"],
)
def test_a_bad_image_stops_before_the_model_loads(
  tmp_path, run_command, counted_loads, make, expected
):
  bad = make(str(tmp_path))
  done = run_command(explain, f"--image={bad}", f"--workdir={tmp_path / 'out'}")
  assert done.returncode == 2
  assert expected in done.stderr and str(bad) in done.stderr
  assert "Traceback" not in done.stderr
  assert counted_loads == []
  assert not os.path.exists(tmp_path / "out")


def test_unknown_class_and_missing_flags_are_one_paragraph(tmp_path, run_command, counted_loads):
  path, _ = next(iter(_write_images(str(tmp_path / "in"), classes=(2,)).items()))
  done = run_command(explain, f"--image={path}", f"--workdir={tmp_path}", "--classes=unicorn")
  assert done.returncode == 2 and "'unicorn'" in done.stderr and "red striped star" in done.stderr
  done = run_command(explain, f"--workdir={tmp_path}")
  assert done.returncode == 2 and "--image" in done.stderr
  assert counted_loads == []


def _text_file(folder):
  path = os.path.join(folder, "notes.png")
  with open(path, "w") as f:
    f.write("not pixels at all\n" * 20)
  return path


def _empty_folder(folder):
  path = os.path.join(folder, "empty")
  os.makedirs(path)
  with open(os.path.join(path, "readme.txt"), "w") as f:
    f.write("no images here")
  return path


def _truncated_png(folder):
  path = os.path.join(folder, "cut.png")
  Image.fromarray(np.full((64, 64, 3), 200, np.uint8)).save(path)
  with open(path, "rb") as f:
    data_ = f.read()
  with open(path, "wb") as f:
    f.write(data_[: len(data_) // 2])
  return path
