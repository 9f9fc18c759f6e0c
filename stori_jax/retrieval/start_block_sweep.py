"""Which text blocks to reweight: how strongly token weights move retrieval for each first
reweighted block (the paper's App. C.6, generalised to any model and probe set).

For every start block b (reweighting blocks b..L) and every (task, attribute) of a probe set,
the attribute's word gets weight w in {0, 0.5, 1, 1.5, 2} (others 1) and ranks the task's
images. Three numbers per block, averaged over (task, attribute):

* `ap_per_log_weight`: (AP(w=1.5) - AP(w=0.5)) / ln 3, the change of the attribute's average
  precision per unit change of its log-weight (ln 1.5 - ln 0.5 = ln 3, about 1.1);
* `gap_per_log_weight`: the same for the category-AUC gap (App. B) between the category with
  every attribute and the one that lacks only this attribute: how much more the attribute
  separates categories per unit of log-weight;
* `removal`: AP(w=0) - AP(w=1), what excluding the word does.

`recommend` picks the default start block from these: the latest block whose response is at
least half the strongest one. Later blocks leave the words' own representations alone (the
paper reweights the second half of ViT-L/14's text tower for that reason) and are cheaper
(the blocks before them run once per prompt), while half of the strongest response keeps
the control usable.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
from tqdm import tqdm

from stori_jax.plumbing import paths
from stori_jax.plumbing.errors import InputError, UserError
from stori_jax.plumbing.plotting import pyplot
from stori_jax.retrieval import datasets, index, protocol
from stori_jax.retrieval.datasets import RetrievalTask
from stori_jax.retrieval.metrics import average_precision, category_auc

#: Weights probed on the attribute's word; 0.5 and 1.5 are the paper's Table 3 weights.
PROBE_WEIGHTS = (0.0, 0.5, 1.0, 1.5, 2.0)
#: ln(1.5) - ln(0.5): the log-weight span of the two Table 3 weights.
LOG_SPAN = math.log(3.0)
#: A start block is recommended when its response reaches this share of the strongest.
RECOMMEND_FRACTION = 0.5


def _gap(task: RetrievalTask, scores: np.ndarray, attribute: int) -> np.ndarray:
  """float [W]: AUC(all attributes present) - AUC(all but `attribute`) per weight row."""
  auc = category_auc(scores, task.categories, task.n_categories)  # [W, C]
  present = [True] * task.n_attributes
  lacking = list(present)
  lacking[attribute] = False
  return auc[:, task.code(present)] - auc[:, task.code(lacking)]


def block_response(
  bundle,
  embeddings: np.ndarray,
  tasks: Sequence[RetrievalTask],
  start_block: int,
  method: str = "stori",
  batch_size: int = protocol.BATCH_SIZE,
) -> dict[str, Any]:
  """The response to token weights when reweighting starts at `start_block` (1-indexed).

  Args:
    bundle: the model (CLIPBundle).
    embeddings: float32 [M, E] unit image embeddings of the probe set.
    tasks: the probe set's retrieval tasks (several attributes each).
    start_block: first reweighted block; reweighting runs to the last block.

  Returns:
    {"start_block", "ap_per_log_weight", "gap_per_log_weight", "removal", "delta_ap"
    ({w: mean AP(w) - AP(1)}), "by_attribute" ({attribute name: the three numbers})}.
  """
  setting = protocol.Setting(method=method, start_block=int(start_block))
  weights = list(PROBE_WEIGHTS)
  rows = protocol.single_attribute_rows(tasks, weights)
  scores = protocol.score_tasks(bundle, embeddings, tasks, rows, setting, batch_size)
  one, low, high, zero = (weights.index(w) for w in (1.0, 0.5, 1.5, 0.0))
  records = []
  for task, s in zip(tasks, scores):
    s = s.reshape(task.n_attributes, len(weights), -1)
    for a in range(task.n_attributes):
      y = task.labels[:, a]
      ap = np.array([average_precision(y, s[a, j]) for j in range(len(weights))])
      gap = _gap(task, s[a], a)
      records.append(
        {
          "attribute": task.attribute_names[a] if task.attribute_names else str(a),
          "ap": ap,
          "ap_slope": (ap[high] - ap[low]) / LOG_SPAN,
          "gap_slope": (gap[high] - gap[low]) / LOG_SPAN,
          "removal": ap[zero] - ap[one],
        }
      )

  def mean(key, rows=records):
    return float(np.mean([r[key] for r in rows]))

  names = sorted({r["attribute"] for r in records})
  return {
    "start_block": int(start_block),
    "ap_per_log_weight": mean("ap_slope"),
    "gap_per_log_weight": mean("gap_slope"),
    "removal": mean("removal"),
    "delta_ap": {
      repr(w): float(np.mean([r["ap"][j] - r["ap"][one] for r in records]))
      for j, w in enumerate(weights)
    },
    "by_attribute": {
      name: {
        key: mean(key, [r for r in records if r["attribute"] == name])
        for key in ("ap_slope", "gap_slope", "removal")
      }
      for name in names
    },
  }


def recommend(responses: Sequence[dict[str, Any]], fraction: float = RECOMMEND_FRACTION) -> int:
  """The latest start block whose AP response per unit log-weight reaches `fraction` of the
  strongest (see the module docstring)."""
  strongest = max(r["ap_per_log_weight"] for r in responses)
  if strongest <= 0:
    return min(r["start_block"] for r in responses)
  good = [r["start_block"] for r in responses if r["ap_per_log_weight"] >= fraction * strongest]
  return max(good)


def start_block_sweep(
  bundle,
  embeddings: np.ndarray,
  tasks: Sequence[RetrievalTask],
  start_blocks: Sequence[int] | None = None,
  method: str = "stori",
  batch_size: int = protocol.BATCH_SIZE,
) -> dict[str, Any]:
  """`block_response` for each start block (default every block of the text tower).

  Returns:
    {"blocks": [responses], "recommended": int, "fraction": RECOMMEND_FRACTION,
     "layers": L, "probe_weights": [w]}.
  """
  layers = int(bundle.config.text.layers)
  blocks = list(range(1, layers + 1)) if start_blocks is None else [int(b) for b in start_blocks]
  bad = [b for b in blocks if not 1 <= b <= layers]
  if bad or not blocks:
    raise ValueError(f"start blocks {bad or blocks} must lie in the text tower's 1..{layers}")
  responses = [
    block_response(bundle, embeddings, tasks, b, method, batch_size)
    for b in tqdm(blocks, desc="start blocks", unit="block", leave=False)
  ]
  return {
    "blocks": responses,
    "recommended": recommend(responses),
    "fraction": RECOMMEND_FRACTION,
    "layers": layers,
    "probe_weights": list(PROBE_WEIGHTS),
  }


def format_table(sweep: dict[str, Any]) -> str:
  """The sweep as a text table, one row per start block, the recommended one marked."""
  lines = [
    "start  dAP per unit    category-gap per   dAP at w=0   dAP at w=0.5 / 1.5",
    "block  log-weight      unit log-weight    (removal)",
  ]
  for r in sweep["blocks"]:
    mark = "  <- recommended" if r["start_block"] == sweep["recommended"] else ""
    lines.append(
      f"{r['start_block']:>5}  {r['ap_per_log_weight']:+.4f}         "
      f"{r['gap_per_log_weight']:+.4f}            {r['removal']:+.4f}      "
      f"{r['delta_ap']['0.5']:+.4f} / {r['delta_ap']['1.5']:+.4f}{mark}"
    )
  return "\n".join(lines)


def plot_sweep(sweep: dict[str, Any], path: str, title: str = "") -> None:
  """start_block.png: the three responses against the start block, per attribute."""
  plt = pyplot()
  blocks = [r["start_block"] for r in sweep["blocks"]]
  names = sorted(sweep["blocks"][0]["by_attribute"])
  fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
  panels = (
    ("ap_slope", "ap_per_log_weight", "dAP per unit log-weight"),
    ("gap_slope", "gap_per_log_weight", "category-AUC gap per unit log-weight"),
    ("removal", "removal", "dAP at w = 0 (word excluded)"),
  )
  for ax, (key, total, label) in zip(axes, panels):
    for name in names:
      ax.plot(blocks, [r["by_attribute"][name][key] for r in sweep["blocks"]], "o-", label=name)
    ax.plot(blocks, [r[total] for r in sweep["blocks"]], "k--", lw=2, label="mean")
    ax.axvline(sweep["recommended"], color="gray", ls=":", label="recommended start")
    ax.axhline(0, color="black", lw=0.5)
    ax.set(xlabel="first reweighted block", ylabel=label, xticks=blocks)
  axes[0].legend(fontsize=8)
  fig.suptitle(title or "Response of retrieval to token weights by first reweighted block")
  fig.tight_layout()
  paths.save_figure(fig, path, dpi=110)
  plt.close(fig)


def measure(
  bundle,
  data_config,
  start_blocks=None,
  cache_dir: str | None = None,
  batch_size: int = protocol.BATCH_SIZE,
) -> dict[str, Any]:
  """`start_block_sweep` on the probe set a retrieval config's `data` block describes (e.g.
  configs/retrieval_synthetic.py's, or CelebA's for a real checkpoint).

  Returns the sweep with "data" (the probe set's name) and "n_images", "n_tasks" added.
  """
  try:
    data = datasets.build_data(data_config, int(bundle.config.vision.image_size))
  except UserError:
    raise
  except (ValueError, FileNotFoundError, KeyError) as e:
    raise InputError(
      f"the probe set (the data config's `data` block) cannot be read: {e}"
    ) from None
  if not data.tasks:
    raise InputError(f"the probe data {data.name!r} defines no prompts (tasks)")
  idx = index.build_index(bundle, data, cache_dir, batch_size)
  sweep = start_block_sweep(bundle, idx.embeddings, data.tasks, start_blocks, batch_size=batch_size)
  return {**sweep, "data": data.name, "n_images": len(data.keys), "n_tasks": len(data.tasks)}
