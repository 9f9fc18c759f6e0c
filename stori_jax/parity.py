r"""JAX vs PyTorch numerics, block by block.

  python -m stori_jax.parity --source DIR_OR_FILE [--arch ViT-B-32-quickgelu]
  python -m stori_jax.parity --random ViT-B-16 --reference transformers --json report.json

Builds the PyTorch reference (open_clip or transformers) with the same weights, runs both on the
same random inputs and prints, for every block of both towers, the max absolute and relative
error of the hidden states, then the errors of the features and logits
(`stori_jax.reference.parity_report` measures them). Needs the `[torch]` extra.
"""

from __future__ import annotations

import jax
from absl import flags

from stori_jax.checkpoints.open_clip_config import architecture_config
from stori_jax.plumbing import cli, jsonio
from stori_jax.plumbing.errors import UserError
from stori_jax.reference import clip_towers, parity_report


def main(argv: list[str], values: flags.FlagValues = flags.FLAGS) -> None:
  """Checks --source (or random --random weights) against PyTorch and prints the errors."""
  f = values
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {argv[1:]}; flags are written --name=value")
  if bool(f.source) == bool(f.random):
    raise UserError("give exactly one of --source PATH or --random ARCH.")
  if f.image_size and not f.random:
    raise UserError("--image_size applies to --random architectures only.")
  if f.batch < 1:
    raise UserError(f"--batch must be >= 1, got {f.batch}")
  # Parity is about fp32: TPUs and GPUs otherwise use reduced-precision matmuls. A context, not
  # jax.config.update: a run in a test's process leaves the precision of later work alone.
  with jax.default_matmul_precision("highest"):
    if f.random:
      arch = architecture_config(f.random)
      if f.image_size:
        arch = arch.with_image_size(f.image_size)
      model, bundle = parity_report.random_pair(arch, f.reference, f.seed)
    else:
      model, bundle = parity_report.reference_for_source(f.source, f.arch)
    report = parity_report.run_parity(model, bundle, f.batch, f.seed)
  passed, verdict = parity_report.format_verdict(report, parity_report.TOLERANCE)
  label, worst = parity_report.worst_error(report)
  report["worst"] = {"tensor": label, "max_rel": worst}
  report["tolerance"], report["passed"] = parity_report.TOLERANCE, passed
  print(parity_report.format_header(bundle, model, f.batch, f.seed))
  print()
  print(parity_report.format_report(report))
  if f.json:
    jsonio.write_json(f.json, report, indent=2)  # strict: a NaN difference is an error
    cli.print_outputs("", [f.json])
  # Last, so that a log's final line is the answer; a failure is the exit status too.
  print(verdict)
  if not passed:
    raise SystemExit(1)


def define_flags(values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the command's flags (when run as a program, or on a test's own FlagValues)."""
  fv = {"flag_values": values}
  flags.DEFINE_string(
    "source", None, "Checkpoint to check (any format stori_jax.load reads).", **fv
  )
  flags.DEFINE_string("arch", None, "Architecture name for bare state-dict files.", **fv)
  flags.DEFINE_string(
    "random",
    None,
    "Check random weights of this architecture instead, "
    "e.g. ViT-B-32-quickgelu, ViT-L-14, RN50-quickgelu, convnext_base, test-tiny.",
    **fv,
  )
  flags.DEFINE_enum(
    "reference", "open_clip", clip_towers.REFERENCES, "PyTorch reference for --random.", **fv
  )
  flags.DEFINE_integer(
    "image_size", None, "Input size for --random (default: the architecture's own).", **fv
  )
  flags.DEFINE_integer("batch", 4, "Images and texts per check.", **fv)
  flags.DEFINE_integer("seed", 0, "Seed of the random inputs and weights.", **fv)
  flags.DEFINE_string("json", None, "Also write the report to this JSON file.", **fv)


if __name__ == "__main__":
  define_flags()
  cli.run(main)
