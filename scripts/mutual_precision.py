r"""How often bfloat16 vision towers change the mutual-knowledge results on the embedded world.

  python scripts/mutual_precision.py            # configs/mutual_synthetic.py, both modes

Every class of configs/mutual_synthetic.py is analysed twice, with config.analysis.compute_dtype
"float32" and "bfloat16" (the towers only; splits, fits and language stages stay float32), and
the per-image results compared: the prediction, and MI and AUC per concept method (equal when
within 1e-6). On a CPU bfloat16 is emulated and slow; the figures are about numbers, not speed.
"""

from __future__ import annotations

import os
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # `python scripts/mutual_precision.py` puts only scripts/ on the path
  sys.path.insert(0, ROOT)

if __name__ == "__main__":  # before NumPy and JAX start: the same figures on every x86-64 CPU
  import reproducible_cpu  # scripts/, beside this

  if note := reproducible_cpu.apply():
    print(note, file=sys.stderr)

import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402
import stori_jax  # noqa: E402
from mutual import data, pipeline  # noqa: E402
from stori_jax.plumbing.config_files import load_config  # noqa: E402

CONFIG = os.path.join(ROOT, "configs", "mutual_synthetic.py")
TOLERANCE = 1e-6


def bf16_changes(mode: str | None = None, progress: bool = True) -> dict[str, Any]:
  """Per-image changes under bfloat16 towers on configs/mutual_synthetic.py.

  Args:
    mode: config.analysis.mode to run (None: the config's).

  Returns:
    dict: images (int), mode, predicted (images whose prediction changes), and per method
    {"mi": images whose MI changes, "auc": images whose AUC changes, "either": either,
     "max_abs_auc": the largest AUC change}.
  """
  config = load_config(CONFIG)
  if mode is not None:
    config.analysis.mode = mode
  dataset = data.prepare(config)
  bundle = stori_jax.load(config.model.source)
  bank = pipeline.encode_config_bank(bundle, config, dataset, progress=False)
  methods = tuple(config.analysis.methods)
  half = config.analysis.copy_and_resolve_references()
  half.compute_dtype = "bfloat16"
  counts = {m: {"mi": 0, "auc": 0, "either": 0, "max_abs_auc": 0.0} for m in methods}
  images = predicted = 0
  classes = dataset.classes(int(bundle.config.vision.image_size))
  for cls in tqdm(classes, desc=f"classes ({mode or 'config'} mode)", disable=not progress):
    full = pipeline.analyze_class(bundle, cls.images, bank, config.analysis, methods)
    low = pipeline.analyze_class(bundle, cls.images, bank, half, methods)
    images += len(cls.images)
    predicted += int(np.sum(full["predicted"] != low["predicted"]))
    for m in methods:
      a, b = pipeline.summarise(full, m), pipeline.summarise(low, m)
      mi = np.abs(a["mi"] - b["mi"]) > TOLERANCE
      auc = np.abs(a["auc"] - b["auc"]) > TOLERANCE
      counts[m]["mi"] += int(mi.sum())
      counts[m]["auc"] += int(auc.sum())
      counts[m]["either"] += int((mi | auc).sum())
      counts[m]["max_abs_auc"] = max(
        counts[m]["max_abs_auc"], float(np.max(np.abs(a["auc"] - b["auc"])))
      )
  return dict(images=images, mode=config.analysis.mode, predicted=predicted, **counts)


def main() -> None:
  for mode in ("reference", "improved"):
    print(bf16_changes(mode))


if __name__ == "__main__":
  main()
