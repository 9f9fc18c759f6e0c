"""Reference mode's K-means under the seeding protocol (issue 37): np.random.seed(s) and
torch.manual_seed(s) before the authors' kmeans_pytorch call. The device replays numpy's legacy
`choice(N, k, replace=False)` and torch's `randint` from MT19937 words (mutual.mt19937), and
its K-means equals kmeans_pytorch's, the authors' call (mutual.reference.
kmeans_labels) and a direct call of the library, assignment for assignment."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mutual import concepts, mt19937, paper_config
from stori_jax.plumbing.config_files import ConfigError


# ---------------------------------------------------------------------------------------------
# The generators.


def _choices(seeds, sizes, k_max: int, size: int) -> np.ndarray:
  """The device's np.random.choice(n, k_max, replace=False) per (seed, n), in one program."""
  words = np.stack([mt19937.legacy_words(int(s), mt19937.permutation_words(size)) for s in seeds])
  draw = jax.jit(jax.vmap(lambda w, n: mt19937.legacy_choice(w, n, k_max, size)))
  return np.asarray(draw(jnp.asarray(words), jnp.asarray(sizes, jnp.int32)))


def test_the_replayed_start_is_numpys_legacy_choice_for_thousands_of_draws():
  """np.random.seed(s); np.random.choice(N, k, replace=False) for 3,000 random (s, N, k), the
  seed over numpy's whole range and N across powers of two (where random_interval's mask grows):
  the device's draw is the same, k's draw being the first k of the permutation."""
  rng = np.random.default_rng(0)
  count, size, k_max = 3000, 300, 8
  seeds = rng.integers(0, 2**32, count)
  seeds[:4] = (0, 1, 2**31, 2**32 - 1)
  sizes = rng.integers(1, size + 1, count)
  sizes[4:20] = (1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 63, 64, 65, 256, 257)
  ks = np.minimum(rng.integers(1, k_max + 1, count), sizes)
  got = _choices(seeds, sizes, k_max, size)
  for seed, n, k, row in zip(seeds, sizes, ks, got):
    np.random.seed(int(seed))
    want = np.random.choice(int(n), int(k), replace=False)
    np.testing.assert_array_equal(row[:k], want, err_msg=f"seed {seed}, N {n}, k {k}")


def test_the_replayed_start_holds_for_class_sized_populations():
  """Populations of a class's foreground tokens (up to 50 images of 14 x 14 patches): the same
  draws, within the words `permutation_words` provides."""
  size = 50 * 196
  sizes = (size, size - 1, 4097, 8192, 8193, 1000)
  seeds = (0, 7, 123456789, 2**32 - 2, 31, 5)
  got = _choices(seeds, sizes, 5, size)
  for seed, n, row in zip(seeds, sizes, got):
    np.random.seed(seed)
    np.testing.assert_array_equal(row, np.random.choice(n, 5, replace=False))
  words = jnp.asarray(mt19937.legacy_words(0, mt19937.permutation_words(size)))
  _, read = mt19937.legacy_permutation(words, size, size)
  assert size - 1 <= int(read) < 2 * size  # about 1.39 words a draw


def test_torch_randint_reads_the_same_stream():
  """torch.manual_seed(s) and np.random.seed(s) seed MT19937 alike: torch.randint(n, (1,)) on
  the CPU, kmeans_pytorch's empty-cluster redraw, is the next word modulo n (below 2**28, where
  torch switches to 64-bit draws)."""
  torch = pytest.importorskip("torch", reason="torch (the torch extra) replays the redraw")
  for seed in (0, 1, 42, 2**32 - 1):
    for n in (1, 2, 5, 97, 1000, 196 * 50, mt19937.TORCH_32_BIT_LIMIT - 1):
      torch.manual_seed(seed)
      want = [int(torch.randint(n, (1,))) for _ in range(20)]
      words = jnp.asarray(mt19937.legacy_words(seed, 20))
      np.testing.assert_array_equal(mt19937.torch_randint(words, jnp.arange(20), n), want)


