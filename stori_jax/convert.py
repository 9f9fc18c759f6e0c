r"""Converts any checkpoint stori_jax.load reads into this project's format.

  python -m stori_jax.convert --input ViT-B-32.pt --output checkpoints/vit_b32
  python -m stori_jax.convert --input open_clip_model.safetensors --arch ViT-B-16 \
      --output checkpoints/vit_b16_dfn --format orbax

The output directory holds stori_config.json and the params (safetensors or
orbax); `stori_jax.load(output)` reads it without torch.
"""

from __future__ import annotations

from absl import flags

from stori_jax.plumbing import cli, paths
from stori_jax.checkpoints import native
from stori_jax.plumbing.errors import UserError

from stori_jax.clip.loading import load, save
from stori_jax.models import tower_kinds


def define_flags(values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the command's flags (when run as a program, or on a test's own FlagValues)."""
  fv = {"flag_values": values}
  flags.DEFINE_string("input", None, "Checkpoint: directory, file or hub id.", required=True, **fv)
  flags.DEFINE_string("output", None, "Directory to write.", required=True, **fv)
  flags.DEFINE_string(
    "arch",
    None,
    "Architecture name for bare state-dict files "
    "(e.g. ViT-B-32-quickgelu); inferred from the shapes when omitted.",
    **fv,
  )
  flags.DEFINE_enum("format", "safetensors", ["safetensors", "orbax"], "Params format.", **fv)


def main(argv: list[str], values: flags.FlagValues = flags.FLAGS) -> None:
  """Converts --input into --output and prints the architecture written."""
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {argv[1:]}; flags are written --name=value")
  paths.check_location(values.output)  # gs://: the bucket, the credentials, a write
  if paths.exists(values.output) and not paths.isdir(values.output):
    raise UserError(f"--output {values.output} is a file; pass a folder to write")
  bundle = load(values.input, arch=values.arch)
  source = paths.absolute(values.input) if paths.exists(values.input) else values.input
  out = save(
    bundle, values.output, values.format, metadata={"converted_from": source, "arch": values.arch}
  )
  c = bundle.config
  vision = tower_kinds.of(c.vision).describe(c.vision)
  print(
    f"converted {values.input}: text {c.text.layers}x{c.text.width}, vision {vision} @ "
    f"{c.vision.image_size}px, embed {c.embed_dim}, {c.text.activation}"
  )
  params = native.SAFETENSORS_FILE if values.format == "safetensors" else native.ORBAX_DIR
  cli.print_outputs(out, [native.CONFIG_FILE, params])


if __name__ == "__main__":
  define_flags()
  cli.run(main)
