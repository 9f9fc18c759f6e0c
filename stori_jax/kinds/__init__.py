"""The built-in image-tower kinds, one module each (stori_jax.models.tower_kinds is their
registry): importing this package registers them, in the order of the families in Table 3:
OpenAI's ViT (`vit.py`), OpenAI's ModifiedResNet (`resnet.py`) and timm's ConvNeXt as open_clip
wraps it (`convnext.py`). Each module holds its kind's whole entry: its config and Flax module
(from stori_jax.models, the layer below), its checkpoint conversions from every layout (OpenAI /
open_clip state dicts, open_clip's vision_cfg, transformers), its PyTorch reference's build (the
parity tool), and the facts the mutual-knowledge analysis reads of its patch features
(`has_keys`, `class_token_layers`, `activation_elements`; the Flax module's `feature_map`).
It sits above stori_jax.models and stori_jax.checkpoints, so a kind's conversions may use the checkpoint readers while models never imports checkpoints;
stori_jax/__init__.py imports it, so the kinds are registered before any of the package's
modules runs."""

from stori_jax.kinds import vit as _vit
from stori_jax.kinds import resnet as _resnet
from stori_jax.kinds import convnext as _convnext
