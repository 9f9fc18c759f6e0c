"""The baselines together: `train_all` trains every one on the same cached features, and
`Baselines` classifies (Table 5, App. D.2's labeler) and explains (Table 1) with them.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from stori_jax.plumbing import paths
from mutual.baselines.bottleneck import MultimodalBottleneck, explain_bottleneck, train_bottleneck
from mutual.baselines.cache import CachedFeatures, flat_tokens
from mutual.baselines.feature_maps import (
  ConceptLabeler,
  explain_feature_maps,
  feature_map_figure,
  train_labeler,
)
from mutual.baselines.fitting import FitSettings, TrainResult
from mutual.baselines.lf_cbm import LabelFreeCBM, lf_cbm_settings, train_lf_cbm
from mutual.baselines.standard import StandardMLP, train_standard


#: Table 1's trained explanations.
NAMES = ("MM-CBM", "MM-ProtoSim", "Feature Maps")
#: Table 5's trained classifiers, in its order.
CLASSIFIERS = ("Standard", "LF-CBM", "MM-CBM", "MM-ProtoSim")
#: `Baselines.classify`'s key for the Feature Maps concept labeler's scores (App. D.2).
LABELER = "Concept labeler"
#: Each baseline's folder under `train_all`'s workdir (its checkpoints).
FOLDERS = {
  "MM-CBM": "mm_cbm",
  "MM-ProtoSim": "mm_protosim",
  "Feature Maps": "feature_maps",
  "Standard": "standard",
  "LF-CBM": "lf_cbm",
}


@functools.partial(jax.jit, static_argnames=("model",))
def _apply_logits(model, params, *inputs):
  out = model.apply({"params": params}, *inputs)
  return out[0] if isinstance(out, tuple) else out


@dataclasses.dataclass
class Baselines:
  """The trained baselines: models, parameters and training records (standard and lf_cbm:
  None when the training images came without embeddings)."""

  cbm: tuple[MultimodalBottleneck, TrainResult]
  protosim: tuple[MultimodalBottleneck, TrainResult]
  labeler: tuple[ConceptLabeler, TrainResult]
  standard: tuple[StandardMLP, TrainResult] | None = None
  lf_cbm: tuple[LabelFreeCBM, dict] | None = None

  def classify(self, tokens, embeddings, descriptor_embeddings) -> dict[str, np.ndarray]:
    """Table 5's classifiers and App. D.2's labeler on B images.

    Args:
      tokens: float [B, h, w, C] patch features; embeddings: float [B, E] image embeddings,
        unnormalised (`encode_features`); descriptor_embeddings: float [D, E'].

    Returns:
      {row of CLASSIFIERS that was trained: logits float32 [B, C]; LABELER: the labeler's
      descriptor logits float32 [B, D] on the whole feature map (every token, no DropBlock)}.
    """
    flat = flat_tokens(tokens)
    descriptors = jnp.asarray(descriptor_embeddings, jnp.float32)
    out = {}
    if self.standard is not None:
      model, result = self.standard
      out["Standard"] = _apply_logits(model, result.params, jnp.asarray(embeddings, jnp.float32))
    if self.lf_cbm is not None:
      out["LF-CBM"] = self.lf_cbm[0].logits(embeddings)
    for name, (model, result) in (("MM-CBM", self.cbm), ("MM-ProtoSim", self.protosim)):
      out[name] = _apply_logits(model, result.params, flat, descriptors)
    model, result = self.labeler
    out[LABELER] = _apply_logits(model, result.params, flat, jnp.ones(flat.shape[:2], jnp.float32))
    return {k: np.asarray(v, np.float32) for k, v in out.items()}

  def explain(self, tokens, descriptor_embeddings, predicted, config) -> dict[str, dict]:
    """{baseline name: explanation dict} for B images (config: config.baselines)."""
    n = int(config.n_concepts)
    out = {}
    for name, (model, result) in (("MM-CBM", self.cbm), ("MM-ProtoSim", self.protosim)):
      out[name] = explain_bottleneck(
        model,
        result.params,
        tokens,
        descriptor_embeddings,
        predicted,
        n,
        float(config.region_threshold),
      )
    model, result = self.labeler
    out["Feature Maps"] = explain_feature_maps(
      model,
      result.params,
      tokens,
      n,
      float(config.feature_maps.threshold),
      bool(config.feature_maps.skip_object),
    )
    return out

  def feature_map_figure(self, tokens, config) -> dict[str, np.ndarray]:
    """App. D.2's Fig. 6 for B images (patch features float [B, h, w, C]; config:
    config.baselines): the object's channel and the Feature Maps concepts, labelled by the
    labeler whose scores give Table 5's top-all / top-10 (`classify`'s LABELER)."""
    model, result = self.labeler
    return feature_map_figure(
      model,
      result.params,
      tokens,
      int(config.n_concepts),
      float(config.feature_maps.threshold),
    )

  def training_summary(self) -> dict[str, dict]:
    """Per baseline: steps, first and last losses (mean of 10 steps), seconds; LF-CBM: its
    training record (`train_lf_cbm`)."""
    out = {}
    trained = [(NAMES[0], self.cbm), (NAMES[1], self.protosim), (NAMES[2], self.labeler)]
    if self.standard is not None:
      trained.append(("Standard", self.standard))
    for name, (_, r) in trained:
      k = min(10, len(r.losses))
      out[name] = dict(
        steps=int(len(r.losses)),
        first_loss=float(r.losses[:k].mean()) if k else float("nan"),
        last_loss=float(r.losses[-k:].mean()) if k else float("nan"),
        seconds=round(float(r.seconds), 3),
      )
    if self.lf_cbm is not None:
      out["LF-CBM"] = dict(self.lf_cbm[1])
    return out


def train_all(
  cached: CachedFeatures,
  descriptor_embeddings: np.ndarray,
  targets: np.ndarray,
  config,
  progress: bool = True,
  workdir: str | None = None,
) -> Baselines:
  """Trains MM-CBM, MM-ProtoSim and the Feature Maps labeler, and, when `cached` holds image
  embeddings, Table 5's Standard MLP (hidden width q) and LF-CBM (config: config.baselines).

  workdir: where each keeps its checkpoints, <workdir>/<FOLDERS[name]>/checkpoints (a rerun
  resumes from them; LF-CBM keeps its finished model, <workdir>/lf_cbm/lf_cbm.npz); None: no
  checkpoint.
  """
  lf_settings = lf_cbm_settings(config)  # refused before any training

  def folder(name):
    return None if workdir is None else paths.join(workdir, FOLDERS[name])

  settings = FitSettings.from_config(config.train)
  num_classes = int(targets.shape[0])
  cbm = train_bottleneck(
    cached,
    descriptor_embeddings,
    num_classes,
    settings,
    attention="softmax",
    width=int(config.width),
    workdir=folder("MM-CBM"),
  )
  protosim = train_bottleneck(
    cached,
    descriptor_embeddings,
    num_classes,
    settings,
    attention="gumbel",
    width=int(config.width),
    temperature=float(config.gumbel_temperature),
    workdir=folder("MM-ProtoSim"),
  )
  fm = config.feature_maps
  labeler = train_labeler(
    cached,
    targets,
    dataclasses.replace(settings, epochs=int(fm.get("epochs", settings.epochs))),
    drop_rate=float(fm.drop_rate),
    block_size=int(fm.block_size),
    workdir=folder("Feature Maps"),
  )
  if cached.embeddings is None:
    return Baselines(cbm, protosim, labeler)
  standard = train_standard(
    cached, num_classes, settings, hidden=int(config.width), workdir=folder("Standard")
  )
  lf_cbm = train_lf_cbm(
    cached,
    descriptor_embeddings,
    num_classes,
    lf_settings,
    seed=settings.seed,
    progress=progress,
    workdir=folder("LF-CBM"),
  )
  return Baselines(cbm, protosim, labeler, standard, lf_cbm)
