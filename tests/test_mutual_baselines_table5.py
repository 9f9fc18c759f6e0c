"""Table 5 (App. D.1) and the concept labeler's accuracy (App. D.2): the Standard MLP and LF-CBM
(mutual.baselines), top-1 / top-5 and the labeler's top-all / top-10 (mutual.protocols.bottlenecks),
and their place in `mutual.evaluate`."""

import json
import os
import shutil
import warnings

import jax
import ml_collections
import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import top_k_accuracy_score

from mutual import paper_config
from mutual.baselines import cache, fitting, suite
from mutual.baselines import lf_cbm as lf_cbm_baseline
from mutual.baselines import standard as standard_baseline
from mutual.protocols import bottlenecks
from stori_jax.plumbing.config_files import ConfigError, load_config
from stori_jax.plumbing.errors import NonFiniteError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _toy(n_per_class=24, classes=3, grid=4, channels=8, width=6, seed=0):
  """Tokens [N, grid, grid, C] lighting channel c on a block for class c, and image embeddings
  [N, width] pointing along axis c (plus noise)."""
  rng = np.random.default_rng(seed)
  labels = np.repeat(np.arange(classes), n_per_class).astype(np.int32)
  tokens = 0.1 * rng.normal(size=(len(labels), grid, grid, channels)).astype(np.float32)
  embeddings = 0.3 * rng.normal(size=(len(labels), width)).astype(np.float32)
  for i, c in enumerate(labels):
    tokens[i, c : c + 2, c : c + 2, c] += 3.0
    embeddings[i, c] += 2.0
  return cache.CachedFeatures(tokens, labels, embeddings + 1.0)


def _descriptors(d=6, e=6, seed=1):
  """Descriptors 0..2 along the classes' embedding axes, the rest random."""
  x = np.random.default_rng(seed).normal(size=(d, e)).astype(np.float32)
  x[:3] = np.eye(3, e) + 0.1
  return x / np.linalg.norm(x, axis=1, keepdims=True)


# ---------------------------------------------------------------------------------------------
# Metrics.


def test_top5_is_at_least_top1_and_equals_sklearn_on_the_logits():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(300, 12)).astype(np.float32)
  labels = rng.integers(0, 12, 300)
  labels[:40] = logits[:40].argmax(1)  # some right, so that top-1 is not near 0
  acc = bottlenecks.topk_accuracy(logits, labels)
  for k in (1, 5):
    expected = 100 * top_k_accuracy_score(labels, logits, k=k, labels=np.arange(12))
    assert acc[f"top{k}"] == pytest.approx(expected, abs=1e-4)
  assert acc["top5"] >= acc["top1"] > 10
  # Fewer classes than k: every image counts.
  assert bottlenecks.topk_accuracy(logits[:, :3], labels % 3)["top5"] == 100.0


def test_labeler_top_all_and_top_10_on_a_hand_built_case():
  """Five images, D = 12: every true descriptor first (hit); one true descriptor 4th of K = 3
  (top-all miss, top-10 hit); one true descriptor last (top-10 miss); a class without
  descriptors (left out); all scores tied (ties count for the image)."""
  targets = np.zeros((5, 12), np.float32)
  for c, ids in enumerate(([0, 1, 2], [3, 4, 5], [9, 10, 11], [], [7])):
    targets[c, ids] = 1
  scores = np.zeros((5, 12), np.float32)
  scores[0, [0, 1, 2]] = [3, 2, 1]
  scores[1, [3, 4, 6, 5]] = [4, 3, 2, 1]  # descriptor 6, not the class's, third
  # Descriptor 9 first, 10 seventh, 11 last.
  scores[2] = [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 2.0, 0.55, -1.0]
  scores[3] = np.arange(12)
  labels = np.arange(5)
  got = bottlenecks.labeler_accuracy(scores, labels, targets, k=10)
  assert got["images"] == 4 and got["images_without_descriptors"] == 1
  assert got["top_all"] == pytest.approx(100 * 2 / 4)  # images 0 and 4
  assert got["top_10"] == pytest.approx(100 * 3 / 4)  # 0, 1, 4
  assert got["top_all_recall"] == pytest.approx(100 * (1 + 2 / 3 + 1 / 3 + 1) / 4, abs=1e-4)
  assert got["top_10_recall"] == pytest.approx(100 * (1 + 1 + 2 / 3 + 1) / 4, abs=1e-4)
  # Sorting a chunk at a time changes nothing.
  truth = targets[labels] > 0
  a, b = bottlenecks.labeler_hits(scores, truth), bottlenecks.labeler_hits(scores, truth, chunk=2)
  for key in a:
    np.testing.assert_array_equal(a[key], b[key])


