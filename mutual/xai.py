"""XAI metrics of concept-based multimodal explanations (Sammani & Deligiannis 2024, App. E).

An explanation of one image is a list of L multimodal concepts: a visual region (bool mask) and a
textual concept (a descriptor). The metrics perturb the image concept by concept:

- Deletion (lower is better): start from the image and blur the concepts' regions one more at a
  time, most important first; Insertion (higher is better): start from a heavily blurred image
  and restore the regions one more at a time. After each of the L steps the zero-shot score of
  the class predicted on the original image is recorded, giving a curve of L + 1 points (step 0:
  before any change); the metric is the area under it.
- AccDrop (lower is better) / AccIncrease (higher is better): the same two perturbations, but
  the curve is the dataset's accuracy (the perturbed image's zero-shot prediction against the
  ground-truth label) at each step (Chefer et al.'s positive perturbation test).

Choices where App. E leaves room (all configurable where it matters):
- Regions are blurred, never zeroed (App. E), with one heavy Gaussian blur for both metrics
  (`blur_kernel`: sigma 16 px at 224 px, scaled with the image size; the paper gives no value).
- Concept importance (App. E): cos(image, visual concept) x cos(image, textual concept), the
  visual concept embedded by its three visual prompts (mutual.visual_prompts), as in the analysis.
- The class score is 2.5 x cosine(image embedding, class embedding), the scaling App. E's
  Fig. 7 takes from CLIPScore (without CLIPScore's clamp at zero).
- AUC: trapezoid rule with unit spacing over the L steps, so a curve of L + 1 points at a
  constant s has area L s (Table 1's values, about 3 for L = 5, have that scale). An image with
  fewer than L concepts keeps its last perturbed image for the remaining steps.
- Insertion never restores the pixels outside every concept: its last step is the blurred image
  with all L concept regions restored (L steps, as App. E counts them).

Everything is batched over the B images of a class and jit-compiled; the model enters only
through a `score_fn` (images float [N, H, W, 3] in [0, 1] -> class scores [N, C]), so the
metrics can be checked with a stub scorer whose answers are known.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mutual import visual_prompts
from stori_jax.clip import encoding

#: CLIPScore's weight (Hessel et al. 2021), which App. E's Fig. 7 applies to the class score.
SCORE_SCALE = 2.5
METRICS = ("deletion", "insertion", "acc_drop", "acc_increase")
#: Direction of each metric: +1 higher is better, -1 lower is better.
BETTER = {"deletion": -1, "insertion": 1, "acc_drop": -1, "acc_increase": 1}

ScoreFn = Callable[[jax.Array], np.ndarray]


# ---------------------------------------------------------------------------------------------
# Blur and perturbation steps.


def blur_kernel(image_size: int, sigma_at_224: float = 16.0) -> tuple[int, float]:
  """(odd kernel size, sigma) of the heavy blur for square images of side `image_size`: sigma
  scales with the side; the kernel spans +-3 sigma and stays smaller than the image (the
  mirrored padding of `visual_prompts.gaussian_blur` needs that)."""
  if image_size < 3:
    raise ValueError(f"images must be at least 3 pixels wide, got {image_size}.")
  sigma = max(float(sigma_at_224) * image_size / 224.0, 1e-3)
  half = min(int(math.ceil(3 * sigma)), (image_size - 1) // 2)
  return 2 * half + 1, sigma


@functools.partial(jax.jit, static_argnames=("size", "sigma"))
def blur_images(images: jax.Array, size: int, sigma: float) -> jax.Array:
  """Gaussian blur of float [B, H, W, 3] (mutual.visual_prompts.gaussian_blur, vmapped)."""
  return jax.vmap(lambda x: visual_prompts.gaussian_blur(x, size, sigma))(images)


@jax.jit  # one program, rather than one per op: it runs once per batch
def cumulative_masks(concept_masks: jax.Array, valid: jax.Array) -> jax.Array:
  """The regions perturbed after each step.

  Args:
    concept_masks: bool [B, L, H, W], concept regions in importance order (they may overlap).
    valid: bool [B, L]; invalid concepts are skipped (their steps change nothing).

  Returns:
    bool [B, L + 1, H, W]: step t holds the union of the first t valid regions (step 0: none).
  """
  masks = jnp.asarray(concept_masks, bool) & jnp.asarray(valid, bool)[..., None, None]
  union = jnp.cumsum(masks.astype(jnp.int32), axis=1) > 0
  return jnp.concatenate([jnp.zeros_like(union[:, :1]), union], axis=1)


@functools.partial(jax.jit, static_argnames=("mode",))
def perturbed_images(
  images: jax.Array, blurred: jax.Array, steps: jax.Array, mode: str
) -> jax.Array:
  """The L + 1 images of each curve.

  Args:
    images, blurred: float [B, H, W, 3]; steps: bool [B, T, H, W] (`cumulative_masks`).
    mode: "deletion" (steps' regions blurred) or "insertion" (blurred image, steps' regions
      restored).

  Returns:
    float [B, T, H, W, 3].
  """
  m = steps[..., None]
  if mode == "deletion":
    return jnp.where(m, blurred[:, None], images[:, None])
  if mode == "insertion":
    return jnp.where(m, images[:, None], blurred[:, None])
  raise ValueError(f"mode must be 'deletion' or 'insertion', got {mode!r}.")


# ---------------------------------------------------------------------------------------------
# Scores and curves.


def clip_scorer(
  bundle, class_embeddings, scale: float = SCORE_SCALE, batch_size: int = 256
) -> ScoreFn:
  """A score_fn for a CLIP bundle: images float [N, S, S, 3] in [0, 1] -> float32 [N, C],
  scale x cosine(image embedding, unit class embeddings [C, E]). Chunks of `batch_size` are
  padded to a fixed shape so that the tower compiles once."""
  classes = encoding.l2_normalize_jax(jnp.asarray(class_embeddings, jnp.float32))

  def score(images) -> np.ndarray:
    if not len(images):
      return np.zeros((0, classes.shape[0]), np.float32)
    embedded = encoding.encode_images_on_device(bundle, images, batch_size)
    return np.asarray(scale * embedded @ classes.T)

  return score


@dataclasses.dataclass(frozen=True)
class Curves:
  """Per-image perturbation curves of one explanation (T = L + 1 steps).

  Attributes:
    deletion, insertion: float32 [B, T], the original prediction's class score per step.
    deletion_correct, insertion_correct: bool [B, T], prediction == label per step.
  """

  deletion: np.ndarray
  insertion: np.ndarray
  deletion_correct: np.ndarray
  insertion_correct: np.ndarray

  @staticmethod
  def concatenate(parts: Sequence["Curves"]) -> "Curves":
    if not parts:
      raise ValueError("no curves to concatenate")
    fields = [f.name for f in dataclasses.fields(Curves)]
    return Curves(**{f: np.concatenate([getattr(p, f) for p in parts]) for f in fields})


def perturbation_curves(
  score_fn: ScoreFn,
  images,
  concept_masks,
  valid,
  predicted,
  labels,
  *,
  blur_size: int,
  blur_sigma: float,
) -> Curves:
  """Deletion and insertion curves of B images' explanations.

  Args:
    score_fn: images float [N, H, W, 3] in [0, 1] -> class scores [N, C].
    images: uint8 [B, H, W, 3] or float in [0, 1].
    concept_masks: bool [B, L, H, W], regions in importance order (most important first).
    valid: bool [B, L].
    predicted: int [B], the class whose score is tracked (the prediction on the original image).
    labels: int [B], ground truth (for AccDrop / AccIncrease).
    blur_size, blur_sigma: the heavy blur (`blur_kernel`).

  Returns:
    Curves with T = L + 1 steps.
  """
  images = np.asarray(images)
  if images.ndim != 4 or images.shape[-1] != 3:
    raise ValueError(f"images must be [B, H, W, 3], got {images.shape}.")
  x = jnp.asarray(images, jnp.float32) / (255.0 if images.dtype == np.uint8 else 1.0)
  concept_masks = jnp.asarray(concept_masks, bool)
  if concept_masks.ndim != 4 or concept_masks.shape[2:] != images.shape[1:3]:
    raise ValueError(
      f"concept_masks must be bool [B, L, H, W] at the images' size {images.shape[1:3]}, "
      f"got {concept_masks.shape}."
    )
  batch = images.shape[0]
  predicted = np.asarray(predicted, np.int64)
  labels = np.asarray(labels, np.int64)
  steps = cumulative_masks(concept_masks, valid)
  blurred = blur_images(x, blur_size, blur_sigma)
  out = {}
  for mode in ("deletion", "insertion"):
    stack = perturbed_images(x, blurred, steps, mode)
    t = stack.shape[1]
    scores = np.asarray(score_fn(stack.reshape(batch * t, *stack.shape[2:]))).reshape(batch, t, -1)
    out[mode] = np.take_along_axis(scores, predicted[:, None, None], axis=2)[..., 0]
    out[mode + "_correct"] = np.argmax(scores, axis=-1) == labels[:, None]
  return Curves(**{k: np.asarray(v) for k, v in out.items()})


def curve_auc(curve) -> np.ndarray:
  """Trapezoid area under curves float [..., T] with unit spacing: float64 [...]."""
  c = np.asarray(curve, np.float64)
  return 0.5 * (c[..., 1:] + c[..., :-1]).sum(axis=-1)


def summarize(curves: Curves) -> dict:
  """Table 1's four numbers and the dataset's mean curves.

  Deletion / Insertion: the mean over images of each image's AUC; AccDrop / AccIncrease: the AUC
  of the accuracy curve (the mean over images of prediction == label at each step).
  """
  mean = {
    "deletion": curves.deletion.mean(axis=0),
    "insertion": curves.insertion.mean(axis=0),
    "acc_drop": curves.deletion_correct.mean(axis=0),
    "acc_increase": curves.insertion_correct.mean(axis=0),
  }
  return dict(
    images=int(curves.deletion.shape[0]),
    deletion=float(curve_auc(curves.deletion).mean()),
    insertion=float(curve_auc(curves.insertion).mean()),
    acc_drop=float(curve_auc(mean["acc_drop"])),
    acc_increase=float(curve_auc(mean["acc_increase"])),
    curves={k: [float(v) for v in c] for k, c in mean.items()},
  )


# ---------------------------------------------------------------------------------------------
# Concept importance (App. E) and orderings.


def region_embeddings(
  bundle,
  images,
  masks,
  *,
  thickness: float = 1.0,
  blur_size: int = 11,
  largest_region: bool = True,
  batch_size: int = 256,
  ellipse: str = "moments",
) -> np.ndarray:
  """Visual-prompt embeddings of possibly overlapping regions, as the analysis embeds concepts.

  Each region is prompted on its own (`visual_prompts.render_prompts` with one concept), so
  regions may overlap; for disjoint regions this equals `visual_prompts.concept_embeddings`.

  Args:
    bundle: a CLIPBundle; images: uint8 [B, S, S, 3].
    masks: bool [B, L, h, w] at S or at a resolution that upsamples to S.
    ellipse: "moments" or "reference" (visual_prompts.render_prompts; "reference" draws on the
      reference's uint8 image, the bundle's normalisation round trip); the analysis's stage
      (paper_config.analysis_stages(config.analysis)["ellipse"]).

  Returns:
    float32 [B, L, E]: the mean of the three prompts' unit embeddings; zeros for empty regions.
  """
  images = np.asarray(images)
  masks = np.asarray(masks, bool)
  batch, n = masks.shape[:2]
  pixels = jnp.asarray(images, jnp.float32) / 255.0
  maps = jnp.where(jnp.asarray(masks), 0, -1).reshape(batch * n, *masks.shape[2:])
  repeated = jnp.repeat(pixels, n, axis=0)
  trip = None
  if ellipse == "reference":
    trip = (bundle.preprocess_config.mean, bundle.preprocess_config.std)
  prompted, ok = visual_prompts.render_prompts(
    repeated, maps, 1, thickness, blur_size, largest_region, ellipse=ellipse, round_trip=trip
  )
  flat = prompted.reshape(-1, *prompted.shape[3:])  # [B L 3, S, S, 3]
  embedded = encoding.encode_images_on_device(bundle, flat, batch_size)
  embedded = embedded.reshape(batch, n, len(visual_prompts.VARIANTS), -1).mean(axis=2)
  return np.asarray(jnp.where(ok.reshape(batch, n)[..., None], embedded, 0.0))


@jax.jit
def importance(
  image_embeddings: jax.Array,
  concept_embeddings: jax.Array,
  descriptor_embeddings: jax.Array,
  valid: jax.Array,
) -> tuple[jax.Array, jax.Array]:
  """App. E's ranking of multimodal concepts.

  Args:
    image_embeddings: float [B, E]; concept_embeddings: float [B, L, E] (visual concepts);
    descriptor_embeddings: float [B, L, E], each concept's textual concept; valid: bool [B, L].

  Returns:
    (order int32 [B, L]: concept indices, most important first, invalid ones last (ties keep
     index order); scores float32 [B, L]: cos(image, visual) x cos(image, textual), -inf where
     invalid.)
  """

  unit = encoding.l2_normalize_jax
  image = unit(image_embeddings)[:, None]
  score = jnp.sum(image * unit(concept_embeddings), -1) * jnp.sum(
    image * unit(descriptor_embeddings), -1
  )
  score = jnp.where(valid, score, -jnp.inf)
  order = jnp.argsort(-score, axis=1, stable=True).astype(jnp.int32)
  return order, score


def random_order(key: jax.Array, valid: jax.Array) -> jax.Array:
  """A uniformly random order of each image's valid concepts, invalid ones last: int32 [B, L]."""
  noise = jax.random.uniform(key, valid.shape)
  return jnp.argsort(jnp.where(valid, noise, 2.0), axis=1).astype(jnp.int32)


