r"""Table 3 and Figure 3 (right) of the mutual-knowledge paper: its 13 models on ImageNet val.

  python -m mutual.sweep --config configs/mutual_sweep.py --workdir DIR \
    --config.data.root=/data/imagenet/val \
    --config.data.classnames=/data/imagenet/classnames.txt \
    --config.data.descriptors=data/descriptors/descriptors_imagenet.json
  python -m mutual.sweep --config configs/mutual_sweep.py:random --workdir DIR   # offline check
  python -m mutual.sweep --config configs/mutual_sweep.py:smoke --workdir DIR    # < 1 minute

Data and analysis settings are configs/mutual_imagenet.py's (classnames.txt: CoOp's "<wnid>
<class name>" per line, pairing the wnid folders with the descriptor classes; TFDS:
--config.data.source=tfds --config.data.root=TFDS_DATA_DIR; a subset: --config.data.classes /
images_per_class).
Sweep fields:
  models              registry names (default the study's 13: `python -m stori_jax.list_models
                      --paper mutual-knowledge` lists them and whether their weights are here);
                      a subset: --config.models="('openai-rn50','openai-vit-b-16')"
  skip_missing        False: a model without weights stops the run, before any image is read,
                      with the registry's message (repository, file, where to put it); True:
                      leave it out with a warning (listed under "skipped" in results.json)
  models_dir          hand-placed weights (<models_dir>/<name>/); default $STORI_JAX_MODELS
  max_loaded_models   models held at once (0: all, ~11 GB of fp32 weights for the 13); fewer
                      reloads each model's weights once per class chunk (its compiled towers
                      are kept)
  classes_per_chunk   classes whose per-image results (concept embeddings and maps of every
                      model) are held at once, before the language stages batched over models
  spectral_across_models  the foreground split (Gram eigendecomposition) of the models whose
                      patch features share a shape as one batched eigh per class (True), model
                      by model (False), or "auto" (default): the faster way on the backend as
                      benchmarks/spectral_across_models.py measured it (batched on the CPU,
                      per model on the GPU), where max_loaded_models holds every model (else
                      per model: batching visits each model twice per chunk); the same
                      numbers either way
  accuracy            the Top-1 of the AUC-accuracy fit: "measured", or the registry's "paper"
                      (Table 3) / "open_clip" values, e.g. for a run on part of the val set
  per_image           also write per_image/<model>/<class>/<image>.json
  random_weights      random-weight instances of the models' architectures (no download);
  random_models       their image_size (rounded per tower to a multiple of its patch / stride,
                      at least a 2 x 2 grid; 0: each model's own size), shrink (divide widths by
                      it and keep <= 2 blocks per stage; 1: the real architectures) and seed.
  table2              also Table 2 (App. K) per model, with config.protocols.table2's settings
                      (mutual.evaluate's): table2.md, table2.json (configs/mutual_table2_models.py)
  table_groups        ((title, (model, ...)), ...): App. G's grouped table, table_groups.md
                      (configs/mutual_appg.py)

The argument (`:variant=NAME`, or just `:NAME`) picks one of:
  imagenet   (default) the study: the 13 models on ImageNet val, as above
  random     the offline path: random-weight instances of all 13 architectures at about 64 px on
             4 classes x 2 images of the embedded synthetic world with its descriptor bank
             (configs/mutual_synthetic.py's data and analysis; 4 concept regions per tower call,
             so each model compiles one visual-prompt program). It exercises every stage of the
             sweep for every tower; its numbers carry no meaning. One model is held at a time and
             the 4 classes form one chunk, so each model is made once and peak memory is about the
             largest model's (ViT-L/14: 1.7 GB of weights). Measured on 2 quiet CPU cores: 3 min 9 s,
             3.3 GB peak RSS; on 2 shared cores (load about 2): 3 min 55 s, 3.2 GB, of which visual prompts 100 s, the rest of the
             vision side 50 s, the 13 text banks 47 s, making the weights 24 s, the language
             stages 3 s, and compilation about 95 s of these.
  smoke      `random` for one architecture per tower kind (ViT, ResNet, ConvNeXt) and a second
             ViT-B/32 (a pair of one shape for the batched foreground split), widths shrunk
             16x, on 2 classes x 2 images: the whole path in under a minute on 2 CPU cores
             (the tests' run)
"""

from mutual.paper_config import sweep_config
from stori_jax.plumbing.config_files import config_arguments, sibling_config

#: One model per tower kind; shrunk 16x their embedding dims (32 / 64 / 40) and feature dims
#: (48 / 128 / 64, on one 2 x 2 grid) all differ, so both zero paddings are exercised; and
#: DataComp's ViT-B/32, whose patch features have OpenAI's ViT-B/32's shape, so the foreground
#: split batched across models (config.spectral_across_models) has a group of two to batch.
SMOKE_MODELS = (
  "openai-vit-b-32",
  "datacomp-vit-b-32",
  "openai-rn50",
  "laion-aesthetic-convnext-base-w",
)

#: `random`'s classes of the embedded world (2 images each): every stage for every full-size
#: tower within minutes on 2 CPU cores (all 12 classes would take several times longer).
RANDOM_CLASSES = (0, 3, 6, 9)


def get_config(argument=None):
  variant = config_arguments(argument, __file__, variant=("imagenet", "random", "smoke"))["variant"]
  if variant == "imagenet":
    return sweep_config(sibling_config(__file__, "mutual_imagenet"))
  config = sweep_config(sibling_config(__file__, "mutual_synthetic"), random_weights=True)
  config.data.classes = RANDOM_CLASSES
  config.data.images_per_class = 2
  config.max_loaded_models = 1
  config.classes_per_chunk = len(RANDOM_CLASSES)
  # 4 concept regions (12 prompts) per tower call: one compiled program per model (a class has
  # at most 2 x 2 x 5 regions, which 32-region calls padded to multiples of 4 split into up to
  # 5 shapes, each compiled).
  config.analysis.prompt_chunk = 4
  if variant == "smoke":
    config.name = "mutual_sweep_smoke"
    config.models = SMOKE_MODELS
    config.random_models.shrink = 16
    config.data.classes = (0, 5)
    config.data.images_per_class = 2
  return config
