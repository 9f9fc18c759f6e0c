"""Downloads from the Hugging Face hub, with an actionable error when offline."""

from __future__ import annotations

import functools
import os
import socket
import urllib.parse
from typing import Sequence

import huggingface_hub
import huggingface_hub.constants
from huggingface_hub import errors

from stori_jax.checkpoints.errors import CheckpointError

# The files that make a loadable directory, in order of preference per role.
HF_FILES = (("config.json",), ("model.safetensors", "pytorch_model.bin"))
OPEN_CLIP_FILES = (
  ("open_clip_config.json",),
  ("open_clip_model.safetensors", "open_clip_pytorch_model.bin"),
)


#: Seconds to wait for the hub's host before calling the network unreachable.
PROBE_TIMEOUT = 3.0


def _local_dir(repo_id: str) -> str:
  return os.path.join("checkpoints", repo_id.replace("/", "__"))


def _offline_message(repo_id: str, filename: str, error: Exception | str) -> str:
  url = f"https://huggingface.co/{repo_id}/resolve/main/{filename}"
  local = _local_dir(repo_id)
  if isinstance(error, Exception):
    error = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
  return (
    f"Could not fetch {filename} of {repo_id} from the Hugging Face hub ({error}). "
    f"{repo_id!r} is not a local path either. If this machine is offline, "
    f"download {url} (and the other files named here) on a machine with network, put them "
    f"in a directory such as {local}/ and call stori_jax.load({local!r}); if you meant a "
    "local file or directory, check its path."
  )


def hub_offline() -> bool:
  """Whether the hub is switched off (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE, read now)."""
  flags = (os.environ.get("HF_HUB_OFFLINE", ""), os.environ.get("TRANSFORMERS_OFFLINE", ""))
  if any(f.strip().upper() in ("1", "ON", "YES", "TRUE") for f in flags):
    return True
  return bool(huggingface_hub.constants.HF_HUB_OFFLINE)


@functools.lru_cache(maxsize=None)
def _probe(host: str, port: int) -> str | None:
  try:
    with socket.create_connection((host, port), timeout=PROBE_TIMEOUT):
      return None
  except OSError as e:
    return f"{host} cannot be reached: {e.strerror or e}"


def unreachable_reason() -> str | None:
  """Why the hub cannot be reached (offline mode, no route, no DNS), else None.

  One TCP connection per process, with a short timeout, so that an unreachable hub fails at
  once instead of after huggingface_hub's retries. Behind a proxy the probe is
  left to the proxy (huggingface_hub uses it).
  """
  if hub_offline():
    return "HF_HUB_OFFLINE is set"
  if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
    return None
  endpoint = getattr(huggingface_hub.constants, "ENDPOINT", "https://huggingface.co")
  parsed = urllib.parse.urlparse(endpoint)
  port = parsed.port or (443 if parsed.scheme == "https" else 80)
  return _probe(parsed.hostname or "huggingface.co", port)


def _cached(huggingface_hub, repo_id: str, filename: str, revision: str | None) -> str | None:
  """The cached file, without any network access, else None."""
  try:
    cached = huggingface_hub.try_to_load_from_cache(repo_id, filename, revision=revision)
  except Exception:  # pylint: disable=broad-except  # a malformed id: no cache entry
    return None
  return cached if isinstance(cached, str) and os.path.isfile(cached) else None


def download(repo_id: str, roles: Sequence[Sequence[str]], revision: str | None = None) -> str:
  """Fetches one file per role (the first candidate that exists); returns their directory.

  Cached files are used without the network; an unreachable hub fails at once (see
  `unreachable_reason`) with a message naming the id, the URL and how to pass a local path.
  """
  directory = None
  for candidates in roles:
    last_error = None
    for filename in candidates:
      path = _cached(huggingface_hub, repo_id, filename, revision)
      if path is None:
        reason = unreachable_reason()
        if reason is not None:
          raise CheckpointError(_offline_message(repo_id, filename, reason))
        try:
          path = huggingface_hub.hf_hub_download(repo_id, filename, revision=revision)
        except errors.LocalEntryNotFoundError as e:
          # Subclasses EntryNotFoundError (and OSError): test it first.
          raise CheckpointError(_offline_message(repo_id, filename, e)) from e
        except errors.EntryNotFoundError as e:
          last_error = e  # This repo stores the weights under another name.
          continue
        except errors.RepositoryNotFoundError as e:
          raise CheckpointError(
            f"{repo_id!r} is neither a local path nor a Hugging Face hub repository "
            "(check the spelling, or pass a local checkpoint directory or file, e.g. "
            f"stori_jax.load({_local_dir(repo_id)!r}))."
          ) from e
        except (OSError, ValueError) as e:  # HTTP errors; a malformed id (HFValidationError)
          raise CheckpointError(_offline_message(repo_id, filename, e)) from e
      directory = os.path.dirname(path)
      break
    else:
      raise CheckpointError(f"{repo_id} has none of {list(candidates)}: {last_error}")
  return directory


