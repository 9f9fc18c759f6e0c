"""numpy's legacy global generator and torch's CPU generator, replayed in JAX.

Reference mode's K-means follows the authors' kmeans_pytorch call under one seeding protocol:
`np.random.seed(s)` and `torch.manual_seed(s)` before it. kmeans_pytorch draws its start with
numpy's legacy global generator (`np.random.choice(N, k, replace=False)`) and refills an empty
cluster with a row drawn by `torch.randint(N, (1,))` from torch's default CPU generator.

Both generators are MT19937 seeded by the same rule (init_genrand of the 32-bit seed: numpy's
legacy `mt19937_seed`, torch's `mt19937(seed)`), so for a seed in [0, 2**32) they give the same
stream of 32-bit words, each generator from its first word. The words are computed once on the
host from numpy's own generator (`legacy_words`), as mutual.ellipse computes Python's `random`
words; the draws that read them run on the device:

  * `legacy_permutation`: RandomState.permutation(n), which legacy `choice(n, k,
    replace=False, p=None)` takes the first k of: a Fisher-Yates shuffle of arange(n), for i
    from n - 1 down to 1 swapping items i and random_interval(i); random_interval(i) reads words
    until one's low bits under the smallest all-ones mask >= i are <= i.
  * `torch_randint`: torch.randint(n, (1,)) on the CPU for n < 2**28: one word, modulo n
    (from 2**28 on, torch's public builds draw 64 bits from two words: not replayed).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

#: np.random.seed takes a seed in [0, 2**32); torch.manual_seed keeps its low 32 bits.
SEED_LIMIT = 2**32
#: torch.randint(n) reads one 32-bit word below this range and two (random64) from it, in the
#: public builds (ATen's uniform_int_from_to_distribution).
TORCH_32_BIT_LIMIT = 2**28
#: Words read per loop step of `legacy_permutation` (fewer steps of the device loop).
_UNROLL = 4


def check_seed(seed) -> int:
  """seed as an int, or ValueError where np.random.seed would refuse it."""
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
    raise ValueError(f"the seed must be an integer in [0, 2**32), got {seed!r}.")
  if not 0 <= int(seed) < SEED_LIMIT:
    raise ValueError(f"the seed must be in [0, 2**32) (np.random.seed's range), got {seed}.")
  return int(seed)


@functools.lru_cache(maxsize=16)
def legacy_words(seed: int, count: int) -> np.ndarray:
  """uint32 [count] (read-only): the first words np.random.seed(seed) makes numpy's legacy
  global generator give, and torch.manual_seed(seed) torch's CPU generator (the same stream)."""
  state = np.random.RandomState(check_seed(seed)).get_state(legacy=False)
  generator = np.random.MT19937()
  generator.state = dict(bit_generator="MT19937", state=state["state"])
  words = generator.random_raw(count).astype(np.uint32)
  words.setflags(write=False)
  return words


def permutation_words(size: int) -> int:
  """Words `legacy_words` should hold for `legacy_permutation` of up to `size` items: each
  random_interval reads 1.39 words on average and fewer than 2 words in expectation, so 3 per
  item and 256 more leave at least 10 standard deviations to spare at any size."""
  return 3 * int(size) + 256


def _interval_mask(i):
  """The smallest all-ones mask >= i, for uint32 i >= 1."""
  bits = jnp.uint32(32) - jax.lax.clz(i).astype(jnp.uint32)
  return jnp.where(bits >= 32, jnp.uint32(0xFFFFFFFF), (jnp.uint32(1) << bits) - jnp.uint32(1))


def legacy_permutation(words: jax.Array, n, size: int):
  """np.random.permutation(n) from `words` (uint32 [W], a generator's stream from its cursor
  0): int32 [size] whose first n entries are the permutation (the rest: n, n + 1, ...), and
  the words read. 0 <= n <= size (traced). `legacy_choice` takes its first k.

  Should the words run out (W below `permutation_words(n)`, against odds of 10 standard
  deviations and more), the loop stops there: the words read equal W."""
  count = words.shape[0]
  n = jnp.asarray(n, jnp.int32)

  def step(state):
    arr, i, cursor = state
    active = (i >= 1) & (cursor < count)
    word = words[jnp.clip(cursor, 0, count - 1)]
    bound = jnp.maximum(i, 1).astype(jnp.uint32)
    value = word & _interval_mask(bound)
    take = active & (value <= bound)
    j = jnp.where(take, value.astype(jnp.int32), i)
    at_i, at_j = arr[i], arr[j]
    arr = arr.at[i].set(at_j).at[j].set(at_i)
    return arr, i - take.astype(jnp.int32), cursor + active.astype(jnp.int32)

  def block(state):
    for _ in range(_UNROLL):
      state = step(state)
    return state

  def more(state):
    _, i, cursor = state
    return (i >= 1) & (cursor < count)

  init = (jnp.arange(size, dtype=jnp.int32), n - 1, jnp.int32(0))
  arr, _, cursor = jax.lax.while_loop(more, block, init)
  return arr, cursor


def legacy_choice(words: jax.Array, n, k: int, size: int) -> jax.Array:
  """np.random.choice(n, k, replace=False) (legacy, p=None) from `words`: int32 [k], for
  k <= n <= size. Where n < k (numpy raises) the entries from n on repeat the first ones."""
  arr, _ = legacy_permutation(words, n, size)
  first = arr[:k]
  position = jnp.arange(k, dtype=jnp.int32)
  return jnp.where(position < n, first, first[position % jnp.maximum(n, 1)])


def torch_randint(words: jax.Array, cursor, n) -> jax.Array:
  """torch.randint(n, (1,)) on the CPU (int64, 1 <= n < TORCH_32_BIT_LIMIT) from the word at
  `cursor` (int32; broadcasts): the word modulo n."""
  word = words[jnp.clip(cursor, 0, words.shape[0] - 1)]
  return (word % jnp.asarray(n).astype(jnp.uint32)).astype(jnp.int32)
