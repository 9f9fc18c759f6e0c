"""CLIPBundle: a Flax CLIP, its params, tokenizer and preprocessing, ready to encode."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from stori_jax.plumbing.config_files import ConfigError
from stori_jax.plumbing.errors import InputError
from stori_jax.models import CLIP, CLIPConfig, default_start_block, reweighted_block_indices
from stori_jax.models.attention import matmul_precision
from stori_jax.data.preprocess import ImageLike, PreprocessConfig, preprocess
from stori_jax.tokenizer import Tokenizer, default_tokenizer, tokenize_weighted


def tower_functions(model: CLIP) -> tuple[Any, Any]:
  """The jitted pure encoders of a Flax CLIP, closing over the module only (never parameters):
  text (params, ids, log_weights, reweight_blocks, return_hidden; the last two static) and
  image (params, normalised images, return_hidden static), as CLIP.encode_text / encode_image."""

  def text(params, ids, log_weights, reweight_blocks, return_hidden):
    return model.apply(
      {"params": params},
      ids,
      log_weights,
      reweight_blocks,
      return_hidden,
      method=CLIP.encode_text,
    )

  def image(params, images, return_hidden):
    return model.apply({"params": params}, images, return_hidden, method=CLIP.encode_image)

  return jax.jit(text, static_argnums=(3, 4)), jax.jit(image, static_argnums=2)


@dataclasses.dataclass(frozen=True, eq=False)
class CLIPBundle:
  """Everything needed to encode text and images with one CLIP checkpoint.

  Features are unnormalised and projected, as OpenAI's encode_text and
  encode_image return them; they are float32 whatever the compute dtype.
  preprocess_config defaults to OpenAI's mean and std at the model's image size.
  """

  config: CLIPConfig
  params: Any
  dtype: Any = jnp.float32
  preprocess_config: PreprocessConfig | None = None
  source: str = ""

  def __post_init__(self):
    # A fixed 224 px default would not fit smaller models (bundle.preprocess -> wrong size).
    if self.preprocess_config is None:
      object.__setattr__(self, "preprocess_config", PreprocessConfig(self.config.vision.image_size))

  @functools.cached_property
  def model(self) -> CLIP:
    return CLIP(self.config, dtype=self.dtype)

  @property
  def logit_scale(self) -> float:
    return float(np.exp(self.params["logit_scale"]))

  # Tokenizer ------------------------------------------------------------------

  @property
  def tokenizer(self) -> Tokenizer:
    return default_tokenizer()

  def tokenize(self, texts: str | Sequence, with_weights: bool = False):
    """Texts -> ids int32 [B, context]; with_weights also float32 weights [B, context].

    With with_weights, texts may use the `(words:1.5)` syntax or be lists of
    (text, weight) segments.
    """
    context = self.config.text.context_length
    if with_weights:
      return tokenize_weighted(self.tokenizer, texts, context_length=context)
    return self.tokenizer(texts, context_length=context)

  # Text -------------------------------------------------------------------------

  @functools.cached_property
  def _towers(self):
    return tower_functions(self.model)

  @functools.cached_property
  def _text_fn(self):
    return self._towers[0]

  def check_tokens(self, ids) -> np.ndarray:
    """Validates token ids int [B, L]: L <= context and an end-of-text token in every row."""
    ids = np.asarray(ids)
    if ids.ndim == 1:
      ids = ids[None]
    context, eot = self.config.text.context_length, self.config.text.eot_token_id
    if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
      raise InputError(
        f"Token ids must be an integer array [batch, length], got {ids.dtype} {ids.shape}."
      )
    if ids.shape[0] == 0:
      raise InputError(f"No texts to encode: the token ids have shape {ids.shape}.")
    if ids.shape[1] > context:
      raise InputError(
        f"Token sequences of length {ids.shape[1]} exceed the model's context length "
        f"{context}; tokenize with context_length={context} (bundle.tokenize does)."
      )
    if ids.size and (ids.min() < 0 or ids.max() >= self.config.text.vocab_size):
      raise InputError(
        f"Token ids must lie in [0, {self.config.text.vocab_size}), got [{ids.min()}, {ids.max()}]."
      )
    no_eot = np.flatnonzero(~(ids == eot).any(axis=1))
    if no_eot.size:
      raise InputError(
        f"Rows {no_eot[:10].tolist()} have no end-of-text token ({eot}); the text "
        "features are read at that position."
      )
    return ids.astype(np.int32)

  def check_weights(self, weights, ids: np.ndarray) -> np.ndarray | None:
    """Validates token weights: float32 [B, L] like ids, finite, >= 0."""
    if weights is None:
      return None
    weights = np.asarray(weights, np.float32)
    if weights.ndim == 1:
      weights = weights[None]
    if weights.shape != ids.shape:
      raise InputError(f"weights {weights.shape} must have the shape of the token ids {ids.shape}.")
    if not np.all(np.isfinite(weights)) or (weights < 0).any():
      raise InputError("Token weights must be finite and >= 0 (0 excludes a token).")
    return weights

  def _text_inputs(self, tokens, weights, start_block, stop_block):
    ids = self.check_tokens(tokens)
    weights = self.check_weights(weights, ids)
    with np.errstate(divide="ignore"):  # log 0 = -inf excludes the token.
      log_weights = None if weights is None else np.log(weights)
    blocks = (
      reweighted_block_indices(self.config.text, start_block, stop_block)
      if log_weights is not None
      else ()
    )
    return ids, log_weights, blocks

  @functools.cached_property
  def _prompt_weighting_fn(self):
    def encode(params, ids, weights, block):
      return self.model.apply(
        {"params": params}, ids, weights, block, method=CLIP.encode_text_prompt_weighting
      )

    return jax.jit(encode, static_argnums=3)

  def encode_text(
    self,
    tokens,
    weights=None,
    start_block: int | None = None,
    stop_block: int | None = None,
    method: str = "stori",
  ) -> jax.Array:
    """tokens int [B, L<=context] (+ weights float [B, L] >= 0) -> float32 [B, embed_dim].

    method="stori": weights rescale the attention paid to each token in blocks
    start_block..stop_block (1-indexed, inclusive; start_block None: the model's default,
    `default_start_block`; stop_block None: the last block).
    method="prompt_weighting": the paper's App. C.1 baseline, applied once at
    the input of start_block (see TextTransformer.prompt_weighting).
    weights=None is plain CLIP either way.
    """
    if method == "prompt_weighting":
      if stop_block is not None:
        raise ValueError(
          "prompt_weighting acts at one block (start_block); stop_block does not apply."
        )
      ids = self.check_tokens(tokens)
      weights = self.check_weights(weights, ids)
      if weights is None:
        return self._text_fn(self.params, ids, None, (), False)
      block = reweighted_block_indices(self.config.text, start_block)[0]
      return self._prompt_weighting_fn(self.params, ids, weights, block)
    if method != "stori":
      raise ValueError(f"method must be 'stori' or 'prompt_weighting', got {method!r}.")
    return self._text_fn(
      self.params, *self._text_inputs(tokens, weights, start_block, stop_block), False
    )

  def text_hidden_states(self, tokens, weights=None, start_block=None, stop_block=None):
    """(features [B, E], list of layers + 1 hidden states [B, L, W]) for analysis."""
    return self._text_fn(
      self.params, *self._text_inputs(tokens, weights, start_block, stop_block), True
    )

  def encode_prompts(
    self,
    prompts: str | Sequence,
    start_block: int | None = None,
    stop_block: int | None = None,
    method: str = "stori",
  ) -> jax.Array:
    """Weighted prompts such as "a (red:1.5) circle" -> float32 [B, embed_dim]."""
    ids, weights = self.tokenize(prompts, with_weights=True)
    return self.encode_text(ids, weights, start_block, stop_block, method)

  # Images -----------------------------------------------------------------------

  @functools.cached_property
  def _image_fn(self):
    return self._towers[1]

  @property
  def image_function(self):
    """The image tower as a jitted pure function (params, normalised float32 images
    [B, S, S, 3], return_hidden: bool static) -> encode_image's output; for callers that run
    the tower inside their own jitted code (it is hashable, so it can be a static argument)."""
    return self._image_fn

  def check_images(self, images) -> jax.Array:
    """Validates normalised images float [B, S, S, 3] (or one [S, S, 3]) -> float32 [B, S, S, 3].

    Raises:
      InputError: no images (B = 0), a zero-sized or wrong shape, or integer pixels; the
        message gives the shape received and the one expected.
    """
    size = self.config.vision.image_size
    shape = tuple(np.shape(images))
    expected = f"[batch, {size}, {size}, 3] (NHWC, normalised)"
    if len(shape) == 4 and shape[0] == 0:
      raise InputError(
        f"No images to encode: got an empty batch of shape {shape}; this model takes "
        f"{expected} with batch >= 1."
      )
    if 0 in shape:
      raise InputError(
        f"Zero-sized images of shape {shape}: this model takes {expected}. "
        f"bundle.preprocess(image) gives {size}x{size} inputs."
      )
    images = jnp.asarray(images)
    if images.ndim == 3:
      images = images[None]
    if images.ndim != 4 or images.shape[1:] != (size, size, 3):
      pre = self.preprocess_config.image_size
      hint = (
        f"bundle.preprocess(image) gives {size}x{size} inputs."
        if pre == size
        else f"This bundle's preprocess_config has image_size {pre}, not the model's {size}: "
        f"build the bundle with PreprocessConfig({size}) (or fix image_size in the "
        "checkpoint's stori_config.json)."
      )
      raise InputError(
        f"This model takes images of shape [batch, {size}, {size}, 3] (NHWC, normalised); "
        f"got {tuple(images.shape)}. {hint}"
      )
    if not jnp.issubdtype(images.dtype, jnp.floating):
      raise InputError(
        f"Images must be normalised floats, got {images.dtype}; run "
        "bundle.preprocess on uint8 images first."
      )
    return images.astype(jnp.float32)

  def encode_image(self, images) -> jax.Array:
    """Normalised images float32 NHWC [B, S, S, 3] -> float32 [B, embed_dim]."""
    return self._image_fn(self.params, self.check_images(images), False)

  def image_details(self, images):
    """(features float32 [B, E], details): details hold hidden_states and feature_map
    [B, h, w, C] for every tower, patch_tokens and keys for ViT, keys for ResNet; see
    CLIP.encode_image."""
    return self._image_fn(self.params, self.check_images(images), True)

  def preprocess(self, images: ImageLike | Sequence[ImageLike]) -> np.ndarray:
    """Path / PIL / uint8 array (or a list) -> float32 [S, S, 3] (or [B, S, S, 3])."""
    return preprocess(images, self.preprocess_config)

  # Both ---------------------------------------------------------------------------

  def logits(self, image_features, text_features) -> jax.Array:
    """exp(logit_scale) * cosine similarity: float32 [B_images, B_texts]."""
    image = image_features / jnp.linalg.norm(image_features, axis=-1, keepdims=True)
    text = text_features / jnp.linalg.norm(text_features, axis=-1, keepdims=True)
    # (scale * image) @ text^T, as `scale * image @ text.T` groups; fp32 features, the compute
    # dtype's precision.
    return jnp.matmul(self.logit_scale * image, text.T, precision=matmul_precision(self.dtype))

  def with_dtype(self, dtype) -> "CLIPBundle":
    """The same weights computing in another dtype (params stay float32). The bundle itself
    for its own dtype; one bundle per dtype is kept, so repeated calls (a class at a time, say)
    reuse its compiled towers instead of compiling them again."""
    if jnp.dtype(dtype) == jnp.dtype(self.dtype):
      return self
    # A frozen dataclass: the cache lives in __dict__, as cached_property's values do.
    variants = self.__dict__.setdefault("_dtype_variants", {})
    key = jnp.dtype(dtype).name
    if key not in variants:
      variants[key] = dataclasses.replace(self, dtype=dtype)
    return variants[key]


#: What a start block of None means, for every flag's help and config comment that takes one.
START_BLOCK_NONE = (
  "None: the model's default start block (its stored text.default_start_block, else "
  "layers // 2 + 1, the paper's relative depth)"
)


def resolve_start_block(bundle: CLIPBundle, start_block: int | None, name: str) -> int:
  """The first reweighted text block (1-indexed) a run asks for, checked against the loaded
  model; None gives the model's default (`default_start_block`: its stored
  text.default_start_block, else layers // 2 + 1).

  The one check of a start block against the text tower: every command reports a block
  outside it in this one sentence, which differs only in `name`, how the user wrote the value
  ("config.start_block", "--start_block").

  Raises:
    ConfigError: start_block outside 1..layers.
  """
  text = bundle.config.text
  default = default_start_block(text)
  if start_block is None:
    return default
  if not 1 <= start_block <= text.layers:
    raise ConfigError(
      f"{name} = {start_block} is outside the text tower of {bundle.source or 'the model'} "
      f"(blocks 1..{text.layers}, 1-indexed): pick a block in 1..{text.layers}; this model's "
      f"default start block, which None gives, is {default}."
    )
  return int(start_block)