MODELS_DIR_ENV = "STORI_JAX_MODELS"


def models_dir(directory: str | os.PathLike | None = None) -> str:
  """Where registry weights may be placed by hand: `directory`, $STORI_JAX_MODELS,
  or ~/.cache/stori_jax/models."""
  directory = directory or os.environ.get(MODELS_DIR_ENV) or "~/.cache/stori_jax/models"
  return os.path.abspath(os.path.expanduser(os.fspath(directory)))


def find_local(
  name: str,
  repo_id: str,
  filenames: Sequence[str],
  local_dir: str | os.PathLike | None = None,
  revision: str | None = None,
) -> tuple[str, str] | None:
  """(path, where) of the first of `filenames` on this machine, or None.

  Looks in <models_dir>/<name>/ first ("local dir"), then in the Hugging Face
  cache ("HF cache"); never touches the network.
  """
  directory = os.path.join(models_dir(local_dir), name)
  for filename in filenames:
    path = os.path.join(directory, filename)
    if os.path.isfile(path):
      return path, "local dir"
  for filename in filenames:
    cached = huggingface_hub.try_to_load_from_cache(repo_id, filename, revision=revision)
    if isinstance(cached, str) and os.path.isfile(cached):
      return cached, "HF cache"
  return None


def _placement_message(name, repo_id, filenames, local_dir, reason) -> str:
  target = os.path.join(models_dir(local_dir), name, filenames[0])
  url = f"https://huggingface.co/{repo_id}/resolve/main/{filenames[0]}"
  others = ", ".join(filenames[1:])
  return (
    f"The weights of {name!r} are not on this machine and could not be downloaded ({reason}). "
    f"Fetch {filenames[0]} of the Hugging Face repository {repo_id} ({url}"
    + (f"; {others} works as well" if others else "")
    + f") on a machine with network and place it at {target} (set ${MODELS_DIR_ENV} to use "
    f"another directory than {models_dir(local_dir)}), or fill the Hugging Face cache there "
    f"with `huggingface-cli download {repo_id} {filenames[0]}` and copy the cache over."
  )


def fetch_weights(
  name: str,
  repo_id: str,
  filenames: Sequence[str],
  local_dir: str | os.PathLike | None = None,
  revision: str | None = None,
) -> str:
  """The weights file of a registered model: local copy, HF cache, else a download.

  Downloads prefer .safetensors (no torch needed to read it) and fall back to
  the other names. Raises CheckpointError naming the repository, the file and
  where to place it when the network or huggingface_hub is missing.
  """
  found = find_local(name, repo_id, filenames, local_dir, revision)
  if found:
    return found[0]
  reason = unreachable_reason()
  if reason is not None:  # fail at once rather than after huggingface_hub's retries
    raise CheckpointError(_placement_message(name, repo_id, filenames, local_dir, reason))
  order = sorted(filenames, key=lambda f: not f.endswith(".safetensors"))
  missing = []
  for filename in order:
    try:
      return huggingface_hub.hf_hub_download(repo_id, filename, revision=revision)
    except errors.LocalEntryNotFoundError as e:  # Offline; subclasses EntryNotFoundError.
      error = e
    except errors.EntryNotFoundError:  # The repository names this file differently.
      missing.append(filename)
      continue
    except OSError as e:  # No network, offline mode, HTTP errors.
      error = e
    reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    raise CheckpointError(
      _placement_message(name, repo_id, filenames, local_dir, reason)
    ) from error
  raise CheckpointError(f"{repo_id} has none of {missing}; check the registry entry of {name!r}.")
