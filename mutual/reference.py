"""The mutual-knowledge analysis image by image on the reference code's own libraries.

A straightforward per-image pipeline that follows the authors' code (fawazsammani/
clip-interpret-mutual-knowledge, utils.py) step by step, to check `mutual.pipeline` against:

  * PyTorch: the vision tower (an open_clip model; `open_clip_from_bundle` copies a bundle's
    weights into one), the features read by hooks (the last block's residual tokens, or its keys
    as ln_1(x) W_k^T without bias), `torch.linalg.svd` for the spectral split, the 1,000-round
    Sinkhorn loop, top-k and the descriptor scores;
  * OpenCV: connected components, the upsampled masks (cv2.resize, nearest), findContours,
    contourArea, fitEllipse, ellipse drawing, RGB2GRAY and GaussianBlur;
  * scikit-learn: PCA (with the sign rule of releases before 1.5 applied explicitly, so any
    release gives the reference's labels) and MinMaxScaler;
  * kmeans_pytorch: the reference's K-means (PyPI's 0.3 with the two changes of the GitHub
    code the authors call, or that code itself: `kmeans_labels`);
  * SimpleCRF (`denseCRF.densecrf`): the dense CRF, with the reference's one-hot unary.

The images go through one at a time from the CRF on, as in the reference; the spectral split and
the concepts are fitted over all B images jointly, as there. The text side is the caller's
encoded descriptors and classes (the reference loads them as precomputed linear classifiers).

Where the reference is random or undefined, both sides share one deterministic rule (docs/
design.md, "Analysis modes"):
  * K-means: kmeans_pytorch draws its start from numpy's global generator and an empty
    cluster's new centre from torch's, both unseeded in the reference; both are seeded with
    `kmeans_seed` (np.random.seed, torch.manual_seed) right before the class's call;
  * contours under 5 points are padded as utils.py pads them, from Python's `random`, and
    OpenCV's fits that move points by cv::theRNG() (a 5-point direct fit whose determinant is
    round-off, a degenerate least-squares fit) draw from theRNG: both generators are seeded with
    `ellipse_seed` (random.seed, cv2.setRNGSeed) anew before each image's concepts of each
    method (the reference draws from the unseeded global generator and from theRNG's state of
    the moment, which every earlier fit of the process moves). Where the reference raises (the
    padding's randint(0, -1) on a last point with a 0 coordinate, which reads no word here, or
    a box whose size is not a number, which cv2.ellipse refuses): a zero-size ellipse at the
    centroid of the contour points (mutual.ellipse's rule);
  * PCA: the exact SVD (svd_solver="full"); scikit-learn before 1.5 switched to an unseeded
    randomized SVD above 500 x 500 inputs, whose axes agree with the exact ones;
  * ties in the transport plan (e.g. the uniform row of a single concept): the entries of a row
    within 1e-4 of each other (relative to the row's maximum, in the same buckets as
    mutual.transport.top_descriptors) are ordered by raw score;
  * a CRF that removes the whole foreground keeps the unrefined mask, and an image without
    candidates gets an empty visual set (MI 0), where the reference would fail.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import random
from typing import Any, Callable, Mapping, Sequence

import cv2
import jax
import numpy as np
import torch
import torch.nn.functional as F
from sklearn.decomposition import PCA
from sklearn.preprocessing import MinMaxScaler

from stori_jax.checkpoints import openai
from stori_jax.reference import clip_towers

#: The reference's SimpleCRF parameters: (bilateral weight, spatial sigma, RGB sigma, Gaussian
#: weight, Gaussian sigma, iterations).
CRF_PARAMS = (10.0, 40.0, 13.0, 3.0, 3.0, 5.0)
#: utils.get_label_colors' first colours: concept l is drawn in LABEL_COLORS[l], and the
#: reference visits the concepts of an image in np.unique order of their colours.
LABEL_COLORS = (
  (255, 0, 0),
  (0, 255, 0),
  (0, 0, 255),
  (255, 255, 0),
  (255, 165, 0),
  (255, 192, 203),
  (160, 32, 240),
  (0, 255, 255),
)
#: Relative width of a tie in a transport-plan row (mutual.transport.top_descriptors).
TIE_TOLERANCE = 1e-4


def have_crf() -> bool:
  """SimpleCRF (`import denseCRF`) is importable."""
  try:
    import denseCRF  # noqa: F401  # optional: SimpleCRF, built by make install (checked)
  except ImportError:
    return False
  return True


# ---------------------------------------------------------------------------------------------
# The torch model


def open_clip_from_bundle(bundle):
  """An open_clip CLIP (eval mode, float32) holding a bundle's weights.

  The inverse of stori_jax.checkpoints.openai.params_from_state_dict, found by converting a
  state dict whose entries are their own element ids: each param element then names the state
  dict element it came from.
  """
  model = clip_towers.build(bundle.config, "open_clip")
  state = model.state_dict()
  ids, start = {}, 1
  for key, value in state.items():
    ids[key] = np.arange(start, start + value.numel(), dtype=np.float64).reshape(value.shape)
    start += value.numel()
  if start >= 2**24:
    raise ValueError("open_clip_from_bundle maps models below 2^24 weights (float32 ids).")
  mapped = openai.params_from_state_dict(ids, bundle.config, "element ids")
  values = {
    jax.tree_util.keystr(path): np.asarray(leaf, np.float64)
    for path, leaf in jax.tree_util.tree_leaves_with_path(bundle.params)
  }
  table = np.full(start, np.nan)
  for path, leaf in jax.tree_util.tree_leaves_with_path(mapped):
    index = np.rint(np.asarray(leaf, np.float64)).astype(np.int64).ravel()
    table[index] = values[jax.tree_util.keystr(path)].ravel()
  weights = {}
  for key, value in state.items():
    filled = np.asarray(table[ids[key].astype(np.int64)])
    if np.isnan(filled).any():  # buffers the bundle does not hold (the attention mask)
      weights[key] = value
      continue
    weights[key] = torch.from_numpy(filled.astype(np.float32))
  model.load_state_dict(weights)
  return model.float().eval()


def to_tensor(images: np.ndarray, mean, std) -> torch.Tensor:
  """uint8 [B, S, S, 3] -> float32 NCHW, as ToTensor and Normalize compute it."""
  x = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float() / 255.0
  mean = torch.tensor(np.asarray(mean, np.float32)).view(1, 3, 1, 1)
  std = torch.tensor(np.asarray(std, np.float32)).view(1, 3, 1, 1)
  return (x - mean) / std


def shown_uint8(x: torch.Tensor, mean, std) -> np.ndarray:
  """utils.show_image then (x * 255).astype(uint8): float32 NCHW -> uint8 [B, S, S, 3]."""
  pixels = x.cpu().numpy().transpose(0, 2, 3, 1)
  back = np.asarray(std, np.float64) * pixels + np.asarray(mean, np.float64)
  return np.ascontiguousarray((back.clip(0, 1) * 255).astype(np.uint8))


def tower_features(model, x: torch.Tensor, kind: str = "tokens"):
  """(embeddings float32 [B, E] unnormalised, patch features float32 [B, h*w, D]) of one pass.

  tokens: the residual stream after the last block (a hook on the transformer), CLS dropped;
  keys: the last block's attention input (ln_1 output) times the key rows of in_proj_weight,
  no bias (the reference's Extractor).
  """
  visual = model.visual
  store = []
  if kind == "tokens":
    handle = visual.transformer.register_forward_hook(lambda m, i, o: store.append(o))
  elif kind == "keys":
    attn = visual.transformer.resblocks[-1].attn
    width = attn.in_proj_weight.shape[1]
    key_rows = attn.in_proj_weight[width : 2 * width]
    handle = attn.register_forward_hook(lambda m, i, o: store.append(i[1] @ key_rows.T))
  else:
    raise ValueError(f"kind must be 'tokens' or 'keys', got {kind!r}.")
  try:
    with torch.no_grad():
      embeddings = model.encode_image(x)
  finally:
    handle.remove()
  features = store[0]
  if features.shape[0] != x.shape[0]:  # a sequence-first transformer
    features = features.permute(1, 0, 2)
  return embeddings.float(), features[:, 1:].float()


# ---------------------------------------------------------------------------------------------
# Vision stages


def _largest_component(mask: np.ndarray) -> np.ndarray:
  """utils.get_largest_cc: the largest 8-connected component (ties: the first in raster order)."""
  count, labels = cv2.connectedComponents(mask.astype(np.uint8), connectivity=8)
  if count <= 1:
    return np.zeros(mask.shape, bool)
  sizes = np.bincount(labels.ravel())[1:]
  return labels == int(np.argmax(sizes)) + 1


def main_regions(mask: np.ndarray, min_second: int = 5) -> np.ndarray:
  """The reference's foreground of one image: the largest component, plus the second largest
  when it has at least min_second patches."""
  first = _largest_component(mask)
  second = _largest_component(mask & ~first)
  return first | second if second.sum() >= min_second else first


def spectral_foreground(tokens: torch.Tensor, side: int, joint: bool = True) -> np.ndarray:
  """utils.get_pca_features(foreground_method='svd') and get_foreground_background_indices:
  the second left singular vector of the L2-normalised tokens, negated when its positive share
  lies in (0.5, 1), patches >= 0 kept, then per image the main regions. bool [B, h, w]."""
  batch, count, _ = tokens.shape

  def second_vector(rows):
    u = torch.linalg.svd(F.normalize(rows, p=2, dim=-1), full_matrices=False)[0][:, 1]
    u = u.cpu().numpy()
    return -u if 0.5 < np.mean(u > 0) < 1.0 else u

  if joint:
    second = second_vector(tokens.reshape(batch * count, -1)).reshape(batch, count)
  else:
    second = np.stack([second_vector(t) for t in tokens])
  split = (second >= 0).reshape(batch, side, side)
  return np.stack([main_regions(m) for m in split])


def pca_labels(fg_tokens: np.ndarray, n_concepts: int, sign_rule: str = "sklearn<1.5"):
  """utils.get_component_feats and the argmax of get_pca_part_segments: int [N] labels.

  scikit-learn before 1.5 made the largest-magnitude score of each component positive
  (svd_flip on U); the rule is applied here whatever the installed release ("sklearn>=1.5"
  applies that release's rule: the largest-magnitude entry of each component positive)."""
  pca = PCA(n_components=n_concepts, svd_solver="full").fit(fg_tokens)
  projected = pca.transform(fg_tokens)
  if sign_rule == "sklearn<1.5":
    pivot = projected[np.argmax(np.abs(projected), axis=0), np.arange(n_concepts)]
  elif sign_rule == "sklearn>=1.5":
    components = pca.components_
    pivot = components[np.arange(n_concepts), np.argmax(np.abs(components), axis=1)]
  else:
    raise ValueError(f"unknown sign rule {sign_rule!r}")
  projected = projected * np.where(pivot < 0, -1.0, 1.0)
  scaled = MinMaxScaler(clip=True).fit_transform(projected)
  return scaled.argmax(axis=-1)


#: utils.kmeans_clustering's iter_limit.
KMEANS_ITER_LIMIT = 500


class _IterLimit(Exception):
  """Stops kmeans_pytorch 0.3's loop at the authors' iter_limit (`kmeans_labels`)."""


def kmeans_labels(fg_tokens: torch.Tensor, n_concepts: int, seed: int = 0, stats=None):
  """utils.kmeans_clustering under the seeding protocol: np.random.seed(seed) and
  torch.manual_seed(seed), then kmeans_pytorch on the L2-normalised tokens as the authors call
  it (euclidean, iter_limit 500): the start from numpy's global generator, an empty cluster's
  new centre from torch's. int [N] labels.

  The authors' call (tqdm_flag, iter_limit) needs kmeans_pytorch from GitHub, whose loop also
  moves a centre left without tokens to `X[torch.randint(len(X), (1,))]`. PyPI's release 0.3
  has neither (the centre would become NaN and the loop has no limit); with it, both are
  added here as GitHub's code has them: the empty cluster's row drawn by the same
  torch.randint, the loop stopped after 500 iterations with that iteration's assignments.
  stats["empty_clusters"] counts the redraws."""
  import kmeans_pytorch  # optional: the mutual extra

  unit = F.normalize(fg_tokens, p=2, dim=-1)
  original_index_select = torch.index_select
  legacy = "iter_limit" not in inspect.signature(kmeans_pytorch.kmeans).parameters

  def index_select(x, dim, index):
    if index.numel() == 0 and x.data_ptr() == unit.data_ptr():
      if stats is not None:
        stats["empty_clusters"] = stats.get("empty_clusters", 0) + 1
      if legacy:  # GitHub's kmeans_pytorch: selected = X[torch.randint(len(X), (1,))]
        return x[torch.randint(len(x), (1,))]
    return original_index_select(x, dim, index)

  patches = [(torch, "index_select", index_select)]
  if legacy:
    last = {}
    distance = kmeans_pytorch.pairwise_distance

    def pairwise_distance(*args, **kwargs):
      last["distances"] = distance(*args, **kwargs)
      return last["distances"]

    class Meter:  # kmeans_pytorch 0.3's tqdm: update() ends each iteration
      def __init__(self, *args, **kwargs):
        self.iterations = 0

      def set_postfix(self, *args, **kwargs):
        pass

      def update(self):
        self.iterations += 1
        if self.iterations >= KMEANS_ITER_LIMIT:
          raise _IterLimit

    patches += [(kmeans_pytorch, "pairwise_distance", pairwise_distance)]
    patches += [(kmeans_pytorch, "tqdm", Meter)]
    kwargs = {}
  else:
    kwargs = dict(tqdm_flag=False, iter_limit=KMEANS_ITER_LIMIT)
  originals = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
  for owner, name, value in patches:
    setattr(owner, name, value)
  try:
    # The protocol: both global generators seeded right before the authors' call.
    np.random.seed(seed)
    torch.manual_seed(seed)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
      labels, _ = kmeans_pytorch.kmeans(
        X=unit, num_clusters=n_concepts, distance="euclidean", device=unit.device, **kwargs
      )
  except _IterLimit:
    labels = torch.argmin(last["distances"], dim=1)
  finally:
    for owner, name, value in originals:
      setattr(owner, name, value)
  return labels.cpu().numpy()


def crf_mask(image: np.ndarray, mask: np.ndarray) -> np.ndarray:
  """utils.get_foreground_crf_map: SimpleCRF on the one-hot mask; bool [S, S] (label != 0)."""
  import denseCRF  # optional: SimpleCRF, built by make install

  unary = np.eye(2, dtype=np.float32)[mask.astype(np.int64)]
  out = denseCRF.densecrf(np.ascontiguousarray(image), unary, CRF_PARAMS)
  return out != 0


def ellipse_box(region: np.ndarray, rng: random.Random | None = None):
  """The reference's ellipse of a concept region: fitEllipse on the outer contour of largest
  contourArea, a contour under 5 points first padded with rng.randint(0, last - 1) per
  coordinate of each missing point (`rng`: the reference's `random`, seeded; None: no padding).
  fitEllipse is called once, as the reference calls it: where it moves points, it draws from
  cv::theRNG() (the caller seeds it). The shared rule (a zero-size ellipse at the contour
  points' centroid) where the padding raises (no word read), there is no padding, or the box's
  size is not a number."""
  contours, _ = cv2.findContours(region.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)
  contour = max(contours, key=cv2.contourArea)
  points = contour[:, 0]
  center = points.sum(axis=0).astype(np.float32) / np.float32(len(points))
  zero = (float(center[0]), float(center[1])), (0.0, 0.0), 0.0
  if len(points) < 5:
    if rng is None:
      return zero
    last_x, last_y = (int(v) for v in points[-1])
    if min(last_x, last_y) < 1:  # randint(0, -1): the reference stops here
      return zero
    extra = [
      [rng.randint(0, last_x - 1), rng.randint(0, last_y - 1)] for _ in range(5 - len(points))
    ]
    contour = np.concatenate([contour, np.asarray(extra, np.int32)[:, None]])
  box = cv2.fitEllipse(contour)
  if np.isnan(box[1]).any():  # cv2.ellipse refuses it: the reference stops here
    return zero
  return box


def prompts(image: np.ndarray, box) -> list[np.ndarray]:
  """utils.draw_circle_on_components_with_augments for one concept: red ellipse; grayscale
  outside the filled ellipse; 11 x 11 blur outside; each with the red stroke."""
  red = image.copy()
  cv2.ellipse(red, box, (255, 0, 0), 1)
  inside = np.zeros_like(image)
  cv2.ellipse(inside, box, (255, 255, 255), -1)
  gray = np.tile(cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)[:, :, None], (1, 1, 3))
  gray = np.ascontiguousarray(np.where(inside != 0, image, gray))
  cv2.ellipse(gray, box, (255, 0, 0), 1)
  blur = np.ascontiguousarray(np.where(inside != 0, image, cv2.GaussianBlur(image, (11, 11), 0)))
  cv2.ellipse(blur, box, (255, 0, 0), 1)
  return [red, gray, blur]


def concept_order(pixel_map: np.ndarray) -> list[int]:
  """The concepts present in a pixel map, in the reference's order (np.unique of colours)."""
  present = [int(c) for c in np.unique(pixel_map) if c >= 0]
  return sorted(present, key=lambda c: LABEL_COLORS[c])


# ---------------------------------------------------------------------------------------------
# Language stages


def sinkhorn(logits: torch.Tensor, iterations: int = 1000) -> torch.Tensor:
  """utils.sinkhorn_knopp with epsilon 1: exp, then row and column normalisations."""
  plan = torch.exp(logits)
  for _ in range(iterations):
    plan = plan / plan.sum(dim=1, keepdim=True)
    plan = plan / plan.sum(dim=0, keepdim=True)
  return plan


def top_with_ties(plan: torch.Tensor, scores: torch.Tensor, top: int) -> list[list[int]]:
  """Each row's `top` columns by plan mass; entries in the same 1e-4 bucket of the row's
  maximum are ordered by raw score (the shared tie rule), else torch.topk's order."""
  plan_np = plan.cpu().numpy().astype(np.float32)
  scores_np = scores.cpu().numpy()
  rows = []
  for p, s in zip(plan_np, scores_np):
    row_max = np.float32(max(np.max(np.abs(p)), 1e-30))
    level = np.round(p / row_max / np.float32(TIE_TOLERANCE))
    rows.append([int(j) for j in np.lexsort((-s, -level))[:top]])
  return rows


def mi_reference(visual: Sequence[int], language: Sequence[int]) -> float:
  """utils.get_intersection: log N + log M + the joint entropy of the match table; 0 on NaN."""
  table = np.zeros((len(visual), len(language)))
  for i, x in enumerate(visual):
    for j, y in enumerate(language):
      if x == y:
        table[i, j] = 1
  with np.errstate(invalid="ignore", divide="ignore"):
    table /= np.sum(table)
    joint = -np.sum(table * np.log(table + 1e-9))
    value = np.log(len(visual)) + np.log(len(language)) + joint
  return 0.0 if np.isnan(value) else float(value)


def deletion_curve(ordered: Sequence[int], language: Sequence[int], bank_size: int) -> list:
  """utils.get_deletion_score: MI after replacing the visual descriptors one by one (most
  important first) by a dummy id. An empty visual set gives [0.0] (the reference would fail)."""
  if not ordered:
    return [0.0]
  perturbed = list(ordered)
  curve = [mi_reference(perturbed, language)]
  for t in range(len(perturbed)):
    perturbed[t] = bank_size + 1
    curve.append(mi_reference(perturbed, language))
  return curve


class Reencode:
  """The reference's encodings as written: utils.get_concept_relevance_with_image encodes the
  image and the scored descriptors' texts again at each call (twice per image and method: the
  relevance filter and get_relevance_score), where the project reads them from the features
  pass and the encoded bank.

  Args:
    model: the open_clip CLIP; image: float32 [1, 3, S, S], the normalised image.
    tokens: int [D, context] the descriptors' token ids (open_clip's tokenizer output).
  Counts the tower rows it runs in `image_rows` and `text_rows`.
  """

  def __init__(self, model, image: torch.Tensor, tokens: torch.Tensor):
    self.model, self.image_tensor, self.tokens = model, image, tokens
    self.image_rows = self.text_rows = 0

  def image(self) -> torch.Tensor:
    """float32 [E] unit image embedding."""
    self.image_rows += 1
    with torch.no_grad():
      return F.normalize(self.model.encode_image(self.image_tensor).float(), dim=-1)[0]

  def texts(self, ids: torch.Tensor) -> torch.Tensor:
    """float32 [n, E] unit text embeddings of descriptors `ids`."""
    self.text_rows += len(ids)
    with torch.no_grad():
      return F.normalize(self.model.encode_text(self.tokens[ids]).float(), dim=-1)


def image_concepts(
  concept_embeddings: torch.Tensor,
  image_embedding: torch.Tensor,
  desc: torch.Tensor,
  k: int,
  offset: float = 0.02,
  top: int = 3,
  scale: float = 2.5,
  iterations: int = 1000,
  reencode: "Reencode | None" = None,
):
  """utils.get_corresponding_textual_concepts (OT, relevance threshold) and
  get_relevance_score for one image: (candidates list, per-concept descriptor ids, the unique
  descriptors by decreasing image score).

  With `reencode`, the two image scores re-encode the image and the scored descriptors first,
  as the reference's get_concept_relevance_with_image does each time; otherwise they read
  `image_embedding` and the rows of `desc`."""

  def image_scores(ids):
    if reencode is None:
      return image_embedding @ desc[ids].T
    return reencode.image() @ reencode.texts(ids).T

  logits = concept_embeddings @ desc.T
  common = set(torch.topk(logits[0], k).indices.tolist())
  for row in logits[1:]:
    common.intersection_update(torch.topk(row, k).indices.tolist())
  common = torch.tensor(list(common), dtype=torch.long, device=logits.device)
  if len(common):
    relevance = image_scores(common)
    common = common[relevance > relevance.mean() - offset]
  if len(common) == 0:
    return [], [], []
  chosen_logits = logits[:, common]
  plan = sinkhorn(chosen_logits * scale, iterations)
  picks = top_with_ties(plan, chosen_logits, min(top, len(common)))
  per_concept = [list(dict.fromkeys(int(common[j]) for j in row)) for row in picks]
  flat = [d for row in per_concept for d in row]
  scores = (
    image_scores(torch.tensor(flat, dtype=torch.long, device=logits.device)) * scale
  ).tolist()
  unique, unique_scores = [], []
  for d, s in zip(flat, scores):
    if d not in unique:
      unique.append(d)
      unique_scores.append(s)
  order = sorted(range(len(unique)), key=lambda i: unique_scores[i], reverse=True)
  return common.tolist(), per_concept, [unique[i] for i in order]


# ---------------------------------------------------------------------------------------------
# The class


def analyze_class(
  model,
  images: np.ndarray,
  mean,
  std,
  desc: np.ndarray,
  classes: np.ndarray,
  k: int,
  u: int,
  *,
  methods: Mapping[str, Callable[[torch.Tensor, int, dict], np.ndarray]],
  n_concepts: int = 5,
  feature_kind: str = "tokens",
  joint: bool = True,
  crf: bool = True,
  ellipse_seed: int = 0,
  offset: float = 0.02,
  top: int = 3,
  desc_tokens: torch.Tensor | None = None,
  device: "str | torch.device | None" = None,
) -> dict[str, Any]:
  """The reference's analysis of one class's B images.

  Args:
    model: an open_clip CLIP (eval mode), e.g. `open_clip_from_bundle(bundle)`.
    images: uint8 [B, S, S, 3] at the model's input size.
    mean, std: the model's normalisation.
    desc: float32 [D, E] unit descriptor embeddings; classes: float32 [C, E] unit class ones.
    k, u: the top-k intersection and the language side's descriptors.
    methods: {concept method's name: its labeller}, (foreground tokens torch float32 [N, D] of
      the B images in image, row, column order, n_concepts, stats) -> int [N] labels, run once
      per class: the registered methods' twins (`mutual.concept_methods.reference_labelers`,
      which binds their settings: PCA's sign rule, K-means' seeding protocol, where
      np.random.seed and torch.manual_seed are called with config.analysis.kmeans_seed right
      before the class's kmeans_pytorch call, `kmeans_labels`, leaving both generators moved).
    joint: one spectral split over the B images (the reference) or one per image.
    crf: SimpleCRF refinement (the reference); False uses the upsampled patch mask.
    ellipse_seed: Python's `random` and OpenCV's cv::theRNG() are seeded with it
      (random.seed, cv2.setRNGSeed) before each image's concepts of each method are prompted
      (the padding of contours under 5 points and OpenCV's moved points; ellipse_box).
    offset, top: the relevance offset and the descriptors per concept.
    desc_tokens: int [D, context], the descriptors' token ids: when given, the image scores
      re-encode the image and the scored descriptors each time, as the reference's code does
      (`Reencode`; `desc` must then be those texts' embeddings, for the same results), and
      stats counts those rows ("reencoded_image_rows", "reencoded_text_rows").
    device: where the tensors go (the model must be there already); None: the CPU. The CPU
      libraries (OpenCV, scikit-learn, SimpleCRF) read copies on the host, as the reference.

  Returns:
    dict: predicted int [B], foreground bool [B, h, w], refined bool [B, S, S]; per method a
    dict with concept_maps int [B, h, w] (-1 background), pixel_maps int [B, S, S], per-image
    lists candidates, concept_ids, visual_ids, language_ids, curves, and arrays mi, auc; stats.
  """
  device = torch.device("cpu" if device is None else device)
  x = to_tensor(images, mean, std).to(device)
  desc_t, classes_t = torch.from_numpy(desc).to(device), torch.from_numpy(classes).to(device)
  if desc_tokens is not None:
    desc_tokens = desc_tokens.to(device)
  embeddings, tokens = tower_features(model, x, feature_kind)
  image_emb = F.normalize(embeddings, dim=-1)
  predicted = (image_emb @ classes_t.T).argmax(-1).cpu().numpy()
  batch, count, width = tokens.shape
  side = int(round(count**0.5))
  size = images.shape[1]
  fg = spectral_foreground(tokens, side, joint)
  shown = shown_uint8(x, mean, std)  # the uint8 image the reference draws on
  coarse = np.stack(
    [
      cv2.resize(m.astype(np.float32), (size, size), interpolation=cv2.INTER_NEAREST) > 0
      for m in fg
    ]
  )
  refined = coarse.copy()
  if crf:
    for i in range(batch):
      mask = crf_mask(shown[i], coarse[i])
      refined[i] = mask if mask.any() else coarse[i]
  fg_tokens = tokens.reshape(batch, side, side, width)[torch.from_numpy(fg).to(device)]
  weights = classes_t @ desc_t.T
  stats: dict[str, int] = {}
  out: dict[str, Any] = dict(predicted=predicted, foreground=fg, refined=refined, stats=stats)
  for method, labeller in methods.items():
    labels = labeller(fg_tokens, n_concepts, stats)
    grid = np.full((batch, side, side), -1)
    grid[fg] = labels
    result = dict(
      concept_maps=grid,
      pixel_maps=np.full((batch, size, size), -1),
      candidates=[],
      concept_ids=[],
      visual_ids=[],
      language_ids=[],
      curves=[],
    )
    for i in range(batch):  # per image, as the reference
      pixels = cv2.resize(grid[i].astype(np.float32), (size, size), interpolation=cv2.INTER_NEAREST)
      pixels = np.where(refined[i], pixels, -1).astype(np.int64)
      result["pixel_maps"][i] = pixels
      present = concept_order(pixels)
      # random.seed(ellipse_seed) and cv2.setRNGSeed(ellipse_seed), once per image and method.
      rng = random.Random(ellipse_seed)
      cv2.setRNGSeed(ellipse_seed)
      rendered = [prompts(shown[i], ellipse_box(pixels == c, rng)) for c in present]
      language = torch.topk(weights[predicted[i]], u).indices.tolist()
      candidates, per_concept, ordered = [], [], []
      if rendered:
        # [variant, concept] as the reference stacks them, then the mean over variants.
        stack = np.stack([np.stack([r[v] for r in rendered]) for v in range(3)])
        with torch.no_grad():
          emb = model.encode_image(
            to_tensor(stack.reshape(-1, size, size, 3), mean, std).to(device)
          )
        emb = F.normalize(emb.float(), dim=-1).reshape(3, len(present), -1).mean(0)
        reencode = None if desc_tokens is None else Reencode(model, x[i : i + 1], desc_tokens)
        candidates, per_concept, ordered = image_concepts(
          emb, image_emb[i], desc_t, k, offset, top, reencode=reencode
        )
        if reencode is not None:
          for key, rows in (("image", reencode.image_rows), ("text", reencode.text_rows)):
            stats[f"reencoded_{key}_rows"] = stats.get(f"reencoded_{key}_rows", 0) + rows
      curve = deletion_curve(ordered, language, len(desc))
      result["candidates"].append(candidates)
      result["concept_ids"].append(dict(zip(present, per_concept)))
      result["visual_ids"].append(ordered)
      result["language_ids"].append(language)
      result["curves"].append(curve)
    result["mi"] = np.array([c[0] for c in result["curves"]])
    result["auc"] = np.array([sum(c) / len(c) for c in result["curves"]])
    out[method] = result
  return out
