r"""Re-measures the README's figures of the embedded world for one model (default: the shipped
tiny CLIP) and prints them as markdown: zero-shot quality, Table 3 at the model's default
blocks, weight 0 on the colour word, the Fig. 5 sweep, the start-block table and the few-shot
demo over three seeds.

  python scripts/embedded_world_figures.py [--model tiny-synthetic] [--demo_seeds 1,2,3]

Every number comes from the library functions the commands use, on held-out seeds. The
functions below are also what scripts/readme_figures.py calls to rewrite the README's regions.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Sequence

import numpy as np
from absl import flags

import stori_jax
from stori_jax import cli
from stori_jax.config_files import load_config
from stori_jax import world_metrics as sw
from stori_jax.models import default_start_block
from stori_jax.retrieval import datasets, protocol, block_sweep
from stori_jax.retrieval.index import encode_data

#: The repository's configs, whatever the working directory.
CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
#: Held out from every seed the tests and the README's other tables use.
PROBE_SEED = (4242, 7)
ZERO_SHOT_FAMILIES = ("colour", "shape", "pattern", "size", "position")
TABLE3_WEIGHTS = ("0.5", "1.0", "1.5")


def zero_shot_quality(bundle) -> dict[str, float]:
  """Zero-shot accuracy per attribute family and R@1 both ways ("t2i", "i2t"), held out."""
  accuracy = sw.zero_shot_attributes(bundle)["accuracy"]
  recall = sw.retrieval_recall(bundle)
  out = {f: float(accuracy[f]) for f in ZERO_SHOT_FAMILIES}
  out["t2i"] = float(recall["text_to_image"]["R@1"])
  out["i2t"] = float(recall["image_to_text"]["R@1"])
  return out


def probe_set(bundle) -> tuple[np.ndarray, list]:
  """The encoded probe images and their tasks: 24 held-out colour/pattern/shape triples."""
  data = datasets.synthetic_data(n_triples=24, images_per_category=8, seed=PROBE_SEED)
  return encode_data(bundle, data), list(data.tasks)


def table3(bundle, embeddings, tasks) -> dict[str, dict[str, Any]]:
  """Table 3 per emphasised family: mean AP at w = 0.5 / 1 / 1.5 ("ap") and the mean change
  from w = 1 at 0.5 and 1.5 ("delta")."""
  result = protocol.emphasis(bundle, embeddings, tasks, weights=(0.5, 1.0, 1.5))
  out = {}
  for a, family in enumerate(sw.EMPHASIS_FAMILIES):
    rows = result["rows"][a :: len(sw.EMPHASIS_FAMILIES)]  # rows run task by task
    ap = np.array([[r["ap"][k] for k in TABLE3_WEIGHTS] for r in rows])
    out[family] = dict(
      ap=tuple(float(x) for x in ap.mean(axis=0)),
      delta=(float((ap[:, 0] - ap[:, 1]).mean()), float((ap[:, 2] - ap[:, 1]).mean())),
    )
  return out


def colour_shares(bundle, embeddings, tasks) -> tuple[float, float]:
  """Share of the prompt's colour among the top 16 images at colour weight 1 and 0."""
  w1, w0 = (protocol.top_share(bundle, embeddings, tasks, 0, w) for w in (1.0, 0.0))
  return w1, w0


def fig5_focus(bundle, embeddings, tasks) -> list[float]:
  """Fig. 5 (pattern w, colour 1 - w): the favoured category's mean AUC at each w of
  configs/retrieval_synthetic.py's sweep."""
  config = load_config(os.path.join(CONFIGS, "retrieval_synthetic.py"))
  sweep = protocol.auc_sweep(
    bundle, embeddings, tasks, config.sweep.ws, tuple(config.sweep.attributes), True
  )
  return [row[sweep["focus"]] for row in sweep["mean_auc"]]


