"""SToRI App. A.2: retrieval attributes chosen by zero-shot AUROC >= 0.75
(`stori_jax.retrieval.attribute_selection`): the AUROC against scikit-learn and a hand count,
Table 9's grammar and filter, the pools of CelebA and CUB (small files written here), and the
recomputation run offline on the embedded world (`--config.attributes.source=auroc`)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

import stori_jax
from stori_jax import retrieve
from stori_jax.plumbing.config_files import ConfigError, load_config
from stori_jax.clip.encoding import encode_texts
from stori_jax.retrieval import attribute_selection as A
from stori_jax.retrieval import datasets, index, paper_config, runner, tables

from test_cli import assert_ends_with_outputs
from test_data_cub import write_cub
from test_retrieval_protocol import CELEBA_NAMES, write_celeba

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def bundle():
  return stori_jax.load("tiny-synthetic")


def _pair_count_auroc(labels, scores):
  """P(score of a positive > score of a negative), ties 1/2: the AUROC by hand."""
  pos, neg = scores[labels], scores[~labels]
  wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
  return wins / (len(pos) * len(neg))


def test_zero_shot_auroc_by_hand_and_against_sklearn():
  # Four images on the unit circle, two attribute prompts: the first ranks the images 3 > 2 >
  # 1 > 0 by cosine similarity, the second 0 > 1 > 2 > 3.
  angles = np.array([0.0, 0.3, 0.6, 0.9])
  images = np.stack([np.cos(angles), np.sin(angles)], axis=1)
  text = np.array([[0.0, 1.0], [1.0, 0.0]])
  labels = np.array([[False, True], [True, False], [False, True], [True, True]])
  auroc = A.zero_shot_auroc(images, text, labels)
  # attribute 0: positives 1, 3 against negatives 0, 2: pairs (1>0) yes, (1>2) no, (3>0), (3>2)
  # yes: 3 of 4. Attribute 1: positives 0, 2, 3 against 1: 0 > 1 only: 1 of 3.
  np.testing.assert_allclose(auroc, [3 / 4, 1 / 3])
  with_constant = np.concatenate([labels, np.ones((4, 1), bool)], axis=1)
  assert np.isnan(A.zero_shot_auroc(images, np.concatenate([text, text[:1]]), with_constant)[2])
  rng = np.random.default_rng(0)
  images = rng.normal(size=(200, 8))
  images /= np.linalg.norm(images, axis=1, keepdims=True)
  text = rng.normal(size=(5, 8))
  labels = (images @ text.T + rng.normal(scale=0.5, size=(200, 5))) > 0
  auroc = A.zero_shot_auroc(images, text, labels)
  scores = images @ text.T
  for a in range(5):
    assert auroc[a] == pytest.approx(roc_auc_score(labels[:, a], scores[:, a]), abs=1e-12)
    assert auroc[a] == pytest.approx(_pair_count_auroc(labels[:, a], scores[:, a]), abs=1e-12)


def test_select_keeps_the_threshold_and_orders_by_auroc():
  names = ["a", "b", "c", "d", "e"]
  aurocs = np.array([0.75, 0.9, np.nan, 0.749, 0.9])
  assert A.select(names, aurocs, 0.75) == ["b", "e", "a"]
  assert A.select(names, aurocs, A.PAPER_THRESHOLD) == ["b", "e", "a"]
  assert A.select(names, aurocs, 0.95) == []


def test_celeba_prompts_follow_table_9s_grammar():
  """Every row of Table 9 and App. C.4's prompt, rebuilt from their attributes alone."""
  for template, rows in paper_config.CELEBA3_PROMPTS + paper_config.CELEBA5_PROMPTS:
    columns = [name for name, _ in rows if name != "SEX"]
    assert A.celeba_prompt(columns[::-1]) == (template, rows)
  template, rows = A.celeba_prompt(["Attractive", "Wavy_Hair"])
  filled = template.format(*(p or "woman" for _, p in rows))
  assert filled == "a photo of an attractive woman with wavy hair"
  candidates = {c.name: c.prompts for c in A.celeba_candidates()}
  assert len(candidates) == 41 and set(candidates) == set(CELEBA_NAMES) | {"not Male"}
  assert candidates["Smiling"] == ("a photo of a smiling person",)  # App. A.2's example
  assert candidates["not Male"] == ("a photo of a woman",)
  assert candidates["Wearing_Hat"] == ("a photo of a person wearing hat",)
  assert candidates["Bangs"] == ("a photo of a person with bangs",)


