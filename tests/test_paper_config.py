"""The paper's few-shot hyperparameters (App. A.1) as the configs encode them."""

import os

import pytest

from stori_jax.plumbing.config_files import ConfigError, load_config
from stori_jax.fewshot.paper_config import (
  DATASETS,
  SHOTS,
  backbone_family,
  fewshot_config,
  learning_rate,
  resolve_learning_rate,
)

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def _config_file(name, argument=None):
  return load_config(os.path.join(CONFIGS, f"{name}.py"), argument)


# SToRI App. A.1 ("Few-shot Image Classification"), transcribed cell by cell rather than
# computed by the rule under test. CLIP: "1e-2 for the ImageNet and SUN397 datasets, 0.1 for the
# Food101 dataset and for 8/16-shot scenarios on the DTD and Flower102 datasets, and 5e-2 for
# the other datasets." MetaCLIP: "1e-2 for the ImageNet and SUN397 datasets, 0.1 for Flower102
# dataset, and 5e-2 for the other datasets." Table 2 (CLIP) and Table 8 (MetaCLIP) are the runs
# these settings produce. Columns: 1, 2, 4, 8, 16 shots.
PAPER_LEARNING_RATES = {
  "clip": {
    "imagenet": (1e-2, 1e-2, 1e-2, 1e-2, 1e-2),
    "dtd": (5e-2, 5e-2, 5e-2, 0.1, 0.1),
    "flowers102": (5e-2, 5e-2, 5e-2, 0.1, 0.1),
    "sun397": (1e-2, 1e-2, 1e-2, 1e-2, 1e-2),
    "caltech101": (5e-2, 5e-2, 5e-2, 5e-2, 5e-2),
    "food101": (0.1, 0.1, 0.1, 0.1, 0.1),
  },
  "metaclip": {
    "imagenet": (1e-2, 1e-2, 1e-2, 1e-2, 1e-2),
    "dtd": (5e-2, 5e-2, 5e-2, 5e-2, 5e-2),
    "flowers102": (0.1, 0.1, 0.1, 0.1, 0.1),
    "sun397": (1e-2, 1e-2, 1e-2, 1e-2, 1e-2),
    "caltech101": (5e-2, 5e-2, 5e-2, 5e-2, 5e-2),
    "food101": (5e-2, 5e-2, 5e-2, 5e-2, 5e-2),
  },
}
PAPER_SHOTS = (1, 2, 4, 8, 16)
CELLS = [
  (backbone, dataset, shots, rates[i])
  for backbone, table in PAPER_LEARNING_RATES.items()
  for dataset, rates in table.items()
  for i, shots in enumerate(PAPER_SHOTS)
]


def test_the_table_covers_every_cell():
  assert len(CELLS) == 2 * len(DATASETS) * len(SHOTS) == 60
  assert set(PAPER_SHOTS) == set(SHOTS)


@pytest.mark.parametrize("backbone,dataset,shots,lr", CELLS)
def test_learning_rates_are_the_papers(backbone, dataset, shots, lr):
  """Every (backbone, dataset, shots) cell, through the rule and through the config file a user
  runs (configs/<dataset>.py:shots=N,backbone=B), whose rate comes from its model."""
  assert learning_rate(dataset, shots, backbone) == lr
  config = _config_file(dataset, f"shots={shots},backbone={backbone}")
  assert config.optim.lr is None  # filled in for the run's model
  assert resolve_learning_rate(config).optim.lr == lr


