"""The sweep's models: registered weights, or random-weight instances of the registered
architectures (small input size, optionally shrunk widths), and the pool that holds at most a
given number of them loaded. Their compiled towers are shared by architecture (`SweepBundle`),
so a model the pool reloads is not compiled again."""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import gc
from typing import Any, Callable, Sequence

import jax.numpy as jnp

import stori_jax
from stori_jax.clip import loading
from stori_jax.clip.bundle import CLIPBundle, tower_functions
from stori_jax.checkpoints import hub
from stori_jax.models import CLIP, CLIPConfig, registry, tower_kinds

from stori_jax.models.random_weights import shrink_config, small_image_size


def families() -> tuple[str, ...]:
  """Table 3's model families in the table's order: one per registered image-tower kind ("ViT",
  "ResNet", "ConvNeXt", then any kind registered since)."""
  return tuple(kind.family for kind in tower_kinds.kinds())


def family(config: CLIPConfig) -> str:
  """Table 3's family of a model: its image tower kind's ("ViT", "ResNet" or "ConvNeXt")."""
  return tower_kinds.of(config.vision).family


@functools.lru_cache(maxsize=None)
def _encoders(config: CLIPConfig, dtype) -> tuple[Any, Any]:
  """The jitted text and image encoders of an architecture and compute dtype, as CLIPBundle
  builds them, but closing over the Flax module only (never a bundle or its parameters), so
  every bundle of the architecture shares them and their compiled executables."""
  return tower_functions(CLIP(config, dtype=dtype))


def _architecture(config: CLIPConfig) -> CLIPConfig:
  """The config without its name, which the modules never read: models of one architecture
  under different names (ViT-L/14 and ViT-L/14@336px at the same input size, OpenAI's and
  DFN's ViT-B/16) share their compiled towers and visual-prompt programs."""
  return config.replace(name="")


@dataclasses.dataclass(frozen=True, eq=False)
class SweepBundle(CLIPBundle):
  """A CLIPBundle whose jitted towers are shared by every SweepBundle of the same architecture
  (whatever its name) and dtype (`_encoders`): the pool can drop a model's weights and reload them later without
  compiling its towers again, and a dropped bundle holds no reference cycle through its
  compiled functions. Same programs, same numbers as the plain bundle."""

  @property
  def _text_fn(self):
    return _encoders(_architecture(self.config), jnp.dtype(self.dtype))[0]

  @property
  def _image_fn(self):
    return _encoders(_architecture(self.config), jnp.dtype(self.dtype))[1]

  @classmethod
  def of(cls, bundle: CLIPBundle) -> "SweepBundle":
    """The same weights and settings as `bundle`, with the shared towers."""
    return cls(**{f.name: getattr(bundle, f.name) for f in dataclasses.fields(CLIPBundle)})


def random_bundle(
  name: str, image_size: int = 64, shrink: int = 1, seed: int = 0, dtype=jnp.float32
) -> SweepBundle:
  """A random-weight instance of a registered model's architecture at a small input size (0: the
  entry's own size), with the entry's mean / std (`stori_jax.clip.loading.random_instance`), sharing
  its compiled towers with the other instances of the architecture. The seed mixes in the name,
  so models of one architecture differ."""
  return SweepBundle.of(loading.random_instance(name, image_size, shrink, seed, dtype))


@dataclasses.dataclass(frozen=True)
class SweepModel:
  """One model of the sweep: its registry entry, how to (re)load it and, for registered
  weights, how to make sure they are here (local copy, HF cache or download) without building
  the model; it raises CheckpointError with what to fetch and where to put it."""

  entry: registry.ModelEntry
  load: Callable[[], CLIPBundle]
  fetch: Callable[[], Any] | None = None

  @property
  def name(self) -> str:
    return self.entry.name


def _libc():
  try:
    return ctypes.CDLL("libc.so.6")
  except OSError:  # not glibc (macOS, musl): nothing to trim
    return None


_LIBC = _libc()


def _release_memory() -> None:
  """Frees what dropped bundles held and gives it back to the OS: glibc keeps freed heap memory
  (a dropped ViT-L/14's 1.7 GB stayed in the RSS, measured), so the peak would grow to the sum
  of the models rather than the largest one."""
  gc.collect()
  if _LIBC is not None and hasattr(_LIBC, "malloc_trim"):
    _LIBC.malloc_trim(0)


class ModelPool:
  """Bundles by model index, at most `max_loaded` held at once (0: all); least recently used
  goes first, and its memory is returned before the next one loads. Passes alternate their
  direction (`order`), so consecutive passes over the models start with the ones still held.
  Callers should not keep a bundle past their use of it (the pool then frees it)."""

  def __init__(self, models: Sequence[SweepModel], max_loaded: int = 0):
    self.models = list(models)
    self.max_loaded = int(max_loaded) or len(self.models)
    self._held: dict[int, CLIPBundle] = {}
    self._forward = False
    self.loads = 0

  def get(self, index: int) -> CLIPBundle:
    if index in self._held:
      self._held[index] = self._held.pop(index)  # most recently used last
      return self._held[index]
    if len(self._held) >= self.max_loaded:
      while len(self._held) >= self.max_loaded:
        self._held.pop(next(iter(self._held)))
      _release_memory()  # before the next model's weights are made
    self.loads += 1
    self._held[index] = self.models[index].load()
    return self._held[index]

  def order(self, indices: Sequence[int] | None = None) -> list[int]:
    """`indices` (default all) forwards, then backwards on the next call, and so on."""
    indices = list(range(len(self.models)) if indices is None else indices)
    self._forward = not self._forward
    return indices if self._forward else indices[::-1]


def model_image_size(config, entry: registry.ModelEntry) -> int:
  """The input size of a sweep model: the entry's, or the random instance's small size."""
  if not config.random_weights:
    return int(entry.image_size)
  if not config.random_models.image_size:
    return int(entry.image_size)
  arch = shrink_config(entry.config, int(config.random_models.shrink))
  return small_image_size(arch, int(config.random_models.image_size))


def _load_shared(name: str, **options) -> SweepBundle:
  return SweepBundle.of(stori_jax.load(name, **options))


def sweep_models(config) -> list[SweepModel]:
  """The models of config.models, as registered weights or (config.random_weights) random
  instances of their architectures."""
  dtype = jnp.dtype(config.dtype)
  out = []
  for name in config.models:
    entry = registry.get(name)
    if config.random_weights:
      r = config.random_models
      load = functools.partial(
        random_bundle, entry.name, int(r.image_size), int(r.shrink), int(r.seed), dtype
      )
      out.append(SweepModel(entry, load))
      continue
    models_dir = config.models_dir or None
    load = functools.partial(_load_shared, entry.name, dtype=dtype, models_dir=models_dir)
    fetch = functools.partial(
      hub.fetch_weights, entry.name, entry.hf_repo, entry.weights_files, models_dir
    )
    out.append(SweepModel(entry, load, fetch))
  return out
