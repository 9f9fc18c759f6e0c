"""The paper's few-shot hyperparameters (App. A.1) as the configs encode them."""

import os

import pytest

from stori_jax.config_files import ConfigError, load_config
from stori_jax.fewshot.paper_config import fewshot_config, learning_rate

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def _config_file(name, argument=None):
  return load_config(os.path.join(CONFIGS, f"{name}.py"), argument)


@pytest.mark.parametrize(
  "dataset,shots,lr",
  [
    ("imagenet", 1, 1e-2),
    ("sun397", 16, 1e-2),
    ("food101", 2, 0.1),
    ("dtd", 4, 5e-2),
    ("dtd", 8, 0.1),
    ("flowers102", 16, 0.1),
    ("flowers102", 2, 5e-2),
    ("caltech101", 16, 5e-2),
  ],
)
def test_learning_rates(dataset, shots, lr):
  assert learning_rate(dataset, shots) == lr
  assert fewshot_config(dataset, shots).optim.lr == lr


def test_protocol_details():
  imagenet = _config_file("imagenet_16shot")
  assert imagenet.epochs == 200 and imagenet.batch_size == 256 and imagenet.start_block == 7
  assert imagenet.prompts.per_class == 10 and imagenet.taskres.lr == 2e-5
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