def test_a_seed_numpy_refuses_is_refused():
  for seed in (-1, 2**32, 1.5, True):
    with pytest.raises(ValueError, match="seed"):
      mt19937.legacy_words(seed, 4)
  for seed in (-1, 2**32):
    a = paper_config.analysis_config(kmeans_seed=seed)
    with pytest.raises(ConfigError, match="kmeans_seed"):
      paper_config.check_analysis(a)


# ---------------------------------------------------------------------------------------------
# The whole K-means against kmeans_pytorch.


def _torch_reference():
  pytest.importorskip("torch", reason="the torch extra runs the reference K-means")
  pytest.importorskip(
    "kmeans_pytorch",
    reason="kmeans-pytorch (PyPI, in the mutual and test extras: pip install -e '.[test]') "
    "is the library the reference K-means runs",
  )
  return pytest.importorskip(
    "mutual.reference",
    reason="the reference pipeline needs OpenCV and scikit-learn (the mutual extra)",
  )


def _case(rng, m: int, d: int, k: int):
  """Unit rows x [m, d] around k + 1 random means, a foreground mask with at least k rows."""
  mask = rng.random(m) < rng.uniform(0.3, 0.9)
  mask[rng.choice(m, k, replace=False)] = True
  means = rng.normal(size=(k + 1, d)) * rng.uniform(0.5, 2.0)
  x = means[rng.integers(0, k + 1, m)] + rng.normal(size=(m, d))
  x = x / np.linalg.norm(x, axis=1, keepdims=True)
  return x.astype(np.float32), mask


def _ours(x, mask, k: int, seed: int) -> np.ndarray:
  words = jnp.asarray(concepts.reference_words(seed, len(x), k))
  _, labels = concepts.random_start_kmeans(words, jnp.asarray(x), jnp.asarray(mask), k)
  return np.asarray(labels)[mask]


class _Meter:
  """kmeans_pytorch 0.3's tqdm meter, stopping a loop past 5,000 iterations."""

  def __init__(self, *args, **kwargs):
    self.n = 0

  def set_postfix(self, *args, **kwargs):
    pass

  def update(self):
    self.n += 1
    if self.n > 5000:
      raise TimeoutError


def _direct(kmeans_pytorch, torch, x, k: int, seed: int):
  """kmeans_pytorch.kmeans called as the authors call it, after the protocol's two seeds (on
  PyPI's 0.3, which has no iter_limit, a watchdog fails a loop past 5,000 iterations)."""
  github = "iter_limit" in inspect.signature(kmeans_pytorch.kmeans).parameters
  kwargs = dict(tqdm_flag=False, iter_limit=500) if github else {}
  original = kmeans_pytorch.tqdm
  kmeans_pytorch.tqdm = _Meter
  try:
    np.random.seed(seed)
    torch.manual_seed(seed)
    labels, _ = kmeans_pytorch.kmeans(
      X=torch.from_numpy(x), num_clusters=k, distance="euclidean", **kwargs
    )
  finally:
    kmeans_pytorch.tqdm = original
  return labels.numpy()


def test_reference_kmeans_equals_kmeans_pytorch_on_random_inputs():
  """80 random inputs (foreground masks, k from 2 to 6, seeds over numpy's range): the device's
  K-means (start and loop) gives the assignments of the authors' call under the protocol
  (`kmeans_labels`) and of kmeans_pytorch.kmeans called directly after the two seeds."""
  reference = _torch_reference()
  import kmeans_pytorch  # pylint: disable=import-outside-toplevel  (after the skip checks)
  import torch  # pylint: disable=import-outside-toplevel

  rng = np.random.default_rng(1)
  for case in range(80):
    k = int(rng.integers(2, 7))
    x, mask = _case(rng, 64, 8, k)
    seed = int(rng.integers(0, 2**32))
    stats = {}
    theirs = reference.kmeans_labels(torch.from_numpy(x[mask]), k, seed, stats)
    np.testing.assert_array_equal(_ours(x, mask, k, seed), theirs, err_msg=f"case {case}")
    if not stats.get("empty_clusters"):  # there PyPI's 0.3 and the authors' code agree
      called = _direct(kmeans_pytorch, torch, x[mask], k, seed)
      np.testing.assert_array_equal(called, theirs, err_msg=f"case {case}")


