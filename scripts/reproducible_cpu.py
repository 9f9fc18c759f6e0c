"""Makes the README's figures come out the same on every x86-64 CPU with AVX2: XLA's CPU flags,
OpenBLAS's kernels and a fixed thread count, set before NumPy and JAX start.
scripts/readme_figures.py, mutual_precision.py and embedded_world_figures.py call `apply` first
when run as scripts (not when imported: the tests import them).

What differs between two machines by default, with the same packages, command and seed:
  - XLA:CPU hands dots, reductions and elementwise ops to YNNPACK, which picks its kernels from
    the CPU it finds at run time (AVX2, AVX-512, AVX512-BF16, AMX, and per-CPU cost models);
    kernels with another accumulation order or other bf16 instructions round differently.
    `--xla_cpu_enable_platform_dependent_math=false` makes XLA ask YNNPACK for its
    consistent-arithmetic kernels only (the same results on every CPU one build runs on).
  - XLA's own generated code (LLVM) uses the widest vectors the CPU has, and a sum's order
    differs between AVX2 and AVX-512: `--xla_cpu_max_isa=AVX2` caps it.
  - XNNPACK (unused by this jaxlib's defaults) would dispatch on the CPU too:
    `--xla_cpu_use_xnnpack=false`.
  - OpenBLAS (NumPy's, and the LAPACK behind jnp.linalg.svd and eigh) picks its kernels by CPU
    (Haswell, SkylakeX, Zen, ...) and splits work by its thread count:
    OPENBLAS_CORETYPE=Haswell, OPENBLAS_NUM_THREADS=1.
  - XLA's intra-op thread count (the CPUs the process may use) splits Eigen's and YNNPACK's
    products and sums differently: the process is pinned to CORES of its CPUs.

A flag XLA_FLAGS sets already, or a variable already set, is left as it is. What can still
differ: Eigen's and YNNPACK's blocking of long contractions by the CPU's cache sizes, and a
machine with fewer than CORES CPUs (`apply` returns a note then).
"""

from __future__ import annotations

import os
import re
from typing import Mapping

FLAGS = (
  "--xla_cpu_enable_platform_dependent_math=false",
  "--xla_cpu_max_isa=AVX2",
  "--xla_cpu_use_xnnpack=false",
)
OPENBLAS = {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_NUM_THREADS": "1"}
CORES = 2
#: The variables `apply` sets, as they were before it (None: unset).
ORIGINAL: dict[str, str | None] = {}


def xla_flags(current: str) -> str:
  """`current` XLA_FLAGS plus each of FLAGS that it does not set already."""
  named = set(re.findall(r"--(\w+)", current))
  added = [f for f in FLAGS if f[2:].split("=")[0] not in named]
  return " ".join(x for x in (current.strip(), *added) if x)


def apply(cores: int = CORES) -> str | None:
  """Sets XLA_FLAGS (see `xla_flags`) and OpenBLAS's variables, and pins this process to its
  first `cores` CPUs. Must run before NumPy is imported and JAX creates its CPU client. Returns
  a note when the thread count cannot be `cores`."""
  for name in ("XLA_FLAGS", *OPENBLAS):
    ORIGINAL.setdefault(name, os.environ.get(name))
  os.environ["XLA_FLAGS"] = xla_flags(os.environ.get("XLA_FLAGS", ""))
  for name, value in OPENBLAS.items():
    os.environ.setdefault(name, value)
  allowed = sorted(os.sched_getaffinity(0))
  if len(allowed) < cores:
    return (
      f"note: {len(allowed)} CPU core here, the README's figures are measured on {cores}: "
      "products and sums split across threads may round differently."
    )
  os.sched_setaffinity(0, allowed[:cores])
  return None


def original_env(env: Mapping[str, str]) -> dict[str, str]:
  """`env` with the variables `apply` set as they were before it: for a child process that
  should run as the user's commands do (the test suite)."""
  env = dict(env)
  for name, value in ORIGINAL.items():
    if value is None:
      env.pop(name, None)
    else:
      env[name] = value
  return env
