r"""Encodes weighted prompts and shows how each token is weighted.

  python -m stori_jax.embed --source tiny-synthetic "a photo of a (red:1.5) circle"
  python -m stori_jax.embed --source ViT-B-32.pt --start_block 7 \
      "a woman with (blonde hair:1.5), wearing (eyeglasses:0.5)" --output emb.npy

Prints a table of the BPE tokens and their weights per prompt, then the norm
and the first values of each (unnormalised) text embedding; --output saves the
embeddings as float32 [num_prompts, embed_dim] (".npy" is added when missing, as np.save
does, and the path written is printed). A prompt syntax error, a weight outside [0, 100], a
bad flag or checkpoint prints one paragraph (with a caret under the prompt's fault) and
exits 2; embeddings that are not finite are refused, never printed or saved.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
from absl import flags

from stori_jax.plumbing import cli, paths
from stori_jax.clip.bundle import CLIPBundle
from stori_jax.checkpoints.open_clip_config import architecture_config
from stori_jax.plumbing.errors import DiskFullError, InputError, NonFiniteError, UserError
from stori_jax.clip.loading import load
from stori_jax.models import init_params
from stori_jax.models.text import reweighted_block_indices
from stori_jax.tokenizer import parse_weighted


def define_flags(values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the command's flags (when run as a program, or on a test's own FlagValues)."""
  fv = {"flag_values": values}
  flags.DEFINE_string("source", None, "Checkpoint (anything stori_jax.load reads).", **fv)
  flags.DEFINE_string("arch", None, "Architecture name for bare state-dict files.", **fv)
  flags.DEFINE_string(
    "random",
    None,
    "Use random weights of this architecture instead "
    "(e.g. test-tiny): shows the tokenization offline, the embedding is noise.",
    **fv,
  )
  flags.DEFINE_integer(
    "start_block",
    None,
    "First reweighted block, 1-indexed (default: the paper's relative depth, 7 of 12).",
    **fv,
  )
  flags.DEFINE_integer("stop_block", None, "Last reweighted block (default: the last).", **fv)
  flags.DEFINE_enum(
    "method",
    "stori",
    ["stori", "prompt_weighting"],
    "SToRI reweighting or the paper's prompt-weighting baseline (App. C.1).",
    **fv,
  )
  flags.DEFINE_integer("show", 8, "How many embedding values to print.", lower_bound=0, **fv)
  flags.DEFINE_string(
    "output", None, "Save the embeddings here (.npy is added when missing).", **fv
  )


_EXAMPLE = 'python -m stori_jax.embed --source tiny-synthetic "a photo of a (red:1.5) circle"'


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


def output_path(output: str) -> str:
  """The file `np.save(output)` writes (".npy" added when missing), checked to be writable
  before any work: its folder exists and takes a file, and neither `output` nor the file is a
  folder (an existing folder given as --output once got `<folder>.npy` written beside it).

  Raises:
    InputError: the folder is missing or cannot be written to, or the path is a folder.
    StorageError: a gs:// bucket is missing, or refuses the write or the credentials.
  """
  if paths.is_remote(output):  # a bucket has no folders: its bucket and a write are checked
    path = output if output.endswith(".npy") else output + ".npy"
    paths.check_location(paths.parent(path))
    return path
  if os.path.isdir(output) or output.endswith(os.sep):
    raise InputError(
      f"--output {output} is a folder; give a file name, such as "
      f"{os.path.join(output, 'embeddings.npy')}"
    )
  path = output if output.endswith(".npy") else output + ".npy"
  folder = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(folder):
    raise InputError(f"--output {output}: the folder {folder} does not exist; create it first")
  if os.path.isdir(path):
    raise InputError(f"--output {output}: {path} is a folder; give a file name")
  try:  # a real write, as save_npy will do it: access() says yes to root on /proc and the like
    fd, probe = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    os.close(fd)
    os.remove(probe)
  except OSError as e:
    raise InputError(
      f"--output {output}: cannot write a file in the folder {folder} ({e.strerror or e}); "
      "give a path in a folder you can write to"
    ) from None
  return path


def save_npy(path: str, array: np.ndarray) -> None:
  """np.save streamed through `paths.AtomicWrite` (a path or gs://): a kill never leaves half
  a file.

  Raises:
    DiskFullError: the disk (or quota) is full.
    InputError: the file cannot be written (its folder removed meanwhile, no permission).
  """
  try:
    with paths.AtomicWrite(path, what="the embeddings ") as f:
      np.save(f, array)
  except DiskFullError:
    raise
  except OSError as e:  # a folder removed meanwhile: the user's to fix
    raise InputError(f"cannot save the embeddings to {path}: {e}; nothing was saved") from None


def check_finite(features: np.ndarray, prompts: list[str]) -> None:
  """Raises NonFiniteError naming the prompts whose features [B, E] hold NaN or infinity."""
  bad = [i for i, row in enumerate(features) if not np.isfinite(row).all()]
  if bad:
    shown = ", ".join(repr(prompts[i][:80]) for i in bad[:5]) + (", ..." if len(bad) > 5 else "")
    raise NonFiniteError(
      f"the embedding of {len(bad)} of {len(prompts)} prompts ({shown}) is not finite (NaN or "
      "infinity): the checkpoint's parameters hold NaN/infinity or the weights overflow the "
      "text tower; nothing was printed or saved"
    )


def main(argv: list[str], values: flags.FlagValues = flags.FLAGS) -> None:
  """Encodes the prompts (argv[1:]) and prints their tokens, weights and embeddings."""
  prompts = argv[1:]
  if not prompts:
    raise UserError(f"give one or more prompts, for example: {_EXAMPLE}")
  if bool(values.source) == bool(values.random):
    raise UserError(
      "give exactly one of --source (a checkpoint) or --random (an architecture name: random "
      f"weights); for example: {_EXAMPLE}"
    )
  if values.method == "prompt_weighting" and values.stop_block is not None:
    raise UserError("--stop_block does not apply to --method prompt_weighting (one block)")
  path = output_path(values.output) if values.output else None
  for prompt in prompts:  # syntax errors before the model loads
    parse_weighted(prompt)
  if values.random:
    try:
      config = architecture_config(values.random)
    except ValueError as e:
      raise InputError(f"--random {values.random}: {e}") from None
    bundle = CLIPBundle(config=config, params=init_params(config), source=f"random:{values.random}")
  else:
    bundle = load(values.source, arch=values.arch)
  _check_blocks(bundle.config.text, values)
  ids, weights = bundle.tokenize(prompts, with_weights=True)
  features = np.asarray(
    bundle.encode_text(ids, weights, values.start_block, values.stop_block, values.method),
    np.float32,
  )
  check_finite(features, prompts)
  for prompt, row_ids, row_weights, feature in zip(prompts, ids, weights, features):
    print(f"\n{prompt!r}")
    print(token_table(bundle, row_ids, row_weights))
    shown = ", ".join(f"{v:+.4f}" for v in feature[: values.show])
    print(
      f"  embedding: dim {feature.shape[0]}, norm {np.linalg.norm(feature):.4f}, "
      f"first values [{shown}]"
    )
  if path:
    save_npy(path, features)
    print(f"\nsaved {features.shape} float32 to {path}")
    cli.print_outputs("", [path])


def _check_blocks(text_config, values: flags.FlagValues) -> None:
  # pylint: disable-next=import-outside-toplevel

  try:
    reweighted_block_indices(text_config, values.start_block, values.stop_block)
  except ValueError as e:
    raise InputError(f"--start_block/--stop_block: {e}") from None


if __name__ == "__main__":
  define_flags()
  cli.run(main)