def reorder(order: jax.Array, *arrays: jax.Array) -> tuple[jax.Array, ...]:
  """Takes arrays [B, L, ...] in the order int [B, L]."""
  order = jnp.asarray(order)
  out = []
  for a in arrays:
    a = jnp.asarray(a)
    idx = order.reshape(order.shape + (1,) * (a.ndim - 2))
    out.append(jnp.take_along_axis(a, idx, axis=1))
  return tuple(out)


def label_masks(pixel_maps, n_concepts: int) -> jax.Array:
  """Concept maps int [B, H, W] (-1: none) -> bool [B, L, H, W], one mask per concept id."""
  maps = jnp.asarray(pixel_maps)
  return maps[:, None] == jnp.arange(n_concepts)[None, :, None, None]


def table_rows(summaries: Mapping[str, Mapping], training: Mapping[str, bool]) -> str:
  """Table 1 in markdown: one row per explanation."""
  head = "| Explanation | Requires Training | Delet.↓ | Insert.↑ | AccDrop↓ | AccInc↑ |"
  lines = [head, "|---|---|---|---|---|---|"]
  for name, s in summaries.items():
    cells = [f"{s[m]:.3f}" for m in METRICS]
    lines.append(
      f"| {name} | {'Yes' if training.get(name) else 'No'} | " + " | ".join(cells) + " |"
    )
  return "\n".join(lines) + "\n"
