"""The machine's dense matmul rate, measured in the run that compares against it.

benchmarks/mutual_throughput.py (the analysis) and benchmarks/train_step.py (the few-shot step)
state how far their compute is from the machine by dividing their FLOP/s by this rate: a square
[side, side] @ [side, side] product in JAX (XLA, the backend the project's code runs on) and in
PyTorch (oneDNN / cuBLAS, its baselines' backend), whichever is faster being the machine's rate.
"""

from __future__ import annotations

import time

import jax
import numpy as np


class MatmulRate:
  """A square product ready to time again and again (its inputs made and its program compiled
  once): `measure` can run inside each timed round of a benchmark, so that a machine whose load
  drifts is measured under the load the round's steps saw.

  side: the matrices' side; dtype: "float32" or "bfloat16"; torch_device: where PyTorch's
  product runs ("cpu", "cuda", a torch.device), or None for JAX's alone.
  """

  def __init__(self, side: int = 4096, dtype: str = "float32", torch_device=None):
    self.side, self.dtype = side, dtype
    self.flops = 2.0 * side**3
    self._a = jax.random.normal(jax.random.PRNGKey(0), (side, side), jax.numpy.float32).astype(
      dtype
    )
    self._product = jax.jit(lambda x, y: x @ y)
    jax.block_until_ready(self._product(self._a, self._a))  # compiled outside the clocks
    self._torch = None
    if torch_device is not None:
      import torch  # pylint: disable=import-outside-toplevel

      self._torch = torch
      self._t = torch.randn(side, side).to(torch_device, getattr(torch, dtype))
      cuda = torch.device(torch_device).type == "cuda"
      self._sync = torch.cuda.synchronize if cuda else (lambda: None)
      torch.mm(self._t, self._t)
      self._sync()

  def _best(self, run, repeats: int) -> float:
    best = np.inf
    for _ in range(repeats):
      start = time.perf_counter()
      run()
      best = min(best, time.perf_counter() - start)
    return best

  def measure(self, repeats: int = 1) -> dict:
    """{side, dtype, jax_gflop_per_s, torch_gflop_per_s (None without torch)}: the best of
    `repeats` products in each framework."""
    jax_s = self._best(lambda: jax.block_until_ready(self._product(self._a, self._a)), repeats)
    torch_rate = None
    if self._torch is not None:

      def run_torch():
        self._torch.mm(self._t, self._t)
        self._sync()

      torch_rate = round(self.flops / self._best(run_torch, repeats) / 1e9, 2)
    return dict(
      side=self.side,
      dtype=self.dtype,
      jax_gflop_per_s=round(self.flops / jax_s / 1e9, 2),
      torch_gflop_per_s=torch_rate,
    )


def matmul_rate(side: int, dtype: str = "float32", repeats: int = 3, device="cpu") -> dict:
  """GFLOP/s of a dense [side, side] @ [side, side] product in `dtype`, best of `repeats`, in
  JAX (XLA) and PyTorch (on `device`): {side, dtype, jax_gflop_per_s, torch_gflop_per_s}."""
  return MatmulRate(side, dtype, torch_device=device).measure(repeats)


def machine_gflop_per_s(measured: dict) -> float:
  """The machine's rate of one `measure`: the faster framework's."""
  return max(r for r in (measured["jax_gflop_per_s"], measured["torch_gflop_per_s"]) if r)
