"""Synthetic attribute world: procedural images of coloured, patterned shapes with captions.

Every image holds one or two objects with known attributes (shape, colour, pattern, size,
position) on a plain background with mild noise, plus a natural-language caption and a
per-pixel object mask. It is the offline stand-in for image-text data: a tiny CLIP can learn
it in minutes, and every experiment has ground truth (which word should matter, which pixels
belong to which object).

Everything is deterministic given the seed and vectorised with numpy: objects are rasterised
as signed-distance fields (anti-aliased by the distance to the edge) on small crops around each
object, all objects of a batch at once, then pasted onto the canvases.

Identifiers use British "colour" (as the project does); caption text uses the spellings most
common in CLIP's training text ("gray", "color", "center").
"""

from __future__ import annotations

import dataclasses
import math
from types import MappingProxyType
from typing import ClassVar, Mapping, Sequence

import numpy as np

# ---------------------------------------------------------------------------------------------
# Vocabularies. Every value is one word (CLIP BPE: one token except "checkered", two tokens).
# Background tones are achromatic and object colours chromatic, so no word is shared.

SHAPES = ("circle", "square", "triangle", "star", "diamond", "cross", "heart", "moon")
COLOURS = ("red", "orange", "yellow", "green", "teal", "blue", "purple", "pink")
PATTERNS = ("plain", "striped", "dotted", "checkered")
SIZES = ("small", "large")
POSITIONS = ("left", "right", "top", "bottom", "center")
BACKGROUNDS = ("gray", "black", "white")

#: Attribute families of one object, in the order of `SyntheticBatch.mentioned`'s last axis.
FAMILIES = ("shape", "colour", "pattern", "size", "position")

VOCABULARIES: Mapping[str, tuple[str, ...]] = MappingProxyType(
  {
    "shape": SHAPES,
    "colour": COLOURS,
    "pattern": PATTERNS,
    "size": SIZES,
    "position": POSITIONS,
    "background": BACKGROUNDS,
  }
)

#: Nominal sRGB of each object colour (pixels get a small per-object jitter around it).
COLOUR_RGB: Mapping[str, tuple[int, int, int]] = MappingProxyType(
  {
    "red": (215, 35, 35),
    "orange": (245, 135, 20),
    "yellow": (240, 215, 30),
    "green": (40, 165, 50),
    "teal": (0, 150, 150),
    "blue": (35, 75, 225),
    "purple": (130, 50, 185),
    "pink": (245, 125, 195),
  }
)
BACKGROUND_RGB: Mapping[str, tuple[int, int, int]] = MappingProxyType(
  {
    "gray": (128, 128, 128),
    "black": (22, 22, 22),
    "white": (238, 238, 238),
  }
)
#: Pattern marks (stripes, dots, checks) are the object colour scaled by this factor: a darker
#: shade keeps the hue readable, so "red striped" still reads as red.
PATTERN_SHADE = 0.4

#: Words by which captions and prompts name each attribute value (first one is the adjective).
ATTRIBUTE_WORDS: Mapping[tuple[str, str], tuple[str, ...]] = MappingProxyType(
  {
    **{("shape", s): (s,) for s in SHAPES},
    **{("colour", c): (c,) for c in COLOURS},
    ("pattern", "plain"): ("plain",),
    ("pattern", "striped"): ("striped", "stripes"),
    ("pattern", "dotted"): ("dotted", "dots"),
    ("pattern", "checkered"): ("checkered",),
    **{("size", s): (s,) for s in SIZES},
    **{("position", p): (p,) for p in POSITIONS},
    **{("background", b): (b,) for b in BACKGROUNDS},
  }
)

POSITION_PHRASES: Mapping[str, str] = MappingProxyType(
  {
    "left": "on the left",
    "right": "on the right",
    "top": "at the top",
    "bottom": "at the bottom",
    "center": "in the center",
  }
)
#: Noun phrase for "a red circle {with ...}"; plain has none (it is only ever an adjective).
PATTERN_WITH_PHRASES: Mapping[str, str] = MappingProxyType(
  {
    "striped": "with stripes",
    "dotted": "with dots",
    "checkered": "with a checkered pattern",
  }
)

# Geometry, in units of the image side. Anchors are far enough apart (>= 0.25) that the
# position label is unambiguous from the mask centroid, and two-object layouts never overlap.
_POSITION_CENTRES = {
  "left": (0.25, 0.5),
  "right": (0.75, 0.5),
  "top": (0.5, 0.25),
  "bottom": (0.5, 0.75),
  "center": (0.5, 0.5),
}
_SIZE_RADII = {"small": 0.13, "large": 0.2}
_TWO_OBJECT_LAYOUTS = (("left", "right"), ("top", "bottom"))
_POSITION_JITTER = 0.02  # +- fraction of the image side
_SCALE_JITTER = 0.07  # radius multiplied by 1 +- this
_ROTATION_JITTER = 15.0  # +- degrees
_COLOUR_JITTER = 14.0  # +- per channel, 0..255
_BACKGROUND_JITTER = 10.0  # +- grey level
_MAX_EXTENT = 1.1  # every shape fits in this many radii from its centre
# Pattern geometry in pixels at 64x64 (scaled with image size): coarse enough to survive a
# 64px image and a small object (~15px across), fine enough that each object shows several.
_STRIPE_PERIOD, _STRIPE_DUTY = 5.0, 0.45
_DOT_PERIOD, _DOT_RADIUS = 5.0, 1.5
_CHECK_CELL = 4.0


