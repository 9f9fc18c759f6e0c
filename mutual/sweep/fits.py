"""Figure 3 (right)'s fits: zero-shot Top-1 against the AUC of the MI curve, least squares with
Pearson r, over all models and per family."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
from scipy import stats

from mutual.sweep.models import families

#: Accuracies the AUC-accuracy fit can use.
ACCURACIES = ("measured", "paper", "open_clip")
#: Fewest models for a fit (two points always give |r| = 1).
MIN_FIT_MODELS = 3


def fit_line(x: Sequence[float], y: Sequence[float]) -> dict[str, Any]:
  """Least-squares y = slope * x + intercept and Pearson r (scipy.stats.linregress).

  Returns a JSON-ready dict (n, slope, intercept, pearson_r, p_value); the numbers are None when
  there are fewer than MIN_FIT_MODELS points or x or y does not vary.
  """
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  out: dict[str, Any] = dict(n=len(x), slope=None, intercept=None, pearson_r=None, p_value=None)
  if len(x) < MIN_FIT_MODELS or np.ptp(x) == 0 or np.ptp(y) == 0:
    return out
  fit = stats.linregress(x, y)
  out.update(
    slope=float(fit.slope),
    intercept=float(fit.intercept),
    pearson_r=float(fit.rvalue),
    p_value=float(fit.pvalue),
  )
  return out


def accuracy_of(row: Mapping[str, Any], accuracy: str) -> float | None:
  """The Top-1 (%) a fit uses: measured, or the registry's paper / open_clip value."""
  if accuracy == "measured":
    return row["top1"]
  return row["reported_top1"][accuracy]


def auc_accuracy_fits(
  rows: Sequence[Mapping[str, Any]], methods: Sequence[str], accuracy: str = "measured"
) -> dict[str, dict[str, Any]]:
  """Figure 3 (right): Top-1 = slope * AUC + intercept per method, over all models ("all") and
  within each family (the paper fits ViTs and ResNets separately; its ViT line is 11.24 AUC +
  25.97). Models without the chosen accuracy are left out."""
  out: dict[str, dict[str, Any]] = {}
  for method in methods:
    out[method] = {}
    groups = {"all": list(rows)}
    for fam in families():
      groups[fam] = [r for r in rows if r["family"] == fam]
    for group, members in groups.items():
      members = [r for r in members if accuracy_of(r, accuracy) is not None]
      fit = fit_line(
        [r[method]["auc"] for r in members], [accuracy_of(r, accuracy) for r in members]
      )
      fit["models"] = [r["name"] for r in members]
      if group == "all" or members:
        out[method][group] = fit
  return out
