"""Table 1 and the paper's protocols on the embedded synthetic world (offline default).

python -m mutual.evaluate --config configs/mutual_eval_synthetic.py --workdir workdirs/eval_synthetic

The analysis is configs/mutual_synthetic.py's (the shipped tiny CLIP, the world's 12 few-shot
classes, 16 fresh images each, D = 48 descriptors). The baselines train on 128 other images per
class (seed 1 of the same stream; the evaluation images are seed 0), with q, the learning rate
and the epochs scaled to the tiny model (App. D's ImageNet values: configs/mutual_eval_imagenet.py).
A few minutes on 2 CPU cores.
"""

import ml_collections

from mutual import protocols
from mutual.analyze import analysis_config
from mutual.evaluate import baselines_config, evaluation_config


def get_config():
  config = ml_collections.ConfigDict()
  config.name = "mutual_eval_synthetic"
  config.model = ml_collections.ConfigDict(dict(source="tiny-synthetic", name="tiny-synthetic"))
  config.data = ml_collections.ConfigDict(
    dict(source="synthetic", bank="vocabulary", images_per_class=16, seed=0, classes=())
  )
  # As configs/mutual_synthetic.py: per-image foreground split, k and u scaled to D = 48.
  config.analysis = analysis_config(top_k=24, u=9, joint_foreground=False)
  config.batch_size = 256
  config.evaluation = evaluation_config()
  config.baselines = baselines_config(
    data_overrides=dict(images_per_class=128, seed=1),
    width=64,
    feature_maps=dict(block_size=2),  # 8 x 8 patch grid
    train=dict(epochs=20, learning_rate=3e-3, final_learning_rate=3e-4),
  )
  config.protocols = protocols.protocols_config(table2=dict(added_per_class=3))
  return config
