"""The mutual-knowledge analysis of one class's B images, batched end to end.

  1. zero-shot prediction with the class embeddings (`encode_bank`; `encode_config_bank` for a
     run's config and dataset);
  2. vision side (mutual.features / foreground / crf / concepts / visual_prompts): patch features,
     prominent patches, CRF refinement, visual concepts (PCA and / or K-means, fitted jointly over
     the B images), one embedding per concept from its visual prompts;
  3. language stages (`language_stages`, one jit-compiled function vmapped over the images):
     descriptor scores, top-k intersection and relevance filter, optimal transport, top descriptors
     per concept, importance order, the predicted class's top-u descriptors, the MI curve and the
     OT entropy diagnostic.
`analyze_class` (`vision_side`, then the language stages) returns numpy arrays per image;
`mutual.report` turns them into JSON and figures.

Device calls (compiled-program executions) per class are few and the host waits late: the glue
between stages runs as a few fused programs (the tower's outputs normalised and converted in one,
every method's pixel maps in one, the language stages of both methods' images in one call), and
nothing is read back to the host before the visual prompts need their region counts.
`benchmarks/mutual_throughput.py` counts them (`device_calls_per_class`: 31 for the tiny model's
class of 16 images, down from 39; the results are the same bit for bit).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mutual import concept_methods, crf, descriptors, features, foreground, information
from mutual import paper_config, transport, visual_prompts
from mutual.ellipse import pixels as ellipse_pixels
from stori_jax.data import synthetic_tasks
from stori_jax.clip.encoding import encode_texts, l2_normalize, l2_normalize_jax
from stori_jax.data.preprocess import normalize

#: The concept methods run by default: the paper's (config.analysis.methods' default; any
#: registered mutual.concept_methods entry may be named).
METHODS = paper_config.ANALYSIS_DEFAULTS["methods"]


@dataclasses.dataclass(frozen=True)
class TextBank:
  """The descriptors and classes, encoded once per model.

  Attributes:
    descriptors: the D unique descriptors (index = descriptor id).
    descriptor_embeddings: float32 [D, E], unit rows (each descriptor encoded in the bank
      template, App. L's "a photo showing {d}" by default: `bank_prompts`).
    class_names: C names; class_embeddings: float32 [C, E], unit rows.
  """

  descriptors: tuple[str, ...]
  descriptor_embeddings: np.ndarray
  class_names: tuple[str, ...]
  class_embeddings: np.ndarray


def class_prompts(
  name: str,
  class_descriptors: Sequence[str],
  mode: str = "descriptors",
  templates: Sequence[str] = ("a photo of a {c}.",),
  descriptor_template: str = "{c}, which has {d}.",
) -> list[str]:
  """The prompts averaged into a class's embedding.

  mode "descriptors": Menon & Vondrick's descriptor-based class embedding, one prompt per class
  descriptor; "templates": the zero-shot template ensemble (paper Table 8).
  """
  if mode == "descriptors":
    if not class_descriptors:
      raise ValueError(f"class {name!r} has no descriptors for a descriptor-based embedding.")
    return [descriptor_template.format(c=name, d=d) for d in class_descriptors]
  if mode == "templates":
    return [t.format(c=name) for t in templates]
  raise ValueError(f"class prompt mode must be 'descriptors' or 'templates', got {mode!r}.")


def bank_prompts(bank: Sequence[str], bank_template: str = paper_config.BANK_TEMPLATE) -> list[str]:
  """The prompts the descriptor bank's rows encode: `bank_template` filled with each descriptor
  (App. L: "a photo showing [DES]"; "{d}": the descriptors as they are)."""
  return [bank_template.format(d=d) for d in bank]


def encode_bank(
  bundle,
  class_names: Sequence[str],
  per_class_descriptors: Sequence[Sequence[str]],
  bank: Sequence[str],
  *,
  mode: str = "descriptors",
  templates: Sequence[str] = ("a photo of a {c}.",),
  descriptor_template: str = "{c}, which has {d}.",
  bank_template: str = paper_config.BANK_TEMPLATE,
  batch_size: int = 256,
  progress: bool = True,
) -> TextBank:
  """Encodes the descriptor bank (each descriptor in `bank_template`, `bank_prompts`; the rows
  keep the descriptors' order) and the class embeddings (mean of unit prompt embeddings,
  re-normalised)."""
  if len(class_names) != len(per_class_descriptors):
    raise ValueError("one descriptor list per class is needed")
  desc = "encode descriptors" if progress else None
  bank_embeddings = encode_texts(
    bundle, bank_prompts(bank, bank_template), batch_size=batch_size, desc=desc
  )
  prompts = [
    class_prompts(n, d, mode, templates, descriptor_template)
    for n, d in zip(class_names, per_class_descriptors)
  ]
  flat = [p for group in prompts for p in group]
  encoded = encode_texts(
    bundle, flat, batch_size=batch_size, desc="encode classes" if progress else None
  )
  bounds = np.cumsum([0] + [len(g) for g in prompts])
  classes = np.stack([encoded[a:b].mean(axis=0) for a, b in zip(bounds[:-1], bounds[1:])])
  return TextBank(tuple(bank), bank_embeddings, tuple(class_names), l2_normalize(classes))


def bank_descriptors(config, per_class: Mapping[str, Sequence[str]]) -> list[str]:
  """The descriptor bank D of a config: the synthetic vocabulary, or the unique descriptors of
  the classes (`per_class`: {class name: descriptors})."""
  if config.data.source == "synthetic" and config.data.get("bank", "classes") == "vocabulary":
    return list(synthetic_tasks.DESCRIPTOR_ATTRIBUTES)
  return descriptors.unique_descriptors(per_class)


def encode_config_bank(bundle, config, dataset, progress: bool = True) -> TextBank:
  """`encode_bank` for a run's config (config.analysis's class prompts and bank template,
  config.batch_size) on a mutual.data.Dataset: its classes in label order and the config's
  descriptor bank."""
  a = config.analysis
  return encode_bank(
    bundle,
    list(dataset.names),
    dataset.lists(),
    bank_descriptors(config, dataset.descriptors),
    mode=a.class_prompts,
    templates=tuple(a.templates),
    descriptor_template=a.descriptor_template,
    bank_template=paper_config.check_bank_template(a),
    batch_size=config.batch_size,
    progress=progress,
  )


@functools.partial(
  jax.jit,
  static_argnames=(
    "top_k",
    "rule",
    "solver",
    "top",
    "u",
    "formula",
    "iterations",
    "max_iterations",
  ),
)
def language_stages(
  concept_embeddings: jax.Array,
  concept_valid: jax.Array,
  image_embeddings: jax.Array,
  descriptor_embeddings: jax.Array,
  class_embeddings: jax.Array,
  predicted: jax.Array,
  *,
  top_k: int = 500,
  rule: str = "mean",
  offset: float = 0.02,
  solver: str = "ott",
  scale: float = 2.5,
  epsilon: float = 1.0,
  iterations: int = 1000,
  threshold: float = 1e-6,
  max_iterations: int = 2000,
  top: int = 3,
  u: int = 50,
  formula: str = "reference",
) -> dict[str, jax.Array]:
  """Descriptor scoring to MI curves for B images (shapes: B images, L concepts, D descriptors).

  Args:
    concept_embeddings: float32 [B, L, E]; concept_valid: bool [B, L].
    image_embeddings: float32 [B, E] unit whole-image embeddings.
    descriptor_embeddings: float32 [D, E]; class_embeddings: float32 [C, E]; predicted: int [B].
    The rest: see mutual.descriptors, mutual.transport and mutual.information.

  Returns:
    dict of arrays: candidates bool [B, D]; concept_ids int32 [B, L, top] / concept_ids_valid;
    visual_ids int32 [B, L*top] (importance order) / visual_valid / visual_scores; language_ids
    int32 [B, u']; curve float32 [B, L*top + 1]; n_visual int32 [B]; entropy and
    entropy_without_ot float32 [B] (App. A.2), concept_ids_without_ot /
    concept_ids_without_ot_valid (each concept's descriptors without OT: App. A.2's Fig. 2).
  """
  concept_scores = descriptors.cosine_scores(concept_embeddings, descriptor_embeddings)
  image_scores = descriptors.cosine_scores(image_embeddings, descriptor_embeddings)
  candidates = descriptors.select_candidates(
    concept_scores, concept_valid, image_scores, k=top_k, rule=rule, offset=offset
  )
  ot = dict(
    solver=solver,
    top=top,
    scale=scale,
    epsilon=epsilon,
    iterations=iterations,
    threshold=threshold,
    max_iterations=max_iterations,
  )
  ids, ids_valid = transport.concept_descriptors(concept_scores, concept_valid, candidates, **ot)
  raw_ids, raw_valid = transport.concept_descriptors(
    concept_scores, concept_valid, candidates, use_ot=False, **ot
  )
  visual_ids, visual_valid, visual_scores = jax.vmap(information.importance_order)(
    ids, ids_valid, image_scores
  )
  language_ids, language_scores = descriptors.language_concepts(
    class_embeddings, descriptor_embeddings, predicted, u
  )
  curve = information.mi_curves(visual_ids, visual_valid, language_ids, formula=formula)
  return dict(
    candidates=candidates,
    concept_ids=ids,
    concept_ids_valid=ids_valid,
    concept_ids_without_ot=raw_ids,
    concept_ids_without_ot_valid=raw_valid,
    visual_ids=visual_ids,
    visual_valid=visual_valid,
    visual_scores=visual_scores,
    language_ids=language_ids,
    language_scores=language_scores,
    curve=curve,
    n_visual=jnp.sum(visual_valid, axis=1).astype(jnp.int32),
    entropy=jax.vmap(transport.choice_entropy)(ids, ids_valid),
    entropy_without_ot=jax.vmap(transport.choice_entropy)(raw_ids, raw_valid),
  )


def stage_options(analysis) -> dict[str, Any]:
  """config.analysis -> the keyword arguments of `language_stages`."""
  return dict(
    top_k=int(analysis.top_k),
    rule=analysis.relevance,
    offset=float(analysis.relevance_offset),
    solver=analysis.solver,
    scale=float(analysis.ot_scale),
    epsilon=float(analysis.ot_epsilon),
    iterations=int(analysis.ot_iterations),
    threshold=float(analysis.ot_threshold),
    max_iterations=int(analysis.ot_max_iterations),
    top=int(analysis.top_descriptors),
    u=int(analysis.u),
    formula=analysis.mi_formula,
  )


def concept_maps(features_, mask, method: str, n_concepts: int, settings) -> jax.Array:
  """int32 [B, h, w] visual concepts of the foreground patches (-1: background): the fit of the
  concept method named `method` (mutual.concept_methods), with `settings`
  (paper_config.concept_settings of config.analysis)."""
  return concept_methods.get(method).fit(features_, mask, n_concepts, settings)


@jax.jit  # one program, not the ~11 of its eager index arithmetic
def pixel_concepts(maps: jax.Array, pixel_mask: jax.Array) -> jax.Array:
  """Patch concept maps [B, h, w] -> pixel maps int32 [B, H, W] (nearest), -1 outside the
  refined foreground (the reference blanks concept pixels the CRF calls background)."""
  batch, height, width = pixel_mask.shape
  rows = (jnp.arange(height) * maps.shape[1]) // height
  cols = (jnp.arange(width) * maps.shape[2]) // width
  upsampled = maps[:, rows][:, :, cols]
  return jnp.where(pixel_mask, upsampled, -1)


# The glue between the stages in a few programs: eager jnp ops outside jit compile a program each
# (per op and shape, once: about 100 small programs for a class seen first).


@jax.jit
def _tower_outputs(image_embeddings, patch):
  """The tower's outputs as the stages read them, in one program (the three eager ops of the
  normalisation and the conversion were four device calls): the embeddings L2-normalised in the
  tower's dtype, as `features.embeddings_and_patches` normalises them, then both as float32
  (exact)."""
  return l2_normalize_jax(image_embeddings).astype(jnp.float32), patch.astype(jnp.float32)


@jax.jit
def _scores(image_embeddings, class_embeddings_t):
  """Class scores float32 [B, C] of float32 [B, E] and [E, C] (the classes' rows transposed on
  the host: a product of materialised fp32 operands at full precision, as the eager product
  was, bit for bit; a transpose or convert fused into it changes XLA's kernel and the last
  bits), and the predicted class int32 [B]."""
  class_scores = jnp.matmul(
    image_embeddings, class_embeddings_t, precision=jax.lax.Precision.HIGHEST
  )
  return class_scores, jnp.argmax(class_scores, axis=-1)


_upsample_mask = jax.jit(foreground.upsample_mask, static_argnums=1)


@functools.partial(jax.jit, static_argnums=2)
def _coarse_pixel_maps(fg, maps: tuple, size: int):
  """Without the CRF, in one program: the foreground upsampled to the image (the refined
  foreground then, as no CRF empties it) and every method's pixel concept map on it."""
  coarse = foreground.upsample_mask(fg, size)
  return coarse, tuple(pixel_concepts(m, coarse) for m in maps)