# ---------------------------------------------------------------------------------------------
# Public containers.


@dataclasses.dataclass(frozen=True)
class ObjectSpec:
  """One object's attributes by name; None means "draw at random" when rendering."""

  shape: str | None = None
  colour: str | None = None
  pattern: str | None = None
  size: str | None = None
  position: str | None = None


@dataclasses.dataclass(frozen=True)
class SyntheticBatch:
  """A batch of synthetic images with captions and ground truth.

  Attribute labels index into the vocabularies (`VOCABULARIES[family]`); -1 marks an absent
  object slot. Object slot k of image i owns the pixels where `masks[i] == k`.

  Attributes:
    images: uint8 [n, H, W, 3], RGB.
    captions: n strings.
    shape, colour, pattern, size, position: int8 [n, max_objects].
    background: int8 [n].
    masks: int8 [n, H, W], object slot index or -1 for background.
    mentioned: bool [n, max_objects, 5], whether the caption names each attribute of each
      object by its word, families in `FAMILIES` order (shape and colour always are).
    background_mentioned: bool [n].
  """

  images: np.ndarray
  captions: tuple[str, ...]
  shape: np.ndarray
  colour: np.ndarray
  pattern: np.ndarray
  size: np.ndarray
  position: np.ndarray
  background: np.ndarray
  masks: np.ndarray
  mentioned: np.ndarray
  background_mentioned: np.ndarray

  vocabularies: ClassVar[Mapping[str, tuple[str, ...]]] = VOCABULARIES

  def __len__(self) -> int:
    return len(self.captions)

  @property
  def num_objects(self) -> np.ndarray:
    """int32 [n]: objects per image."""
    return (self.shape >= 0).sum(axis=1).astype(np.int32)

  def labels(self, family: str) -> np.ndarray:
    """Label array of one family ("shape", ..., "background")."""
    if family not in VOCABULARIES:
      raise KeyError(f"unknown attribute family {family!r}; expected one of {tuple(VOCABULARIES)}")
    return getattr(self, family)

  def objects(self, index: int) -> tuple[ObjectSpec, ...]:
    """The named attributes of the objects in image `index`, by slot."""
    specs = []
    for k in range(self.shape.shape[1]):
      if self.shape[index, k] < 0:
        continue
      specs.append(
        ObjectSpec(**{f: VOCABULARIES[f][int(self.labels(f)[index, k])] for f in FAMILIES})
      )
    return tuple(specs)

  def select(self, indices) -> "SyntheticBatch":
    """A sub-batch (indices: int array or slice), in the given order."""
    idx = np.arange(len(self))[indices]
    fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    out = {k: v[idx] for k, v in fields.items() if isinstance(v, np.ndarray)}
    out["captions"] = tuple(self.captions[int(i)] for i in idx)
    return SyntheticBatch(**out)


# ---------------------------------------------------------------------------------------------
# Public generators.


def generate(
  n: int,
  seed: int | Sequence[int],
  *,
  image_size: int = 64,
  max_objects: int = 2,
  two_object_fraction: float = 0.35,
  jitter: bool = True,
) -> SyntheticBatch:
  """Random images of the synthetic world with captions and ground truth.

  Args:
    n: number of images.
    seed: int or sequence of ints (numpy SeedSequence entropy); same seed, same bytes.
    image_size: side H = W in pixels.
    max_objects: 1 or 2 objects per image at most.
    two_object_fraction: probability of two objects when max_objects == 2.
    jitter: small random offset, scale, rotation, colour tone and pixel noise; False renders
      canonical images (still a random choice of attributes).

  Returns:
    SyntheticBatch with images uint8 [n, image_size, image_size, 3].
  """
  rng = np.random.default_rng(seed)
  ids, background = _random_scenes(n, rng, max_objects, two_object_fraction)
  return _build_batch(ids, background, rng, image_size=image_size, jitter=jitter)


def random_captions(
  n: int, seed: int | Sequence[int], *, max_objects: int = 2, two_object_fraction: float = 0.35
) -> tuple[str, ...]:
  """The captions `generate(n, seed, ...)` gives, without rendering the images (the text
  side of the world, e.g. for training a text tower alone)."""
  rng = np.random.default_rng(seed)
  ids, background = _random_scenes(n, rng, max_objects, two_object_fraction)
  ids = {f: np.asarray(ids[f], np.int64) for f in FAMILIES}
  return _captions(ids, np.asarray(background, np.int64), rng)[0]


