"""The random parameter initialisers of the models, each compiled as one program per shape.

`clip.init_params` runs flax's init op by op (`lazy_init`: no forward pass, and no program of the
whole init to compile, which took about a minute for ViT-B/16). Run op by op, normal(std) =
(normal draw) * std rounds differently (by 1 ulp) from the same operations compiled together, as
they are in a jitted init; compiled as one program each, the initialisers give the jitted init's
values bit for bit, and every layer of the same shape reuses the program. Inside a jitted init
they are inlined, so both ways give the same values. Constant initialisers (zeros, ones,
`constant`) are exact either way and stay flax's.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

Initializer = Callable[..., jax.Array]


def _compiled(init: Initializer) -> Initializer:
  """init(key, shape[, dtype]) with shape and dtype static: one program per (shape, dtype)."""
  jitted = jax.jit(init, static_argnames=("shape", "dtype"))

  def call(key: jax.Array, shape, dtype: Any = None) -> jax.Array:
    if dtype is None:  # init's own default
      return jitted(key, shape=tuple(shape))
    return jitted(key, shape=tuple(shape), dtype=jnp.dtype(dtype))

  return call


@functools.lru_cache(maxsize=None)
def normal(stddev: float) -> Initializer:
  """flax's `nn.initializers.normal(stddev)`, compiled (one per stddev, so programs are shared)."""
  return _compiled(nn.initializers.normal(stddev))


@functools.lru_cache(maxsize=None)
def lecun_normal() -> Initializer:
  """flax's `nn.initializers.lecun_normal()`, the default kernel init of nn.Dense and nn.Conv."""
  return _compiled(nn.initializers.lecun_normal())
