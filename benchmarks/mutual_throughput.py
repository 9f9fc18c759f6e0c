r"""Images per second of the mutual-knowledge analysis: this JAX pipeline vs a per-image one.

  python benchmarks/mutual_throughput.py                       # tiny-synthetic's architecture, CPU
  python benchmarks/mutual_throughput.py --arch ViT-B-16 --images 50 --descriptors 4229   # GPU

Both sides get the same random weights (stori_jax.parity.random_pair: an open_clip model and the
converted bundle), the same B images of one class, the same descriptor / class embeddings (encoded
once, outside the timing) and the same settings (tokens, joint spectral split, PCA and K-means
with L = 5, k, relevance mean - 0.02, Sinkhorn, top 3, u). The reference side follows the
reference code's structure with its libraries: PyTorch for the towers, the SVD and the 1,000-round
Sinkhorn loop; scikit-learn for PCA, MinMaxScaler and K-means; OpenCV for connected components,
contours, fitEllipse, ellipse drawing, grayscale and the Gaussian blur; python sets and numpy for
the intersection and MI. Images go through it one by one from the visual prompts on, as there.
The dense CRF is off on both sides (its reference library, SimpleCRF, has no wheel here).
The JAX side is timed after one warm-up call on other images of the same shape (compilation
excluded); one timed run each; the figure is the ratio of images per second.
"""

from __future__ import annotations

import json
import time

import cv2
import jax
import numpy as np
import torch
from absl import app, flags
from sklearn.cluster import KMeans
from sklearn.decomposition import PCA
from sklearn.preprocessing import MinMaxScaler

import stori_jax
from mutual import pipeline, report
from mutual.paper_config import analysis_config
from stori_jax.data import synthetic
from stori_jax.encoding import l2_normalize
from stori_jax.parity import random_pair

flags.DEFINE_string("arch", "", "open_clip architecture; empty: the tiny-synthetic model's config.")
flags.DEFINE_integer("images", 16, "B, the images of the class.")
flags.DEFINE_integer("descriptors", 500, "D, the size of the descriptor bank.")
flags.DEFINE_integer("classes", 100, "C, zero-shot classes.")
flags.DEFINE_integer("top_k", 0, "k of the intersection (0: D / 8, at most 500).")
flags.DEFINE_integer("u", 50, "Language-side descriptors.")
flags.DEFINE_string("json", None, "Also write the figures here.")
FLAGS = flags.FLAGS

L = 5


# ---------------------------------------------------------------------------------------------
# Per-image reference implementation (PyTorch, scikit-learn, OpenCV).


def _tokens(model, x):
  """Last-block residual tokens without CLS, float32 [B, h*w, W], via a forward hook."""
  store = []
  handle = model.visual.transformer.register_forward_hook(lambda m, i, o: store.append(o))
  with torch.no_grad():
    features = model.encode_image(x)
  handle.remove()
  tokens = store[0]
  if tokens.shape[0] != x.shape[0]:  # sequence-first transformer
    tokens = tokens.permute(1, 0, 2)
  return features, tokens[:, 1:].float()


def _largest_components(mask):
  count, labels, stats, _ = cv2.connectedComponentsWithStats(mask.astype(np.uint8), connectivity=8)
  if count <= 1:
    return np.zeros_like(mask, bool)
  areas = stats[1:, cv2.CC_STAT_AREA]
  order = np.argsort(-areas, kind="stable")
  keep = labels == order[0] + 1
  if len(order) > 1 and areas[order[1]] >= 5:
    keep |= labels == order[1] + 1
  return keep


def _prompts(image, region):
  contours, _ = cv2.findContours(region.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)
  contour = max(contours, key=cv2.contourArea)
  if len(contour) < 5:
    contour = np.concatenate([contour] * 5)
  ellipse = cv2.fitEllipse(contour)
  red = image.copy()
  cv2.ellipse(red, ellipse, (255, 0, 0), 1)
  inside = np.zeros_like(image)
  cv2.ellipse(inside, ellipse, (255, 255, 255), -1)
  gray = np.repeat(cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)[:, :, None], 3, axis=2)
  gray = np.where(inside != 0, image, gray)
  cv2.ellipse(gray, ellipse, (255, 0, 0), 1)
  blur = np.where(inside != 0, image, cv2.GaussianBlur(image, (11, 11), 0))
  cv2.ellipse(blur, ellipse, (255, 0, 0), 1)
  return [red, gray, blur]


def _sinkhorn(logits, iterations=1000):
  p = torch.exp(logits)
  for _ in range(iterations):
    p = p / p.sum(dim=1, keepdim=True)
    p = p / p.sum(dim=0, keepdim=True)
  return p


def _mi(x, y):
  table = np.array([[1.0 if a == b else 0.0 for b in y] for a in x])
  if table.sum() == 0:
    return 0.0
  p = table / table.sum()
  return float(np.log(len(x)) + np.log(len(y)) - np.sum(p * np.log(p + 1e-9)))


