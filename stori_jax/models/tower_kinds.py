"""Image-tower kinds by registration: everything the project knows about one kind of CLIP vision
tower (ViT, ModifiedResNet, ConvNeXt, ...) in one `TowerKind` entry, looked up by name or by the
type of its config.

Not to be confused with `registry.py`, the registry of named *checkpoints* (weights to fetch,
such as "openai-vit-b-16", each with an architecture). This one registers *architectures' image
towers*: a checkpoint's config holds a vision config, and the type of that config names its
kind. Nothing outside this module switches on a kind's name: code that needs a per-kind fact
asks the kind (`of(config.vision).has_keys`, `.describe(vision)`, `.hook("...")`).

Adding a kind is one call, `register(TowerKind(...))`, with:

* the model side (this layer): its config dataclass (`config`: a frozen dataclass with
  `image_size` and the `patch_size` and `grid_size` of its final map, written to
  `stori_config.json` as its fields), its Flax module (`module(clip_config, dtype)`), how a
  config dict is recognised as this kind (`recognises`), its consistency checks, its family
  label, a one-line description, the size of its largest activation, and the facts the
  mutual-knowledge analysis reads (`has_keys`, `class_token_layers`);
* the layers above (`hooks`, by the names in HOOKS): checkpoint conversions (OpenAI / open_clip
  state-dict keys, open_clip's `vision_cfg`, transformers' keys), and the PyTorch reference's
  builder. `models` lies below `checkpoints` and `reference` and may not import them, so the
  registry holds these as callables, passed in the same `register` call as the model side. The
  three built-in kinds are one module each in stori_jax/kinds/ (a layer above models and
  checkpoints, imported by stori_jax/__init__.py): `vit.py`, `resnet.py`, `convnext.py`, each
  registering its complete entry; a kind defined outside the project does the same from its own
  file (tests/toy_plugins.py's toy tower).

The Flax module's contract: `tower(images [B, S, S, 3], return_hidden=False)` (images
normalised) returns the features float32 [B, embed_dim]; with `return_hidden`, `(features, details)` where details holds
`hidden_states` (list of arrays, the states the parity tool compares), `feature_map` [B, h, w, C]
(the final spatial map, h = w = grid_size: mutual knowledge's patch tokens), `patch_tokens`
[B, h * w, C] (feature_map row-major), `keys` [B, 1 + h * w, C] (the last attention's keys, the
pooled / class token first) when `has_keys`, and `class_keys` [B, layers, W] (the class token's
key of every block) when `class_token_layers` (then `hidden_states[1:]` are the blocks' outputs
with the class token first). A hook that a kind lacks raises a ValueError naming it when used.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

#: The kind a vision dict, a state dict or an open_clip `vision_cfg` is taken to be when no other
#: kind claims it: CLIP's original ViT (configs written before the CNN kinds have only its keys).
DEFAULT = "vit"

#: The hooks higher layers give a kind, with their signatures. A kind may leave any out; using a
#: missing one is an error naming it.
HOOKS = {
  # stori_jax/checkpoints/: reading checkpoints.
  "state_dict_config": "(state_dict, source, activation, head_width) -> the vision config that "
  "the `visual.*` keys of an OpenAI / open_clip state dict hold, or None where they are another "
  "kind's (checkpoints.openai.config_from_state_dict)",
  "state_dict_params": "(reader, vision) -> None: puts this tower's `vision/*` params from the "
  "`visual.*` keys (reader: a checkpoints.mapping.StateDictReader; "
  "checkpoints.openai.params_from_state_dict)",
  "open_clip_config": "(vision_cfg, image_size, activation, name) -> the vision config of an "
  "open_clip model config's `vision_cfg`, or None where it is another kind's "
  "(checkpoints.open_clip_config)",
  "transformers_params": "(reader, vision) -> None: puts `vision/*` from a transformers "
  "CLIPModel's `vision_model.*` keys (checkpoints.hf.params_from_state_dict)",
  # stori_jax/reference/clip_towers.py: the PyTorch reference of the parity tool.
  "reference_vision_cfg": "(clip_config) -> open_clip's `vision_cfg` dict that builds this tower",
  "reference_finish": "(model, clip_config) -> None: adjusts the built open_clip model in place",
  "reference_hidden": "(visual) -> (first, modules, layout) or None where `visual` (an open_clip "
  "model's image tower) is another kind's: the module whose input is the first hidden state "
  "(None: none), the modules whose outputs follow, and their layout, 'sequence' [B, T, W] or "
  "'nchw'",
  "reference_transformers_vision": "(clip_config) -> transformers' `vision_config` dict",
}


def _no_check(vision) -> None:
  del vision


def _no_blocks(vision) -> Sequence[tuple[str, int, str]]:
  del vision
  return ()


@dataclasses.dataclass(frozen=True, eq=False)
class TowerKind:
  """One kind of image tower.

  Attributes:
    name: the kind's name, `CLIPConfig.vision_kind` ("vit", "resnet", "convnext").
    config: the vision config dataclass (frozen; `image_size` a field, `patch_size` and
      `grid_size` fields or properties: pixels per cell of the final map and cells per side).
    module: (clip_config, dtype) -> the Flax module (see the module docstring for its contract).
    recognises: (vision dict) -> whether a config dict (`dataclasses.asdict`, or read from
      JSON, lists for tuples) is this kind's; no two kinds may claim one dict.
    family: the family name in tables and figures ("ViT", "ResNet", "ConvNeXt").
    describe: (vision) -> a short description ("ViT 12x768 patch 32").
    activation_elements: (vision) -> elements of one image's largest activation (sizes the
      passes of the mutual-knowledge analysis on a CPU).
    check: (vision) -> None, or a ValueError naming an inconsistent value.
    shrink: (vision, factor) -> the tower with its widths divided by factor and at most 2 blocks
      per stage (random-weight instances for offline sweeps); None: not offered.
    has_keys: whether details hold attention `keys` (mutual knowledge's key features).
    class_token_layers: whether every block carries a class token (`class_keys`, and hidden
      states with it first: the layer similarity of App. A.1).
    shares_activation: whether the config's `activation` follows the text tower's (open_clip's
      one `quick_gelu` switch sets both).
    hidden_labels: (first, unit) naming the hidden states in the parity table: "embed",
      "block 1", ... or "stem", "stage 1", ...
    param_blocks: (vision) -> ((config key, count, flat param prefix), ...): block counts a
      checkpoint's weights must agree with before the model is built.
    hooks: the higher layers' callables, by the names of HOOKS.
  """

  name: str
  config: type
  module: Callable[[Any, Any], Any]
  recognises: Callable[[Mapping[str, Any]], bool]
  family: str
  describe: Callable[[Any], str]
  activation_elements: Callable[[Any], int]
  check: Callable[[Any], None] = _no_check
  shrink: Callable[[Any, int], Any] | None = None
  has_keys: bool = True
  class_token_layers: bool = False
  shares_activation: bool = False
  hidden_labels: tuple[str, str] = ("embed", "block")
  param_blocks: Callable[[Any], Sequence[tuple[str, int, str]]] = _no_blocks
  hooks: dict[str, Callable] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    _check_hook_names(self.name, self.hooks)
    object.__setattr__(self, "hooks", dict(self.hooks))

  def hook(self, name: str) -> Callable:
    """The hook `name` of this kind; a ValueError naming the kind where it has none."""
    if name not in HOOKS:
      raise ValueError(f"Unknown tower-kind hook {name!r}; the hooks are {sorted(HOOKS)}.")
    if name not in self.hooks:
      raise ValueError(
        f"The {self.name!r} image tower has no {name!r} hook ({HOOKS[name]}), so this "
        f"operation is not available for it. Give it one in the kind's register call "
        f"(TowerKind(..., hooks={{{name!r}: ...}}))."
      )
    return self.hooks[name]


_KINDS: dict[str, TowerKind] = {}


def _check_hook_names(kind: str, hooks: Mapping[str, Callable]) -> None:
  unknown = sorted(set(hooks) - set(HOOKS))
  if unknown:
    raise ValueError(
      f"Tower kind {kind!r}: unknown hooks {unknown}; the hooks are {sorted(HOOKS)}."
    )


def register(kind: TowerKind) -> TowerKind:
  """Adds a kind; refuses a name or a config class already registered. Returns the kind."""
  if kind.name in _KINDS:
    raise ValueError(f"A tower kind named {kind.name!r} is already registered.")
  taken = [k.name for k in _KINDS.values() if k.config is kind.config]
  if taken:
    raise ValueError(f"{kind.config.__name__} is already the config of tower kind {taken[0]!r}.")
  _KINDS[kind.name] = kind
  return kind


def unregister(name: str) -> None:
  """Removes a kind (tests that register their own)."""
  _KINDS.pop(name, None)


def kinds() -> tuple[TowerKind, ...]:
  """Every registered kind, in registration order (the families' order in tables)."""
  return tuple(_KINDS.values())


def get(name: str) -> TowerKind:
  """The kind named `name`."""
  if name not in _KINDS:
    raise ValueError(f"Unknown image tower kind {name!r}; registered: {sorted(_KINDS)}.")
  return _KINDS[name]


def of(vision) -> TowerKind:
  """The kind of a vision config (by its type)."""
  for kind in _KINDS.values():
    if type(vision) is kind.config:
      return kind
  raise ValueError(
    f"Unknown vision config type {type(vision).__name__}; registered tower kinds: "
    + ", ".join(f"{k.name} ({k.config.__name__})" for k in _KINDS.values())
    + ". Register a new kind with stori_jax.models.tower_kinds.register."
  )


def _default_last() -> list[TowerKind]:
  return sorted(_KINDS.values(), key=lambda kind: kind.name == DEFAULT)


def kind_of_dict(values: Mapping[str, Any]) -> TowerKind:
  """The kind of a vision config dict: the one kind whose `recognises` claims it, else DEFAULT
  (whose config then names the unknown keys).

  Raises:
    ValueError: two kinds claim it.
  """
  claims = [k for k in _KINDS.values() if k.recognises(values)]
  if len(claims) > 1:
    raise ValueError(
      f"The vision config {dict(values)!r:.200} fits tower kinds "
      f"{[k.name for k in claims]} alike; their `recognises` must tell them apart."
    )
  return claims[0] if claims else get(DEFAULT)


def vision_from_dict(values: Mapping[str, Any]):
  """A vision config rebuilt from its dict (JSON lists become tuples)."""
  values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
  return kind_of_dict(values).config(**values)


def check_stride_32(vision, kind: str) -> None:
  """A ValueError where a tower that downsamples by 32 (a kind's `check`) gets another size."""
  if vision.image_size % 32:
    raise ValueError(
      f"{kind} towers downsample by 32: image_size {vision.image_size} is not a multiple of 32."
    )


def shrunk_heads(width: int, count: int) -> int:
  """Heads of a tower shrunk to `width` (a kind's `shrink`): a quarter of `count` (at least 1),
  lowered until they divide the width."""
  count = max(1, count // 4)
  while width % count:
    count -= 1
  return count


def detect(hook: str, *args) -> Any:
  """The first non-None result of the kinds' `hook` (every kind that has it, DEFAULT last):
  the kind that claims a checkpoint or a reference model builds from it. None when none does."""
  for kind in _default_last():
    if hook in kind.hooks:
      result = kind.hooks[hook](*args)
      if result is not None:
        return result
  return None
