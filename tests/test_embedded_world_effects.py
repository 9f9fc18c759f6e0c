"""The shipped tiny CLIP: its text tower responds to token weights at its default
blocks the way the paper reports for real CLIP, with sizes asserted on held-out images, while
it keeps its zero-shot quality. (Measured values are in docs/embedded_world.md, re-measured by
scripts/embedded_world_figures.py.)"""

import numpy as np
import pytest

import stori_jax
from stori_jax.plumbing.config_files import load_config
from stori_jax.world_evaluation import metrics as sw
from stori_jax.retrieval import datasets, protocol, start_block_sweep
from stori_jax.retrieval.index import encode_data

pytestmark = pytest.mark.slow
#: Images and triples no test or training run has seen (pretraining draws (0, step) streams).
HELD_OUT = (5151, 3)


@pytest.fixture(scope="module")
def world():
  bundle = stori_jax.load("tiny-synthetic")
  data = datasets.synthetic_data(n_triples=24, images_per_category=8, seed=HELD_OUT)
  return bundle, encode_data(bundle, data), list(data.tasks)


def test_table3_moves_every_attribute_by_three_points(world):
  bundle, embeddings, tasks = world
  table3 = protocol.emphasis(bundle, embeddings, tasks, weights=(0.5, 1.0, 1.5))
  for a, family in enumerate(sw.EMPHASIS_FAMILIES):
    rows = table3["rows"][a :: len(sw.EMPHASIS_FAMILIES)]
    assert len(rows) == 24
    ap = np.array([[r["ap"][k] for k in ("0.5", "1.0", "1.5")] for r in rows])
    assert (ap[:, 2] - ap[:, 1]).mean() >= 0.03, (family, ap.mean(axis=0))
    assert (ap[:, 0] - ap[:, 1]).mean() <= -0.03, (family, ap.mean(axis=0))


def test_weight_zero_removes_the_colour_preference(world):
  bundle, embeddings, tasks = world
  # Measured 89.6% -> 53.6% here (96.1% -> 53.6% on the README's probe set).
  assert protocol.top_share(bundle, embeddings, tasks, 0, 1.0) >= 0.85
  assert protocol.top_share(bundle, embeddings, tasks, 0, 0.0) <= 0.65


def test_fig5_sweep_moves_the_favoured_category(world):
  bundle, embeddings, tasks = world
  config = load_config("configs/retrieval_synthetic.py")
  sweep = protocol.auc_sweep(
    bundle, embeddings, tasks, config.sweep.ws, tuple(config.sweep.attributes), True
  )
  focus = [row[sweep["focus"]] for row in sweep["mean_auc"]]
  # Measured 0.081 -> 0.280 (0.199) here, 0.070 -> 0.273 (0.203) on the README's probe set;
  # issue 17 asks for 0.2 (tiny-synthetic-base: 0.000).
  assert focus[-1] - focus[0] >= 0.15, focus
  assert protocol.is_monotonic(focus, tolerance=1e-3), focus


def test_stored_default_start_block_is_the_measured_one(world):
  bundle, embeddings, tasks = world
  sweep = start_block_sweep.start_block_sweep(bundle, embeddings, tasks)
  assert bundle.config.text.default_start_block == sweep["recommended"], (
    start_block_sweep.format_table(sweep)
  )


def test_zero_shot_quality_is_kept():
  bundle = stori_jax.load("tiny-synthetic")
  accuracy = sw.zero_shot_attributes(bundle, families=("colour", "shape", "pattern"))["accuracy"]
  assert accuracy["colour"] >= 0.99 and accuracy["shape"] >= 0.90, accuracy
  assert accuracy["pattern"] >= 0.90, accuracy
  recall = sw.retrieval_recall(bundle, n_pairs=1000)
  assert recall["text_to_image"]["R@1"] >= 0.60, recall["text_to_image"]
