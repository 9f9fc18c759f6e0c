"""`stori_jax.load(source)`: any supported checkpoint -> CLIPBundle."""

from __future__ import annotations

import difflib
import logging
import os
import zlib
from typing import Any

import jax.numpy as jnp

from stori_jax.plumbing import paths
from stori_jax.clip.bundle import CLIPBundle
from stori_jax.checkpoints import hf, hub, native, openai, validate
from stori_jax.checkpoints.errors import CheckpointError
from stori_jax.checkpoints.open_clip_config import architecture_config, config_from_open_clip
from stori_jax.checkpoints.state_dict import is_torchscript, read_state_dict
from stori_jax.data.files import read_json
from stori_jax.models import CLIPConfig, architecture_names, random_weights, registry, tower_kinds
from stori_jax.clip.preprocess import PreprocessConfig

# The shipped checkpoints are package data of stori_jax itself (setup.py), one folder up.
ASSETS_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "assets")


def named_checkpoints() -> list[str]:
  """Checkpoints shipped inside the package, loadable by name offline."""
  if not os.path.isdir(ASSETS_DIR):
    return []
  return sorted(
    d for d in os.listdir(ASSETS_DIR) if native.is_native_dir(os.path.join(ASSETS_DIR, d))
  )


def _load_registered(entry: registry.ModelEntry, models_dir, revision):
  """A registry entry: its weights (local copy, HF cache or download) in its architecture."""
  if entry.resize_mode != "shortest" or entry.interpolation != "bicubic":
    raise CheckpointError(
      f"{entry.name}: preprocessing {entry.resize_mode}/{entry.interpolation} is not "
      "implemented; stori_jax.clip.preprocess resizes the shorter side (bicubic) and crops."
    )
  path = hub.fetch_weights(entry.name, entry.hf_repo, entry.weights_files, models_dir, revision)
  config = entry.config
  params = openai.params_from_state_dict(read_state_dict(path), config, path)
  return config, params, PreprocessConfig(entry.image_size, entry.mean, entry.std), path


def _first_file(directory: str, names) -> str | None:
  for name in names:
    if os.path.isfile(os.path.join(directory, name)):
      return os.path.join(directory, name)
  return None


def _load_hf_dir(directory: str):
  config_path = os.path.join(directory, "config.json")
  config = hf.config_from_hf(
    read_json(config_path, "transformers config", error=CheckpointError), config_path
  )
  weights = _first_file(directory, ("model.safetensors", "pytorch_model.bin"))
  if weights is None:
    raise CheckpointError(
      f"{directory} has config.json but neither model.safetensors nor pytorch_model.bin."
    )
  params = hf.params_from_state_dict(read_state_dict(weights), config, weights)
  return config, params, PreprocessConfig(config.vision.image_size), weights


def _load_open_clip_dir(directory: str):
  config_path = os.path.join(directory, "open_clip_config.json")
  spec = read_json(config_path, "open_clip config", error=CheckpointError)
  if not isinstance(spec, dict) or not isinstance(spec.get("model_cfg"), dict):
    raise CheckpointError(
      f'{config_path} has no "model_cfg" object; is it open_clip\'s open_clip_config.json?'
    )
  try:
    config = config_from_open_clip(spec["model_cfg"], os.path.basename(directory))
    pre = spec.get("preprocess_cfg", {})
    preprocess = validate.preprocess_from_dict(
      {k: pre[k] for k in ("mean", "std") if k in pre}, config, config_path
    )
  except CheckpointError:
    raise
  except (KeyError, TypeError, ValueError, AttributeError) as e:  # a key of the wrong type
    raise CheckpointError(
      f"{config_path}: malformed model_cfg or preprocess_cfg ({type(e).__name__}: {e}); "
      "compare it with open_clip's own config of the architecture."
    ) from None
  weights = _first_file(directory, ("open_clip_model.safetensors", "open_clip_pytorch_model.bin"))
  if weights is None:
    raise CheckpointError(
      f"{directory} has open_clip_config.json but no "
      "open_clip_model.safetensors or open_clip_pytorch_model.bin."
    )
  params = openai.params_from_state_dict(read_state_dict(weights), config, weights)
  return config, params, preprocess, weights


def _arch_config(arch: str | CLIPConfig, source: str) -> CLIPConfig:
  """The CLIPConfig an `arch` argument names; an unknown name is a CheckpointError naming it
  and the checkpoint `source` it was given for."""
  if isinstance(arch, CLIPConfig):
    return arch
  if not isinstance(arch, str):
    raise CheckpointError(
      f"arch must be an architecture name or a CLIPConfig, got {type(arch).__name__} {arch!r}."
    )
  try:
    return architecture_config(arch)
  except ValueError:
    known = architecture_names()
    near = difflib.get_close_matches(arch, known, n=1)
    shown = ", ".join(known[:10]) + (f" and {len(known) - 10} more" if len(known) > 10 else "")
    raise CheckpointError(
      f"arch={arch!r}, given for {source}, is not a known architecture"
      + (f" (did you mean {near[0]!r}?)" if near else "")
      + f". Known: {shown} (stori_jax.models.architecture_names() lists them; open_clip's "
      "names work too when open_clip is installed). Or pass a CLIPConfig, or leave arch out: "
      "a checkpoint directory records its architecture and a state dict's shapes define it."
    ) from None


