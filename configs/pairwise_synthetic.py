"""SToRI Fig. 3 on the embedded world (offline): two-class classifiers whose prompts come from
the classes' attribute labels, one class contrasted with two others.

  python -m stori_jax.contrast --config configs/pairwise_synthetic.py \
      --workdir workdirs/pairwise_synthetic

The analogue of the paper's pairs: "red striped star" (Blue headed Vireo) against "red dotted
star" (Warbling Vireo: another pattern, so the stripes tell them apart) and against "orange
striped star" (White eyed Vireo, "which also has striped wings": the same pattern, another
colour). Each class's prompts state the attributes labelled on at least three quarters of its
16 training images: its colour, pattern and shape (the size and background are random per
image), one prompt each. The tiny CLIP, 100 epochs of Adam at 0.05 on the paper's scheme
(TaskRes's: a warm-up epoch, then a cosine per epoch): about a minute on two CPU cores (most of
it compiling).
"""

import ml_collections

from stori_jax.fewshot.pairwise_contrast import base_config


def get_config():
  config = base_config()
  config.name = "pairwise_synthetic"
  config.model = ml_collections.ConfigDict(dict(source="tiny-synthetic", arch=""))
  config.data = ml_collections.ConfigDict(
    dict(
      source="synthetic",
      root="",
      anchor="red striped star",
      others=("red dotted star", "orange striped star"),
      shots=16,
      n_test_per_class=50,
      image_size=64,
    )
  )
  config.prompts.template = "a photo of {a_name}, which has {attribute}."
  config.prompts.per_class = 10
  # Three quarters of the images: the class's colour, pattern and shape (every image); a size
  # reaches it by chance in about one class of 13 (16 images; random per image).
  config.prompts.min_share = 0.75
  # Not the paper's fresh view per step: 4 flipped views per image encoded once, the fast
  # approximation (docs/fewshot.md), as configs/demo.py.
  config.views = 4
  # Flips only, as configs/demo.py: crops cut the world's small objects off.
  config.augment_scale = (1.0, 1.0)
  config.epochs = 100
  config.optim.lr = 0.05
  return config