def _random_scenes(
  n: int, rng: np.random.Generator, max_objects: int, two_object_fraction: float
) -> tuple[dict[str, np.ndarray], np.ndarray]:
  """Attribute ids {family: int [n, max_objects]} (-1: no object) and background ids [n] of
  random scenes, drawn from `rng` (the draws `generate` makes before rendering)."""
  if max_objects not in (1, 2):
    raise ValueError(f"max_objects must be 1 or 2, got {max_objects}")
  two = rng.random(n) < (two_object_fraction if max_objects == 2 else 0.0)
  ids = {
    f: rng.integers(0, len(VOCABULARIES[f]), size=(n, max_objects))
    for f in ("shape", "colour", "pattern", "size")
  }
  single_position = rng.integers(0, len(POSITIONS), size=n)
  layout = rng.integers(0, len(_TWO_OBJECT_LAYOUTS), size=n)
  position = np.full((n, max_objects), -1)
  position[:, 0] = single_position
  if max_objects == 2:
    for li, (first, second) in enumerate(_TWO_OBJECT_LAYOUTS):
      rows = two & (layout == li)
      position[rows, 0] = POSITIONS.index(first)
      position[rows, 1] = POSITIONS.index(second)
    for f in ids:
      ids[f][~two, 1] = -1
  ids["position"] = position
  background = rng.integers(0, len(BACKGROUNDS), size=n)
  return ids, background


def generate_with(
  n: int,
  seed: int | Sequence[int],
  *,
  shape: str | Sequence[str] | None = None,
  colour: str | Sequence[str] | None = None,
  pattern: str | Sequence[str] | None = None,
  size: str | Sequence[str] | None = None,
  position: str | Sequence[str] | None = None,
  background: str | Sequence[str] | None = None,
  image_size: int = 64,
  jitter: bool = True,
  always_mention: Sequence[str] = (),
) -> SyntheticBatch:
  """Single-object images with chosen attributes; the others are drawn at random.

  Each attribute is None (random per image), one name (all images), or n names (per image;
  None entries are random).
  For example `generate_with(16, 0, colour="red", pattern="striped")` gives 16 red striped
  objects of random shape, size, position and background.
  `always_mention` names families ("size", "pattern", "position") every caption states;
  the others are mentioned at random as in `generate` (shape and colour always are).

  Returns:
    SyntheticBatch with max_objects = 1.
  """
  rng = np.random.default_rng(seed)
  chosen = dict(shape=shape, colour=colour, pattern=pattern, size=size, position=position)
  ids = {f: _ids_for(f, chosen[f], n, rng)[:, None] for f in FAMILIES}
  background_ids = _ids_for("background", background, n, rng)
  return _build_batch(
    ids,
    background_ids,
    rng,
    image_size=image_size,
    jitter=jitter,
    always_mention=_mention_families(always_mention),
  )


def render(
  scenes: Sequence[Sequence[ObjectSpec]],
  seed: int | Sequence[int],
  *,
  backgrounds: str | Sequence[str | None] | None = None,
  image_size: int = 64,
  jitter: bool = True,
) -> SyntheticBatch:
  """Images of exactly specified scenes, for controlled experiments.

  Args:
    scenes: per image, 1 or 2 ObjectSpecs (None fields are drawn at random). With two
      objects, their positions must be a layout pair (left/right or top/bottom) or None.
    seed: jitter, noise, caption wording and unspecified attributes.
    backgrounds: None (random), one name, or one name (or None) per scene.

  Returns:
    SyntheticBatch whose object slots follow each scene's order.
  """
  n = len(scenes)
  if n == 0:
    raise ValueError("render() needs at least one scene")
  max_objects = max(len(s) for s in scenes)
  if min(len(s) for s in scenes) < 1 or max_objects > 2:
    raise ValueError("each scene holds 1 or 2 objects")
  rng = np.random.default_rng(seed)
  ids = {f: np.full((n, max_objects), -1) for f in FAMILIES}
  for i, scene in enumerate(scenes):
    for k, spec in enumerate(scene):
      for f in FAMILIES:
        value = getattr(spec, f)
        vocab = VOCABULARIES[f]
        if value is None:
          ids[f][i, k] = rng.integers(len(vocab)) if f != "position" else -2
        else:
          ids[f][i, k] = _index_of(f, value)
    _resolve_positions(ids["position"][i], len(scene), rng)
  if isinstance(backgrounds, str) or backgrounds is None:
    backgrounds = [backgrounds] * n
  if len(backgrounds) != n:
    raise ValueError(f"got {len(backgrounds)} backgrounds for {n} scenes")
  background_ids = np.array(
    [
      rng.integers(len(BACKGROUNDS)) if b is None else _index_of("background", b)
      for b in backgrounds
    ]
  )
  return _build_batch(ids, background_ids, rng, image_size=image_size, jitter=jitter)


