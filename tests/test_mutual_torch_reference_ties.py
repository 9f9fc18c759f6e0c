"""Tie order in the language stage: torch.topk's on CPU is no stable rule, so mutual.
torch_reference and the project share one (mutual.reference.top_with_ties)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")


def test_torch_topk_tie_order_is_not_a_stable_rule():
  """On rows of equal values (the uniform transport-plan row of a single concept), the indices
  torch.topk returns depend on the row length and k (its partial selection), not on a rule such
  as lowest index first; partly tied rows likewise."""
  lowest_first, other = 0, 0
  for n in range(3, 200):
    for k in (1, 2, 3):
      got = torch.topk(torch.ones(n), k).indices.tolist()
      lowest_first += got == list(range(k))
      other += got != list(range(k))
  assert lowest_first > 0 and other > 0
  assert torch.topk(torch.ones(10), 3).indices.tolist() != [0, 1, 2]
  rng = np.random.default_rng(0)
  stable = 0
  for _ in range(500):
    n = int(rng.integers(3, 200))
    values = rng.integers(0, 3, n).astype(np.float32)
    got = torch.topk(torch.from_numpy(values), 3).indices.tolist()
    stable += got == list(np.lexsort((np.arange(n), -values))[:3])
  assert stable < 500


def test_shared_tie_rule_orders_ties_by_raw_score():
  from mutual import reference as torch_reference  # pylint: disable=import-outside-toplevel

  plan = torch.ones(1, 10)
  scores = torch.tensor([[0.1, 0.5, 0.3, 0.9, 0.2, 0.8, 0.0, 0.4, 0.7, 0.6]])
  assert torch_reference.top_with_ties(plan, scores, 3) == [[3, 5, 8]]
