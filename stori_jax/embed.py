r"""Encodes weighted prompts and shows how each token is weighted.

  python -m stori_jax.embed --source tiny-synthetic "a photo of a (red:1.5) circle"
  python -m stori_jax.embed --source ViT-B-32.pt --start_block 7 \
      "a woman with (blonde hair:1.5), wearing (eyeglasses:0.5)" --output emb.npy

Prints a table of the BPE tokens and their weights per prompt, then the norm
and the first values of each (unnormalised) text embedding; --output saves the
embeddings as float32 [num_prompts, embed_dim].
"""

from __future__ import annotations

import numpy as np
from absl import app, flags

from stori_jax.bundle import CLIPBundle
from stori_jax.loading import load

flags.DEFINE_string("source", None, "Checkpoint (anything stori_jax.load reads).")
flags.DEFINE_string("arch", None, "Architecture name for bare state-dict files.")
flags.DEFINE_string(
  "random",
  None,
  "Use random weights of this architecture instead "
  "(e.g. test-tiny): shows the tokenization offline, the embedding is noise.",
)
flags.DEFINE_integer(
  "start_block",
  None,
  "First reweighted block, 1-indexed (default: the paper's relative depth, 7 of 12).",
)
flags.DEFINE_integer("stop_block", None, "Last reweighted block (default: the last).")
flags.DEFINE_enum(
  "method",
  "stori",
  ["stori", "prompt_weighting"],
  "SToRI reweighting or the paper's prompt-weighting baseline (App. C.1).",
)
flags.DEFINE_integer("show", 8, "How many embedding values to print.")
flags.DEFINE_string("output", None, "Save the embeddings here (.npy).")
FLAGS = flags.FLAGS


def token_table(bundle: CLIPBundle, ids: np.ndarray, weights: np.ndarray) -> str:
  """One line per token up to EOT: position, token text, id, weight."""
  tokens = bundle.tokenizer.token_strings(ids)
  lines = [f"  {'pos':>3}  {'token':<16}{'id':>7}  weight"]
  for pos, (token, token_id, weight) in enumerate(zip(tokens, ids, weights)):
    marker = "" if weight == 1.0 else "  <-"
    lines.append(f"  {pos:>3}  {token:<16}{token_id:>7}  {weight:6.3f}{marker}")
    if token_id == bundle.config.text.eot_token_id:
      break
  return "\n".join(lines)


def main(argv):
  prompts = argv[1:]
  if not prompts:
    raise app.UsageError('Give one or more prompts, e.g. "a photo of a (red:1.5) circle".')
  if bool(FLAGS.source) == bool(FLAGS.random):
    raise app.UsageError("Give exactly one of --source or --random.")
  if FLAGS.random:
    from stori_jax.checkpoints.open_clip_config import architecture_config  # pylint: disable=import-outside-toplevel
    from stori_jax.models import init_params  # pylint: disable=import-outside-toplevel

    config = architecture_config(FLAGS.random)
    bundle = CLIPBundle(config=config, params=init_params(config), source=f"random:{FLAGS.random}")
  else:
    bundle = load(FLAGS.source, arch=FLAGS.arch)
  ids, weights = bundle.tokenize(prompts, with_weights=True)
  features = np.asarray(
    bundle.encode_text(ids, weights, FLAGS.start_block, FLAGS.stop_block, FLAGS.method)
  )
  for prompt, row_ids, row_weights, feature in zip(prompts, ids, weights, features):
    print(f"\n{prompt!r}")
    print(token_table(bundle, row_ids, row_weights))
    values = ", ".join(f"{v:+.4f}" for v in feature[: FLAGS.show])
    print(
      f"  embedding: dim {feature.shape[0]}, norm {np.linalg.norm(feature):.4f}, "
      f"first values [{values}]"
    )
  if FLAGS.output:
    np.save(FLAGS.output, features.astype(np.float32))
    print(f"\nsaved {features.shape} float32 to {FLAGS.output}")


if __name__ == "__main__":
  app.run(main)
