"""The synthetic world as the explorer's default index: every colour x pattern x shape.

Its images' attributes are known, so the page can plot App. B's per-category curves beside
the top k.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np

from stori_jax.data import synthetic
from stori_jax.retrieval import datasets

#: The synthetic world's index: its families whose prompt words define the chart's categories,
#: the render seed (its own namespace, apart from pretraining's (0, k) and the evaluations'
#: (2024, 1..3): held-out images), the prompt the page opens with, and a bound on its size
#: (every change sends C x N curve points to the page).
WORLD_FAMILIES = ("colour", "pattern", "shape")
WORLD_SEED = (2024, 17)
WORLD_PROMPT = "a photo of a red checkered heart"
MAX_IMAGES_PER_COMBINATION = 16


def world_data(images_per_combination: int = 2, image_size: int = 64, seed=WORLD_SEED):
  """The synthetic world's index: every colour x pattern x shape, one object per image.

  Args:
    images_per_combination: m images of each of the 8 x 4 x 8 combinations (size, position,
      background and jitter random).
    image_size: render size (the model's input size).
    seed: render seed.

  Returns:
    (RetrievalData of N = 256 m images, keys "red-checkered-heart/0", rendered on first use;
    their attributes {family: str [N]} for WORLD_FAMILIES).
  """
  m = int(images_per_combination)
  vocabularies = [synthetic.VOCABULARIES[f] for f in WORLD_FAMILIES]
  combinations = list(itertools.product(*vocabularies))
  scenes = [
    (synthetic.ObjectSpec(**dict(zip(WORLD_FAMILIES, values))),)
    for values in combinations
    for _ in range(m)
  ]
  attributes = {
    f: np.repeat(np.asarray([values[j] for values in combinations]), m)
    for j, f in enumerate(WORLD_FAMILIES)
  }
  keys = tuple(f"{'-'.join(values)}/{j}" for values in combinations for j in range(m))

  @functools.lru_cache(maxsize=1)
  def rendered() -> np.ndarray:
    return synthetic.render(scenes, seed, image_size=image_size).images

  def load(indices, size):
    return datasets.resize_images(rendered()[np.asarray(indices, np.int64).reshape(-1)], size)

  spec = {
    "source": "synthetic-world",
    "families": list(WORLD_FAMILIES),
    "images_per_combination": m,
    "seed": [int(s) for s in np.atleast_1d(seed)],
    "render_size": int(image_size),
  }
  return datasets.RetrievalData("synthetic-world", spec, keys, load, ()), attributes


def world_description(images_per_combination: int) -> str:
  """What `world_data`'s index holds, for the page."""
  sizes = [len(synthetic.VOCABULARIES[f]) for f in WORLD_FAMILIES]
  names = {"colour": "colours", "pattern": "patterns", "shape": "shapes"}
  m = int(images_per_combination)
  return (
    " x ".join(f"{n} {names[f]}" for n, f in zip(sizes, WORLD_FAMILIES))
    + f", {m} image{'s' if m > 1 else ''} each, {m * int(np.prod(sizes))} images, synthetic "
    "world (one object per image; size, position and background at random)"
  )
