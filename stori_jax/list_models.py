r"""Lists the registered CLIP models and whether their weights are on this machine.

  python -m stori_jax.list_models [--paper mutual-knowledge|stori] [--models_dir DIR]

Never touches the network: "local dir" means <models_dir>/<name>/ holds the
weights, "HF cache" that the Hugging Face cache does; "missing" rows show the
repository and file to fetch.
"""

from __future__ import annotations

from absl import flags

from stori_jax.plumbing import cli

from stori_jax.checkpoints import hub
from stori_jax.plumbing.errors import UserError
from stori_jax.models import registry


def define_flags(values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the command's flags (when run as a program, or on a test's own FlagValues)."""
  fv = {"flag_values": values}
  flags.DEFINE_enum(
    "paper", None, [registry.MUTUAL, registry.STORI], "Only this paper's models.", **fv
  )
  flags.DEFINE_string(
    "models_dir",
    None,
    f"Directory of hand-placed weights (default ${hub.MODELS_DIR_ENV} or ~/.cache).",
    **fv,
  )


def _percent(value) -> str:
  return "-" if value is None else f"{value:.2f}"


def table(paper: str | None = None, models_dir: str | None = None) -> str:
  """One row per registered model, with its local status."""
  header = (
    f"{'name':<32}{'paper label':<26}{'architecture':<24}{'px':>4}  {'quickgelu':<10}"
    f"{'IN-1k oc/paper':<16}status"
  )
  lines = [header]
  missing = []
  for name in registry.names(paper):
    entry = registry.get(name)
    found = hub.find_local(name, entry.hf_repo, entry.weights_files, models_dir)
    status = f"{found[1]}: {found[0]}" if found else "missing"
    if not found:
      missing.append(entry)
    accuracy = f"{_percent(entry.imagenet_open_clip)}/{_percent(entry.imagenet_paper)}"
    lines.append(
      f"{name:<32}{entry.label:<26}{entry.arch:<24}{entry.image_size:>4}  "
      f"{str(entry.quick_gelu):<10}{accuracy:<16}{status}"
    )
  if missing:
    lines.append(
      f"\nMissing weights: fetch the file from the hub repository and place it in "
      f"{hub.models_dir(models_dir)}/<name>/ (or run `huggingface-cli download REPO FILE`):"
    )
    lines += [f"  {e.name:<32}{e.hf_repo:<48} {e.weights_files[0]}" for e in missing]
  return "\n".join(lines)


def main(argv: list[str], values: flags.FlagValues = flags.FLAGS) -> None:
  """Prints the table of registered models."""
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {argv[1:]}; see --help.")
  print(table(values.paper, values.models_dir))


if __name__ == "__main__":
  define_flags()
  cli.run(main)
