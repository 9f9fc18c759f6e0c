r"""One image (or several) explained by the mutual-knowledge analysis: the authors' notebook as a
command.

  python -m mutual.explain --image PHOTO --workdir DIR
  python -m mutual.explain --image a.png --image b.jpg --image FOLDER --workdir DIR
  python -m mutual.explain --image PHOTO --workdir DIR --model /models/ViT-B-16 \
      --descriptors descriptors_imagenet.json [--classes "tiger cat,tabby cat,lynx"]
  python -m mutual.explain --image PHOTO --workdir DIR --config configs/mutual_imagenet.py \
      --config.data.descriptors=descriptors_imagenet.json

Each image goes through the whole analysis on its own (its foreground split, both concept
methods, visual prompts, descriptors by optimal transport, the language side, MI and its curve;
`mutual.explanation`). By default the embedded world's tiny CLIP, its 12 classes and its
descriptor vocabulary (configs/mutual_synthetic.py); `--config` takes any analysis config (its
`model`, `data` and `analysis`), and `--model`, `--descriptors`, `--classes` override it.

Writes to the workdir, per image (named by the image file):
  <name>.png    the image's concepts outlined with their descriptors (Fig. 4), the vision /
                mutual / language descriptors (Fig. 6) and the MI curve, a row per concept method
  <name>.json   the same as JSON: the class ranking and the per-image record mutual.analyze writes
and prints the prediction and the top concepts of each image. Several images: one model load.
A missing, unreadable or non-image file stops the command before the model loads (exit 2).
"""

from __future__ import annotations

import os

from absl import flags
from ml_collections import config_flags

import stori_jax
from mutual import explanation, paper_config, pipeline, report
from stori_jax.plumbing import cli as stori_cli
from stori_jax.plumbing import paths
from stori_jax.plumbing.errors import UserError

#: The embedded world's analysis config, the default.
DEFAULT_CONFIG = os.path.join(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "mutual_synthetic.py"
)
USAGE = "python -m mutual.explain --image PHOTO --workdir DIR"


def define_flags(values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the command's flags (when run as a program, or on a test's own FlagValues)."""
  fv = {"flag_values": values}
  flags.DEFINE_multi_string(
    "image", None, "An image file or a folder of images (repeat the flag for several).", **fv
  )
  flags.DEFINE_string("workdir", None, "Output directory (a figure and a JSON per image).", **fv)
  config_flags.DEFINE_config_file(
    "config", DEFAULT_CONFIG, "Analysis config file (default: the embedded world's).", **fv
  )
  flags.DEFINE_string("model", None, "Model source (overrides config.model.source).", **fv)
  flags.DEFINE_string(
    "descriptors",
    None,
    "Descriptor file ({class: [descriptors]}, Menon & Vondrick's JSON): its classes compete for "
    "the prediction and its descriptors form the bank (default: the config's).",
    **fv,
  )
  flags.DEFINE_list(
    "classes", None, "Only these classes, comma-separated, as the descriptor file names them.", **fv
  )


def main(argv: list[str], values: flags.FlagValues = flags.FLAGS) -> None:
  """Explains each image and writes its figure and JSON to the workdir."""
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {argv[1:]}; flags are written --name=value: {USAGE}")
  stori_cli.require_flags("image", "workdir", example=USAGE, values=values)
  config, workdir = values.config, os.path.expanduser(values.workdir)
  # Everything a user could have got wrong, before the model loads.
  paper_config.check_analysis(config.analysis)
  files = explanation.image_files(values.image)
  explanation.check_files(files)
  names, per_class, bank_descriptors = explanation.class_bank(
    config, values.descriptors, values.classes
  )
  source = values.model or config.model.source
  model = values.model or config.model.get("name", source)
  bundle = stori_jax.load(source)
  images = explanation.read_images(files, int(bundle.config.vision.image_size))
  a = config.analysis
  bank = pipeline.encode_bank(
    bundle,
    names,
    per_class,
    bank_descriptors,
    mode=a.class_prompts,
    templates=tuple(a.templates),
    descriptor_template=a.descriptor_template,
    bank_template=paper_config.check_bank_template(a),
    batch_size=config.get("batch_size", 256),
  )
  methods = tuple(a.methods)
  results = explanation.explain(bundle, images, files, bank, a, methods)
  paths.makedirs(workdir)
  stems = _stems(files)
  written = []
  for stem, found in zip(stems, results):
    figure = paths.join(workdir, f"{stem}.png")
    explanation.plot(figure, found, methods, model=model)
    report.write_json(paths.join(workdir, f"{stem}.json"), explanation.payload(found, model))
    written += [f"{stem}.png", f"{stem}.json"]
    print(explanation.summary(found, methods))
  stori_cli.print_outputs(workdir, written)


def _stems(files: list[str]) -> list[str]:
  """An output name per image: its file name without the ending, numbered where two images
  share a name (a.png in two folders)."""
  stems = [os.path.splitext(os.path.basename(f))[0] for f in files]
  seen: dict[str, int] = {}
  out = []
  for stem in stems:
    seen[stem] = seen.get(stem, 0) + 1
    out.append(stem if stems.count(stem) == 1 else f"{stem}_{seen[stem]}")
  return out


if __name__ == "__main__":
  define_flags()
  stori_cli.run(main)
