"""JAX vs PyTorch numerics, block by block: the library of `python -m stori_jax.parity`.

Builds the PyTorch reference (open_clip or transformers) with the same weights, runs both on the
same random inputs and measures, for every block of both towers, the max absolute and relative
error of the hidden states, then the errors of the features and logits. Relative errors are
max |jax - torch| / max |torch| of the tensor, except for the logits, whose scale is the logit
scale exp(t) (the largest logit a unit cosine gives): random weights make nearly orthogonal
features, and max |logits| near 0 would inflate the ratio. Needs the `[torch]` extra.
"""

from __future__ import annotations

import importlib.metadata
import os
from typing import Any, Mapping

import jax
import numpy as np

from stori_jax.clip.bundle import CLIPBundle
from stori_jax.checkpoints import hf, native, openai
from stori_jax.checkpoints.open_clip_config import architecture_config
from stori_jax.checkpoints.state_dict import read_state_dict
from stori_jax.clip.loading import load
from stori_jax.models import CLIPConfig, tower_kinds
from stori_jax.reference import clip_towers

#: The numerics contract (docs/design.md section 3): max |jax - torch| <= TOLERANCE * scale for
#: every block's hidden state, the features and the logits.
TOLERANCE = 1e-5


def random_inputs(config: CLIPConfig, batch: int = 4, seed: int = 0):
  """Normalised images float32 [B, S, S, 3] and token ids int32 [B, context].

  Rows have varied lengths: SOT, random ids, EOT, zero padding; EOT stays the
  largest id of a row (open_clip pools at the argmax of the ids).
  """
  rng = np.random.default_rng(seed)
  size, text = config.vision.image_size, config.text
  images = rng.standard_normal((batch, size, size, 3), dtype=np.float32)
  ids = np.zeros((batch, text.context_length), np.int32)
  eot = text.eot_token_id
  for row in range(batch):
    length = int(rng.integers(2, text.context_length + 1)) if row else text.context_length
    ids[row, : length - 1] = rng.integers(1, eot - 1, length - 1)
    ids[row, 0] = eot - 1 if eot - 1 < text.vocab_size else 1  # SOT when the vocab has one.
    ids[row, length - 1] = eot
  return images, ids


def jax_outputs(bundle: CLIPBundle, images: np.ndarray, ids: np.ndarray) -> dict[str, Any]:
  """The quantities clip_towers.run returns, from the Flax model."""
  text_features, text_hidden = bundle.text_hidden_states(ids)
  image_features, details = bundle.image_details(images)
  return {
    "image_features": np.asarray(image_features),
    "text_features": np.asarray(text_features),
    "logits": np.asarray(bundle.logits(image_features, text_features)),
    "text_hidden": [np.asarray(h) for h in text_hidden],
    "vision_hidden": [np.asarray(h) for h in details["hidden_states"]],
  }


def _errors(ours: np.ndarray, reference: np.ndarray, scale: float | None = None) -> dict:
  ours, reference = np.asarray(ours, np.float64), np.asarray(reference, np.float64)
  if ours.shape != reference.shape:
    raise ValueError(f"shape mismatch: jax {ours.shape} vs torch {reference.shape}")
  max_abs = float(np.max(np.abs(ours - reference)))
  scale = float(np.max(np.abs(reference))) if scale is None else float(scale)
  return {"max_abs": max_abs, "max_rel": max_abs / scale if scale else max_abs, "scale": scale}


def compare(
  ours: Mapping[str, Any], reference: Mapping[str, Any], logit_scale: float | None = None
) -> dict[str, Any]:
  """Per-block and final errors; `worst_final_rel` is the headline number.

  logit_scale: exp(t), the scale of the logits' relative error (None: max |torch logits|).
  """
  report = {}
  for tower in ("text", "vision"):
    hidden_ours, hidden_ref = ours[f"{tower}_hidden"], reference[f"{tower}_hidden"]
    if len(hidden_ours) != len(hidden_ref):
      raise ValueError(f"{tower}: {len(hidden_ours)} hidden states vs {len(hidden_ref)}")
    report[f"{tower}_blocks"] = [
      dict(block=i, **_errors(a, b)) for i, (a, b) in enumerate(zip(hidden_ours, hidden_ref))
    ]
  for name in ("text_features", "image_features"):
    report[name] = _errors(ours[name], reference[name])
  report["logits"] = _errors(ours["logits"], reference["logits"], logit_scale)
  report["worst_final_rel"] = max(
    report[n]["max_rel"] for n in ("text_features", "image_features", "logits")
  )
  return report


def random_pair(arch: str | CLIPConfig, reference: str = "open_clip", seed: int = 0):
  """(torch model, CLIPBundle) sharing the same random weights, the same for the same seed in
  every process (the library's initialisation is seeded too, not only the noise added to it)."""
  config = arch if isinstance(arch, CLIPConfig) else architecture_config(arch)
  model = clip_towers.randomize_(clip_towers.build(config, reference, seed), seed)
  state_dict = clip_towers.state_dict_numpy(model)
  convert = hf if reference == "transformers" else openai
  params = convert.params_from_state_dict(state_dict, config, f"random {reference}")
  return model, CLIPBundle(config=config, params=params, source=f"random:{reference}")


