"""The CLIP checkpoints of both papers, by name: architecture, weights, preprocessing, accuracy.

Sources of the facts below (looked up, not guessed):
  * open_clip 3.3.0 `open_clip/pretrained.py`: the pretrained tags, hub
    repositories, QuickGELU flags and preprocessing (all these entries use its
    `_pcfg` defaults: OpenAI mean/std, bicubic, resize_mode "shortest");
  * open_clip 3.3.0 `open_clip/model_configs/*.json`: the architectures, which
    `stori_jax.models.config` mirrors;
  * `imagenet_open_clip`: the "ImageNet 1k" column of open_clip's
    docs/openclip_results.csv (commit f862f86cd92123615a8695ce8bcb6ecc066af452),
    as a percentage;
  * `imagenet_paper`: Table 3 of Sammani & Deligiannis, "Interpreting and
    Analyzing CLIP's Zero-Shot Image Classification via Mutual Knowledge"
    (NeurIPS 2024), its own ImageNet-val zero-shot evaluation. None where the
    paper does not report the model (MetaCLIP is SToRI's, whose paper gives no
    zero-shot ImageNet accuracy).
Open_clip's hub repositories hold `open_clip_pytorch_model.bin` (its default
file name) and, for most, `open_clip_model.safetensors`; either is read.
"""

from __future__ import annotations

import dataclasses

from stori_jax.models.config import CLIPConfig, get_architecture

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
INCEPTION_MEAN = (0.5, 0.5, 0.5)  # open_clip's INCEPTION_MEAN / _STD (some LAION-2B tags)
INCEPTION_STD = (0.5, 0.5, 0.5)
WEIGHTS_FILE = "open_clip_pytorch_model.bin"  # open_clip's HF_WEIGHTS_NAME.
SAFE_WEIGHTS_FILE = "open_clip_model.safetensors"  # open_clip's HF_SAFE_WEIGHTS_NAME.
MUTUAL = "mutual-knowledge"
STORI = "stori"
#: SToRI's two ViT-L/14 backbones, CLIP and MetaCLIP (App. A.1, §4.2), as the hub ids
#: (transformers layout) that its few-shot and retrieval configs load: {backbone: source}.
STORI_BACKBONES = {
  "clip": "openai/clip-vit-large-patch14",
  "metaclip": "facebook/metaclip-l14-fullcc2.5b",
}


@dataclasses.dataclass(frozen=True)
class ModelEntry:
  """One pretrained CLIP: where its weights live and how to feed it."""

  name: str  # Registry name: stori_jax.load(name).
  label: str  # As the papers name it.
  arch: str  # Architecture name for stori_jax.models.get_architecture.
  pretrained: str  # open_clip pretrained tag: open_clip.create_model(arch, pretrained=...).
  hf_repo: str  # Hugging Face hub repository of the open_clip weights.
  data: str  # Training data (samples seen where the tag says).
  papers: tuple[str, ...]
  imagenet_open_clip: float | None  # Zero-shot ImageNet top-1 (%), open_clip's table.
  imagenet_paper: float | None  # Zero-shot ImageNet top-1 (%), mutual-knowledge Table 3.
  image_size: int = 224
  mean: tuple[float, float, float] = OPENAI_MEAN
  std: tuple[float, float, float] = OPENAI_STD
  interpolation: str = "bicubic"
  resize_mode: str = "shortest"  # Shorter side to image_size, then center crop.
  weights_files: tuple[str, ...] = (WEIGHTS_FILE, SAFE_WEIGHTS_FILE)

  @property
  def quick_gelu(self) -> bool:
    return self.arch.endswith("-quickgelu")

  @property
  def config(self) -> CLIPConfig:
    return get_architecture(self.arch).replace(name=self.name)

  @property
  def size(self) -> str:
    """The model size the mutual-knowledge paper holds fixed while the pretraining data vary
    (its Fig. 3, middle; App. G): the architecture without patch size, input size or
    activation. "ViT-B" for ViT-B/32 and ViT-B/16 alike, "ViT-L" for ViT-L/14 and
    ViT-L/14@336, "RN50x4", "convnext_base_w"."""
    parts = self.arch.removesuffix("-quickgelu").split("-")
    return "-".join(parts[:2]) if parts[0] == "ViT" else parts[0]

  @property
  def data_name(self) -> str:
    """The pretraining data without the samples-seen note: "DataComp-1B", "WIT-400M"; the
    paper's Fig. 3 (left) holds it fixed while size and patch vary."""
    return self.data.split(" (")[0]

  def url(self, filename: str | None = None) -> str:
    return f"https://huggingface.co/{self.hf_repo}/resolve/main/{filename or self.weights_files[0]}"