@jax.jit
def _pixel_maps(maps: tuple, refined):
  """Every method's pixel concept map on the refined foreground, in one program."""
  return tuple(pixel_concepts(m, refined) for m in maps)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _reference_uint8(images, mean: tuple, std: tuple):
  """The reference's uint8 round trip of uint8 images (mutual.ellipse.pixels.reference_uint8) as
  one program; crf.refine(round_trip=...) runs it eagerly (some 14 small programs)."""
  return ellipse_pixels.reference_uint8(images, mean, std)


@jax.jit
def _keep_nonempty(refined, coarse):
  """refined bool [B, H, W], or coarse for an image whose refined foreground is empty."""
  return jnp.where(jnp.any(refined, axis=(1, 2), keepdims=True), refined, coarse)


def tower_bundle(bundle, analysis):
  """The bundle computing in config.analysis.compute_dtype (weights stay float32; outputs are
  float32; one bundle per dtype, so its compiled towers are reused)."""
  # A name of paper_config.COMPUTE_DTYPES, checked there.
  return bundle.with_dtype(jnp.dtype(paper_config.analysis_value(analysis, "compute_dtype")))


def vision_tower(bundle, images: np.ndarray, bank: TextBank, analysis) -> dict[str, Any]:
  """The tower's part of `vision_side` on one class: one pass gives the image embeddings and the
  patch features, then the zero-shot scores.

  Args: as analyze_class.

  Returns:
    dict of device arrays: image_embeddings float32 [B, E] (unit rows), patch float32
    [B, h, w, D] (config.analysis.feature_kind), class_scores float32 [B, C], predicted int32
    [B].
  """
  images = np.asarray(images)
  if images.dtype != np.uint8 or images.ndim != 4:
    raise ValueError(f"images must be uint8 [B, S, S, 3], got {images.dtype} {images.shape}")
  bundle = tower_bundle(bundle, analysis)
  # Images per tower pass: a few on a CPU (its tower slows once activations leave the cache).
  tower_batch = int(paper_config.analysis_value(analysis, "tower_batch"))
  per_pass = features.images_per_pass(bundle, tower_batch)
  x = normalize(images, bundle.preprocess_config.mean, bundle.preprocess_config.std)
  # One tower pass gives both (the embeddings and the patch grid); the splits and fits run in
  # float32 whatever the towers' compute dtype. (device_put: the host array goes to the device
  # with no program of its own.)
  image_embeddings, patch = features.embeddings_and_patches(
    bundle, jax.device_put(x), kind=analysis.feature_kind, per_pass=per_pass, normalize=False
  )
  image_embeddings, patch = _tower_outputs(image_embeddings, patch)
  class_scores, predicted = _scores(
    image_embeddings, np.ascontiguousarray(np.asarray(bank.class_embeddings).T)
  )
  return dict(
    image_embeddings=image_embeddings, patch=patch, class_scores=class_scores, predicted=predicted
  )


