"""The paper's few-shot protocol as ConfigDicts (SToRI App. A.1; TaskRes for the baseline).

configs/<dataset>.py files call `fewshot_config`; everything can still be
overridden from the command line (--config.optim.lr=...).
"""

from __future__ import annotations

import os
import re

import ml_collections
from ml_collections import config_dict

from stori_jax.plumbing.config_files import ConfigError, config_arguments
from stori_jax.fewshot.prompts import CUPL_FILES
from stori_jax.models import registry

DATASETS = ("imagenet", "dtd", "sun397", "flowers102", "caltech101", "food101")
SHOTS = (1, 2, 4, 8, 16)
# Hub ids of the paper's backbones (transformers layout; downloaded when online, or point
# --config.model.source at a local copy); the retrieval configs load the same ones.
BACKBONES = registry.STORI_BACKBONES
#: TaskRes's schedule (its configs/trainers/TaskRes/*.yaml on Dassl): one epoch at a constant
#: 1e-5 ("constant" warm-up), then the cosine decay stepped per epoch. SToRI trains on it too
#: (App. A.1: "the training scheme of TaskRes"; config.optim.schedule = "taskres").
TASKRES_WARMUP_EPOCHS = 1
TASKRES_WARMUP_LR = 1e-5
# OpenAI's hub names, as a local copy's folder keeps them.
_OPENAI_FOLDER = re.compile(r"clip-vit-(base|large)-patch(14|16|32)(-336)?")


def learning_rate(dataset: str, shots: int, backbone: str) -> float:
  """SToRI's Adam learning rate for a (dataset, shots, backbone) cell, paper App. A.1.

  CLIP: 1e-2 for ImageNet and SUN397; 0.1 for Food101, and for DTD and Flowers102 at 8/16
  shots; 5e-2 otherwise. MetaCLIP: 1e-2 for ImageNet and SUN397; 0.1 for Flowers102; 5e-2
  otherwise.

  Raises:
    ConfigError: a backbone other than "clip" or "metaclip" (the paper gives no rate for it:
      refused rather than given CLIP's), or a dataset or shot count outside the paper's.
  """
  if backbone not in BACKBONES:
    raise ConfigError(
      f"The paper (App. A.1) gives few-shot learning rates for the CLIP and MetaCLIP ViT-L/14 "
      f"backbones only ({', '.join(map(repr, BACKBONES))}), got backbone {backbone!r}; for "
      f"another model set --config.optim.lr=VALUE."
    )
  if dataset not in DATASETS or shots not in SHOTS:
    raise ConfigError(
      f"The paper (App. A.1) gives few-shot learning rates for the datasets {DATASETS} at "
      f"{SHOTS} shots, got {dataset!r} at {shots} shots; set --config.optim.lr=VALUE."
    )
  if dataset in ("imagenet", "sun397"):
    return 1e-2
  if backbone == "metaclip":
    return 0.1 if dataset == "flowers102" else 5e-2
  if dataset == "food101" or (dataset in ("dtd", "flowers102") and shots >= 8):
    return 0.1
  return 5e-2


def backbone_family(source: str) -> str | None:
  """The paper backbone ("clip" or "metaclip") that a model source names, or None.

  source: a registry name or its hub repository (`stori_jax.models.registry`), another hub id
  or a local path. MetaCLIP: a registry entry with MetaCLIP weights, or a hub id or folder
  name containing "metaclip". CLIP: a registry entry with OpenAI's weights, an `openai/` hub id,
  or a folder named like OpenAI's (`clip-vit-large-patch14`). Anything else (a folder named
  otherwise, another model) is None: its family is unknown.
  """
  name = source.rstrip("/\\").lower()
  entry = registry.find(source) or next(
    (e for e in registry.REGISTRY.values() if e.hf_repo.lower() == name), None
  )
  if entry is not None:
    if entry.pretrained.startswith("metaclip"):
      return "metaclip"
    return "clip" if entry.pretrained == "openai" else None
  base = os.path.basename(name)
  if "metaclip" in base:
    return "metaclip"
  if name.startswith("openai/") or _OPENAI_FOLDER.fullmatch(base):
    return "clip"
  return None