def _describe(config: CLIPConfig) -> str:
  v, t = config.vision, config.text
  tower = tower_kinds.of(v).describe(v)
  return (
    f"{config.name or 'unnamed'}: embed {config.embed_dim}, image {v.image_size} px ({tower}), "
    f"text {t.layers}x{t.width}, {t.activation}"
  )


def _check_arch(arch: str | CLIPConfig, config: CLIPConfig, source: str) -> None:
  """Raises CheckpointError when `arch` contradicts the architecture `source` records."""
  wanted = _arch_config(arch, source)
  ours = {k: v for k, v in validate.flatten(config.to_dict()).items() if k != "name"}
  theirs = {k: v for k, v in validate.flatten(wanted.to_dict()).items() if k != "name"}
  diffs = [k for k in sorted(set(ours) | set(theirs)) if ours.get(k) != theirs.get(k)]
  if diffs:
    shown = "; ".join(
      f"{k.replace('/', '.')}: {ours.get(k)!r} in the checkpoint, {theirs.get(k)!r} in arch"
      for k in diffs[:6]
    )
    label = arch if isinstance(arch, str) else (arch.name or "the CLIPConfig given")
    raise CheckpointError(
      f"arch={label!r} contradicts the architecture that {source} records "
      f"({_describe(config)}): {shown}"
      + (f"; and {len(diffs) - 6} more" if len(diffs) > 6 else "")
      + ". Leave arch out (this checkpoint defines its own architecture), or load the "
      "checkpoint that arch describes."
    )


def _load_state_dict_file(path: str, arch: str | CLIPConfig | None):
  state_dict = read_state_dict(path)
  if any(k.startswith("text_model.") for k in state_dict):
    raise CheckpointError(
      f"{path} is a Hugging Face transformers state dict; load its directory (with "
      "config.json) instead, so the architecture is known."
    )
  if arch is not None:
    config = _arch_config(arch, path)
  else:
    config = openai.config_from_state_dict(state_dict, path)
    if not is_torchscript(path):
      # The activation is not visible in the weights. OpenAI's models use
      # QuickGELU; open_clip's own trainings mostly use exact GELU.
      logging.warning(
        "No architecture name given for %s: assuming OpenAI's QuickGELU. Pass "
        "arch='ViT-B-32' (exact GELU) or 'ViT-B-32-quickgelu' to be explicit.",
        path,
      )
  params = openai.params_from_state_dict(state_dict, config, path)
  return config, params, PreprocessConfig(config.vision.image_size), path


def _hub_id_or_missing(source: str, revision: str | None) -> str:
  """The directory of a hub id's files; a local-looking path that does not exist is an error."""
  if source.count("/") == 1 and not source.startswith((".", "/", "~")):
    return hub.download(source, hub.HF_FILES, revision)
  known = ", ".join(named_checkpoints()) or "none installed"
  raise CheckpointError(
    f"{source} does not exist. Pass a checkpoint directory or file, a hub id such as "
    f"'openai/clip-vit-base-patch32' or 'hf-hub:org/name', a shipped name ({known}) "
    f"or a registered model ({', '.join(registry.names())})."
  )