def reference_class(model, images, mean, std, desc, classes, k, u):
  """The analysis of one class's images, the reference's way; returns per-image AUCs."""
  to_tensor = lambda a: torch.from_numpy(((a / 255.0 - mean) / std).astype(np.float32)).permute(
    0, 3, 1, 2
  )  # noqa: E731
  desc_t, classes_t = torch.from_numpy(desc), torch.from_numpy(classes)
  features, tokens = _tokens(model, to_tensor(images))
  image_emb = torch.nn.functional.normalize(features, dim=-1)
  predicted = (image_emb @ classes_t.T).argmax(-1)
  b, n, width = tokens.shape
  side = int(round(n**0.5))
  flat = torch.nn.functional.normalize(tokens.reshape(-1, width), dim=-1)
  second = torch.linalg.svd(flat, full_matrices=False)[0][:, 1].numpy()
  if 0.5 < np.mean(second > 0) < 1.0:
    second = -second
  fg = np.stack([_largest_components(m) for m in (second >= 0).reshape(b, side, side)])
  raw = tokens.numpy().reshape(b, side, side, width)
  fg_tokens = raw[fg]
  maps = {}
  pca = MinMaxScaler(clip=True).fit_transform(PCA(n_components=L).fit_transform(fg_tokens))
  maps["pca"] = pca.argmax(-1)
  unit = fg_tokens / np.linalg.norm(fg_tokens, axis=-1, keepdims=True)
  maps["kmeans"] = KMeans(n_clusters=L, n_init=10, random_state=0).fit_predict(unit)
  size = images.shape[1]
  weights = classes_t @ desc_t.T
  aucs = []
  for method, labels in maps.items():
    grid = np.full((b, side, side), -1)
    grid[fg] = labels
    for i in range(b):  # per image, as the reference
      pixels = cv2.resize(grid[i].astype(np.float32), (size, size), interpolation=cv2.INTER_NEAREST)
      prompts = [
        p for c in range(L) if (pixels == c).any() for p in _prompts(images[i], pixels == c)
      ]
      if not prompts:
        aucs.append(0.0)
        continue
      with torch.no_grad():
        emb = torch.nn.functional.normalize(
          model.encode_image(to_tensor(np.stack(prompts))), dim=-1
        )
      emb = emb.reshape(-1, 3, emb.shape[-1]).mean(1)
      logits = emb @ desc_t.T
      common = set(torch.topk(logits[0], k).indices.tolist())
      for row in logits[1:]:
        common &= set(torch.topk(row, k).indices.tolist())
      common = torch.tensor(sorted(common), dtype=torch.long)
      relevance = image_emb[i] @ desc_t[common].T
      common = common[relevance > relevance.mean() - 0.02]
      if len(common) == 0:
        aucs.append(0.0)
        continue
      plan = _sinkhorn(2.5 * logits[:, common])
      top = plan.topk(min(3, len(common)), dim=-1).indices
      chosen = list(dict.fromkeys(int(common[j]) for j in top.reshape(-1)))
      scores = (image_emb[i] @ desc_t[chosen].T).tolist()
      ordered = [d for _, d in sorted(zip(scores, chosen), key=lambda t: -t[0])]
      language = torch.topk(weights[predicted[i]], u).indices.tolist()
      curve = [_mi(ordered, language)]
      for t in range(len(ordered)):
        ordered[t] = -1
        curve.append(_mi(ordered, language))
      aucs.append(float(np.mean(curve)))
  return aucs


# ---------------------------------------------------------------------------------------------


def main(argv):
  del argv
  if FLAGS.arch:
    arch = FLAGS.arch
  else:
    arch = stori_jax.load("tiny-synthetic").config
  model, bundle = random_pair(arch)
  model = model.eval()
  size = int(bundle.config.vision.image_size)
  embed = int(bundle.config.embed_dim)
  rng = np.random.default_rng(0)
  # Normalised in float64, as drawn, then stored as float32.
  desc = l2_normalize(rng.normal(size=(FLAGS.descriptors, embed)), dtype=np.float64)
  classes = l2_normalize(rng.normal(size=(FLAGS.classes, embed)), dtype=np.float64)
  desc, classes = desc.astype(np.float32), classes.astype(np.float32)
  bank = pipeline.TextBank(
    tuple(f"d{i}" for i in range(len(desc))),
    desc,
    tuple(f"c{i}" for i in range(len(classes))),
    classes,
  )
  k = FLAGS.top_k or min(500, max(3, FLAGS.descriptors // 8))
  analysis = analysis_config(
    crf=False, top_k=k, u=min(FLAGS.u, FLAGS.descriptors), solver="reference"
  )
  warm = synthetic.generate(FLAGS.images, (31, 0), image_size=size, max_objects=1).images
  timed = synthetic.generate(FLAGS.images, (31, 1), image_size=size, max_objects=1).images
  mean = np.asarray(bundle.preprocess_config.mean, np.float32)
  std = np.asarray(bundle.preprocess_config.std, np.float32)

  def run_jax(images):
    out = pipeline.analyze_class(bundle, images, bank, analysis)
    return jax.block_until_ready(out["pca"]["curve"])

  run_jax(warm)
  start = time.perf_counter()
  run_jax(timed)
  jax_seconds = time.perf_counter() - start
  torch.set_num_threads(max(1, torch.get_num_threads()))
  start = time.perf_counter()
  reference_class(model, timed, mean, std, desc, classes, k, analysis.u)
  ref_seconds = time.perf_counter() - start
  figures = dict(
    arch=arch if isinstance(arch, str) else "tiny-synthetic config",
    device=str(jax.devices()[0]),
    images=FLAGS.images,
    descriptors=FLAGS.descriptors,
    top_k=k,
    jax_images_per_s=round(FLAGS.images / jax_seconds, 3),
    reference_images_per_s=round(FLAGS.images / ref_seconds, 3),
    speedup=round(ref_seconds / jax_seconds, 2),
  )
  print(json.dumps(figures, indent=1))
  if FLAGS.json:
    report.write_json(FLAGS.json, figures)


if __name__ == "__main__":
  app.run(main)
