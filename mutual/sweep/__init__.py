r"""The mutual-knowledge analysis over many CLIP models: the paper's Table 3 and Figure 3.

  python -m mutual.sweep --config configs/mutual_sweep.py --workdir DIR \
      --config.data.root=/data/imagenet/val \
      --config.data.classnames=/data/imagenet/classnames.txt \
      --config.data.descriptors=data/descriptors/descriptors_imagenet.json
  python -m mutual.sweep --config configs/mutual_sweep.py:random --workdir DIR   # offline check

Every model of `config.models` (registry names, default the study's 13) runs the same analysis as
`mutual.pipeline.analyze_class`, a chunk of classes at a time, in two phases:

  1. per model    text bank (at its first load); then per class `pipeline.vision_side`: image
                  embeddings and patch features from one tower pass, zero-shot prediction,
                  foreground split, CRF, PCA / K-means concepts and the concept embeddings
                  from the visual prompts. Each model is fetched from the pool once per chunk;
                  its patch features are dropped once its concepts are fitted.
  2. all models   language stages (descriptor scores, candidates, Sinkhorn OT, importance order,
                  MI curves) vmapped over a leading model axis, the embedding dim E zero-padded
                  to the largest

Zero padding changes nothing: a zero column adds nothing to a norm or a dot product (cosine
scores of unit vectors are unchanged), so the padded stages compute each model's own result up to
floating-point summation order; tests/test_mutual_sweep.py finds the per-model pipeline's
per-image records exactly.

With `config.spectral_across_models` (True, or "auto" where the benchmark found it faster,
mutual.sweep.batched.SPECTRAL_ACROSS_MODELS_AUTO, and the pool holds every model) phase 1 visits
the models twice: their towers,
then per class the foreground split (the Gram matrix's eigendecomposition) of the models whose
patch features share a shape as one batched eigh, unpadded (padding to the largest grid and width
costs far more eigendecomposition than batching saves), then the rest of each model's vision
side. The masks and numbers are those of the per-model split (tested).

Models are loaded through a pool (`config.max_loaded_models`; 0 holds all of them, the fastest on
an accelerator with room for the 13 models' ~11 GB of fp32 weights); a smaller pool reloads a
model's weights once per chunk of `config.classes_per_chunk` classes (not its compiled towers,
which `SweepBundle` shares by architecture). The `:random` config holds one model at a time.

Several processes (a TPU pod or SLURM job with --distributed, or local processes:
`launch/local_multiprocess.sh 2 -- python -m mutual.sweep --config ... --workdir DIR`) share the class
chunks: process p runs the chunks c with c % processes == p through every model and leaves their
slimmed records in workdir/shards; process 0 aggregates them in chunk order and writes what one
process writes (tests/test_mutual_multihost.py). The workdir must be on a filesystem they share.

Missing weights stop the run before any image is read, with the registry's message (what to fetch
and where to put it), unless `config.skip_missing` is set: then the missing models are left out
with a warning and listed under "skipped" in results.json.

Modules, one per phase of the run:
  models.py      the models: registered weights or random-weight instances (SweepBundle: their
                 compiled towers shared by architecture), the ModelPool
  batched.py     the stages batched across models: the language stages, and the foreground
                 split of the models that share a shape (config.spectral_across_models)
  chunk.py       one chunk of classes through every model, phases 1-2 (`analyze_classes`)
  fits.py        Figure 3 (right)'s AUC-accuracy fits
  table.py       Table 3, App. G's grouped tables, Table 2's layout (markdown); plots.py:
                 Figure 3 (its three panels)
  runner.py      `run`: checks, weights, chunks, outputs
  __main__.py    the command line (flags, config, run, printed table)
The settings are `mutual.paper_config.sweep_config` (configs/mutual_sweep.py).

Writes to the workdir:
  results.json                  per model: Top-1, MI and AUC per method, images, the registry's
                                reported accuracies; the AUC-accuracy fits (slope, intercept,
                                Pearson r) per method, over all models and per family
  table.md                      Table 3 (family, model, data, Top-1, MI and AUC per method)
  fig3_auc_vs_accuracy.png      Figure 3 (right): Top-1 against AUC, least-squares lines, r
  fig3_<method>.png             Figure 3 as the paper lays it out: MI curves with the pretraining
                                data fixed (left), with the model size fixed (middle), the fits
  fig3_curves_<method>.png      every model's MI curve in one panel
  table_groups.md               with config.table_groups: App. G's Tables 6 / 7 (models grouped
                                by size and by pretraining data; configs/mutual_appg.py)
  table2.md, table2.json        with config.table2: Table 2 (App. K) per model, each equal to
                                mutual.evaluate's for that model (configs/mutual_table2_models.py)
  per_image/<model>/<class>/<image>.json   with config.per_image
  shards/chunk_<c>.json         each class chunk's records of every model, with the models and
                                images they are of, written once the chunk is through every
                                model: the same command keeps those chunks (resume), and process
                                0 of a multi-process run reads the others' there
  shards/chunk_<c>_table2.npz   with config.table2: the chunk's concepts of every model
"""

from mutual.sweep.batched import (
  SPECTRAL_ACROSS_MODELS_AUTO,
  batched_foreground,
  batched_language_stages,
  pad_stack,
  spectral_across_models,
)
from mutual.sweep.chunk import analyze_classes
from mutual.sweep.fits import ACCURACIES, MIN_FIT_MODELS, accuracy_of, auc_accuracy_fits, fit_line
from mutual.sweep.models import (
  ModelPool,
  SweepBundle,
  SweepModel,
  families,
  family,
  model_image_size,
  random_bundle,
  sweep_models,
)
from mutual.sweep.plots import plot_auc_vs_accuracy
from mutual.sweep.runner import check_config, run
from mutual.sweep.table import markdown_table, table_order
from stori_jax.models.random_weights import random_params, shrink_config, small_image_size
