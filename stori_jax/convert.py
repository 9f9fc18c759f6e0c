r"""Converts any checkpoint stori_jax.load reads into this project's format.

  python -m stori_jax.convert --input ViT-B-32.pt --output checkpoints/vit_b32
  python -m stori_jax.convert --input open_clip_model.safetensors --arch ViT-B-16 \
      --output checkpoints/vit_b16_dfn --format orbax

The output directory holds stori_config.json and the params (safetensors or
orbax); `stori_jax.load(output)` reads it without torch.
"""

from __future__ import annotations

import os

from absl import flags

from stori_jax import cli
from stori_jax.errors import UserError

from stori_jax.loading import load, save

flags.DEFINE_string("input", None, "Checkpoint: directory, file or hub id.", required=True)
flags.DEFINE_string("output", None, "Directory to write.", required=True)
flags.DEFINE_string(
  "arch",
  None,
  "Architecture name for bare state-dict files "
  "(e.g. ViT-B-32-quickgelu); inferred from the shapes when omitted.",
)
flags.DEFINE_enum("format", "safetensors", ["safetensors", "orbax"], "Params format.")
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {argv[1:]}; flags are written --name=value")
  if os.path.exists(FLAGS.output) and not os.path.isdir(FLAGS.output):
    raise UserError(f"--output {FLAGS.output} is a file; pass a folder to write")
  bundle = load(FLAGS.input, arch=FLAGS.arch)
  source = os.path.abspath(FLAGS.input) if os.path.exists(FLAGS.input) else FLAGS.input
  out = save(
    bundle, FLAGS.output, FLAGS.format, metadata={"converted_from": source, "arch": FLAGS.arch}
  )
  c = bundle.config
  if c.vision_kind == "vit":
    vision = f"ViT {c.vision.layers}x{c.vision.width} patch {c.vision.patch_size}"
  else:
    vision = type(c.vision).__name__.removesuffix("Config")
  print(
    f"wrote {out}: text {c.text.layers}x{c.text.width}, vision {vision} @ "
    f"{c.vision.image_size}px, embed {c.embed_dim}, {c.text.activation}"
  )


if __name__ == "__main__":
  cli.run(main)