def test_celeba_combinations_rebuild_table_9_when_its_attributes_are_selected():
  """With the sex and Table 9's six attributes selected, and the five pairs Table 9 lacks
  leaving a category under the minimum, the filter keeps Table 9's ten combinations in its
  order; a pair is kept only when each of its 8 categories reaches the minimum."""
  rng = np.random.default_rng(0)
  n = 6000
  table = {c: rng.random(n) < 0.5 for c in CELEBA_NAMES}
  for a, b in (
    ("Bangs", "Blond_Hair"),
    ("Bangs", "Gray_Hair"),
    ("Blond_Hair", "Gray_Hair"),
    ("Blond_Hair", "Wearing_Hat"),
    ("Gray_Hair", "Wearing_Hat"),
  ):
    table[b] &= ~(table[a] & table["Male"])  # no man has both: a category empty
  selected = ["Male", "not Male", "Smiling", "Bangs", "Blond_Hair", "Gray_Hair"]
  selected += ["Wearing_Hat", "Eyeglasses"]
  kept, notes = A.celeba_combinations(table, selected, 3, min_images=100)
  assert kept == list(paper_config.CELEBA3_PROMPTS)
  assert len(notes) == 15 and sum(n["kept"] for n in notes) == 10
  failed = next(n for n in notes if n["attributes"] == ["Bangs", "Blond_Hair"])
  assert failed["smallest_category"] == 0 and not failed["kept"]
  assert A.celeba_prompt_dicts(kept, ["not Male", "Male"]) == paper_config.celeba_prompt_dicts(
    paper_config.CELEBA3_PROMPTS
  )
  women = A.celeba_prompt_dicts(kept, ["not Male"])
  assert len(women) == 10 and all(
    p["attributes"][[r[0] for r in p["attributes"]].index("not Male")][1] == "woman" for p in women
  )
  # Five attributes: App. C.4's combination where each of 32 categories has an image.
  table = {c: rng.random(n) < 0.5 for c in CELEBA_NAMES}
  five, _ = A.celeba_combinations(
    table, ["Male", "Smiling", "Bangs", "Gray_Hair", "Eyeglasses"], 5, min_images=1
  )
  assert five == list(paper_config.CELEBA5_PROMPTS)


def test_celeba_recomputed_on_a_folder(tmp_path, bundle):
  """The CelebA path on a CelebA-format folder: every candidate scored on the test split's
  images as scikit-learn scores it, the prompts formed from the selected attributes."""
  truth = write_celeba(str(tmp_path), n=48)
  partition = "".join(f"{i + 1:06d}.jpg {0 if i < 16 else 2}\n" for i in range(48))
  (tmp_path / "list_eval_partition.txt").write_text(partition)
  config = load_config(os.path.join(ROOT, "configs", "retrieval_celeba3.py"))
  config.data.root = str(tmp_path)
  config.attributes.source = "auroc"
  config.attributes.threshold = 0.0
  config.attributes.min_category_images = 3
  data, result = A.recompute(bundle, config, None, 16)
  assert result["n_images"] == 32 and result["split"] == "test"
  images = index.encode_data(
    bundle, datasets.folder_data(str(tmp_path / "img_align_celeba")), batch_size=16
  )[16:]
  candidates = A.celeba_candidates()
  text = encode_texts(bundle, [c.prompts[0] for c in candidates], batch_size=16)
  for k, c in enumerate(candidates):
    column = (
      ~truth[16:, CELEBA_NAMES.index("Male")]
      if c.name == "not Male"
      else truth[16:, CELEBA_NAMES.index(c.name)]
    )
    assert result["auroc"][c.name] == pytest.approx(
      roc_auc_score(column, images @ text[k]), abs=1e-5
    ), c.name
  assert result["selected"] == A.select(
    [c.name for c in candidates], np.array([result["auroc"][c.name] for c in candidates]), 0.0
  )
  kept = [n for n in result["combinations"] if n["kept"]]
  assert kept and all(n["smallest_category"] >= 3 for n in kept)
  assert len(data.prompts) == 2 * len(kept) == len(result["prompts_used"])
  assert result["paper"][:2] == ["not Male", "Male"] and "Smiling" in result["paper"]
  text = tables.selection_table(result)
  assert "| Smiling | a photo of a smiling person |" in text
  assert "in the paper's list but not selected here: none" in text