def attribute_words(family: str, value: str) -> tuple[str, ...]:
  """The words captions and prompts use for one attribute value (adjective first)."""
  return ATTRIBUTE_WORDS[(family, value)]


# ---------------------------------------------------------------------------------------------
# Attribute bookkeeping.


def _index_of(family: str, value: str) -> int:
  vocab = VOCABULARIES[family]
  if value not in vocab:
    raise ValueError(f"unknown {family} {value!r}; expected one of {vocab}")
  return vocab.index(value)


def _ids_for(family: str, value, n: int, rng: np.random.Generator) -> np.ndarray:
  """int64 [n] label ids from None (random), a name, or n names (each may be None: random)."""
  random_ids = rng.integers(0, len(VOCABULARIES[family]), size=n)
  if value is None:
    return random_ids
  if isinstance(value, str):
    return np.full(n, _index_of(family, value))
  if len(value) != n:
    raise ValueError(f"{family}: got {len(value)} values for {n} images")
  return np.array(
    [random_ids[i] if v is None else _index_of(family, v) for i, v in enumerate(value)],
    dtype=np.int64,
  )


def _resolve_positions(row: np.ndarray, count: int, rng: np.random.Generator) -> None:
  """Fill -2 (unspecified) positions of one scene in place and check two-object layouts."""
  if count == 1:
    if row[0] == -2:
      row[0] = rng.integers(len(POSITIONS))
    return
  pairs = [tuple(POSITIONS.index(p) for p in layout) for layout in _TWO_OBJECT_LAYOUTS]
  pairs += [(b, a) for a, b in pairs]
  fitting = [p for p in pairs if all(row[k] in (-2, p[k]) for k in range(2))]
  if not fitting:
    names = [POSITIONS[r] if r >= 0 else None for r in row[:2]]
    raise ValueError(f"two objects need positions left/right or top/bottom, got {names}")
  row[:2] = fitting[rng.integers(len(fitting))]


# ---------------------------------------------------------------------------------------------
# Shapes as signed distance functions in object-local units (y up, radius ~1).


def _regular_star(points: int, outer: float, inner: float) -> np.ndarray:
  angles = np.pi / 2 + np.arange(2 * points) * np.pi / points
  radii = np.where(np.arange(2 * points) % 2 == 0, outer, inner)
  return np.stack([radii * np.cos(angles), radii * np.sin(angles)], axis=1)


def _frozen(array) -> np.ndarray:
  array = np.asarray(array, dtype=np.float32)
  array.flags.writeable = False
  return array


_TRIANGLE = _frozen(
  [[1.1 * math.cos(a), 1.1 * math.sin(a)] for a in np.pi / 2 + np.arange(3) * 2 * np.pi / 3]
)
_STAR = _frozen(_regular_star(5, 1.08, 0.5))
_DIAMOND = _frozen([[0.0, 1.05], [-0.72, 0.0], [0.0, -1.05], [0.72, 0.0]])


def _polygon_sdf(x: np.ndarray, y: np.ndarray, vertices: np.ndarray) -> np.ndarray:
  """Exact signed distance to a closed polygon (negative inside), any shape of x/y."""
  dist_sq = (x - vertices[0, 0]) ** 2 + (y - vertices[0, 1]) ** 2
  inside = np.zeros(x.shape, dtype=bool)
  for i in range(len(vertices)):
    vx, vy = vertices[i]
    ex, ey = vertices[i - 1] - vertices[i]
    wx, wy = x - vx, y - vy
    t = np.clip((wx * ex + wy * ey) * (1.0 / (ex * ex + ey * ey)), 0.0, 1.0)
    bx, by = wx - ex * t, wy - ey * t
    np.minimum(dist_sq, bx * bx + by * by, out=dist_sq)
    # Winding parity: flip on edges that cross the horizontal ray through the point.
    above, below_prev, left_side = y >= vy, y < vertices[i - 1, 1], ex * wy > ey * wx
    inside ^= (above == below_prev) & (below_prev == left_side)
  dist = np.sqrt(dist_sq)
  return np.where(inside, -dist, dist)


def _box_sdf(x: np.ndarray, y: np.ndarray, half_x: float, half_y: float) -> np.ndarray:
  dx, dy = np.abs(x) - half_x, np.abs(y) - half_y
  outside = np.hypot(np.maximum(dx, 0.0), np.maximum(dy, 0.0))
  return outside + np.minimum(np.maximum(dx, dy), 0.0)


def _circle_sdf(x, y, cx: float, cy: float, radius: float) -> np.ndarray:
  return np.hypot(x - cx, y - cy) - radius