def run_backbone(config: ml_collections.ConfigDict) -> str:
  """The backbone family of a run: `config.model.backbone` where set, else recognised from
  `config.model.source` (`backbone_family`).

  Raises:
    ConfigError: config.model.backbone is not "clip" or "metaclip"; it disagrees with the
      family the model source names; or neither says which family the model is.
  """
  source = str(config.model.source)
  stated = config.model.get("backbone") or ""
  known = ", ".join(map(repr, BACKBONES))
  if stated and stated not in BACKBONES:
    raise ConfigError(
      f"config.model.backbone must be one of {known} (the paper's ViT-L/14 backbones, whose "
      f"learning rates App. A.1 gives), got {stated!r}; for another model set "
      f"--config.optim.lr=VALUE."
    )
  detected = backbone_family(source)
  if stated and detected and stated != detected:
    raise ConfigError(
      f"config.model.source {source!r} is a {detected} model but config.model.backbone is "
      f"{stated!r}, whose learning rate rule (App. A.1) differs; build the config for that "
      f"backbone (configs/<dataset>.py:backbone={detected}) or set "
      f"--config.model.backbone={detected}."
    )
  family = stated or detected
  if family is None:
    raise ConfigError(
      f"config.optim.lr is None (the paper's learning rate for the run's backbone) but the "
      f"backbone family of config.model.source {source!r} is unknown: the paper (App. A.1) "
      f"gives learning rates for CLIP and MetaCLIP ViT-L/14 only. Set "
      f"--config.model.backbone to one of {known} if the model is one of them, or set "
      f"--config.optim.lr=VALUE."
    )
  return family