def _foreground_options(analysis) -> dict[str, bool]:
  return dict(joint=bool(analysis.joint_foreground), center=bool(analysis.center_features))


def split_foreground(patch, analysis) -> jax.Array:
  """The foreground step of `vision_side`: bool [B, h, w] prominent patches of float32 patch
  features [B, h, w, D] (`foreground.prominent_patches` with config.analysis's settings)."""
  return foreground.prominent_patches(patch, **_foreground_options(analysis))


def split_foreground_across(patches: Sequence, analysis) -> list[jax.Array]:
  """`split_foreground` of M models' patch features of one shape, float32 [B, h, w, D] each,
  as one batched eigendecomposition (`foreground.prominent_patches_across`): the M masks, bool
  [B, h, w] each, those `split_foreground` gives each model."""
  stacked = jnp.stack([jnp.asarray(p, jnp.float32) for p in patches])
  masks = foreground.prominent_patches_across(stacked, **_foreground_options(analysis))
  return list(masks)


def vision_after_foreground(
  bundle,
  images: np.ndarray,
  tower: Mapping[str, Any],
  fg,
  analysis,
  methods: Sequence[str] = METHODS,
) -> dict[str, Any]:
  """`vision_side` from the foreground on: concepts, CRF and the visual prompts' embeddings.

  Args:
    bundle, images, analysis, methods: as analyze_class.
    tower: `vision_tower`'s dict for the class; fg: bool [B, h, w], its `split_foreground`.

  Returns: vision_side's dict.
  """
  images = np.asarray(images)
  # config.analysis.mode and the stage keys, resolved before any work (the run checked the
  # whole of config.analysis once, paper_config.check_analysis, before its claim).
  stages = paper_config.analysis_stages(analysis)
  settings = paper_config.concept_settings(analysis, stages)
  chunk = int(paper_config.analysis_value(analysis, "prompt_chunk"))
  bundle = tower_bundle(bundle, analysis)
  tower_batch = int(paper_config.analysis_value(analysis, "tower_batch"))
  per_pass = features.images_per_pass(bundle, tower_batch)
  patch = tower["patch"]
  size = images.shape[1]
  n = int(analysis.n_concepts)
  # Nothing waits for the device until the visual prompts need their region counts: the host
  # dispatches the stages below while the tower and the split run (the arrays of `out` are read
  # back at the end).
  maps = {method: concept_maps(patch, fg, method, n, settings) for method in methods}
  del patch
  if analysis.crf:
    coarse = _upsample_mask(fg, size)
    # The reference's CRF ("lattice") refines the uint8 image it draws on (the round trip,
    # which crf.refine(round_trip=...) would run op by op).
    drawn = images
    if stages["crf_filter"] == "lattice":
      preprocess = bundle.preprocess_config
      drawn = _reference_uint8(
        jax.device_put(images),
        tuple(map(float, preprocess.mean)),
        tuple(map(float, preprocess.std)),
      )
    refined = crf.refine(
      drawn, coarse, confidence=stages["crf_confidence"], filter=stages["crf_filter"]
    )
    # Where the CRF removes a whole foreground, keep the unrefined one (the reference would
    # fail to fit an ellipse there).
    refined = _keep_nonempty(refined, coarse)
    pixel_maps = dict(zip(methods, _pixel_maps(tuple(maps[m] for m in methods), refined)))
  else:
    # The unrefined foreground is never empty where a concept map has a region.
    refined, pixels = _coarse_pixel_maps(fg, tuple(maps[m] for m in methods), size)
    pixel_maps = dict(zip(methods, pixels))
  # The present regions of both methods share the tower calls.
  embedded = visual_prompts.concept_embeddings_of_maps(
    bundle,
    images,
    [pixel_maps[m] for m in methods],
    n_concepts=n,
    ellipse=stages["ellipse"],
    chunk=chunk,
    per_pass=per_pass,
    ellipse_seed=int(paper_config.analysis_value(analysis, "ellipse_seed")),
  )
  out: dict[str, Any] = dict(
    image_embeddings=np.asarray(tower["image_embeddings"]),
    predicted=np.asarray(tower["predicted"]),
    class_scores=np.asarray(tower["class_scores"]),
    foreground=np.asarray(fg),
    refined=np.asarray(refined),
  )
  for method, (embeddings, valid) in zip(methods, embedded):
    out[method] = dict(
      concept_maps=np.asarray(maps[method]),
      pixel_maps=np.asarray(pixel_maps[method]),
      concept_valid=np.asarray(valid),
      concept_embeddings=np.asarray(embeddings),
    )
  return out


