"""SToRI Fig. 3, the pairwise study (`stori_jax.fewshot.pairwise_contrast`, `python -m
stori_jax.contrast`): prompts from attribute labels (CUB files written here, the embedded
world), the figure, the refusals, and the study run offline on the embedded world."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from stori_jax import contrast
from stori_jax.plumbing.config_files import ConfigError, load_config
from stori_jax.data.files import ClassMismatchError, DatasetMissingError
from stori_jax.fewshot import pairwise_contrast

from test_cli import assert_ends_with_outputs
from test_data_cub import write_cub

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _vireo_labels(c, i, training):
  """Blue headed Vireo (0): striped wings, grey wings on 3 of 4 training images, a blue crown;
  Warbling Vireo (1): grey wings; White eyed Vireo (2): striped wings, red eyes. Test images
  carry no label (prompts read the training images only)."""
  if not training:
    return [False] * 5
  return [
    c in (0, 2),  # has_wing_pattern::striped
    c == 1 or (c == 0 and i < 3),  # has_wing_color::grey
    c == 0 and i < 2,  # has_crown_color::blue (2 of 4: the share 0.5)
    c == 2,  # has_eye_color::red
    False,
  ]


def test_cub_prompts_come_from_each_classs_attribute_labels(tmp_path):
  root = write_cub(str(tmp_path), _vireo_labels)
  tasks = pairwise_contrast.cub_pairings(
    root, "Blue headed Vireo", ["warbling vireo", "White_eyed_Vireo"], min_share=0.5
  )
  assert [t.name for t in tasks] == [
    "Blue_headed_Vireo vs Warbling_Vireo",
    "Blue_headed_Vireo vs White_eyed_Vireo",
  ]
  assert [t.folder for t in tasks] == ["vs_Warbling_Vireo", "vs_White_eyed_Vireo"]
  expected = [
    "a photo of a Blue headed Vireo, a type of bird, which has striped wing pattern.",
    "a photo of a Blue headed Vireo, a type of bird, which has grey wing.",
    "a photo of a Blue headed Vireo, a type of bird, which has blue crown.",
  ]
  for task in tasks:  # the anchor's prompts: the same texts in both pairings
    assert task.prompts["Blue_headed_Vireo"] == expected
    assert task.attributes["Blue_headed_Vireo"] == [
      ("has_wing_pattern::striped", 1.0),
      ("has_wing_color::grey", 0.75),
      ("has_crown_color::blue", 0.5),
    ]
    split = task.split
    assert split.dataset == "cub" and len(split.train) == 8 and len(split.test) == 6
    assert all(os.path.isfile(item.source) for item in split.train + split.test)
  assert tasks[0].prompts["Warbling_Vireo"] == [
    "a photo of a Warbling Vireo, a type of bird, which has grey wing."
  ]
  assert tasks[1].prompts["White_eyed_Vireo"] == [
    "a photo of a White eyed Vireo, a type of bird, which has striped wing pattern.",
    "a photo of a White eyed Vireo, a type of bird, which has red eye.",
  ]
  # A stricter share and a cap; a K-shot sample of the training images.
  (task,) = pairwise_contrast.cub_pairings(
    root, "Blue_headed_Vireo", ["Warbling_Vireo"], min_share=0.6, per_class=1, shots=2
  )
  assert task.attributes["Blue_headed_Vireo"] == [("has_wing_pattern::striped", 1.0)]
  assert np.bincount(task.split.train_labels).tolist() == [2, 2]
  with pytest.raises(ClassMismatchError, match="did you mean 'Warbling_Vireo'"):
    pairwise_contrast.cub_pairings(root, "Blue_headed_Vireo", ["Warbling Vireos"])
  with pytest.raises(ConfigError, match="no attribute labelled"):
    pairwise_contrast.cub_pairings(root, "Blue_headed_Vireo", ["Black_footed_Albatross"])


def test_synthetic_pairings_share_the_anchors_images_and_prompts():
  tasks = pairwise_contrast.synthetic_pairings(
    "red striped star",
    ["red dotted star", "orange striped star"],
    shots=4,
    n_test_per_class=3,
    image_size=32,
    min_share=1.0,
  )
  anchor = [
    "a photo of a red striped star, which has red color.",
    "a photo of a red striped star, which has striped pattern.",
    "a photo of a red striped star, which has star shape.",
  ]
  assert [t.prompts["red striped star"] for t in tasks] == [anchor, anchor]
  assert tasks[1].prompts["orange striped star"][0].endswith("which has orange color.")
  first, second = (np.stack([i.source for i in t.split.train[:4]]) for t in tasks)
  np.testing.assert_array_equal(first, second)  # the anchor's images, in both pairings
  assert first.shape == (4, 32, 32, 3) and len(tasks[0].split.test) == 6
  # Every image of the class is labelled with its colour, pattern and shape.
  batch = pairwise_contrast.synthetic_class_images(
    pairwise_contrast.synthetic_tasks.class_from_name("orange striped star"), 5, 1, False, 16
  )
  table = pairwise_contrast.synthetic_attribute_table(batch)
  assert table["has_primary_color::orange"].all() and table["has_pattern::striped"].all()
  assert not table["has_shape::circle"].any()
  assert sum(table[f"has_size::{s}"].sum() for s in ("small", "large")) == 5


def test_prompt_builder_and_template_checks():
  names = ["has_shape::duck-like", "has_crown_color::blue", "has_wing_color::grey"]
  chosen = pairwise_contrast.class_attributes(
    names, np.array([0.5, 0.9, 0.9]), per_class=2, min_share=0.5
  )
  assert chosen == [("has_crown_color::blue", 0.9), ("has_wing_color::grey", 0.9)]  # stable ties
  assert pairwise_contrast.attribute_prompts(
    "Black_footed_Albatross", chosen, "{attribute} on a {name}"
  ) == [
    "blue crown on a Black footed Albatross",
    "grey wing on a Black footed Albatross",
  ]
  assert pairwise_contrast.attribute_prompts(
    "American_Crow", chosen[:1], "{a_name}: {attribute}"
  ) == ["an American Crow: blue crown"]
  assert pairwise_contrast.check_template("a {name} with {attribute}") is None
  assert "{attribute}" in pairwise_contrast.check_template("a photo of a {name}")
  assert pairwise_contrast.check_template("a photo of {a_name}, {attribute}") is None
  assert "only the fields" in pairwise_contrast.check_template("a {bird} with {attribute}")
  config = load_config(os.path.join(ROOT, "configs", "pairwise_synthetic.py"))
  config.prompts.template = "a photo of a {name}"
  config.data.others = ()
  with pytest.raises(ConfigError) as caught:
    pairwise_contrast.validate_config(config)
  assert "must contain {attribute}" in str(caught.value) and "config.data.others" in str(
    caught.value
  )


def _fake_pairing(other, words_of):
  prompts = []
  for c in ("anchor", other):
    for k in range(2):
      words = words_of(c, k)
      prompts.append(
        {
          "class": c,
          "prompt": " ".join(w for w, _ in words),
          "tokens": [(w + " ", x) for w, x in words],
          "words": words,
        }
      )
  return {
    "classes": ["anchor", other],
    "zero_shot": {"accuracy": 0.5},
    "trained": {"accuracy": 0.75},
    "prompts": prompts,
  }


def test_figure_shows_the_pairings_side_by_side(tmp_path, monkeypatch):
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  closed, close = [], plt.close
  monkeypatch.setattr(plt, "close", lambda fig=None: (closed.append(fig), close(fig)))
  first = _fake_pairing("dotted", lambda c, k: [("a", 1.0), ("striped", 3.0), ("red", 1.0)])
  second = _fake_pairing("orange", lambda c, k: [("a", 1.0), ("striped", 1.0), ("red", 3.0)])
  changes = pairwise_contrast.anchor_word_changes([first, second])
  assert {r["word"] for r in changes[:4]} == {"striped", "red"}
  np.testing.assert_allclose([r["spread"] for r in changes], [0.4] * 4 + [0.0] * 2)
  striped = next(r for r in changes if r["word"] == "striped")
  assert striped["shares"] == pytest.approx({"dotted": 0.6, "orange": 0.2})
  pairwise_contrast.pairwise_figure(str(tmp_path / "fig3.png"), [first, second])
  (fig,) = closed
  texts = [t.get_text() for t in fig.texts]
  assert "anchor vs dotted" in texts and "anchor vs orange" in texts
  assert "normalised to sum to 1 per prompt" in fig._suptitle.get_text()
  (bar,) = [ax for ax in fig.axes if ax.get_xlabel()]
  assert "sums to 1 per prompt" in bar.get_xlabel()
  # One colour scale: the darkest box is the largest share anywhere (3 / 5).
  boxes = [t.get_bbox_patch().get_facecolor()[3] for t in fig.texts if t.get_bbox_patch()]
  assert max(boxes) == pytest.approx(0.85) and min(boxes) == pytest.approx(0.85 / 3)
  assert (tmp_path / "fig3.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_contrast_refuses_a_missing_cub_before_loading_a_model(tmp_path, run_command):
  done = run_command(
    contrast,
    "--config",
    os.path.join(ROOT, "configs", "pairwise_cub.py"),
    f"--config.data.root={tmp_path / 'CUB_200_2011'}",
    f"--workdir={tmp_path / 'out'}",
  )
  assert done.returncode == 2, done.stderr[-2000:]
  assert "CUB_200_2011.tgz" in done.stderr and "Traceback" not in done.stderr
  assert "image_attribute_labels.txt" in done.stderr
  with pytest.raises(DatasetMissingError):
    pairwise_contrast.build_pairings(load_config(os.path.join(ROOT, "configs", "pairwise_cub.py")))


def test_the_cub_config_trains_on_the_papers_scheme_with_fresh_views(
  tmp_path, run_command, tiny_random_model
):
  """configs/pairwise_cub.py as shipped but for the model, data and length: App. A.1's few-shot
  training, TaskRes's scheme (epoch 1 at 1e-5, then one cosine rate per epoch, Dassl's
  CosineAnnealingLR restarted after the warm-up) and a fresh view of every image at every step
  (no cached views)."""
  root = write_cub(str(tmp_path), _vireo_labels)
  done = run_command(
    contrast,
    "--config",
    os.path.join(ROOT, "configs", "pairwise_cub.py"),
    f"--config.data.root={root}",
    "--config.data.others=('Warbling_Vireo',)",
    f"--config.model.source={tiny_random_model}",
    "--config.epochs=3",
    "--config.batch_size=4",
    "--config.log_every=1",
    f"--workdir={tmp_path / 'out'}",
  )
  assert done.returncode == 0, done.stderr[-3000:]
  run = json.loads((tmp_path / "out" / "run.json").read_text())["config"]
  assert run["views"] == 0 and run["optim"]["schedule"] == "taskres"
  history = [
    json.loads(line)
    for line in (tmp_path / "out" / "vs_Warbling_Vireo" / "history.jsonl").read_text().splitlines()
  ]
  rates = {}
  for record in history:
    if "lr" in record:
      rates.setdefault(record["epoch"], set()).add(record["lr"])
  assert sorted(rates) == [1, 2, 3] and all(len(r) == 1 for r in rates.values()), rates
  (warmup,), (second,), (third,) = (rates[e] for e in (1, 2, 3))
  assert warmup == pytest.approx(1e-5, rel=1e-6)
  # lr (1 + cos(pi (e - 2) / 3)) / 2 in epoch e >= 2: the full rate, then a quarter down.
  assert second == pytest.approx(0.05, rel=1e-6)
  assert third == pytest.approx(0.05 * (1 + np.cos(np.pi / 3)) / 2, rel=1e-6)


@pytest.mark.slow
def test_contrast_on_the_embedded_world(tmp_path, run_command):
  """The embedded Fig. 3: red striped star against red dotted star (the pattern tells them
  apart) and against orange striped star (the colour does). The anchor's pattern word weighs
  more against the first, its colour word more against the second, as 'striped' and 'grey' do
  in the paper's figure; a second run resumes every pairing without training."""
  args = [
    "--config",
    os.path.join(ROOT, "configs", "pairwise_synthetic.py"),
    "--config.epochs=40",
    "--config.data.n_test_per_class=20",
    f"--workdir={tmp_path / 'out'}",
  ]
  done = run_command(contrast, *args)
  assert done.returncode == 0, done.stderr[-3000:]
  out = tmp_path / "out"
  paths = assert_ends_with_outputs(
    done.stdout, "run.json", "pairwise.json", "fig3_pairwise.png", "vs_red_dotted_star"
  )
  assert os.path.join(out, "vs_orange_striped_star", "") in paths  # folders end with a slash
  for folder in ("vs_red_dotted_star", "vs_orange_striped_star"):
    for name in ("weights.json", "interpretability.png", "history.jsonl", "training_curve.png"):
      assert (out / folder / name).is_file(), (folder, name)
  results = json.loads((out / "pairwise.json").read_text())
  assert results["anchor"] == "red striped star"
  dotted, orange = results["pairings"]
  assert [p["prompt"] for p in dotted["prompts"][:3]] == [
    p["prompt"] for p in orange["prompts"][:3]
  ]
  for pairing in (dotted, orange):
    assert pairing["trained"]["accuracy"] >= 0.9, pairing["trained"]

  def anchor_weight(pairing, word):
    """Mean trained weight of `word` over the anchor's prompts (both places it appears)."""
    return np.mean(
      [
        w
        for p in pairing["prompts"]
        if p["class"] == "red striped star"
        for x, w in p["words"]
        if x == word
      ]
    )

  assert anchor_weight(dotted, "striped") > anchor_weight(orange, "striped") + 0.1
  assert anchor_weight(orange, "red") > anchor_weight(dotted, "red") + 0.3
  assert "Anchor: red striped star" in done.stdout
  again = run_command(contrast, *args)
  assert again.returncode == 0 and "Resumed from step 40 of 40" in again.stderr
  assert json.loads((out / "pairwise.json").read_text())["pairings"] == results["pairings"]