def test_the_backbone_comes_from_the_model():
  """A model named on the command line changes the rule; an unknown family is refused."""
  assert backbone_family("openai/clip-vit-large-patch14") == "clip"
  assert backbone_family("facebook/metaclip-l14-fullcc2.5b") == "metaclip"
  assert backbone_family("metaclip-2.5b-vit-l-14") == "metaclip"  # registry names
  assert backbone_family("timm/vit_large_patch14_clip_224.metaclip_2pt5b") == "metaclip"
  assert backbone_family("/models/clip-vit-large-patch14/") == "clip"  # a local copy
  for other in ("laion/CLIP-ViT-L-14-laion2B-s32B-b82K", "/models/ViT-L-14", "tiny-synthetic"):
    assert backbone_family(other) is None, other

  # The backbone left to the model: MetaCLIP's rule for a MetaCLIP model.
  config = _config_file("food101", "shots=16")
  config.model.backbone = ""
  config.model.source = "facebook/metaclip-l14-fullcc2.5b"
  assert resolve_learning_rate(config).optim.lr == 5e-2  # CLIP's would be 0.1
  # A local copy whose name says nothing: the backbone the config names.
  config = _config_file("flowers102", "shots=1,backbone=metaclip")
  config.model.source = "/models/ViT-L-14"
  assert resolve_learning_rate(config).optim.lr == 0.1
  # A set learning rate is kept, whatever the model.
  config.optim.lr = 0.3
  config.model.source, config.model.backbone = "/models/ViT-L-14", ""
  assert resolve_learning_rate(config) is config and config.optim.lr == 0.3

  with pytest.raises(ConfigError, match="CLIP and MetaCLIP ViT-L/14 backbones only"):
    learning_rate("dtd", 16, "openclip")
  with pytest.raises(ConfigError, match="gives few-shot learning rates for the datasets"):
    learning_rate("cifar10", 16, "clip")
  unknown = _config_file("dtd")
  unknown.model.backbone = ""
  unknown.model.source = "laion/CLIP-ViT-L-14-laion2B-s32B-b82K"
  with pytest.raises(ConfigError, match="backbone family of config.model.source .* is unknown"):
    resolve_learning_rate(unknown)
  mismatch = _config_file("dtd", "shots=16,backbone=clip")
  mismatch.model.source = "facebook/metaclip-l14-fullcc2.5b"
  with pytest.raises(ConfigError, match="is a metaclip model but config.model.backbone is 'clip'"):
    resolve_learning_rate(mismatch)
  bad = _config_file("dtd")
  bad.model.backbone = "openclip"
  with pytest.raises(ConfigError, match="config.model.backbone must be one of 'clip', 'metaclip'"):
    resolve_learning_rate(bad)


def test_an_unknown_backbone_stops_the_command_with_one_paragraph(tmp_path, run_command):
  from stori_jax import train  # pylint: disable=import-outside-toplevel

  result = run_command(
    train,
    "--config=configs/dtd.py:shots=16",
    "--config.model.source=laion/CLIP-ViT-L-14-laion2B-s32B-b82K",
    "--config.model.backbone=",
    f"--workdir={tmp_path / 'run'}",
  )
  assert result.returncode == 2
  assert "backbone family of config.model.source" in result.stderr
  assert "--config.optim.lr=VALUE" in result.stderr and "Traceback" not in result.stderr
  assert not (tmp_path / "run").exists()  # refused before any work


def test_protocol_details():
  imagenet = _config_file("imagenet_16shot")
  assert imagenet.epochs == 200 and imagenet.batch_size == 256 and imagenet.start_block == 7
  assert imagenet.prompts.per_class == 10 and imagenet.taskres.lr == 2e-5
  # TaskRes's own schedule (its Dassl configs): one constant warm-up epoch at 1e-5.
  assert (imagenet.taskres.warmup_epochs, imagenet.taskres.warmup_lr) == (1, 1e-5)
  assert imagenet.taskres.weight_decay == 5e-3 and imagenet.taskres.alpha == 0.5  # App. A.1
  assert imagenet.prompts.use_cupl and imagenet.model.backbone == "clip"
  assert imagenet.prompts.cupl_path.endswith("imagenet_prompts_base.json")
  dtd = _config_file("dtd", "4,metaclip")
  assert dtd.epochs == 100 and dtd.prompts.per_class == 0 and dtd.taskres.lr == 2e-4
  assert dtd.model.source == "facebook/metaclip-l14-fullcc2.5b"
  assert _config_file("ablation_rare_tokens", "demo").prompts.rare_tokens == 5
  assert _config_file("ablation_start_block", "sun397,3").start_block == 3


