"""The paper's preference-retrieval protocol (section 4.2, App. B, C.1, C.4, C.6).

Every experiment ranks a task's image pool by cosine similarity to the task's prompt with
some attribute weights (`RetrievalTask.prompt`), encoded by SToRI or by the prompt-weighting
baseline from some block:

* `emphasis`: one attribute's weight set to w (Tables 3, 5, 6); AP and P@k with that
  attribute's images as positives, summarised over (task, attribute) pairs with the change
  from w = 1.
* `pair_emphasis`: two attributes at 2.0 and 1.5, the rest 1.0 (Table 4).
* `auc_sweep`: per-category AUC (App. B) while one attribute gets w and another 1 - w
  (Figures 5, 6a, 9) or only one attribute gets w (Figure 6b).

A `Setting` selects the encoder: method "stori" (reweighted attention in blocks
start_block..stop_block, 1-indexed; start_block None: the model's default start block) or
"prompt_weighting" (App. C.1 at the input of start_block).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Sequence

import numpy as np

from stori_jax.clip import encoding
from stori_jax.clip.encoding import BATCH_SIZE
from stori_jax.retrieval.datasets import RetrievalTask
from stori_jax.retrieval.metrics import average_precision, category_auc, precision_at_k

REFERENCE_WEIGHT = 1.0


@dataclasses.dataclass(frozen=True)
class Setting:
  """How weights enter the text encoder (see CLIPBundle.encode_text)."""

  method: str = "stori"
  start_block: int | None = None
  stop_block: int | None = None

  @property
  def label(self) -> str:
    if self.method == "prompt_weighting":
      return "prompt weighting" + ("" if self.start_block is None else f" @{self.start_block}")
    if self.start_block is None and self.stop_block is None:
      return "SToRI"
    if self.stop_block is not None and self.stop_block == self.start_block:
      return f"SToRI block {self.start_block} only"
    return f"SToRI from block {self.start_block}"


def encode_prompts(
  bundle, prompts: Sequence[str], setting: Setting = Setting(), batch_size: int = BATCH_SIZE
) -> np.ndarray:
  """Weighted prompts -> float32 [P, E] unit rows, in fixed-shape batches (few compiles)."""
  prompts = list(prompts)
  if not prompts:
    raise ValueError("no prompts to encode")
  ids, weights = bundle.tokenize(prompts, with_weights=True)
  # The weights go in even when all are 1: the w = 1 reference is encoded like the other
  # weights of its method (prompt weighting at w = 1 rounds differently from plain CLIP).
  return encoding.encode_tokens(
    bundle,
    ids,
    weights,
    method=setting.method,
    start_block=setting.start_block,
    stop_block=setting.stop_block,
    batch_size=batch_size,
  )


def score_tasks(
  bundle,
  embeddings: np.ndarray,
  tasks: Sequence[RetrievalTask],
  weight_rows: Sequence[np.ndarray],
  setting: Setting = Setting(),
  batch_size: int = BATCH_SIZE,
) -> list[np.ndarray]:
  """Cosine similarities of each task's images to its prompts, all prompts in one pass.

  Args:
    embeddings: float32 [M, E] unit image embeddings (the index).
    tasks: T tasks.
    weight_rows: per task, float [W_t, A_t] attribute weights.

  Returns:
    per task float32 [W_t, N_t].
  """
  prompts = [task.prompt(w) for task, rows in zip(tasks, weight_rows) for w in rows]
  text = encode_prompts(bundle, prompts, setting, batch_size)
  out, offset = [], 0
  for task, rows in zip(tasks, weight_rows):
    out.append(text[offset : offset + len(rows)] @ embeddings[task.images].T)
    offset += len(rows)
  return out


def _summary(values: np.ndarray, keys: Sequence[str], reference: int | None) -> dict[str, Any]:
  """values [R, W] -> mean/std per column and the change from column `reference`."""
  out: dict[str, Any] = {
    "mean": {k: float(values[:, j].mean()) for j, k in enumerate(keys)},
    "std": {k: float(values[:, j].std()) for j, k in enumerate(keys)},
    "n": int(values.shape[0]),
  }
  if reference is not None:
    delta = values - values[:, reference : reference + 1]
    out["delta_mean"] = {k: float(delta[:, j].mean()) for j, k in enumerate(keys)}
    out["delta_std"] = {k: float(delta[:, j].std()) for j, k in enumerate(keys)}
  return out


def _k(labels: np.ndarray, precision_k: int | None) -> int | None:
  return None if precision_k is None else min(int(precision_k), len(labels))


def single_attribute_rows(
  tasks: Sequence[RetrievalTask], weights: Sequence[float]
) -> list[np.ndarray]:
  """Per task, float [A * W, A] weight rows: attribute a at each of the W weights (the others
  1), attribute-major; reshape scores to [A, W, N]."""
  out = []
  for task in tasks:
    rows = np.ones((task.n_attributes, len(weights), task.n_attributes))
    for a in range(task.n_attributes):
      rows[a, :, a] = weights
    out.append(rows.reshape(-1, task.n_attributes))
  return out


def emphasis(
  bundle,
  embeddings: np.ndarray,
  tasks: Sequence[RetrievalTask],
  weights: Sequence[float] = (0.5, 1.0, 1.5, 2.0),
  setting: Setting = Setting(),
  precision_k: int | None = None,
  batch_size: int = BATCH_SIZE,
) -> dict[str, Any]:
  """AP and P@k when one attribute's weight is w (paper Table 3).

  For every task and attribute a, the prompt with weight w on a (others 1) ranks the pool;
  positives are the images with a. precision_k None: k = number of positives (P_400 for
  800 CelebA images).

  Returns:
    {"weights": [w], "setting", "ap": summary, "p_at_k": summary, "rows": [{"task",
    "attribute", "ap": {w: float}, "p_at_k": {...}}]} with summary {"mean", "std",
    "delta_mean", "delta_std": {repr(w): float}, "n"} over (task, attribute) rows; deltas
    from w = 1 (absent when 1.0 is not among the weights).
  """
  weights = [float(w) for w in weights]
  keys = [repr(w) for w in weights]
  scores = score_tasks(
    bundle, embeddings, tasks, single_attribute_rows(tasks, weights), setting, batch_size
  )
  ap, pk, details = [], [], []
  for task, s in zip(tasks, scores):
    s = s.reshape(task.n_attributes, len(weights), -1)
    for a in range(task.n_attributes):
      y = task.labels[:, a]
      ap.append([average_precision(y, s[a, j]) for j in range(len(weights))])
      pk.append([precision_at_k(y, s[a, j], _k(y, precision_k)) for j in range(len(weights))])
      details.append(
        {
          "task": task.name,
          "attribute": task.phrases[a],
          "ap": dict(zip(keys, ap[-1])),
          "p_at_k": dict(zip(keys, pk[-1])),
        }
      )
  ref = weights.index(REFERENCE_WEIGHT) if REFERENCE_WEIGHT in weights else None
  return {
    "weights": weights,
    "setting": dataclasses.asdict(setting),
    "precision_k": precision_k,
    "ap": _summary(np.asarray(ap), keys, ref),
    "p_at_k": _summary(np.asarray(pk), keys, ref),
    "rows": details,
  }


def pair_emphasis(
  bundle,
  embeddings: np.ndarray,
  tasks: Sequence[RetrievalTask],
  high: float = 2.0,
  low: float = 1.5,
  setting: Setting = Setting(),
  precision_k: int | None = None,
  batch_size: int = BATCH_SIZE,
) -> dict[str, Any]:
  """Two attributes weighted `high` and `low`, the others 1 (paper Table 4, App. C.4).

  Every ordered pair (a, b) of a task's attributes gives one prompt (a at `high`, b at
  `low`); the AP of a (positives: images with a) and of b are compared with their plain-
  prompt AP.

  Returns:
    {"high", "low", "ap" / "p_at_k": {"plain": summary, "low": summary, "high": summary}}
    where "low"/"high" summaries hold mean/std of the metric and of its change from plain,
    over (task, ordered pair) rows; "rows": [{"task", "high", "low" (phrases), "ap",
    "p_at_k": [plain of high, weighted high, plain of low, weighted low]}].
  """
  rows_per_task, pairs_per_task = [], []
  for task in tasks:
    pairs = list(itertools.permutations(range(task.n_attributes), 2))
    rows = np.ones((1 + len(pairs), task.n_attributes))
    for i, (a, b) in enumerate(pairs):
      rows[1 + i, a], rows[1 + i, b] = high, low
    rows_per_task.append(rows)
    pairs_per_task.append(pairs)
  scores = score_tasks(bundle, embeddings, tasks, rows_per_task, setting, batch_size)
  values = {"ap": [], "p_at_k": []}  # rows [plain_a, high_a, plain_b, low_b]
  details = []
  for task, s, pairs in zip(tasks, scores, pairs_per_task):
    for i, (a, b) in enumerate(pairs):
      details.append({"task": task.name, "high": task.phrases[a], "low": task.phrases[b]})
      ya, yb = task.labels[:, a], task.labels[:, b]
      values["ap"].append(
        [
          average_precision(ya, s[0]),
          average_precision(ya, s[1 + i]),
          average_precision(yb, s[0]),
          average_precision(yb, s[1 + i]),
        ]
      )
      values["p_at_k"].append(
        [
          precision_at_k(ya, s[0], _k(ya, precision_k)),
          precision_at_k(ya, s[1 + i], _k(ya, precision_k)),
          precision_at_k(yb, s[0], _k(yb, precision_k)),
          precision_at_k(yb, s[1 + i], _k(yb, precision_k)),
        ]
      )
  out: dict[str, Any] = {
    "high": float(high),
    "low": float(low),
    "setting": dataclasses.asdict(setting),
  }
  for row, ap, pk in zip(details, values["ap"], values["p_at_k"]):
    row["ap"], row["p_at_k"] = ap, pk
  out["rows"] = details
  for name, v in values.items():
    v = np.asarray(v)
    out[name] = {
      "plain": _summary(np.concatenate([v[:, 0], v[:, 2]])[:, None], ["1.0"], None),
      "high": _summary(v[:, :2], ["plain", "weighted"], 0),
      "low": _summary(v[:, 2:], ["plain", "weighted"], 0),
    }
  return out


def sweep_rows(
  n_attributes: int, attributes: Sequence[int], ws: Sequence[float], complement: bool
) -> np.ndarray:
  """float [W, A]: attribute a = attributes[0] at w, and (complement) b = attributes[1] at
  1 - w (the paper's Figure 5); all others 1."""
  rows = np.ones((len(ws), n_attributes))
  rows[:, attributes[0]] = ws
  if complement:
    rows[:, attributes[1]] = 1.0 - np.asarray(ws, np.float64)
  if (rows < 0).any():
    raise ValueError(f"sweep weights must stay >= 0; got w in {list(ws)} (with 1 - w)")
  return rows


def focus_category(task: RetrievalTask, attributes: Sequence[int]) -> int:
  """The category whose AUC the paper follows in a sweep on attributes (a, b): every attribute
  present except b ("female, blonde hair, no eyeglasses" for a = blonde hair, b = eyeglasses).

  The same for both sweeps: with w on a and 1 - w on b (Figures 5, 6a) it is the category the
  weights favour; with w on a alone (Figure 6b) the paper highlights it too ("STORI consistently
  raises the AUC for the category 'female, blonde hair, no eyeglasses'"): emphasising a lifts
  the images that have a without b above those that have b without a.
  """
  present = [True] * task.n_attributes
  present[attributes[1]] = False
  return task.code(present)


def auc_sweep(
  bundle,
  embeddings: np.ndarray,
  tasks: Sequence[RetrievalTask],
  ws: Sequence[float],
  attributes: Sequence[int] = (1, 2),
  complement: bool = True,
  setting: Setting = Setting(),
  normalize: str = "share",
  batch_size: int = BATCH_SIZE,
) -> dict[str, Any]:
  """Per-category AUC (App. B) over a weight sweep (Figures 5, 6, 9).

  Returns:
    {"ws": [w], "attributes": [a, b], "complement", "setting", "normalize",
     "category_names": [C] (the task's, or generic ones for several tasks), "focus": int
     (`focus_category`: a present, b absent, whether or not b gets 1 - w),
     "auc": float [T][W][C] lists, "mean_auc": float [W][C] (mean over tasks)}.
  """
  ws = [float(w) for w in ws]
  attributes = [int(a) for a in attributes]
  for task in tasks:
    if max(attributes) >= task.n_attributes or len(set(attributes)) != len(attributes):
      raise ValueError(
        f"sweep attributes {attributes} must be distinct attribute indices of task "
        f"{task.name!r} ({task.n_attributes} attributes)"
      )
  rows = [sweep_rows(t.n_attributes, attributes, ws, complement) for t in tasks]
  scores = score_tasks(bundle, embeddings, tasks, rows, setting, batch_size)
  auc = np.stack(
    [category_auc(s, t.categories, t.n_categories, normalize) for t, s in zip(tasks, scores)]
  )
  return {
    "ws": ws,
    "attributes": attributes,
    "complement": bool(complement),
    "setting": dataclasses.asdict(setting),
    "label": setting.label,
    "normalize": normalize,
    "category_names": (
      tasks[0].category_names if len(tasks) == 1 else tasks[0].generic_category_names
    ),
    "focus": focus_category(tasks[0], attributes),
    "auc": auc.tolist(),
    "mean_auc": auc.mean(axis=0).tolist(),
  }


def is_monotonic(values: Sequence[float], increasing: bool = True, tolerance: float = 0.0) -> bool:
  """Whether consecutive values never move the wrong way by more than tolerance."""
  steps = np.diff(np.asarray(values, np.float64))
  return bool(np.all(steps >= -tolerance) if increasing else np.all(steps <= tolerance))


def top_share(
  bundle,
  embeddings: np.ndarray,
  tasks: Sequence[RetrievalTask],
  attribute: int,
  weight: float,
  top: int = 16,
  setting: Setting = Setting(),
) -> float:
  """Mean over tasks of the share of the top `top` images that have `attribute`, when its word
  has weight `weight` (the others 1): what weight 0 does to an attribute's preference."""
  rows = []
  for task in tasks:
    row = np.ones((1, task.n_attributes))
    row[0, attribute] = weight
    rows.append(row)
  scores = score_tasks(bundle, embeddings, tasks, rows, setting)
  return float(
    np.mean([t.labels[np.argsort(-s[0])[:top], attribute].mean() for t, s in zip(tasks, scores)])
  )