def _heart_sdf(x, y):
  # A square standing on a corner plus two discs on its upper edges.
  side = 1.15
  centre_y = -0.085
  s = 1 / math.sqrt(2)
  u, v = (x + (y - centre_y)) * s, ((y - centre_y) - x) * s
  lobe_offset = side / (2 * math.sqrt(2))
  lobes = np.minimum(
    _circle_sdf(x, y, -lobe_offset, centre_y + lobe_offset, side / 2),
    _circle_sdf(x, y, lobe_offset, centre_y + lobe_offset, side / 2),
  )
  return np.minimum(_box_sdf(u, v, side / 2, side / 2), lobes)


_SHAPE_SDFS = MappingProxyType(
  {
    "circle": lambda x, y: np.hypot(x, y) - 0.95,
    "square": lambda x, y: _box_sdf(x, y, 0.78, 0.78),
    "triangle": lambda x, y: _polygon_sdf(x, y, _TRIANGLE),
    "star": lambda x, y: _polygon_sdf(x, y, _STAR),
    "diamond": lambda x, y: _polygon_sdf(x, y, _DIAMOND),
    "cross": lambda x, y: np.minimum(_box_sdf(x, y, 0.95, 0.32), _box_sdf(x, y, 0.32, 0.95)),
    "heart": _heart_sdf,
    # A disc with an offset disc cut out, opening to the right.
    "moon": lambda x, y: np.maximum(
      np.hypot(x, y) - 0.95, 0.8 - _circle_sdf(x, y, 0.45, 0.22, 0.0)
    ),
  }
)


# ---------------------------------------------------------------------------------------------
# Patterns as mark coverage in [0, 1], from pattern coordinates in pixels.


def _band_coverage(t: np.ndarray, period: float, half_width: float) -> np.ndarray:
  """Coverage of bands of the given half-width centred every `period` along t (pixels)."""
  from_centre = np.abs(np.mod(t, period) - 0.5 * period)
  return np.clip(0.5 + half_width - from_centre, 0.0, 1.0)


def _pattern_coverage(name: str, qx: np.ndarray, qy: np.ndarray, scale: float) -> np.ndarray:
  if name == "plain":
    return np.zeros_like(qx)
  if name == "striped":
    period = _STRIPE_PERIOD * scale
    return _band_coverage(qy, period, 0.5 * _STRIPE_DUTY * period)
  if name == "dotted":
    period = _DOT_PERIOD * scale
    fx = np.mod(qx, period) - 0.5 * period
    fy = np.mod(qy, period) - 0.5 * period
    return np.clip(0.5 + _DOT_RADIUS * scale - np.hypot(fx, fy), 0.0, 1.0)
  if name == "checkered":
    period = 2 * _CHECK_CELL * scale
    a = _band_coverage(qx, period, 0.25 * period)
    b = _band_coverage(qy, period, 0.25 * period)
    return a * b + (1 - a) * (1 - b)  # soft XOR of two square waves
  raise ValueError(f"unknown pattern {name!r}")


# ---------------------------------------------------------------------------------------------
# Rasterisation.