def test_empty_clusters_redraw_as_torch_randint_does(monkeypatch):
  """Centres away from every row (kmeans_pytorch's initialize patched to give them) leave
  clusters empty: each takes the row torch.randint draws, in cluster order, on both sides; two
  redraws of one row leave the second empty again, and so on. 40 inputs, 1 to 4 far centres."""
  reference = _torch_reference()
  import kmeans_pytorch  # pylint: disable=import-outside-toplevel  (after the skip checks)
  import torch  # pylint: disable=import-outside-toplevel

  rng = np.random.default_rng(2)
  redraws = 0
  for case in range(40):
    k = int(rng.integers(2, 7))
    x, mask = _case(rng, 48, 6, k)
    n_far = int(rng.integers(1, k)) if k > 2 else 1
    rows = np.flatnonzero(mask)[rng.choice(int(mask.sum()), k - n_far, replace=False)]
    far = -5.0 * np.mean(x[mask], axis=0) + rng.normal(size=(n_far, x.shape[1]))
    centers = np.concatenate([x[rows], far.astype(np.float32)])
    centers = centers[rng.permutation(k)]
    given = torch.from_numpy(centers)
    monkeypatch.setattr(
      kmeans_pytorch, "initialize", lambda X, num_clusters, seed=None: given.clone()
    )
    seed = int(rng.integers(0, 2**32))
    stats = {}
    theirs = reference.kmeans_labels(torch.from_numpy(x[mask]), k, seed, stats)
    words = jnp.asarray(concepts.reference_words(seed, len(x), k))
    _, ours = concepts.kmeans_pytorch_loop(
      words, jnp.asarray(x), jnp.asarray(mask), jnp.asarray(centers)
    )
    np.testing.assert_array_equal(np.asarray(ours)[mask], theirs, err_msg=f"case {case}")
    redraws += stats.get("empty_clusters", 0)
  assert redraws > 40


def test_the_iteration_limit_stops_both_alike(monkeypatch):
  """utils.kmeans_clustering's iter_limit (500; here 1 to 3, on inputs that need more): both
  sides return the assignments of the last iteration."""
  reference = _torch_reference()
  import torch  # pylint: disable=import-outside-toplevel

  rng = np.random.default_rng(4)
  checked = 0
  for case in range(30):
    limit = int(rng.integers(1, 4))
    x, mask = _case(rng, 64, 8, 5)
    seed = int(rng.integers(0, 2**32))
    monkeypatch.setattr(reference, "KMEANS_ITER_LIMIT", limit)
    theirs = reference.kmeans_labels(torch.from_numpy(x[mask]), 5, seed)
    monkeypatch.setattr(reference, "KMEANS_ITER_LIMIT", 500)
    settled = reference.kmeans_labels(torch.from_numpy(x[mask]), 5, seed)
    words = jnp.asarray(concepts.reference_words(seed, len(x), 5))
    _, ours = concepts.random_start_kmeans(
      words, jnp.asarray(x), jnp.asarray(mask), 5, max_iter=limit
    )
    np.testing.assert_array_equal(np.asarray(ours)[mask], theirs, err_msg=f"case {case}")
    checked += not np.array_equal(theirs, settled)
  assert checked >= 10  # the limit did cut those loops short


def test_kmeans_concepts_reference_init_is_the_authors_call_on_the_patch_grid():
  """concept maps of kmeans_concepts(init="random") over [B, h, w, D] features: the labels of
  utils.kmeans_clustering on the foreground tokens in the reference's order (image, row,
  column), L2-normalised there by F.normalize."""
  reference = _torch_reference()
  import torch  # pylint: disable=import-outside-toplevel

  rng = np.random.default_rng(3)
  for seed in (0, 17, 2**32 - 5):
    features = rng.normal(size=(3, 6, 6, 12)).astype(np.float32)
    features[..., :3] += 2.0 * rng.normal(size=(3, 6, 6, 1)).astype(np.float32)
    mask = rng.random((3, 6, 6)) < 0.6
    maps = np.asarray(concepts.kmeans_concepts(features, mask, 5, seed=seed, init="random"))
    theirs = reference.kmeans_labels(torch.from_numpy(features[mask]), 5, seed)
    np.testing.assert_array_equal(maps[mask], theirs)
    assert np.all(maps[~mask] == -1)
