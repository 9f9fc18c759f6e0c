"""Downloads from the Hugging Face hub, with an actionable error when offline."""

from __future__ import annotations

import os
from typing import Sequence

from stori_jax.checkpoints.errors import CheckpointError

# The files that make a loadable directory, in order of preference per role.
HF_FILES = (("config.json",), ("model.safetensors", "pytorch_model.bin"))
OPEN_CLIP_FILES = (
  ("open_clip_config.json",),
  ("open_clip_model.safetensors", "open_clip_pytorch_model.bin"),
)


def _offline_message(repo_id: str, filename: str, error: Exception) -> str:
  url = f"https://huggingface.co/{repo_id}/resolve/main/{filename}"
  local = os.path.join("checkpoints", repo_id.replace("/", "__"))
  return (
    f"Could not fetch {filename} of {repo_id} from the Hugging Face hub ({type(error).__name__}: "
    f"{str(error).splitlines()[0] if str(error) else ''}). If this machine is offline, "
    f"download {url} (and the other files named here) on a machine with network, put them "
    f"in a directory such as {local}/ and call stori_jax.load({local!r})."
  )


def download(repo_id: str, roles: Sequence[Sequence[str]], revision: str | None = None) -> str:
  """Fetches one file per role (the first candidate that exists); returns their directory."""
  try:
    import huggingface_hub  # pylint: disable=import-outside-toplevel
    from huggingface_hub import errors  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise CheckpointError("Hub downloads need huggingface_hub: pip install huggingface_hub") from e
  directory = None
  for candidates in roles:
    last_error = None
    for filename in candidates:
      try:
        path = huggingface_hub.hf_hub_download(repo_id, filename, revision=revision)
      except (errors.LocalEntryNotFoundError, OSError) as e:
        # LocalEntryNotFoundError subclasses EntryNotFoundError: test it first.
        raise CheckpointError(_offline_message(repo_id, filename, e)) from e
      except errors.EntryNotFoundError as e:
        last_error = e  # This repo stores the weights under another name.
        continue
      except errors.RepositoryNotFoundError as e:
        raise CheckpointError(
          f"{repo_id!r} is neither a local path nor a Hugging Face hub repository "
          "(check the spelling, or pass a local directory or file)."
        ) from e
      directory = os.path.dirname(path)
      break
    else:
      raise CheckpointError(f"{repo_id} has none of {list(candidates)}: {last_error}")
  return directory