def test_table5_rows_follow_the_paper_and_the_markdown_shows_its_columns():
  rng = np.random.default_rng(1)
  labels = rng.integers(0, 6, 50)
  logits = {
    name: rng.normal(size=(50, 6))
    for name in ("MM-ProtoSim", bottlenecks.ZERO_SHOT, "Standard", "MM-CBM", "LF-CBM")
  }
  targets = np.eye(6, 9)
  result = bottlenecks.table5(logits, labels, rng.normal(size=(50, 9)), targets)
  assert list(result["rows"]) == ["Standard", "LF-CBM", "MM-CBM", "MM-ProtoSim", "zero-shot"]
  assert result["rows"]["LF-CBM"]["paper_top1"] == 71.95
  assert result["rows"]["LF-CBM"]["paper_top5"] is None
  for r in result["rows"].values():
    assert r["top5"] >= r["top1"]
  text = bottlenecks.table5_markdown(result, "tiny")
  assert "| Standard | ✓ | ✗ | ✗ |" in text and "| MM-CBM | ✓ | ✓ | ✓ |" in text
  assert "| Zero-shot CLIP (untrained reference) |  |  |  |" in text
  assert "| top-all |" in text and "| top-10 |" in text and "65.76" in text and "83.84" in text


# ---------------------------------------------------------------------------------------------
# LF-CBM.


def test_lf_cbm_settings_are_its_authors_imagenet_recipe_and_refuse_bad_values():
  """train_cbm.py's defaults and its ImageNet command (clip_cutoff 0.28, n_iters 80, lam 1e-4);
  GLM-SAGA's step 0.1 and alpha 0.99 as train_cbm.py sets them."""
  d = paper_config.LF_CBM_DEFAULTS
  assert (d["clip_cutoff"], d["n_iters"], d["lam"]) == (0.28, 80, 1e-4)
  assert (d["proj_steps"], d["proj_learning_rate"], d["proj_batch_size"]) == (1000, 1e-3, 50000)
  assert (d["interpretability_cutoff"], d["alpha"], d["step_size"]) == (0.45, 0.99, 0.1)
  assert (d["saga_batch_size"], d["tol"]) == (256, 1e-4)
  assert paper_config.baselines_config().lf_cbm.to_dict() == d
  assert lf_cbm_baseline.lf_cbm_settings(ml_collections.ConfigDict({})) == d  # a config without it
  bad = paper_config.baselines_config(lf_cbm=dict(alpha=0.0, n_iters=2.5, val_fraction=1))
  with pytest.raises(ConfigError) as error:
    lf_cbm_baseline.lf_cbm_settings(bad)
  for key in ("lf_cbm.alpha", "lf_cbm.n_iters", "lf_cbm.val_fraction"):
    assert key in str(error.value)
  # train_all refuses it before it trains anything (the fit would fail on the toy's shapes).
  with pytest.raises(ConfigError, match="lf_cbm.lam"):
    suite.train_all(None, None, None, _config(lam=-1.0), progress=False)


def test_cubed_cosine_similarity_is_theirs():
  """cos_similarity_cubed_single: columns centred, cubed, unit, summed products."""
  rng = np.random.default_rng(2)
  a, b = rng.normal(size=(40, 5)), rng.normal(size=(40, 5))

  def theirs(x, y):
    x, y = (x - x.mean(0)) ** 3, (y - y.mean(0)) ** 3
    return (x / np.linalg.norm(x, axis=0) * y / np.linalg.norm(y, axis=0)).sum(0)

  np.testing.assert_allclose(lf_cbm_baseline.cubed_cosine_similarity(a, b), theirs(a, b), atol=1e-5)
  np.testing.assert_allclose(lf_cbm_baseline.cubed_cosine_similarity(a, 3 * a + 1), 1.0, atol=1e-5)


