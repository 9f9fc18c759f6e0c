"""The explorer over its image index: the model loaded, the index built once and cached
(`stori_jax.retrieval.index`, keyed by the model and the images), an `Explorer` over it.

The index holds an image folder's readable images (`folder`, no labels) or, by default, the
synthetic world (`world`, labelled). Options and blocks are checked before any image is
encoded (minutes for a large folder).
"""

from __future__ import annotations

import stori_jax
from stori_jax.plumbing.errors import InputError
from stori_jax.explorer.folder import image_folder
from stori_jax.explorer.ranking import Explorer
from stori_jax.explorer.world import (
  MAX_IMAGES_PER_COMBINATION,
  WORLD_PROMPT,
  world_data,
  world_description,
)
from stori_jax.models.text import default_start_block, reweighted_block_indices
from stori_jax.retrieval import index


def build_explorer(
  source: str = "tiny-synthetic",
  images: str | None = None,
  cache_dir: str | None = "workdirs/retrieval_cache",
  images_per_combination: int = 2,
  batch_size: int = 256,
  start_block: int | None = None,
  stop_block: int | None = None,
) -> Explorer:
  """An Explorer over an image folder, or over the synthetic world (`world_data`).

  Args:
    source: the model, anything `stori_jax.load` accepts.
    images: a folder of images to index; None: the synthetic world.
    cache_dir: where the index (and a folder's image check) is cached; None: no cache.
    images_per_combination: the synthetic world's images per colour x pattern x shape, in
      [1, MAX_IMAGES_PER_COMBINATION].
    batch_size: images encoded at a time.
    start_block, stop_block: the reweighted blocks a request gets when it names none
      (1-indexed, inclusive); None: the model's default start block, the last block.

  Raises:
    UserError: a bad option (named), a folder without readable images, a bad model source.
  """
  _check_options(images, images_per_combination, batch_size)
  bundle = stori_jax.load(source)
  # The blocks are checked before the index is built (minutes for a large folder).
  start = default_start_block(bundle.config.text) if start_block is None else start_block
  try:
    reweighted_block_indices(bundle.config.text.layers, start, stop_block)
  except ValueError as e:
    given = [f"--{n} {v}" for n, v in [("start_block", start_block), ("stop_block", stop_block)]]
    raise InputError(f"{' '.join(g for g in given if not g.endswith(' None'))}: {e}") from None
  size = int(bundle.config.vision.image_size)
  if images:
    data, attributes, prompt = image_folder(images, cache_dir), None, ""
    description = f"{len(data.keys)} images from {images} (an image folder, without labels)"
  else:
    data, attributes = world_data(images_per_combination, size)
    prompt, description = WORLD_PROMPT, world_description(images_per_combination)
  idx = index.build_index(bundle, data, cache_dir, batch_size)
  return Explorer(
    bundle,
    idx.embeddings,
    idx.keys,
    data.load,
    attributes=attributes,
    default_prompt=prompt,
    start_block=start_block,
    stop_block=stop_block,
    description=description,
  )


def _check_options(images, images_per_combination: int, batch_size: int) -> None:
  if batch_size < 1:
    raise InputError(f"the batch size must be at least 1, got {batch_size}")
  if images:
    return
  if not 1 <= images_per_combination <= MAX_IMAGES_PER_COMBINATION:
    raise InputError(
      f"--images_per_combination must lie in [1, {MAX_IMAGES_PER_COMBINATION}] (every change "
      f"sends each category's share at every rank to the page), got {images_per_combination}"
    )
