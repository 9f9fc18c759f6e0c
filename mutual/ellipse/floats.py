"""OpenCV's floating point in JAX: 64-bit tracing, OpenCV's epsilons, and products and quotients
rounded as C rounds them.

The fits need float64 and the rasteriser int64, so their jitted functions are traced and
compiled with 64-bit types switched on (`with_x64`).

fitEllipse on exactly 5 points (fitEllipseDirect, `direct_fit`) hangs on every rounding, so
each operation there is OpenCV's, in its order, in float64. Two compiler rewrites would move
the result: fusing a product into the sum that uses it (a multiply-add rounds once; XLA:CPU
fuses, GPUs may), and dividing by a broadcast scalar or a quotient as a multiplication by a
reciprocal (XLA's algebraic simplifier). Every product and quotient passes through `fence` (an
XOR of its bits with `zero`, a uint64 0 that is an argument of the program), and every divisor
is tied to its dividend the same way (`mul`, `div`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


FLT_EPSILON = float(np.finfo(np.float32).eps)
DBL_EPSILON = float(np.finfo(np.float64).eps)


def with_x64(jitted):
  """Call `jitted` with 64-bit types on, so it is traced and compiled with them."""

  @functools.wraps(jitted)
  def call(*args, **kwargs):
    with jax.enable_x64(True):
      return jitted(*args, **kwargs)

  return call


def fence(x: jax.Array, zero: jax.Array) -> jax.Array:
  """float32 or float64 x unchanged, through an XOR of its bits with `zero` (uint64 0, an
  argument of the program), so the compiler can neither fold it away nor fuse the product that
  made x into the sum that uses it."""
  if x.dtype == jnp.float64:
    bits = jax.lax.bitcast_convert_type(x, jnp.uint64) ^ zero
    return jax.lax.bitcast_convert_type(bits, jnp.float64)
  bits = jax.lax.bitcast_convert_type(x, jnp.uint32) ^ zero.astype(jnp.uint32)
  return jax.lax.bitcast_convert_type(bits, x.dtype)


def mul(a, b, zero):
  """a * b rounded to the type, then fenced (see fence)."""
  return fence(jnp.asarray(a) * jnp.asarray(b), zero)


def div(a, b, zero):
  """a / b in float64 as C computes it: the divisor is tied bit for bit to the dividend (XLA
  turns a division by a broadcast scalar into a multiplication by its reciprocal) and the
  quotient is fenced ((a / b) / c would become a / (b * c))."""
  a, b = jnp.broadcast_arrays(jnp.asarray(a, jnp.float64), jnp.asarray(b, jnp.float64))
  tie = jax.lax.bitcast_convert_type(a, jnp.uint64) & zero
  b = jax.lax.bitcast_convert_type(jax.lax.bitcast_convert_type(b, jnp.uint64) ^ tie, jnp.float64)
  return fence(a / b, zero)