def _openai(name, label, arch, repo, top1, paper_top1, image_size=224, papers=(MUTUAL,)):
  return ModelEntry(
    name=name,
    label=label,
    arch=arch,
    pretrained="openai",
    hf_repo=repo,
    data="WIT-400M (OpenAI)",
    papers=papers,
    imagenet_open_clip=top1,
    imagenet_paper=paper_top1,
    image_size=image_size,
  )


_ENTRIES = (
  _openai(
    "openai-vit-b-32",
    "ViT-B/32",
    "ViT-B-32-quickgelu",
    "timm/vit_base_patch32_clip_224.openai",
    63.32,
    61.66,
  ),
  _openai(
    "openai-vit-b-16",
    "ViT-B/16",
    "ViT-B-16-quickgelu",
    "timm/vit_base_patch16_clip_224.openai",
    68.34,
    67.70,
    papers=(MUTUAL, STORI),  # SToRI's retrieval experiments also use ViT-B/16.
  ),
  _openai(
    "openai-vit-l-14",
    "ViT-L/14",
    "ViT-L-14-quickgelu",
    "timm/vit_large_patch14_clip_224.openai",
    75.54,
    74.77,
    papers=(MUTUAL, STORI),  # SToRI's main model.
  ),
  _openai(
    "openai-vit-l-14-336",
    "ViT-L/14@336",
    "ViT-L-14-336-quickgelu",
    "timm/vit_large_patch14_clip_336.openai",
    76.56,
    76.23,
    image_size=336,
  ),
  _openai("openai-rn50", "RN50", "RN50-quickgelu", "timm/resnet50_clip.openai", 59.82, 58.42),
  _openai("openai-rn101", "RN101", "RN101-quickgelu", "timm/resnet101_clip.openai", 62.28, 60.90),
  _openai(
    "openai-rn50x4",
    "RN50x4",
    "RN50x4-quickgelu",
    "timm/resnet50x4_clip.openai",
    66.27,
    65.28,
    image_size=288,
  ),
  _openai(
    "openai-rn50x16",
    "RN50x16",
    "RN50x16-quickgelu",
    "timm/resnet50x16_clip.openai",
    70.72,
    70.04,
    image_size=384,
  ),
  ModelEntry(
    name="datacomp-vit-b-32",
    label="ViT-B/32-dcp",
    arch="ViT-B-32",
    pretrained="datacomp_xl_s13b_b90k",
    hf_repo="laion/CLIP-ViT-B-32-DataComp.XL-s13B-b90K",
    data="DataComp-1B (13B samples seen)",
    papers=(MUTUAL,),
    imagenet_open_clip=69.17,
    imagenet_paper=68.88,
  ),
  ModelEntry(
    name="datacomp-vit-b-16",
    label="ViT-B/16-dcp",
    arch="ViT-B-16",
    pretrained="datacomp_xl_s13b_b90k",
    hf_repo="laion/CLIP-ViT-B-16-DataComp.XL-s13B-b90K",
    data="DataComp-1B (13B samples seen)",
    papers=(MUTUAL,),
    imagenet_open_clip=73.49,
    imagenet_paper=73.37,
  ),
  ModelEntry(
    name="dfn2b-vit-b-16",
    label="ViT-B/16-dfn",
    arch="ViT-B-16-quickgelu",  # open_clip's dfn2b tag sets quick_gelu=True.
    pretrained="dfn2b",
    hf_repo="apple/DFN2B-CLIP-ViT-B-16",
    data="DFN-2B",
    papers=(MUTUAL,),
    imagenet_open_clip=76.24,
    imagenet_paper=76.24,
  ),
  ModelEntry(
    name="laion400m-convnext-base",
    label="CNeXt-B1",
    arch="convnext_base",
    pretrained="laion400m_s13b_b51k",
    hf_repo="laion/CLIP-convnext_base-laion400M-s13B-b51K",
    data="LAION-400M (13B samples seen)",
    papers=(MUTUAL,),
    imagenet_open_clip=66.27,
    imagenet_paper=65.36,
  ),
  # The paper says "an aesthetic subset of LAION-5B, 13B samples seen" without
  # the resolution; open_clip has it at 256 px (this entry, 70.99%) and at
  # 320 px (convnext_base_w_320, 71.67%); the paper measures 71.22%.
  ModelEntry(
    name="laion-aesthetic-convnext-base-w",
    label="CNeXt-B2",
    arch="convnext_base_w",
    pretrained="laion_aesthetic_s13b_b82k",
    hf_repo="laion/CLIP-convnext_base_w-laion_aesthetic-s13B-b82K",
    data="LAION-Aesthetic (13B samples seen)",
    papers=(MUTUAL,),
    imagenet_open_clip=70.99,
    imagenet_paper=71.22,
    image_size=256,
  ),
  # SToRI's paper says "MetaCLIP ViT-L/14" without the data size; both are here.
  ModelEntry(
    name="metaclip-2.5b-vit-l-14",
    label="MetaCLIP ViT-L/14 (2.5B)",
    arch="ViT-L-14-quickgelu",
    pretrained="metaclip_fullcc",
    hf_repo="timm/vit_large_patch14_clip_224.metaclip_2pt5b",
    data="MetaCLIP 2.5B (CommonCrawl)",
    papers=(STORI,),
    imagenet_open_clip=79.17,
    imagenet_paper=None,
  ),
  ModelEntry(
    name="metaclip-400m-vit-l-14",
    label="MetaCLIP ViT-L/14 (400M)",
    arch="ViT-L-14-quickgelu",
    pretrained="metaclip_400m",
    hf_repo="timm/vit_large_patch14_clip_224.metaclip_400m",
    data="MetaCLIP 400M (CommonCrawl)",
    papers=(STORI,),
    imagenet_open_clip=76.20,
    imagenet_paper=None,
  ),
)