def _object_crops(
  shape_id: np.ndarray,
  pattern_id: np.ndarray,
  centre: np.ndarray,
  radius: np.ndarray,
  theta: np.ndarray,
  shift: np.ndarray,
  crop: int,
  pattern_scale: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Rasterise m objects on square crops of side `crop` around their centres.

  Args (per object): shape_id, pattern_id int [m]; centre float32 [m, 2] pixels (x, y down);
    radius float32 [m] pixels; theta float32 [m] radians; shift float32 [m, 2] pattern phase
    in pixels.

  Returns:
    origin int64 [m, 2] (x0, y0) of each crop in the image; coverage float32 [m, crop, crop]
    in [0, 1]; lightness float32 [m, crop, crop], coverage times 1 on the body and
    PATTERN_SHADE on pattern marks.
  """
  origin = np.floor(centre).astype(np.int64) - crop // 2
  grid = np.arange(crop, dtype=np.float32) + 0.5
  dx = origin[:, 0, None, None] + grid[None, None, :] - centre[:, 0, None, None]  # [m, 1, crop]
  dy = origin[:, 1, None, None] + grid[None, :, None] - centre[:, 1, None, None]  # [m, crop, 1]
  cos, sin = np.cos(theta)[:, None, None], np.sin(theta)[:, None, None]
  qx = cos * dx + sin * dy  # rotated pixel offsets, [m, crop, crop]
  qy = sin * dx - cos * dy  # y up

  coverage = np.empty(qx.shape, np.float32)
  for s, name in enumerate(SHAPES):
    sel = np.nonzero(shape_id == s)[0]
    if len(sel):
      r = radius[sel, None, None]
      sdf = _SHAPE_SDFS[name](qx[sel] / r, qy[sel] / r)
      coverage[sel] = np.clip(0.5 - sdf * r, 0.0, 1.0)  # anti-aliased by pixel distance

  marks = np.empty(qx.shape, np.float32)
  for p, name in enumerate(PATTERNS):
    sel = np.nonzero(pattern_id == p)[0]
    if len(sel):
      marks[sel] = _pattern_coverage(
        name,
        qx[sel] + shift[sel, 0, None, None],
        qy[sel] + shift[sel, 1, None, None],
        pattern_scale,
      )
  marks *= -(1.0 - PATTERN_SHADE)
  marks += 1.0
  marks *= coverage
  return origin, coverage, marks


def _rasterise(
  ids: Mapping[str, np.ndarray],
  background: np.ndarray,
  rng: np.random.Generator,
  image_size: int,
  jitter: bool,
) -> tuple[np.ndarray, np.ndarray]:
  """Images uint8 [n, S, S, 3] and masks int8 [n, S, S] from label ids ([n, K], -1 absent)."""
  n, num_slots = ids["shape"].shape
  size = image_size
  present = ids["shape"] >= 0

  # Per-object random draws happen for every slot, present or not, so each image's draws
  # do not depend on the other images' attributes.
  def uniform(shape, amount):
    return (
      rng.uniform(-amount, amount, size=shape).astype(np.float32)
      if jitter
      else np.zeros(shape, np.float32)
    )

  offset = uniform((n, num_slots, 2), _POSITION_JITTER)
  scale = 1.0 + uniform((n, num_slots), _SCALE_JITTER)
  rotation = np.deg2rad(uniform((n, num_slots), _ROTATION_JITTER))
  colour_jitter = uniform((n, num_slots, 3), _COLOUR_JITTER)
  phase = (
    rng.random((n, num_slots, 2)).astype(np.float32)
    if jitter
    else np.zeros((n, num_slots, 2), np.float32)
  )
  background_jitter = uniform((n, 1), _BACKGROUND_JITTER)
  noise = rng.integers(0, 256, size=(3, n, size, size), dtype=np.uint8) if jitter else None

  img_idx, slot_idx = np.nonzero(present)
  size_id = ids["size"][img_idx, slot_idx]
  centre = np.array([_POSITION_CENTRES[p] for p in POSITIONS], np.float32)[
    ids["position"][img_idx, slot_idx]
  ]
  centre = (centre + offset[img_idx, slot_idx]) * size  # pixels, (x, y) with y down
  radius = (
    np.array([_SIZE_RADII[s] for s in SIZES], np.float32)[size_id] * scale[img_idx, slot_idx] * size
  )
  pattern_scale = size / 64.0
  shift = phase[img_idx, slot_idx] * (
    2 * max(_STRIPE_PERIOD, _DOT_PERIOD, 2 * _CHECK_CELL) * pattern_scale
  )
  object_rgb = np.zeros((n, num_slots, 3), np.float32)
  object_rgb[img_idx, slot_idx] = (
    np.array([COLOUR_RGB[c] for c in COLOURS], np.float32)[ids["colour"][img_idx, slot_idx]]
    + colour_jitter[img_idx, slot_idx]
  )

  # Objects of one size share a crop side just big enough for them, so they vectorise.
  crops = [
    2 * int(math.ceil(_MAX_EXTENT * _SIZE_RADII[s] * (1 + _SCALE_JITTER) * size)) + 2 for s in SIZES
  ]
  object_crop = np.array(crops)[size_id]
  object_origin = np.floor(centre).astype(np.int64) - (object_crop // 2)[:, None]
  # Canvases padded just enough for crops hanging over the border; crops are pasted through
  # flat indices (1-D fancy indexing is the fast path), one slot per update so that `+=`
  # never sees the same pixel twice within one update.
  pad_lo = max(0, -int(object_origin.min(initial=0)))
  side = size + pad_lo + max(0, int((object_origin + object_crop[:, None]).max(initial=0)) - size)
  canvas_cov = np.zeros(n * side * side, np.float32)
  canvas_mask = np.full(n * side * side, -1, np.int8)
  canvas_light = {k: np.zeros(n * side * side, np.float32) for k in np.unique(slot_idx)}
  for s, crop in enumerate(crops):
    group = np.nonzero(size_id == s)[0]
    if not len(group):
      continue
    origin, coverage, lightness = _object_crops(
      ids["shape"][img_idx[group], slot_idx[group]],
      ids["pattern"][img_idx[group], slot_idx[group]],
      centre[group],
      radius[group],
      rotation[img_idx[group], slot_idx[group]],
      shift[group],
      crop,
      pattern_scale,
    )
    rows = origin[:, 1, None, None] + pad_lo + np.arange(crop)[None, :, None]
    cols = origin[:, 0, None, None] + pad_lo + np.arange(crop)[None, None, :]
    flat = (img_idx[group, None, None] * side + rows) * side + cols  # [m, crop, crop]
    for k in canvas_light:
      sel = np.nonzero(slot_idx[group] == k)[0]
      if len(sel):
        canvas_cov[flat[sel]] += coverage[sel]
        canvas_light[k][flat[sel]] = lightness[sel]
        canvas_mask[flat[sel][coverage[sel] >= 0.5]] = k

  def visible(canvas):
    return canvas.reshape(n, side, side)[:, pad_lo : pad_lo + size, pad_lo : pad_lo + size]

  # Compose channel-planar ([3, n, S, S]): numpy's inner loops then run over whole rows
  # instead of 3-element pixels, which is several times faster; one transpose at the end.
  background_weight = 1.0 - np.minimum(visible(canvas_cov), 1.0)
  bg = (
    np.array([BACKGROUND_RGB[b] for b in BACKGROUNDS], np.float32)[background] + background_jitter
  )
  planes = np.empty((3, n, size, size), np.float32)
  for c in range(3):
    np.multiply(background_weight, bg[:, c, None, None], out=planes[c])
    for k, light in canvas_light.items():
      planes[c] += visible(light) * object_rgb[:, k, c, None, None]
  if noise is not None:
    # Uniform integer noise in [-7.5, 7.5] (std 4.6) from random bytes: ~10x cheaper than
    # Gaussian draws and looks the same.
    planes += noise & np.uint8(15)
    planes -= 7.5
  np.rint(planes, out=planes)
  np.clip(planes, 0, 255, out=planes)
  images = np.empty((n, size, size, 3), np.uint8)
  for c in range(3):
    images[..., c] = planes[c]
  return images, np.ascontiguousarray(visible(canvas_mask))


# ---------------------------------------------------------------------------------------------
# Captions.

_PREFIXES = ("", "a photo of ", "an image of ", "a picture of ", "a drawing of ", "there is ")
_TWO_PREFIXES = ("", "two shapes: ", "a photo of two shapes: ", "a picture of ", "an image with ")
_BACKGROUND_FORMS = (
  ", on a {} background",
  " against a {} background",
  " on {}",
  ", {} background",
)
_MENTION_PROBABILITY = {
  "size": 0.8,
  "pattern": 0.85,
  "plain": 0.5,
  "position": 0.75,
  "background": 0.4,
}
_RANDOMS_PER_CAPTION = 16
#: Families a caption may leave out (in the order of their uniforms u[3k], u[3k+1], u[3k+2]).
_OPTIONAL_FAMILIES = ("size", "pattern", "position")


def _article(phrase: str) -> str:
  return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def _noun_phrase(obj: Mapping[str, str], says: Mapping[str, bool], style: int) -> str:
  """'small red striped circle' etc. without article; pattern and size only if said."""
  pattern = obj["pattern"] if says["pattern"] else None
  size = obj["size"] if says["size"] else None
  with_phrase = None
  if style == 2 and pattern in PATTERN_WITH_PHRASES:
    with_phrase, pattern = PATTERN_WITH_PHRASES[pattern], None
  order = (size, obj["colour"], pattern) if style != 1 else (size, pattern, obj["colour"])
  words = [w for w in order if w] + [obj["shape"]]
  return " ".join(words) + (" " + with_phrase if with_phrase else "")


def _listed(words: Sequence[str]) -> str:
  return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _mention_families(families: Sequence[str]) -> frozenset[str]:
  if isinstance(families, str):
    families = (families,)
  unknown = sorted(set(families) - set(_OPTIONAL_FAMILIES))
  if unknown:
    raise ValueError(
      f"always_mention: unknown or always-mentioned families {unknown}; choose from "
      f"{_OPTIONAL_FAMILIES} "
      "(shape and colour are in every caption)"
    )
  return frozenset(families)


def _caption(
  objects: Sequence[Mapping[str, str]],
  background: str,
  u: np.ndarray,
  always_mention: frozenset[str] = frozenset(),
) -> tuple[str, list[dict[str, bool]], bool]:
  """One caption from uniforms u [_RANDOMS_PER_CAPTION]; returns (text, per-object mentions
  by family, background mentioned). Families in `always_mention` are always stated."""

  def pick(options, j):
    return options[int(u[j] * len(options))]

  says = []
  for k, obj in enumerate(objects):
    p_pattern = _MENTION_PROBABILITY["plain" if obj["pattern"] == "plain" else "pattern"]
    says.append(
      {
        "shape": True,
        "colour": True,
        **{
          family: family in always_mention or bool(u[3 * k + j] < probability)
          for j, (family, probability) in enumerate(
            zip(
              _OPTIONAL_FAMILIES,
              (_MENTION_PROBABILITY["size"], p_pattern, _MENTION_PROBABILITY["position"]),
            )
          )
        },
      }
    )
  says_background = bool(u[6] < _MENTION_PROBABILITY["background"])
  background_text = pick(_BACKGROUND_FORMS, 7).format(background) if says_background else ""
  styles = [int(u[8] * 3), int(u[9] * 3)]

  def located(k):
    return " " + POSITION_PHRASES[objects[k]["position"]] if says[k]["position"] else ""

  if len(objects) == 1:
    obj, s = objects[0], says[0]
    frame = int(u[10] * 5)
    if frame == 4:
      # Attribute-list wording teaches the generic words ("shape", "color", "pattern",
      # "size") that descriptor phrases such as "red color" are made of.
      parts = [f"{obj['shape']} shape", f"{obj['colour']} color"]
      parts += [
        f"{obj[f]} {word}" for f, word in (("pattern", "pattern"), ("size", "size")) if s[f]
      ]
      text = (
        _article(", ".join(parts)) + ("," + located(0) if s["position"] else "") + background_text
      )
    elif frame == 1 and s["position"]:
      text = f"{POSITION_PHRASES[obj['position']]}, {_article(_noun_phrase(obj, s, styles[0]))}{background_text}"
    elif frame == 2:
      adjectives = [obj[f] for f in ("size", "colour", "pattern") if s[f]]
      text = f"{_article(obj['shape'])} that is {_listed(adjectives)}{',' if s['position'] else ''}{located(0)}{background_text}"
    elif frame == 3 and says_background:
      text = f"{background} background with {_article(_noun_phrase(obj, s, styles[0]))}{located(0)}"
    else:
      text = f"{pick(_PREFIXES, 11)}{_article(_noun_phrase(obj, s, styles[0]))}{located(0)}{background_text}"
    return text, says, says_background

  first, second = (0, 1) if u[12] < 0.5 else (1, 0)
  phrases = [_article(_noun_phrase(objects[k], says[k], styles[k])) for k in range(2)]
  if u[13] < 0.25:
    # Relational wording names the layout without the position words themselves.
    for s in says:
      s["position"] = False
    relation = " to the left of " if objects[0]["position"] == "left" else " above "
    text = f"{phrases[0]}{relation}{phrases[1]}{background_text}"
  else:
    text = (
      f"{pick(_TWO_PREFIXES, 14)}{phrases[first]}{located(first)} and "
      f"{phrases[second]}{located(second)}{background_text}"
    )
  return text, says, says_background


def _captions(
  ids: Mapping[str, np.ndarray],
  background: np.ndarray,
  rng: np.random.Generator,
  always_mention: frozenset[str] = frozenset(),
) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
  n, num_slots = ids["shape"].shape
  randoms = rng.random((n, _RANDOMS_PER_CAPTION))
  mentioned = np.zeros((n, num_slots, len(FAMILIES)), bool)
  background_mentioned = np.zeros(n, bool)
  names = {f: np.asarray(VOCABULARIES[f]) for f in FAMILIES}
  captions = []
  for i in range(n):
    slots = [k for k in range(num_slots) if ids["shape"][i, k] >= 0]
    objects = [{f: names[f][ids[f][i, k]] for f in FAMILIES} for k in slots]
    text, says, background_mentioned[i] = _caption(
      objects, BACKGROUNDS[background[i]], randoms[i], always_mention
    )
    captions.append(text)
    for k, s in zip(slots, says):
      mentioned[i, k] = [s[f] for f in FAMILIES]
  return tuple(captions), mentioned, background_mentioned


# ---------------------------------------------------------------------------------------------

_CHUNK = 256  # images rasterised at once: bounds memory (a few tens of MB at 64x64)


def _build_batch(
  ids: Mapping[str, np.ndarray],
  background: np.ndarray,
  rng: np.random.Generator,
  *,
  image_size: int,
  jitter: bool,
  always_mention: frozenset[str] = frozenset(),
) -> SyntheticBatch:
  if image_size < 16:
    raise ValueError(f"image_size must be >= 16, got {image_size}")
  n = len(background)
  ids = {f: np.asarray(ids[f], np.int64) for f in FAMILIES}
  background = np.asarray(background, np.int64)
  captions, mentioned, background_mentioned = _captions(ids, background, rng, always_mention)
  images = np.empty((n, image_size, image_size, 3), np.uint8)
  masks = np.empty((n, image_size, image_size), np.int8)
  for start in range(0, n, _CHUNK):
    part = slice(start, min(n, start + _CHUNK))
    images[part], masks[part] = _rasterise(
      {f: v[part] for f, v in ids.items()}, background[part], rng, image_size, jitter
    )
  return SyntheticBatch(
    images=images,
    captions=captions,
    **{f: ids[f].astype(np.int8) for f in FAMILIES},
    background=background.astype(np.int8),
    masks=masks,
    mentioned=mentioned,
    background_mentioned=background_mentioned,
  )