def test_cub_recomputed_from_koh_candidates(tmp_path, bundle, monkeypatch):
  """The CUB path: Koh et al.'s 112 attributes scored on the test split; the selected ones,
  most discriminable first, form App. A.2's combinations of three without a shared colour."""
  known = {5: "has_bill_shape::hooked_seabird", 221: "has_shape::duck-like"}
  known[294] = "has_crown_color::blue"
  names = [known.get(k, f"has_part{k}_color::c{k}") for k in range(1, 313)]
  root = write_cub(
    str(tmp_path), lambda c, i, t: [(k + i + c) % 3 == 0 for k in range(312)], attributes=names
  )
  planted = {"has_part2_color::c2": 0.95, known[5]: 0.9, known[221]: 0.8, known[294]: 0.76}
  seen = {}

  def fake_auroc(images, text, labels):
    seen["shape"] = (images.shape[0], text.shape[0], labels.shape)
    return np.array([planted.get(n, 0.5) for n in seen["names"]])

  real_candidates = A._cub_pool

  def pool(data, options):
    found = real_candidates(data, options)
    seen["names"] = [c.name for c in found.candidates]
    return found

  monkeypatch.setattr(A, "zero_shot_auroc", fake_auroc)
  monkeypatch.setattr(A, "_cub_pool", pool)
  config = load_config(os.path.join(ROOT, "configs", "retrieval_cub.py"))
  config.data.root = root
  config.attributes.source = "auroc"
  data, result = A.recompute(bundle, config, None, 16)
  assert len(seen["names"]) == 112 and seen["shape"][0] == 4 * 3  # the test split
  assert seen["names"][:2] == ["has_part2_color::c2", known[5]]
  assert result["selected"] == list(planted)
  assert result["selected_not_in_paper"] == ["has_part2_color::c2"]
  assert len(result["in_paper_not_selected"]) == 12
  assert result["prompts"][known[5]] == "a photo of a bird, which has hooked seabird bill"
  assert result["prompts_used"][0] == (
    "a photo of a bird, which has c2 part2, has hooked seabird bill, and has duck-like shape"
  )
  assert len(data.prompts) == 4  # C(4, 3), no two of one colour


def test_synthetic_triples_from_allowed_values():
  every = datasets.synthetic_data(6, 1)
  assert [t.name for t in every.tasks] == [
    t.name for t in datasets.synthetic_data(6, 1, values=None).tasks
  ]
  allowed = {
    "colour": ("red", "blue", "green"),
    "pattern": ("striped",),
    "shape": ("star", "circle", "heart", "moon"),
  }
  data = datasets.synthetic_data(4, 1, values=allowed)
  for task in data.tasks:
    assert task.values[0][0] in allowed["colour"] and task.values[1][0] == "striped"
    assert task.values[2][0] in allowed["shape"]
  assert data.spec["prompt_values"]["pattern"] == ["striped"]
  with pytest.raises(ConfigError, match="fewer than data.n_triples"):
    datasets.synthetic_data(13, 1, values=allowed)


def test_config_checks():
  config = load_config(os.path.join(ROOT, "configs", "retrieval_synthetic.py"))
  assert config.attributes.source == "paper" and config.attributes.threshold == 0.75
  config.attributes.source = "guess"
  config.attributes.threshold = 1.5
  with pytest.raises(ConfigError) as caught:
    runner.validate_config(config)
  assert "attributes.source" in str(caught.value) and "attributes.threshold" in str(caught.value)
  celeba = load_config(os.path.join(ROOT, "configs", "retrieval_celeba3.py"))
  celeba.data.source = "celeba_tfds"
  celeba.attributes.source = "auroc"
  with pytest.raises(ConfigError, match="reads CelebA's attribute table"):
    runner.validate_config(celeba)
  assert (
    load_config(os.path.join(ROOT, "configs", "retrieval_celeba5.py")).attributes[
      "min_category_images"
    ]
    == 1
  )


@pytest.mark.slow
def test_retrieve_recomputes_the_attributes_on_the_embedded_world(tmp_path, run_command):
  """--config.attributes.source=auroc: the world's values scored on rendered images, those
  below the threshold dropped from the prompts, the selection in the metrics and tables."""
  args = [
    "--config",
    os.path.join(ROOT, "configs", "retrieval_synthetic.py"),
    "--config.attributes.source=auroc",
    "--config.attributes.threshold=0.99",
    "--config.attributes.n_images=128",
    "--config.data.n_triples=3",
    "--config.data.images_per_category=2",
    "--config.sweep.ws=(0.0,1.0)",
    "--config.sweep.single_ws=(1.0,2.0)",
    "--config.sweep.start_blocks=none",
    "--config.sweep.single_blocks=none",
    "--config.methods=('stori',)",
    f"--workdir={tmp_path / 'out'}",
  ]
  done = run_command(retrieve, *args)
  assert done.returncode == 0, done.stderr[-3000:]
  assert_ends_with_outputs(done.stdout, "retrieval_metrics.json", "retrieval_tables.md")
  results = json.loads((tmp_path / "out" / "retrieval_metrics.json").read_text())
  selection = results["attribute_selection"]
  assert len(selection["auroc"]) == 20 and selection["paper"] is None
  dropped = [n for n, v in selection["auroc"].items() if v < 0.99]
  assert dropped and sorted(selection["selected"]) == sorted(set(selection["auroc"]) - set(dropped))
  values = selection["prompt_values"]
  for prompt in results["prompts"]:  # "a photo of a red striped circle"
    words = prompt.split()[-3:]
    for family, word in zip(("colour", "pattern", "shape"), words):
      assert word in values[family], (prompt, values)
  tables_md = (tmp_path / "out" / "retrieval_tables.md").read_text()
  assert "## Attributes chosen by zero-shot AUROC (App. A.2)" in tables_md
  assert f"{len(selection['selected'])} of 20 attributes reach zero-shot AUROC >= 0.99" in tables_md