def test_config_files_take_named_arguments():
  """`dtd.py:shots=4,backbone=metaclip` is `dtd.py:4,metaclip`; a wrong name or value is a
  ConfigError naming what the file takes."""
  named = _config_file("dtd", "shots=4,backbone=metaclip")
  assert named.to_dict() == _config_file("dtd", "4,metaclip").to_dict()
  assert named.name == "dtd_4shot_metaclip" and _config_file("dtd").name == "dtd_16shot_clip"
  block = _config_file("ablation_start_block", "dataset=sun397,block=3")
  assert block.start_block == 3 and block.name == "sun397_16shot_clip_start3"
  for config, argument, expected in (
    ("dtd", "shots=3", "shots must be one of"),
    ("dtd", "backbone=vit", "takes :shots=16,backbone=clip|metaclip"),
    ("dtd", "shot=4", "unknown name 'shot'"),
    ("ablation_start_block", "block=two", "block must be an integer"),
    ("ablation_rare_tokens", "cifar10", "dataset must be one of"),
  ):
    with pytest.raises(ConfigError, match=expected):
      _config_file(config, argument)
  with pytest.raises(ValueError, match="shots must be one of"):
    fewshot_config("dtd", 3)
  with pytest.raises(ValueError, match="dataset must be one of"):
    fewshot_config("cifar10", 16)


def test_validation_checks_the_papers_rate_before_the_run_fills_it_in():
  from stori_jax.fewshot import trainer  # pylint: disable=import-outside-toplevel

  trainer.validate_config(_config_file("food101", "shots=2,backbone=metaclip"))  # lr None: ok
  unknown = _config_file("food101")
  unknown.model.backbone = ""
  unknown.model.source = "/models/ViT-L-14"
  with pytest.raises(ConfigError, match="backbone family of config.model.source .* is unknown"):
    trainer.validate_config(unknown)


def test_paper_configs_draw_fresh_views_on_taskres_scheme():
  """configs/<dataset>.py: a fresh augmented view of every training image at every step
  (views 0), SToRI on TaskRes's schedule (one warm-up epoch at 1e-5, then the per-epoch cosine)."""
  for argument in ("shots=16", "shots=1,backbone=metaclip"):
    dtd = _config_file("dtd", argument)
    assert dtd.views == 0 and dtd.image_dtype == "float32"
    assert (dtd.optim.schedule, dtd.optim.warmup_epochs, dtd.optim.warmup_lr) == (
      "taskres",
      1,
      1e-5,
    )
  assert _config_file("demo").optim.schedule == "cosine"  # the demo keeps its own (docs/fewshot.md)


def test_retrieval_configs_take_the_few_shot_backbones():
  """`retrieval_celeba3.py:backbone=metaclip` (celeba5, cub alike) loads the MetaCLIP ViT-L/14
  of the few-shot configs; no argument, CLIP's; another backbone is refused naming both."""
  from stori_jax.retrieval import runner  # noqa: PLC0415

  metaclip = _config_file("dtd", "shots=4,backbone=metaclip").model.source
  clip = _config_file("dtd").model.source
  assert "metaclip" in metaclip
  for name in ("retrieval_celeba3", "retrieval_celeba5", "retrieval_cub"):
    assert _config_file(name).model == clip
    config = _config_file(name, "backbone=metaclip")
    assert config.model == metaclip
    assert _config_file(name, "metaclip").to_dict() == config.to_dict()
    runner.validate_config(config)
    with pytest.raises(ConfigError, match="backbone must be one of 'clip', 'metaclip'"):
      _config_file(name, "backbone=openclip")
