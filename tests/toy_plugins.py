"""Toy plugins: one small entry for each extension point, defined outside the project's packages
as a researcher's own would be, each registered when this module is imported and named in a
config as `toy_plugins:<name>` (tests/test_toy_plugins.py runs them; docs/design.md, "Extend
it", shows them as the examples).

Each section uses only the project's public registries (and the helpers it names); the
imports above serve all of them.
"""

from __future__ import annotations

import os

import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from mutual import protocols
from stori_jax.clip import encoding
from stori_jax.fewshot import methods
from stori_jax.fewshot.schedules import stori_schedule
from stori_jax.plumbing import jsonio, paths

# ---------------------------------------------------------------------------------------------
# A few-shot method (stori_jax.fewshot.methods): --config.method=toy_plugins:class_bias
# ---------------------------------------------------------------------------------------------

#: The file the toy method writes beside the shared ones.
CLASS_BIAS_FILE = "class_bias.json"


def _class_bias_build(config, bundle, classifier, total_steps, steps_per_epoch) -> methods.Method:
  """A bias vector per class added to the unit zero-shot class embeddings (all prompts at
  w = 1): normalize(z_c + b_c), b_c float32 [C, E] trained from 0 with Adam on SToRI's schedule
  (config.optim: lr, schedule)."""
  del bundle, steps_per_epoch
  zero_shot = jnp.asarray(classifier.embed(classifier.init_log_weights()))  # [C, E] unit

  def class_embeddings(bias, base):
    return encoding.l2_normalize_jax(base + bias, eps=None)

  schedule = stori_schedule(config, total_steps)
  return methods.Method(
    "class_bias",
    lambda: jnp.zeros_like(zero_shot),
    class_embeddings,
    zero_shot,
    optax.adam(schedule),
    schedule=schedule,
  )


def _class_bias_report(params, bundle, bank, workdir, is_main):
  """class_bias.json: the norm of every class's trained bias, {class name: float}."""
  del bundle
  norms = np.linalg.norm(np.asarray(params, np.float64), axis=1)
  if is_main:
    with paths.open(os.path.join(workdir, CLASS_BIAS_FILE), "w") as f:
      f.write(jsonio.dumps_strict(dict(zip(bank.class_names, map(float, norms)))))
  return None, None


CLASS_BIAS = methods.register(
  methods.FewShotMethod(
    name="class_bias",
    label="class bias (toy)",
    build=_class_bias_build,
    lr_key="optim.lr",
    warmup_block=lambda config: (
      "optim" if config.optim.get("schedule", "cosine") == "taskres" else None
    ),
    report=_class_bias_report,
  )
)


# ---------------------------------------------------------------------------------------------
# An evaluation protocol (mutual.protocols): config.evaluation.protocols =
# ("toy_plugins:zero_shot_topk",)
# ---------------------------------------------------------------------------------------------


def _zero_shot_topk_run(inputs: protocols.ProtocolInputs) -> dict:
  """Top-k accuracy (%) of the descriptor bank's class embeddings on the Table 1 pass's image
  embeddings (k: settings.k), and the number of images."""
  k = int(inputs.settings.k)
  hits = protocols.topk_hits(
    inputs.concepts.image_embeddings,
    inputs.concepts.labels,
    np.asarray(inputs.bank.class_embeddings),
    ks=(k,),
  )
  return dict(k=k, images=int(len(hits)), accuracy=float(100.0 * hits[:, 0].mean()))


def _zero_shot_topk_markdown(results) -> str:
  lines = ["| Model | Images | k | Top-k (%) |", "|---|---|---|---|"]
  for model, r in results.items():
    lines.append(f"| {model} | {r['images']} | {r['k']} | {r['accuracy']:.2f} |")
  return "\n".join(lines) + "\n"


ZERO_SHOT_TOPK = protocols.register(
  protocols.Protocol(
    name="zero_shot_topk",
    title="Toy: zero-shot top-k (%) of the descriptor classifier on the evaluated images",
    run=_zero_shot_topk_run,
    markdown=_zero_shot_topk_markdown,
    defaults=lambda: ml_collections.ConfigDict(dict(k=2)),
  )
)