def resolve_learning_rate(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The config with `optim.lr` None (the paper's rule) replaced by App. A.1's rate for the
  run's dataset, shots and backbone (`run_backbone`); a set learning rate is kept, and the
  config is returned as is.

  Returns a copy when it fills the rate in (the caller's config, often locked by the command
  line's flags, is left alone).

  Raises:
    ConfigError: the backbone family is unknown or disagrees with the model (`run_backbone`),
      or the dataset or shot count has no rate in the paper (`learning_rate`).
  """
  optim = config.get("optim")
  if optim is None or "lr" not in optim or optim.lr is not None:
    return config
  lr = learning_rate(str(config.data.name), config.shots, run_backbone(config))
  resolved = config.copy_and_resolve_references()
  resolved.optim.lr = lr
  return resolved


def fewshot_config(
  dataset: str, shots: int = 16, backbone: str = "clip", data_root: str = "data"
) -> ml_collections.ConfigDict:
  """SToRI on `dataset` at `shots` shots with a ViT-L/14 backbone ("clip" or "metaclip").

  `optim.lr` is None: the run fills in App. A.1's rate for its dataset, shots and backbone
  (`resolve_learning_rate`), so that a backbone changed on the command line
  (--config.model.backbone, --config.model.source) changes the rate with it.
  """
  if dataset not in DATASETS:
    raise ValueError(f"dataset must be one of {DATASETS}, got {dataset!r}.")
  if shots not in SHOTS:
    raise ValueError(f"shots must be one of {SHOTS}, got {shots}.")
  if backbone not in BACKBONES:
    raise ValueError(f"backbone must be one of {sorted(BACKBONES)}, got {backbone!r}.")
  config = ml_collections.ConfigDict()
  config.name = f"{dataset}_{shots}shot_{backbone}"
  config.method = "stori"  # or "taskres"
  config.seed = 1  # The paper averages seeds 1, 2, 3.
  config.shots = shots
  # backbone: the family whose learning rates apply (App. A.1); "" recognises it from source.
  config.model = ml_collections.ConfigDict(
    dict(source=BACKBONES[backbone], arch="", backbone=backbone)
  )
  # CoOp image folders under data_root (see DATASETS.md of CoOp), or TFDS with
  # --config.data.source=tfds --config.data.tfds_name=... --config.data.root=TFDS_DIR.
  config.data = ml_collections.ConfigDict(
    dict(
      name=dataset,
      source="coop",
      root=data_root,
      tfds_name="",
      image_size=224,
      n_test_per_class=0,
      class_names="",
    )
  )
  config.prompts = ml_collections.ConfigDict(
    dict(
      cupl_path=f"{data_root}/cupl/{CUPL_FILES[dataset]}",
      # ImageNet and SUN397: 10 CuPL prompts per class, chosen by similarity to the
      # class's training images (paper §4.1.1).
      per_class=10 if dataset in ("imagenet", "sun397") else 0,
      rare_tokens=0,  # Table 1 ablation: append this many of 'sks', 'pll', 'ucd'.
      use_base=True,  # Base prompts join the class embedding, untrained.
      # False: the Base prompts alone (Table 2's "TaskRes / Base" row; TaskRes only, since
      # SToRI trains the CuPL prompts' weights) and no CuPL file is read.
      use_cupl=True,
    )
  )
  config.start_block = 7  # Blocks 7-12 of ViT-L/14's text tower.
  # 0: a fresh augmented view of every training image at every step, as Dassl's data loader
  # draws them (the crop and flip on the device, the image tower inside the step); N > 0: the
  # fast approximation, N augmented views per image encoded once and drawn from (docs/fewshot.md).
  config.views = 0
  # The image tower's compute dtype: "float32", or "bfloat16" (fp32 products at HIGHEST
  # precision cost several times bf16's on an accelerator, whose features keep a cosine of at
  # least 0.999 to fp32's; docs/models.md, "Loading checkpoints").
  config.image_dtype = "float32"
  config.augment_scale = (0.08, 1.0)
  config.batch_size = 256
  config.epochs = 200 if shots >= 8 else 100
  # lr None: App. A.1's rate for the run's dataset, shots and backbone
  # (`resolve_learning_rate`). SToRI trains on TaskRes's scheme (App. A.1), as Dassl steps it:
  # one constant warm-up epoch at 1e-5, then a cosine over the epochs, stepped once per epoch
  # (schedules.stori_schedule, schedules.taskres_schedule).
  config.optim = ml_collections.ConfigDict(
    dict(
      lr=config_dict.placeholder(float),
      schedule="taskres",
      warmup_epochs=TASKRES_WARMUP_EPOCHS,
      warmup_lr=TASKRES_WARMUP_LR,
    )
  )
  # App. A.1's TaskRes reproduction (lr, weight decay, alpha) on TaskRes's own schedule: Adam
  # with L2 weight decay, one warm-up epoch at 1e-5, then cosine (schedules.taskres_optimizer).
  config.taskres = ml_collections.ConfigDict(
    dict(
      alpha=0.5,
      lr=2e-5 if dataset == "imagenet" else 2e-4,
      weight_decay=5e-3,
      warmup_epochs=TASKRES_WARMUP_EPOCHS,
      warmup_lr=TASKRES_WARMUP_LR,
    )
  )
  config.chunk = 64  # Prompts per device per encoder call: bounds activation memory.
  config.log_every = 10
  config.eval_every = 500
  config.checkpoint_every = 200
  return config


def parse_argument(argument: str | None, config_file: str) -> tuple[int, str]:
  """`file.py:shots=4,backbone=metaclip` (config_flags' `file.py:ARG`; `:4,metaclip` also
  works, positional values filling shots then backbone) -> (shots, backbone).

  Raises ConfigError naming the accepted values when the argument is not understood.
  """
  values = config_arguments(argument, config_file, shots=16, backbone=tuple(BACKBONES))
  if values["shots"] not in SHOTS:
    raise ConfigError(f"configs/{os.path.basename(config_file)}: shots must be one of {SHOTS}.")
  return values["shots"], values["backbone"]
