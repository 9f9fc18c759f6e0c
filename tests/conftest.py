"""Fixtures shared by test files: the explorer on the shipped tiny CLIP (one per module)."""

import pytest

from stori_jax import explore


@pytest.fixture(scope="module")
def explorer():
  """The explorer over the synthetic world's index, one image per colour x pattern x shape."""
  return explore.build_explorer("tiny-synthetic", cache_dir=None, images_per_combination=1)


@pytest.fixture(scope="module")
def client(explorer):
  """Flask's test client of the explorer's app."""
  return explore.create_app(explorer).test_client()
