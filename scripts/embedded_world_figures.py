r"""Re-measures the README's figures of the embedded world for one model (default: the shipped
tiny CLIP) and prints them as markdown: zero-shot quality, Table 3 at the model's default
blocks, weight 0 on the colour word, the Fig. 5 sweep, the start-block table and the few-shot
demo over three seeds.

  python scripts/embedded_world_figures.py [--model tiny-synthetic] [--demo_seeds 1,2,3]

Every number comes from the library functions the commands use, on held-out seeds.
"""

from __future__ import annotations

import tempfile

import numpy as np
from absl import flags

import stori_jax
from stori_jax import cli
from stori_jax.config_files import load_config
from stori_jax.evaluation import synthetic_world as sw
from stori_jax.models import default_start_block
from stori_jax.retrieval import datasets, protocol, start_block
from stori_jax.retrieval.index import encode_data

_MODEL = flags.DEFINE_string("model", "tiny-synthetic", "Model to measure.")
_SEEDS = flags.DEFINE_string("demo_seeds", "1,2,3", "Few-shot seeds of the demo ('' skips it).")
_PENALTY = flags.DEFINE_float("penalty", None, "Demo's log-weight penalty (default: config's).")
#: Held out from every seed the tests and the README's other tables use.
PROBE_SEED = (4242, 7)


def main(argv):
  del argv
  bundle = stori_jax.load(_MODEL.value)
  print(f"## {_MODEL.value} (default start block {default_start_block(bundle.config.text)})\n")
  zero_shot = sw.zero_shot_attributes(bundle)["accuracy"]
  recall = sw.retrieval_recall(bundle)
  print("| colour | shape | pattern | size | position | R@1 t->i | R@1 i->t |")
  print("|---|---|---|---|---|---|---|")
  print(
    "| "
    + " | ".join(f"{zero_shot[f]:.3f}" for f in ("colour", "shape", "pattern", "size", "position"))
    + f" | {recall['text_to_image']['R@1']:.3f} | {recall['image_to_text']['R@1']:.3f} |\n"
  )
  data = datasets.synthetic_data(n_triples=24, images_per_category=8, seed=PROBE_SEED)
  embeddings, tasks = encode_data(bundle, data), list(data.tasks)
  table3 = protocol.emphasis(bundle, embeddings, tasks, weights=(0.5, 1.0, 1.5))
  print("| emphasised word | AP w=0.5 | AP w=1.0 | AP w=1.5 | dAP 0.5 | dAP 1.5 |")
  print("|---|---|---|---|---|---|")
  for a, family in enumerate(sw.EMPHASIS_FAMILIES):
    rows = table3["rows"][a :: len(sw.EMPHASIS_FAMILIES)]
    ap = np.array([[r["ap"][k] for k in ("0.5", "1.0", "1.5")] for r in rows])
    print(
      f"| {family} | {ap[:, 0].mean():.3f} | {ap[:, 1].mean():.3f} | {ap[:, 2].mean():.3f} | "
      f"{(ap[:, 0] - ap[:, 1]).mean():+.3f} | {(ap[:, 2] - ap[:, 1]).mean():+.3f} |"
    )
  shares = [protocol.top_share(bundle, embeddings, tasks, 0, w) for w in (1.0, 0.0)]
  print(f"\ncolour of the top 16: {shares[0]:.1%} at w = 1, {shares[1]:.1%} at w = 0")
  config = load_config("configs/retrieval_synthetic.py")
  sweep = protocol.auc_sweep(
    bundle, embeddings, tasks, config.sweep.ws, tuple(config.sweep.attributes), True
  )
  focus = [row[sweep["focus"]] for row in sweep["mean_auc"]]
  print(
    f"Fig. 5 (pattern w, colour 1 - w): favoured category AUC {focus[0]:.3f} at w = 0 -> "
    f"{focus[-1]:.3f} at w = 1 (moves {max(focus) - min(focus):.3f})\n"
  )
  blocks = start_block.start_block_sweep(bundle, embeddings, tasks)
  print("```\n" + start_block.format_table(blocks) + "\n```\n")
  if _SEEDS.value:
    from stori_jax.fewshot import trainer  # pylint: disable=import-outside-toplevel

    print("| seed | zero-shot | SToRI | AUC vs nuisance | AUC vs other | top-3 explained |")
    print("|---|---|---|---|---|---|")
    for seed in (int(s) for s in _SEEDS.value.split(",")):
      demo = load_config("configs/demo.py")
      demo.seed, demo.model.source = seed, _MODEL.value
      if _PENALTY.value is not None:
        demo.optim.log_weight_penalty = _PENALTY.value
      with tempfile.TemporaryDirectory() as workdir:
        m = trainer.run(demo, workdir)
      print(
        f"| {seed} | {m['zero_shot']['accuracy']:.2%} | {m['trained']['accuracy']:.2%} | "
        f"{m['word_rank_auc']['nuisance']:.3f} | {m['word_rank_auc']['other']:.3f} | "
        f"{len(m['classes_with_discriminating_top3'])} of {len(m['top_words'])} |"
      )


if __name__ == "__main__":
  cli.run(main)