def test_glm_saga_reaches_sklearns_elastic_net_solution():
  """The same objective as scikit-learn's multinomial elastic net (C = 1 / (lam' N), lam' =
  lam / alpha as GLM-SAGA receives LF-CBM's lam): the same weights, zeros and objective."""
  rng = np.random.default_rng(0)
  n, k, c = 150, 5, 3
  y = np.repeat(np.arange(c), n // c)
  x = rng.normal(size=(n, k)) + 1.5 * np.eye(c, k)[y]
  x = ((x - x.mean(0)) / x.std(0, ddof=1)).astype(np.float32)
  lam, alpha = 0.02, 0.99
  ours = lf_cbm_baseline.glm_saga(
    x, y, c, lam=lam, alpha=alpha, epochs=3000, batch_size=32, tol=1e-7, progress=False
  )
  assert ours.converged and np.all(np.diff(ours.objectives[-50:]) <= 1e-6)
  strength = lam / alpha
  reference = LogisticRegression(
    penalty="elasticnet",
    solver="saga",
    l1_ratio=alpha,
    C=1 / (strength * n),
    tol=1e-10,
    max_iter=100000,
  )
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    reference.fit(x, y)
  np.testing.assert_allclose(ours.weight, reference.coef_.T, atol=2e-4)
  # The softmax's bias is fixed up to a constant (it is not penalised).
  np.testing.assert_allclose(
    ours.bias - ours.bias.mean(), reference.intercept_ - reference.intercept_.mean(), atol=2e-4
  )
  zeros = np.abs(reference.coef_.T) < 1e-6
  assert zeros.sum() >= 5 and np.all(np.abs(ours.weight[zeros]) < 1e-5)  # sparse, the same zeros


def test_glm_saga_stops_at_the_epoch_limit_and_a_stronger_penalty_zeros_more():
  x = np.asarray(_toy().embeddings, np.float32)
  x = (x - x.mean(0)) / x.std(0, ddof=1)
  y = _toy().labels
  weak = lf_cbm_baseline.glm_saga(x, y, 3, lam=1e-4, epochs=7, progress=False)
  strong = lf_cbm_baseline.glm_saga(x, y, 3, lam=0.3, epochs=7, progress=False)
  assert len(weak.objectives) == 7 and not weak.converged
  assert (np.abs(strong.weight) > 1e-5).sum() < (np.abs(weak.weight) > 1e-5).sum()
  assert ((x @ weak.weight + weak.bias).argmax(1) == y).mean() > 0.95


def test_lf_cbm_drops_the_concepts_its_cutoffs_name():
  """Descriptors 0-2 follow the classes' axes; 3-5 are random: with a clip_cutoff between their
  top-5 cosines, only the first three stay, and the classifier separates the classes."""
  cached, text = _toy(), _descriptors()
  unit = cached.embeddings / np.linalg.norm(cached.embeddings, axis=1, keepdims=True)
  top5 = np.sort(unit @ text.T, axis=0)[-5:].mean(0)
  cutoff = float((top5[:3].min() + top5[3:].max()) / 2)
  assert top5[:3].min() > top5[3:].max()  # the toy separates them
  settings = dict(clip_cutoff=cutoff, interpretability_cutoff=0.0, proj_steps=200, n_iters=20)
  model, record = lf_cbm_baseline.train_lf_cbm(cached, text, 3, settings, progress=False)
  np.testing.assert_array_equal(model.concepts, [0, 1, 2])
  assert record["after_clip_cutoff"] == 3 and record["descriptors"] == 6
  assert record["projection_step"] % 50 == 0 or record["projection_step"] == 199
  assert (model.logits(cached.embeddings).argmax(1) == cached.labels).mean() > 0.95
  # The standardised training activations: mean 0, std 1.
  act = model.concept_activations(cached.embeddings)
  np.testing.assert_allclose(act.mean(0), 0, atol=1e-4)
  np.testing.assert_allclose(act.std(0, ddof=1), 1, atol=1e-4)
  with pytest.raises(ConfigError, match="clip_cutoff"):
    lf_cbm_baseline.train_lf_cbm(cached, text, 3, dict(clip_cutoff=0.999), progress=False)
  with pytest.raises(ConfigError, match="interpretability_cutoff"):
    lf_cbm_baseline.train_lf_cbm(
      cached, text, 3, dict(clip_cutoff=-1.0, interpretability_cutoff=0.9999), progress=False
    )


def _projection_inputs():
  """The toy's embeddings and CLIP scores, 7 images held out: fit_projection's arguments."""
  cached, text = _toy(), _descriptors()
  e = cached.embeddings
  scores = (e / np.linalg.norm(e, axis=1, keepdims=True)) @ (
    text / np.linalg.norm(text, axis=1, keepdims=True)
  ).T
  held = np.zeros(len(e), bool)
  held[::10] = True
  return e[~held], scores[~held], e[held], scores[held]


def test_lf_cbm_projection_resumes_from_its_checkpoints_to_the_same_weights(tmp_path, capfd):
  """Issue 42: the projection trains through the shared training loop; its newest checkpoint
  lost (a run killed after it), the same fit resumes from the one before and ends with the
  weights, step and similarity of the fit never stopped."""
  args = _projection_inputs()
  kwargs = dict(steps=120, batch_size=16, progress=False)
  whole = lf_cbm_baseline.fit_projection(*args, **kwargs, workdir=str(tmp_path / "a"))
  plain = lf_cbm_baseline.fit_projection(*args, **kwargs)
  np.testing.assert_array_equal(whole[0], plain[0])
  assert whole[1:] == plain[1:] and whole[1] == 119
  saved = sorted(int(s) for s in os.listdir(tmp_path / "a" / "checkpoints"))
  assert saved == [108, 120]  # every 12 steps, the last two kept
  shutil.rmtree(tmp_path / "a" / "checkpoints" / "120")
  capfd.readouterr()
  again = lf_cbm_baseline.fit_projection(*args, **kwargs, workdir=str(tmp_path / "a"))
  assert "Resumed from step 108 of 120" in capfd.readouterr().err
  np.testing.assert_array_equal(again[0], whole[0])
  assert again[1:] == whole[1:]


def test_a_diverging_lf_cbm_projection_stops_with_one_paragraph():
  args = _projection_inputs()
  with pytest.raises(NonFiniteError, match="proj_learning_rate"):
    lf_cbm_baseline.fit_projection(*args, steps=40, batch_size=16, learning_rate=1e38)


# ---------------------------------------------------------------------------------------------
# train_all and classify.


def _config(**lf_cbm):
  return ml_collections.ConfigDict(
    dict(
      n_concepts=2,
      width=8,
      gumbel_temperature=1.0,
      region_threshold=0.5,
      feature_maps=dict(threshold=0.9, skip_object=True, drop_rate=0.3, block_size=2),
      train=dict(epochs=2, batch_size=16, learning_rate=3e-2, final_learning_rate=3e-3, seed=0),
      lf_cbm=dict(
        clip_cutoff=-1.0, interpretability_cutoff=-1.0, proj_steps=60, n_iters=5, **lf_cbm
      ),
    )
  )


@pytest.mark.slow
def test_train_all_adds_table5_rows_and_a_rerun_loads_them(tmp_path, capfd):
  cached, text = _toy(), _descriptors()
  targets = np.eye(3, 6, dtype=np.float32)
  first = suite.train_all(cached, text, targets, _config(), progress=False, workdir=str(tmp_path))
  out = first.classify(cached.tokens[:5], cached.embeddings[:5], text)
  assert set(out) == {*suite.CLASSIFIERS, suite.LABELER}
  assert all(out[n].shape == (5, 3) for n in suite.CLASSIFIERS)
  assert out[suite.LABELER].shape == (5, 6)
  summary = first.training_summary()
  assert summary["Standard"]["steps"] == 2 * (72 // 16)
  assert summary["LF-CBM"]["after_interpretability_cutoff"] == 6
  assert sorted(os.listdir(tmp_path / "standard" / "checkpoints")) == ["7", "8"]  # keep=2
  # whole: no partial file left (the projection's checkpoints beside the model: issue 42)
  assert sorted(os.listdir(tmp_path / "lf_cbm")) == ["checkpoints", "lf_cbm.npz"]
  capfd.readouterr()
  again = suite.train_all(cached, text, targets, _config(), progress=False, workdir=str(tmp_path))
  assert "Resumed from step 8 of 8" in capfd.readouterr().err
  assert again.training_summary()["LF-CBM"] == summary["LF-CBM"]
  for name, logits in again.classify(cached.tokens[:5], cached.embeddings[:5], text).items():
    np.testing.assert_array_equal(logits, out[name], err_msg=name)
  # Without embeddings, only Table 1's baselines (the old caches).
  plain = cache.CachedFeatures(cached.tokens, cached.labels)
  old = suite.train_all(plain, text, targets, _config(), progress=False)
  assert old.standard is None and old.lf_cbm is None
  assert set(old.classify(cached.tokens[:2], None, text)) == {
    "MM-CBM",
    "MM-ProtoSim",
    "Concept labeler",
  }


def test_standard_mlp_learns_the_toy_classes():
  cached = _toy()
  model, result = standard_baseline.train_standard(
    cached,
    3,
    fitting.FitSettings(30, 16, learning_rate=3e-2, final_learning_rate=3e-3),
    hidden=16,
  )
  assert result.losses[-5:].mean() < 0.2 * result.losses[:5].mean()
  # Jitted, as evaluation runs it (eagerly, a program per op).
  logits = jax.jit(model.apply)({"params": result.params}, cached.embeddings)
  assert (np.asarray(logits).argmax(1) == cached.labels).mean() > 0.95
  with pytest.raises(ValueError, match="image embeddings"):
    standard_baseline.train_standard(
      cache.CachedFeatures(cached.tokens, cached.labels), 3, fitting.FitSettings(1), hidden=8
    )


# ---------------------------------------------------------------------------------------------
# The embedded world.


@pytest.mark.slow
def test_standard_and_lf_cbm_beat_chance_on_the_embedded_world():
  """The tiny CLIP's embeddings of 24 training images per class (seed 1), 8 test images per
  class (seed 0), 12 classes (chance 8.3%): measured 97.9% (Standard) and 95.8% (LF-CBM, at
  LF-CBM's ImageNet recipe); asserted >= 80%, top-5 >= top-1."""
  import stori_jax
  from mutual import data, pipeline

  config = load_config(os.path.join(ROOT, "configs/mutual_eval_synthetic.py"))
  bundle = stori_jax.load(config.model.source)
  bank = pipeline.encode_config_bank(bundle, config, data.prepare(config), False)

  def encode(per_class, seed):
    classes = list(data.synthetic_classes(per_class, seed=seed))
    e, t = cache.encode_features(bundle, np.concatenate([c.images for c in classes]))
    return e, t, np.concatenate([np.full(per_class, c.label, np.int32) for c in classes])

  train_e, train_t, train_l = encode(24, 1)
  test_e, _, test_l = encode(8, 0)
  cached = cache.CachedFeatures(train_t, train_l, train_e)
  b = config.baselines
  model, result = standard_baseline.train_standard(
    cached,
    12,
    fitting.FitSettings(20, 64, learning_rate=3e-3, final_learning_rate=3e-4),
    hidden=int(b.width),
  )
  standard = bottlenecks.topk_accuracy(model.apply({"params": result.params}, test_e), test_l)
  lf, record = lf_cbm_baseline.train_lf_cbm(
    cached, bank.descriptor_embeddings, 12, lf_cbm_baseline.lf_cbm_settings(b), progress=False
  )
  lf_cbm = bottlenecks.topk_accuracy(lf.logits(test_e), test_l)
  for acc in (standard, lf_cbm):
    assert acc["top1"] >= 80.0 and acc["top5"] >= acc["top1"]
  assert 0 < record["after_interpretability_cutoff"] <= record["after_clip_cutoff"] <= 48


@pytest.mark.slow
def test_evaluation_writes_table5_and_the_labeler_accuracy(tmp_path):
  """configs/mutual_eval_synthetic.py:smoke through `evaluation.run` (no protocols): Table 5's
  four rows and the zero-shot reference in table1.json and table1.md, the labeler's accuracy."""
  from mutual.evaluation import runner as evaluation

  config = load_config(os.path.join(ROOT, "configs/mutual_eval_synthetic.py"), "smoke")
  config.evaluation.protocols = ()
  results = evaluation.run(config, str(tmp_path), progress=False)
  rows = results["table5"]["rows"]
  assert list(rows) == ["Standard", "LF-CBM", "MM-CBM", "MM-ProtoSim", "zero-shot"]
  for r in rows.values():
    assert 0 <= r["top1"] <= r["top5"] <= 100
  assert results["top1"] == {name: r["top1"] for name, r in rows.items()}
  labeler = results["table5"]["labeler"]
  assert labeler["images"] == 8 and 0 <= labeler["top_all"] <= labeler["top_10"] <= 100
  assert set(results["baselines"]["training"]) == {*suite.NAMES, "Standard", "LF-CBM"}
  saved = json.loads((tmp_path / "table1.json").read_text())
  assert saved["table5"]["rows"]["LF-CBM"]["top5"] == rows["LF-CBM"]["top5"]
  table = (tmp_path / "table1.md").read_text()
  assert "## Table 5 (App. D)" in table and "| LF-CBM | ✓ | ✓ | ✗ |" in table
  assert "| top-all |" in table
  # The baselines' training set, said with Table 5 (the smoke run's 8 images a class).
  setting = saved["table5"]["training_set"]
  assert setting == saved["baselines"]["training_set"] and not setting["paper_setting"]
  assert table.count(setting["note"]) == 2 and "not the paper's setting" in setting["note"]
  # App. D.2's Fig. 6: one image of each class in turn, 6 of them, each with its object
  # channel and the Feature Maps concepts labelled by the labeler's descriptors.
  assert (tmp_path / "fig6_feature_maps.png").stat().st_size > 20_000
  shown = saved["fig6"]
  assert [(r["class_name"], r["image"]) for r in shown[:2]] == [
    ("red striped circle", 0),
    ("red dotted star", 0),
  ]
  assert len(shown) == 6 and [r["image"] for r in shown] == [0, 0, 1, 1, 2, 2]
  for r in shown:
    assert len(r["neurons"]) == 1 + config.baselines.n_concepts
    assert r["object_neuron"] == r["neurons"][0]
    assert all(d is None or (isinstance(d, str) and d) for d in r["descriptors"])


def test_imagenet_baselines_train_on_every_image_and_quick_says_it_is_not_the_papers():
  """§4 and App. D: "we train them on the full ImageNet training set". The ImageNet config's
  default takes every training image (their features on disk); `:quick`'s 20 per class, and the
  embedded world's generated images, are marked as not the paper's setting in Table 5."""
  from mutual.evaluation import runner as evaluation

  def config(name, argument=None):
    return load_config(os.path.join(ROOT, "configs", name), argument)

  full, quick = config("mutual_eval_imagenet.py"), config("mutual_eval_imagenet.py", "quick")
  assert full.baselines.data.images_per_class == 0 and full.baselines.cache_on_disk
  assert quick.baselines.data.images_per_class == 20 and not quick.baselines.cache_on_disk
  assert quick.name == "mutual_eval_imagenet_quick"
  # Nothing else differs.
  same = quick.to_dict()
  same["baselines"]["data"]["images_per_class"] = 0
  same["baselines"]["cache_on_disk"] = True
  same["name"] = full.name
  assert same == full.to_dict()
  with pytest.raises(ConfigError, match="quick"):
    config("mutual_eval_imagenet.py", "fast")

  paper = evaluation.training_set(full, 1_281_167)
  assert paper["paper_setting"] and paper["full_training_set"]
  assert paper["images_per_class"] is None and "not the paper's setting" not in paper["note"]
  assert paper["note"] == (
    "Baselines trained on every image of the training split (1,281,167 images), as App. D."
  )
  capped = evaluation.training_set(quick, 20_000)
  assert not capped["paper_setting"] and capped["images_per_class"] == 20
  assert "at most 20 images per class" in capped["note"]
  assert "not the paper's setting" in capped["note"]
  world = evaluation.training_set(config("mutual_eval_synthetic.py"), 1536)
  assert not world["paper_setting"] and world["full_training_set"] is None
  assert "128 generated images per class" in world["note"]
  assert "not the paper's setting" in world["note"]

  result = bottlenecks.table5({"Standard": np.eye(3)}, np.arange(3))
  result["training_set"] = capped
  text = bottlenecks.table5_markdown(result, "ViT-B/16")
  assert text.index(capped["note"]) < text.index("| Model |")