def reference_for_source(source: str, arch: str | None = None):
  """(torch model, CLIPBundle) for a checkpoint on disk."""
  bundle = load(source, arch=arch)
  path = bundle.source
  if os.path.isdir(path) and native.is_native_dir(path):
    _, _, _, metadata = native.load(path)
    original = metadata.get("converted_from")
    if not original or not os.path.exists(original):
      raise ValueError(
        f"{path} is a converted checkpoint; parity needs the original "
        f"({original or 'unknown'}): pass it as --source."
      )
    return reference_for_source(original, metadata.get("arch") or arch)
  if os.path.isdir(path):
    names = (
      "model.safetensors",
      "pytorch_model.bin",
      "open_clip_model.safetensors",
      "open_clip_pytorch_model.bin",
    )
    path = next(os.path.join(path, n) for n in names if os.path.isfile(os.path.join(path, n)))
  state_dict = read_state_dict(path)
  reference = (
    "transformers" if any(k.startswith("text_model.") for k in state_dict) else "open_clip"
  )
  model = clip_towers.build(bundle.config, reference)
  torch = clip_towers._torch()  # pylint: disable=protected-access
  ignored = set(hf.IGNORED_KEYS) | set(openai.IGNORED_KEYS)
  tensors = {k: torch.from_numpy(v) for k, v in state_dict.items() if k not in ignored}
  missing, unexpected = model.load_state_dict(tensors, strict=False)
  missing = [k for k in missing if k not in ignored]
  if missing or unexpected:
    raise ValueError(
      f"The {reference} reference does not take {path}: missing {missing}, unexpected {unexpected}."
    )
  return model.eval(), bundle


def run_parity(model, bundle: CLIPBundle, batch: int = 4, seed: int = 0) -> dict[str, Any]:
  images, ids = random_inputs(bundle.config, batch, seed)
  report = compare(
    jax_outputs(bundle, images, ids),
    clip_towers.run(model, images, ids),
    logit_scale=float(bundle.logit_scale),
  )
  report["config"] = bundle.config.to_dict()
  report["source"] = bundle.source
  return report


def _rows(report: Mapping[str, Any]) -> list[tuple[str, Mapping[str, float]]]:
  """(label, errors) of every tensor the report compares: each block, then the outputs."""
  rows = []
  # The image tower's kind names its states (CNNs: the stem and the four stages).
  vision_labels = tower_kinds.kind_of_dict(report.get("config", {}).get("vision", {})).hidden_labels
  for tower in ("text", "vision"):
    first, unit = vision_labels if tower == "vision" else ("embed", "block")
    for row in report[f"{tower}_blocks"]:
      rows.append((f"{tower} " + (first if row["block"] == 0 else f"{unit} {row['block']}"), row))
  rows.extend((name, report[name]) for name in ("text_features", "image_features", "logits"))
  return rows


def format_report(report: Mapping[str, Any]) -> str:
  lines = [f"{'tensor':<22}{'max |jax-torch|':>18}{'max |torch|':>14}{'relative':>12}"]
  for label, row in _rows(report):
    lines.append(f"{label:<22}{row['max_abs']:>18.3e}{row['scale']:>14.3e}{row['max_rel']:>12.3e}")
  lines.append(f"worst relative error of features/logits: {report['worst_final_rel']:.3e}")
  return "\n".join(lines)


def reference_name(model) -> str:
  """Which PyTorch reference `model` is (as clip_towers.run tells them apart)."""
  return "transformers" if hasattr(model, "text_model") else "open_clip"


def format_header(bundle: CLIPBundle, model, batch: int, seed: int) -> str:
  """What was compared, in what precision, on which device: the lines above the table."""
  import torch  # optional: the torch extra

  c = bundle.config
  vision = tower_kinds.of(c.vision).describe(c.vision)
  reference = reference_name(model)
  version = _package_version("open_clip_torch" if reference == "open_clip" else reference)
  backend, kind = jax.default_backend(), jax.devices()[0].device_kind
  kind = "" if kind.lower() == backend else f" ({kind})"  # a GPU's or TPU's model
  return "\n".join(
    [
      f"architecture: {c.name or 'unnamed'} (text {c.text.layers}x{c.text.width}, vision "
      f"{vision} @ {c.vision.image_size}px, embed {c.embed_dim}, {c.text.activation})",
      f"weights:      {bundle.source}",
      f"reference:    {reference} {version} (torch {torch.__version__}, CPU, float32)",
      f"dtype:        {np.dtype(bundle.dtype).name} compute, float32 params, matmul precision "
      "highest",
      f"device:       {backend}{kind}, jax {jax.__version__}",
      f"inputs:       {batch} images and {batch} texts, seed {seed}",
    ]
  )


def _package_version(name: str) -> str:
  try:
    return importlib.metadata.version(name)
  except importlib.metadata.PackageNotFoundError:
    return "(version unknown)"


def worst_error(report: Mapping[str, Any]) -> tuple[str, float]:
  """The tensor with the largest relative error, blocks and outputs alike, and that error:
  the contract bounds every one of them."""
  # A NaN error counts as the worst (max would otherwise pass over it).
  label, row = max(_rows(report), key=lambda item: np.nan_to_num(item[1]["max_rel"], nan=np.inf))
  return label, float(row["max_rel"])


def format_verdict(report: Mapping[str, Any], tolerance: float = TOLERANCE) -> tuple[bool, str]:
  """(passed, the verdict line): every relative error within `tolerance`."""
  label, worst = worst_error(report)
  # Written so that a NaN error fails: NaN <= tolerance is False.
  passed = bool(worst <= tolerance)
  verdict = "PASS" if passed else "FAIL"
  relation = "<=" if passed else ">"
  return passed, (
    f"{verdict}: worst relative error {worst:.3e} ({label}) {relation} tolerance {tolerance:.0e} "
    "(the numerics contract, docs/design.md section 3)"
  )