def load(
  source: str | os.PathLike,
  arch: str | CLIPConfig | None = None,
  dtype: Any = jnp.float32,
  revision: str | None = None,
  models_dir: str | os.PathLike | None = None,
) -> CLIPBundle:
  """Loads a CLIP checkpoint as a CLIPBundle.

  Args:
    source: one of
      - a name from `named_checkpoints()` (shipped with the package);
      - a registered model (`python -m stori_jax.list_models` lists them), by name
        ('openai-rn50') or paper label ('ViT-B/16-dfn'): read from
        <models_dir>/<name>/ or the Hugging Face cache, else downloaded from
        its hub repository; offline, the error names the file to fetch and
        where to put it;
      - this project's converted directory (stori_config.json);
      - a transformers directory (config.json + model.safetensors/pytorch_model.bin);
      - an open_clip hub directory (open_clip_config.json + weights);
      - a state-dict file (.safetensors/.bin/.pt) in OpenAI/open_clip layout,
        with `arch` naming its architecture (e.g. 'ViT-B-32-quickgelu');
      - an OpenAI JIT archive (ViT-B-32.pt, ...);
      - a hub id: 'openai/clip-vit-base-patch32' (transformers) or
        'hf-hub:org/name' (open_clip), downloaded when the network allows.
    arch: architecture name or CLIPConfig for state-dict files; inferred from
      the tensor shapes (with QuickGELU) when omitted. For a checkpoint that
      records its architecture (a directory, a shipped name), arch is checked
      against it.
    dtype: compute dtype (float32 or bfloat16); params stay float32.
    revision: hub revision for hub ids and registered models.
    models_dir: where registered models' weights are placed by hand (default
      $STORI_JAX_MODELS or ~/.cache/stori_jax/models).

  Raises:
    CheckpointError: the message names the path (or id) and what is wrong: missing, not a
      file, empty, truncated, text instead of weights, a config key of the wrong type, an
      arch that contradicts the checkpoint or is unknown, a hub id that cannot be fetched.
    NonFiniteError: the weights hold a NaN or infinity (the file and parameter named).
  """
  source = os.fspath(source)
  origin = source
  entry = None if paths.exists(source) else registry.find(source)
  if entry is not None:
    if arch is not None:
      raise CheckpointError(
        f"{source!r} is a registered model with architecture {entry.arch}; drop arch="
        f"{arch if isinstance(arch, str) else 'CLIPConfig(...)'}."
      )
    config, params, preprocess, weights = _load_registered(entry, models_dir, revision)
    validate.check_finite(params, weights)
    return CLIPBundle(
      config=config, params=params, dtype=dtype, preprocess_config=preprocess, source=entry.name
    )
  if source in named_checkpoints():
    source = os.path.join(ASSETS_DIR, source)
  elif source.startswith("hf-hub:"):
    source = hub.download(source[len("hf-hub:") :], hub.OPEN_CLIP_FILES, revision)
  elif not paths.exists(source):
    source = _hub_id_or_missing(source, revision)
  if paths.is_remote(source) and not native.is_native_dir(source):
    # gs://: other layouts are read from a local copy, made once the URL is known to hold one
    # (a folder of another kind is refused by its URL before anything is downloaded), removed
    # as soon as the weights are in memory; errors name the URL, not the copy.
    if paths.isdir(source) and not any(
      paths.isfile(paths.join(source, marker)) for marker in _FOLDER_MARKERS
    ):
      raise _unknown_folder(source)
    with paths.copied_locally(source) as local:
      config, params, preprocess, weights = _load_local(local, arch, origin)
    if isinstance(weights, str):  # the weights named by URL in messages
      weights = weights.replace(os.path.dirname(local), paths.parent(source))
  else:
    config, params, preprocess, weights = _load_local(source, arch, origin)
  validate.check_finite(params, weights)
  return CLIPBundle(
    config=config, params=params, dtype=dtype, preprocess_config=preprocess, source=origin
  )


#: The file that marks a model folder of each layout `load` reads besides this project's own.
_FOLDER_MARKERS = ("config.json", "open_clip_config.json")


def _unknown_folder(source: str) -> CheckpointError:
  return CheckpointError(
    f"{source} is a directory without {native.CONFIG_FILE} (converted), config.json "
    "(transformers) or open_clip_config.json (open_clip); point at the weights file "
    f"instead, or convert it with python -m stori_jax.convert."
  )


def _load_local(source: str, arch: Any, origin: str):
  """(config, params, preprocess config, weights path) of a model folder or weights file
  `source` (local, or a native gs:// folder)."""
  if paths.isdir(source):
    if native.is_native_dir(source):
      config, params, preprocess, _ = native.load(source)
      weights = native.params_path(source)
    elif os.path.isfile(os.path.join(source, "config.json")):
      config, params, preprocess, weights = _load_hf_dir(source)
    elif os.path.isfile(os.path.join(source, "open_clip_config.json")):
      config, params, preprocess, weights = _load_open_clip_dir(source)
    else:
      raise _unknown_folder(source)
    if arch is not None:
      _check_arch(arch, config, origin)
    return config, params, preprocess, weights
  return _load_state_dict_file(source, arch)


def save(
  bundle: CLIPBundle,
  directory: str | os.PathLike,
  params_format: str = "safetensors",
  metadata: dict | None = None,
) -> str:
  """Writes the bundle in this project's format; `load(directory)` reads it back."""
  meta = {"converted_from": bundle.source, **(metadata or {})}
  return native.save(
    directory, bundle.config, bundle.params, bundle.preprocess_config, params_format, meta
  )


def random_instance(
  name: str, image_size: int = 64, shrink: int = 1, seed: int = 0, dtype: Any = jnp.float32
) -> CLIPBundle:
  """A random-weight instance of a registered model's architecture (an offline stand-in for the
  trained model: the same towers, meaningless numbers), with the entry's mean / std.

  Args:
    name: a registry name or paper label.
    image_size: the input size, rounded per tower (`random_weights.small_image_size`); 0: the
      entry's own size.
    shrink: widths divided by it, at most 2 blocks per tower (`random_weights.shrink_config`).
    seed: mixed with the name, so models of one architecture differ.

  Returns:
    a CLIPBundle whose source is "random:<name>".
  """
  entry = registry.get(name)
  config = random_weights.shrink_config(entry.config, int(shrink))
  size = random_weights.small_image_size(config, int(image_size)) if image_size else None
  config = config.with_image_size(size or entry.image_size)
  params = random_weights.random_params(config, seed=(int(seed), zlib.crc32(entry.name.encode())))
  preprocess = PreprocessConfig(config.vision.image_size, entry.mean, entry.std)
  return CLIPBundle(
    config=config,
    params=params,
    dtype=dtype,
    preprocess_config=preprocess,
    source=f"random:{entry.name}",
  )