def demo_runs(
  seeds: Sequence[int],
  model: str = "tiny-synthetic",
  classes: str = "one_colour",
  penalty: float | None = None,
) -> list[dict[str, Any]]:
  """configs/demo.py trained once per seed in a temporary workdir; one summary per seed:
  seed, zero_shot and stori (accuracy), auc_nuisance, auc_other, top3 (classes with a
  discriminating word among their 3 top-weighted words), classes, test_images, shots."""
  from stori_jax.fewshot import trainer  # pylint: disable=import-outside-toplevel

  out = []
  for seed in seeds:
    demo = load_config(os.path.join(CONFIGS, "demo.py"), f"classes={classes}")
    demo.seed, demo.model.source = int(seed), model
    if penalty is not None:
      demo.optim.log_weight_penalty = penalty
    with tempfile.TemporaryDirectory() as workdir:
      m = trainer.run(demo, workdir)
    n_classes = len(m["top_words"])
    out.append(
      dict(
        seed=int(seed),
        zero_shot=float(m["zero_shot"]["accuracy"]),
        stori=float(m["trained"]["accuracy"]),
        auc_nuisance=float(m["word_rank_auc"]["nuisance"]),
        auc_other=float(m["word_rank_auc"]["other"]),
        top3=len(m["classes_with_discriminating_top3"]),
        classes=n_classes,
        test_images=n_classes * int(demo.data.n_test_per_class),
        shots=int(demo.shots),
      )
    )
  return out


def define_flags(values: flags.FlagValues = flags.FLAGS) -> None:
  """The script's flags, on `values`."""
  flags.DEFINE_string("model", "tiny-synthetic", "Model to measure.", flag_values=values)
  flags.DEFINE_string(
    "demo_seeds", "1,2,3", "Few-shot seeds of the demo ('' skips it).", flag_values=values
  )
  flags.DEFINE_float(
    "penalty", None, "Demo's log-weight penalty (default: config's).", flag_values=values
  )
  flags.DEFINE_string(
    "demo_classes",
    "one_colour",
    "The demo's task (configs/demo.py:classes=...): one_colour, two_colours.",
    flag_values=values,
  )


def main(argv: list[str], values: flags.FlagValues = flags.FLAGS) -> None:
  """Prints every figure for --model."""
  del argv
  model = values.model
  bundle = stori_jax.load(model)
  print(f"## {model} (default start block {default_start_block(bundle.config.text)})\n")
  q = zero_shot_quality(bundle)
  print("| colour | shape | pattern | size | position | R@1 t->i | R@1 i->t |")
  print("|---|---|---|---|---|---|---|")
  print("| " + " | ".join(f"{q[f]:.3f}" for f in (*ZERO_SHOT_FAMILIES, "t2i", "i2t")) + " |\n")
  embeddings, tasks = probe_set(bundle)
  print("| emphasised word | AP w=0.5 | AP w=1.0 | AP w=1.5 | dAP 0.5 | dAP 1.5 |")
  print("|---|---|---|---|---|---|")
  for family, row in table3(bundle, embeddings, tasks).items():
    ap, delta = row["ap"], row["delta"]
    print(
      f"| {family} | {ap[0]:.3f} | {ap[1]:.3f} | {ap[2]:.3f} | {delta[0]:+.3f} | {delta[1]:+.3f} |"
    )
  shares = colour_shares(bundle, embeddings, tasks)
  print(f"\ncolour of the top 16: {shares[0]:.1%} at w = 1, {shares[1]:.1%} at w = 0")
  focus = fig5_focus(bundle, embeddings, tasks)
  print(
    f"Fig. 5 (pattern w, colour 1 - w): favoured category AUC {focus[0]:.3f} at w = 0 -> "
    f"{focus[-1]:.3f} at w = 1 (moves {max(focus) - min(focus):.3f})\n"
  )
  blocks = block_sweep.start_block_sweep(bundle, embeddings, tasks)
  print("```\n" + block_sweep.format_table(blocks) + "\n```\n")
  if values.demo_seeds:
    seeds = [int(s) for s in values.demo_seeds.split(",")]
    print(f"configs/demo.py:classes={values.demo_classes}\n")
    print("| seed | zero-shot | SToRI | AUC vs nuisance | AUC vs other | top-3 explained |")
    print("|---|---|---|---|---|---|")
    for r in demo_runs(seeds, model, values.demo_classes, values.penalty):
      print(
        f"| {r['seed']} | {r['zero_shot']:.2%} | {r['stori']:.2%} | "
        f"{r['auc_nuisance']:.3f} | {r['auc_other']:.3f} | {r['top3']} of {r['classes']} |"
      )


if __name__ == "__main__":
  define_flags()
  cli.run(main)
