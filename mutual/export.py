r"""Exports a model's class-agnostic descriptor bank and its zero-shot text classifiers as files.

  python -m mutual.export --config configs/mutual_synthetic.py --output workdirs/text_bank
  python -m mutual.export --config configs/mutual_imagenet.py --output DIR \
      --config.model.source=openai-vit-b-16 \
      --config.data.descriptors=data/descriptors/descriptors_imagenet.json

Writes to --output (mutual.text_bank):
  text_bank.safetensors   float32 [D, E] descriptor embeddings and two [C, E] classifiers
                          (descriptor-based and template-based), unit rows
  text_bank.json          the descriptors and class names in row order, the model, the prompt
                          settings, dtype and shapes
`mutual.text_bank.load_text_bank(DIR)` reads them back. An --output that already holds a text
bank is refused unless --overwrite is given. No image is read.
"""

from __future__ import annotations

from absl import flags
from ml_collections import config_flags

from mutual import text_bank
from stori_jax.plumbing import cli
from stori_jax.plumbing.errors import UserError

USAGE = "python -m mutual.export --config configs/mutual_synthetic.py --output DIR"


def define_flags(values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the command's flags (when run as a program, or on a test's own FlagValues)."""
  fv = {"flag_values": values}
  config_flags.DEFINE_config_file(
    "config",
    None,
    "Analysis config: its model, data (descriptors) and class-prompt settings.",
    lock_config=True,
    **fv,
  )
  flags.DEFINE_string("output", None, "Folder to write the two files to.", **fv)
  flags.DEFINE_bool("overwrite", False, "Replace a text bank already in --output.", **fv)


def main(argv: list[str], values: flags.FlagValues = flags.FLAGS) -> None:
  """Exports the config's text bank to --output and prints its sizes."""
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {argv[1:]}; flags are written --name=value: {USAGE}")
  cli.require_flags("config", "output", example=USAGE, values=values)
  output, bank = text_bank.export_text_bank(
    values.config, values.output, overwrite=values.overwrite
  )
  d, e = bank.descriptor_embeddings.shape
  print(
    f"text bank of {bank.names['model']['name']}: {d} descriptors, {len(bank.class_names)} "
    f"classes, embedding dim {e}; classifiers {', '.join(bank.classifiers)} (the analysis uses "
    f"{bank.analysis_classifier})"
  )
  cli.print_outputs(output, list(text_bank.FILES))


if __name__ == "__main__":
  define_flags()
  cli.run(main)