# SToRI's "OpenCLIP (Cherti et al., 2023)" (section 4.2, Fig. 5) names no architecture or
# tag; Cherti et al. trained these on LAION-2B. ViT-L/14 matches the paper's other models (CLIP
# and MetaCLIP ViT-L/14), ViT-B/16 its CLIP ViT-B/16, ViT-H/14 is their largest ViT. open_clip
# gives the ViT-L/14 tag Inception's mean / std (0.5), the other two OpenAI's (open_clip's
# GELU, not QuickGELU, for all three).
_ENTRIES += (
  ModelEntry(
    name="laion2b-vit-b-16",
    label="OpenCLIP ViT-B/16 (LAION-2B)",
    arch="ViT-B-16",
    pretrained="laion2b_s34b_b88k",
    hf_repo="laion/CLIP-ViT-B-16-laion2B-s34B-b88K",
    data="LAION-2B (34B samples seen)",
    papers=(STORI,),
    imagenet_open_clip=70.23,
    imagenet_paper=None,
  ),
  ModelEntry(
    name="laion2b-vit-l-14",
    label="OpenCLIP ViT-L/14 (LAION-2B)",
    arch="ViT-L-14",
    pretrained="laion2b_s32b_b82k",
    hf_repo="laion/CLIP-ViT-L-14-laion2B-s32B-b82K",
    data="LAION-2B (32B samples seen)",
    papers=(STORI,),
    imagenet_open_clip=75.25,
    imagenet_paper=None,
    mean=INCEPTION_MEAN,
    std=INCEPTION_STD,
  ),
  ModelEntry(
    name="laion2b-vit-h-14",
    label="OpenCLIP ViT-H/14 (LAION-2B)",
    arch="ViT-H-14",
    pretrained="laion2b_s32b_b79k",
    hf_repo="laion/CLIP-ViT-H-14-laion2B-s32B-b79K",
    data="LAION-2B (32B samples seen)",
    papers=(STORI,),
    imagenet_open_clip=77.96,
    imagenet_paper=None,
  ),
)

REGISTRY = {entry.name: entry for entry in _ENTRIES}


def names(paper: str | None = None) -> list[str]:
  """Registered names, in the order above; `paper` ("mutual-knowledge", "stori") filters."""
  return [e.name for e in _ENTRIES if paper is None or paper in e.papers]


def mutual_knowledge_models() -> list[str]:
  """The 13 models of the mutual-knowledge study, in its Table 3 order of families."""
  return names(MUTUAL)


def find(name: str) -> ModelEntry | None:
  """The entry with this registry name or paper label (e.g. 'ViT-B/16-dfn'), else None."""
  if name in REGISTRY:
    return REGISTRY[name]
  return next((e for e in _ENTRIES if e.label == name), None)


def get(name: str) -> ModelEntry:
  entry = find(name)
  if entry is None:
    raise ValueError(
      f"{name!r} is not a registered model. Registered: {', '.join(names())} "
      "(python -m stori_jax.list_models lists them with their local status)."
    )
  return entry
