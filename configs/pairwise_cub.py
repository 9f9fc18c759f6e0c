"""SToRI Fig. 3 on CUB-200-2011: Blue headed Vireo against Warbling Vireo and against White eyed
Vireo, two-class text classifiers whose prompts come from each class's attribute labels.

  python -m stori_jax.contrast --config configs/pairwise_cub.py \
      --config.data.root=/data/CUB_200_2011 --workdir workdirs/pairwise_cub

data.root is the unpacked CUB_200_2011 folder (https://data.caltech.edu/records/65de6-vp158:
CUB_200_2011.tgz); without it the command says what to download and where, before any model
loads. The paper names the classes, CLIP ViT-L/14 and reweighting from block 7; it does not say
how the prompts are phrased, how many attributes a class states, or the training settings of
this figure. Here (stori_jax.fewshot.pairwise_contrast): the attributes labelled on at least half of a
class's training images, at most 10, most frequent first, one prompt each, "a photo of
{a_name}, a type of bird, which has {attribute}." ("a photo of a Warbling Vireo, a type of
bird, which has grey wing."); all of each class's training images (the official split, ~30),
tested on its test images; the paper's few-shot training (App. A.1): Adam at CLIP's 5e-2 on
TaskRes's scheme (a warm-up epoch at 1e-5, then a cosine stepped per epoch), 200 epochs, a
fresh augmented view of every image at every step.
"""

import ml_collections

from stori_jax.fewshot.pairwise_contrast import CUB_TEMPLATE, base_config


def get_config():
  config = base_config()
  config.name = "pairwise_cub"
  config.model = ml_collections.ConfigDict(
    dict(source="openai/clip-vit-large-patch14", arch="")
  )  # or a local checkpoint path
  config.data = ml_collections.ConfigDict(
    dict(
      source="cub",
      root="",
      anchor="Blue_headed_Vireo",
      others=("Warbling_Vireo", "White_eyed_Vireo"),
      shots=0,  # 0: every training image of the class (the official split); K: a K-shot sample
    )
  )
  config.prompts.template = CUB_TEMPLATE
  config.prompts.per_class = 10
  config.prompts.min_share = 0.5
  return config
