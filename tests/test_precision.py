"""fp32 means fp32 (design.md section 3): in float32 every matrix product and convolution of the
towers and of the mutual-knowledge stages requests HIGHEST precision, so that a GPU does not run
TF32 nor a TPU bf16 passes; in bfloat16 they keep DEFAULT precision, accumulated in float32.
Read from the lowered StableHLO, so no accelerator is needed (a CPU computes fp32 exactly either
way)."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stori_jax
from mutual import concepts, descriptors
from stori_jax.clip.bundle import tower_functions
from stori_jax.models import (
  CLIP,
  CLIPConfig,
  ConvNeXtConfig,
  ResNetConfig,
  TextConfig,
  VisionConfig,
  param_shapes,
)

# Small random models of the three image-tower families (as tests/test_zoo_parity.py builds
# them), each with its text transformer.
TEXT = TextConfig(width=64, layers=2, heads=4, activation="quick_gelu")
FAMILIES = {
  "vit": CLIPConfig(
    embed_dim=16,
    text=TextConfig(width=32, layers=2, heads=2),
    vision=VisionConfig(image_size=32, patch_size=8, width=32, layers=2, heads=4),
  ),
  "resnet": CLIPConfig(
    embed_dim=40,
    text=TEXT,
    vision=ResNetConfig(image_size=64, layers=(1, 2, 1, 1), width=16, heads=8),
  ),
  "convnext": CLIPConfig(
    embed_dim=40,
    text=dataclasses.replace(TEXT, activation="gelu"),
    vision=ConvNeXtConfig(image_size=64, depths=(1, 1, 2, 1), dims=(16, 32, 48, 64)),
  ),
}

_OPS = re.compile(r"stablehlo\.(dot_general|convolution)")
# dot_general prints `precision = [HIGHEST, HIGHEST]`; convolution (and the generic form)
# `precision_config = [#stablehlo<precision HIGHEST>, ...]`. Absent means DEFAULT.
_PRECISION = re.compile(r"precision(?:_config)? = \[([^\]]*)\]")
_RESULT = re.compile(r"->\s*tensor<(?:[\d?]+x)*(\w+)>")


@dataclasses.dataclass(frozen=True)
class Product:
  op: str  # "dot_general" or "convolution"
  precision: tuple[str, ...]  # per operand: "DEFAULT", "HIGH" or "HIGHEST"
  result: str  # element type of the result, e.g. "f32"
  line: str


def products(hlo: str) -> list[Product]:
  """Every dot_general and convolution of a lowered program's StableHLO text."""
  found = []
  for line in hlo.splitlines():
    op = _OPS.search(line)
    if not op:
      continue
    match = _PRECISION.search(line)
    precision = ("DEFAULT", "DEFAULT")
    if match:
      precision = tuple(re.findall(r"DEFAULT|HIGHEST|HIGH", match.group(1))) or precision
    result = _RESULT.findall(line)
    found.append(Product(op.group(1), precision, result[-1] if result else "", line.strip()))
  return found


def lowered_towers(config: CLIPConfig, dtype) -> dict[str, str]:
  """StableHLO of the image tower (with its details), the reweighted text tower, the cached-prefix
  text path, the prompt-weighting baseline and CLIP's logits, in `dtype`."""
  model = CLIP(config, dtype=dtype)
  text, image = tower_functions(model)
  params = param_shapes(config)
  size, context = config.vision.image_size, config.text.context_length
  images = jax.ShapeDtypeStruct((2, size, size, 3), jnp.float32)
  ids = jax.ShapeDtypeStruct((2, context), jnp.int32)
  weights = jax.ShapeDtypeStruct((2, context), jnp.float32)
  hidden = jax.ShapeDtypeStruct((2, context, config.text.width), dtype)

  def apply(method, *static):
    """method(*args, *static) as a jitted function of (params, *args)."""
    return jax.jit(lambda p, *args: model.apply({"params": p}, *args, *static, method=method))

  def from_block(module, hidden, ids, weights):  # the prompt bank's path from a cached prefix
    return module.encode_text_from(hidden, ids, 1, weights, (1,))

  lowered = {
    "image": image.lower(params, images, True),
    "text": text.lower(params, ids, weights, (1,), True),
    "text_from": apply(from_block).lower(params, hidden, ids, weights),
    "prompt_weighting": apply(CLIP.encode_text_prompt_weighting, 1).lower(params, ids, weights),
    "logits": apply(CLIP.__call__).lower(params, images, ids),
  }
  return {part: program.as_text() for part, program in lowered.items()}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_float32_towers_request_highest_precision(family):
  config = FAMILIES[family]
  for part, lowered in lowered_towers(config, jnp.float32).items():
    found = products(lowered)
    assert found, (family, part)
    low = [p.line for p in found if p.precision != ("HIGHEST", "HIGHEST")]
    assert not low, (family, part, low[:3])
    if part == "image":
      assert any(p.op == "convolution" for p in found), family


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_bfloat16_towers_keep_default_precision_and_float32_accumulation(family):
  config = FAMILIES[family]
  for part, lowered in lowered_towers(config, jnp.bfloat16).items():
    found = products(lowered)
    assert found, (family, part)
    assert all(p.precision == ("DEFAULT", "DEFAULT") for p in found), (family, part)
    dots = [p for p in found if p.op == "dot_general"]
    bf16_dots = [p for p in dots if "xbf16>" in p.line.split("->")[0]]
    assert bf16_dots, (family, part)
    rounded = [p for p in bf16_dots if p.result != "f32"]
    # Every bf16 product accumulates in float32 (`dense`, attention), except ConvNeXt's head
    # projection, a plain bf16 nn.Dense, as before.
    allowed = 1 if family == "convnext" and part in ("image", "logits") else 0
    assert len(rounded) == allowed, (family, part, [p.line for p in rounded])


def test_bundle_logits_follow_the_compute_dtype():
  config = FAMILIES["vit"]
  params = jax.tree_util.tree_map(lambda s: np.zeros(s.shape, s.dtype), param_shapes(config))
  bundle = stori_jax.CLIPBundle(config=config, params=params)
  features = jax.ShapeDtypeStruct((3, config.embed_dim), jnp.float32)
  for dtype, expected in ((jnp.float32, "HIGHEST"), (jnp.bfloat16, "DEFAULT")):
    hlo = jax.jit(bundle.with_dtype(dtype).logits).lower(features, features).as_text()
    found = products(hlo)
    assert len(found) == 1 and found[0].precision == (expected, expected), found


def test_mutual_stages_request_highest_precision():
  f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)  # noqa: E731
  lowered = {
    "cosine_scores": jax.jit(descriptors.cosine_scores).lower(f32(2, 5, 16), f32(40, 16)),
    "language_concepts": descriptors.language_concepts.lower(
      f32(6, 16), f32(40, 16), jax.ShapeDtypeStruct((2,), jnp.int32), u=4
    ),
    "pca": concepts._pca_assign.lower(
      f32(30, 8), jax.ShapeDtypeStruct((30,), bool), n_concepts=3, sign_rule="sklearn>=1.5"
    ),
    "kmeans": concepts.kmeans.lower(
      jax.random.PRNGKey(0), f32(30, 8), jax.ShapeDtypeStruct((30,), bool), k=3, n_init=2
    ),
  }
  for name, program in lowered.items():
    found = products(program.as_text())
    assert found, name
    assert all(p.precision == ("HIGHEST", "HIGHEST") for p in found), (name, found)