def vision_side(
  bundle, images: np.ndarray, bank: TextBank, analysis, methods: Sequence[str] = METHODS
) -> dict[str, Any]:
  """Stages 1 and 2 of `analyze_class` (everything but the language stages) on one class:
  `vision_tower`, `split_foreground`, `vision_after_foreground`.

  Args: as analyze_class.

  Returns:
    dict of numpy arrays: image_embeddings float32 [B, E] (unit rows), predicted int [B],
    class_scores [B, C], foreground bool [B, h, w], refined bool [B, S, S]; per method a dict
    with concept_maps int [B, h, w], pixel_maps int [B, S, S], concept_valid bool [B, L] and
    concept_embeddings float32 [B, L, E]. The patch features are dropped here (the largest
    per-image array).
  """
  # config.analysis.mode and the stage keys, resolved before any work.
  paper_config.analysis_stages(analysis)
  tower = vision_tower(bundle, images, bank, analysis)
  fg = split_foreground(tower["patch"], analysis)
  return vision_after_foreground(bundle, images, tower, fg, analysis, methods)


def analyze_class(
  bundle, images: np.ndarray, bank: TextBank, analysis, methods: Sequence[str] = METHODS
) -> dict[str, Any]:
  """The full analysis of one class's images: `vision_side`, then `language_stages` per method.

  Args:
    bundle: a CLIPBundle (ViT, ModifiedResNet or ConvNeXt image tower).
    images: uint8 [B, S, S, 3] at the model's input size.
    bank: the encoded descriptors and classes.
    analysis: config.analysis (see configs/mutual_synthetic.py).
    methods: names of the concept methods to run (mutual.concept_methods; METHODS by default).

  Returns:
    dict of numpy arrays: predicted int [B], class_scores [B, C], foreground bool [B, h, w],
    refined bool [B, S, S]; and per method a dict with concept_maps int [B, h, w], pixel_maps
    int [B, S, S] (the regions prompted: concepts inside the refined foreground), concept_valid
    bool [B, L] and the outputs of `language_stages`.
  """
  vision = vision_side(bundle, images, bank, analysis, methods)
  options = stage_options(analysis)
  out: dict[str, Any] = {
    k: vision[k] for k in ("predicted", "class_scores", "foreground", "refined")
  }
  # Both methods' images in one call: the stages treat each image on its own, so the methods'
  # B images each, stacked as 2B rows, give what two calls gave (one program run, not two).
  # Transferred once (device_put compiles nothing; jnp.asarray would).
  count = len(methods)
  descriptor_embeddings, class_embeddings = jax.device_put(
    (np.asarray(bank.descriptor_embeddings), np.asarray(bank.class_embeddings))
  )
  stages = language_stages(
    np.concatenate([vision[m]["concept_embeddings"] for m in methods]),
    np.concatenate([vision[m]["concept_valid"] for m in methods]),
    np.concatenate([vision["image_embeddings"]] * count),
    descriptor_embeddings,
    class_embeddings,
    np.concatenate([vision["predicted"]] * count),
    **options,
  )
  stages = {k: np.asarray(v) for k, v in stages.items()}
  batch = len(vision["predicted"])
  for index, method in enumerate(methods):
    v = vision[method]
    rows = slice(index * batch, (index + 1) * batch)
    out[method] = dict(
      concept_maps=v["concept_maps"],
      pixel_maps=v["pixel_maps"],
      concept_valid=v["concept_valid"],
      **{k: s[rows] for k, s in stages.items()},
    )
  return out


def summarise(result: Mapping[str, Any], method: str) -> dict[str, np.ndarray]:
  """Per-image MI (curve point 0), AUC (mean of its N + 1 points) and curve lengths."""
  r = result[method]
  lengths = r["n_visual"] + 1
  auc = np.array([information.curve_auc(c, n) for c, n in zip(r["curve"], lengths)])
  return dict(mi=r["curve"][:, 0], auc=auc, lengths=lengths)
