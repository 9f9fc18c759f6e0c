"""SToRI's reweighted attention through the text tower (paper Eq. 4)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stori_jax
from stori_jax.models import (
  CLIP,
  CLIPConfig,
  TextConfig,
  VisionConfig,
  attention_probs,
  init_params,
  reweighted_attention,
)
from stori_jax.models.transformer import ACTIVATION_FNS

CONFIG = CLIPConfig(
  embed_dim=24,
  text=TextConfig(width=32, layers=6, heads=4, activation="quick_gelu"),
  vision=VisionConfig(image_size=16, patch_size=8, width=16, layers=1, heads=2),
)


@pytest.fixture(scope="module")
def bundle():
  params = init_params(CONFIG, seed=3)
  # Non-trivial LayerNorms and biases, so the numpy reference checks every term.
  rng = np.random.default_rng(0)
  # Added in numpy (the same float32 sums): jnp's eager add compiled a program per shape.
  params = jax.tree_util.tree_map(
    lambda p: jax.device_put(
      np.asarray(p) + 0.05 * rng.standard_normal(np.shape(p)).astype(np.float32)
    ),
    params,
  )
  return stori_jax.CLIPBundle(config=CONFIG, params=params)


@pytest.fixture(scope="module")
def tokens(bundle):
  return bundle.tokenize(
    [
      "a photo of a (red:1.5) striped circle on a (gray:0.3) background",
      "a (small:0) (blue dotted:2.5) square",
      "a plain (star:1e-3)",
    ],
    with_weights=True,
  )


# An independent numpy forward of the text tower ------------------------------------


def _ln(x, p, eps=1e-5):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def _dense(x, p):
  return x @ np.asarray(p["kernel"], np.float64) + np.asarray(p["bias"], np.float64)


def numpy_text_tower(params, ids, weights, first_block, activation):
  """float64 numpy: a_mn = w_n exp(s_mn) / sum_j w_j exp(s_mj) in blocks >= first_block (0-idx)."""
  params = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
  text, heads = params["text"], CONFIG.text.heads
  batch, length = ids.shape
  x = text["token_embedding"]["embedding"][ids] + text["positional_embedding"][:length]
  causal = np.tril(np.ones((length, length), bool))
  act = {
    "quick_gelu": lambda v: v / (1 + np.exp(-1.702 * v)),
    "gelu": lambda v: np.asarray(ACTIVATION_FNS["gelu"](jnp.asarray(v)), np.float64),
  }[activation]
  for i in range(CONFIG.text.layers):
    block = text[f"resblocks_{i}"]
    h = _ln(x, block["ln_1"])
    split = lambda t: t.reshape(batch, length, heads, -1).transpose(0, 2, 1, 3)
    q, k, v = (split(_dense(h, block["attn"][n])) for n in ("query", "key", "value"))
    scores = np.exp(q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1]))
    scores = scores * causal
    if i >= first_block:
      scores = scores * weights[:, None, None, :]
    attn = scores / scores.sum(-1, keepdims=True)
    out = (attn @ v).transpose(0, 2, 1, 3).reshape(batch, length, -1)
    x = x + _dense(out, block["attn"]["out"])
    x = x + _dense(act(_dense(_ln(x, block["ln_2"]), block["mlp"]["c_fc"])), block["mlp"]["c_proj"])
  eot = np.argmax(ids == CONFIG.text.eot_token_id, axis=1)
  return _ln(x[np.arange(batch), eot], text["ln_final"]) @ text["text_projection"]


@pytest.mark.parametrize("start_block", [1, 4, 6])
def test_matches_numpy_weighted_softmax(bundle, tokens, start_block):
  ids, weights = tokens
  ours = np.asarray(bundle.encode_text(ids, weights, start_block=start_block))
  reference = numpy_text_tower(bundle.params, ids, weights, start_block - 1, "quick_gelu")
  np.testing.assert_allclose(ours, reference, rtol=0, atol=2e-5 * np.abs(reference).max())


def test_unit_weights_are_plain_clip(bundle, tokens):
  ids, _ = tokens
  plain = np.asarray(bundle.encode_text(ids))
  ones = np.asarray(bundle.encode_text(ids, np.ones(ids.shape, np.float32), start_block=1))
  assert np.abs(ones - plain).max() <= 1e-6 * np.abs(plain).max()


def test_default_start_block_is_the_papers_relative_depth(bundle, tokens):
  ids, weights = tokens
  np.testing.assert_array_equal(
    bundle.encode_text(ids, weights), bundle.encode_text(ids, weights, start_block=4)
  )
  assert stori_jax.models.default_start_block(12) == 7


def test_weights_change_the_embedding_monotonically(bundle):
  """More weight on 'red' moves the embedding further from the unweighted one."""
  ids, _ = bundle.tokenize(["a photo of a red circle"], with_weights=True)
  position = 5
  plain = np.asarray(bundle.encode_text(ids))[0]
  distances = []
  for w in (1.0, 1.5, 2.0, 4.0):
    weights = np.ones(ids.shape, np.float32)
    weights[0, position] = w
    distances.append(np.linalg.norm(np.asarray(bundle.encode_text(ids, weights))[0] - plain))
  assert distances[0] == 0 and all(a < b for a, b in zip(distances, distances[1:]))


@jax.jit
def _block_eot_share(block, x, mask, log_w, eot, position):
  """One block's mean over heads of the EOT query's attention to `position` (one program for
  every block, rather than an eager program per op)."""
  mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
  h = (x - mean) / jnp.sqrt(var + 1e-5) * block["ln_1"]["scale"] + block["ln_1"]["bias"]
  q, k = (h @ block["attn"][n]["kernel"] + block["attn"][n]["bias"] for n in ("query", "key"))
  split = lambda t: t.reshape(*t.shape[:2], CONFIG.text.heads, -1)
  probs = attention_probs(split(q), split(k), mask, log_w)
  return probs[0, :, eot, position].mean()


def _eot_attention_share(bundle, ids, weights, position, start_block):
  """Mean over heads of the EOT query's attention to `position`, at every block."""
  params = bundle.params["text"]
  _, hidden = bundle.text_hidden_states(ids, weights, start_block=start_block)
  eot = int(np.argmax(ids[0] == CONFIG.text.eot_token_id))
  log_w = jnp.log(jnp.asarray(weights))
  mask = np.tril(np.ones((ids.shape[1],) * 2, bool))
  shares = []
  for i in range(CONFIG.text.layers):
    block_log_w = log_w if i >= start_block - 1 else None
    share = _block_eot_share(params[f"resblocks_{i}"], hidden[i], mask, block_log_w, eot, position)
    shares.append(float(share))
  return np.array(shares)


def test_raising_a_weight_raises_its_eot_attention_at_every_reweighted_block(bundle):
  ids, _ = bundle.tokenize(["a photo of a red striped circle"], with_weights=True)
  position, start_block = 5, 3
  base = np.ones(ids.shape, np.float32)
  raised = base.copy()
  raised[0, position] = 2.0
  share_base = _eot_attention_share(bundle, ids, base, position, start_block)
  share_raised = _eot_attention_share(bundle, ids, raised, position, start_block)
  np.testing.assert_allclose(
    share_raised[: start_block - 1], share_base[: start_block - 1], rtol=1e-5
  )
  assert np.all(share_raised[start_block - 1 :] > share_base[start_block - 1 :]), (
    share_base,
    share_raised,
  )


@functools.partial(jax.jit, static_argnames="dtype")
def _sum_of_squares_and_grad(params, ids, log_w, dtype):
  """sum(features**2) and its gradient in log w, jitted as training runs them (eagerly, the
  forward and backward passes compiled a program per op)."""
  model = CLIP(CONFIG, dtype=dtype)

  def loss(log_weights):
    features = model.apply(
      {"params": params}, ids, log_weights, (2, 3, 4, 5), method=CLIP.encode_text
    )
    return jnp.sum(features**2)

  return jax.value_and_grad(loss)(log_w)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("weight", [0.0, 1e-3, 1.0, 1e3])
def test_gradients_wrt_log_weights_are_finite(bundle, weight, dtype):
  ids, _ = bundle.tokenize(["a photo of a red striped circle"], with_weights=True)
  log_w = np.zeros(ids.shape, np.float32)
  log_w[0, 5] = np.log(np.float32(weight)) if weight else -np.inf
  value, grad = _sum_of_squares_and_grad(bundle.params, ids, jnp.asarray(log_w), dtype=dtype)
  grad = np.asarray(grad)
  assert np.isfinite(value) and np.all(np.isfinite(grad))
  if 0 < weight < 1e3:
    assert np.abs(grad[0, 5]) > 0  # The weighted token matters.


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_zero_weight_excludes_the_token(dtype):
  """w = 0 is the same as deleting the key: exact exclusion, no NaN/inf."""
  # Inputs built and cut in numpy (the same values: the cast is elementwise), so that only the
  # functions under test compile programs.
  rng = np.random.default_rng(0)
  q_np, k_np, v_np = (rng.standard_normal((2, 6, 2, 4)) for _ in range(3))
  q, k, v = (jnp.asarray(a, dtype) for a in (q_np, k_np, v_np))
  mask = np.tril(np.ones((6, 6), bool))
  log_w = np.zeros((2, 6), np.float32)
  log_w[:, 2] = -np.inf
  out = reweighted_attention(q, k, v, mask, log_w)
  assert np.all(np.isfinite(np.asarray(out, np.float32)))
  probs = jax.jit(attention_probs)(q, k, mask, log_w)
  assert float(np.abs(np.asarray(probs)[..., 2]).max()) == 0.0
  keep = np.array([0, 1, 3, 4, 5])
  q_keep, k_keep, v_keep = (jnp.asarray(a[:, keep], dtype) for a in (q_np, k_np, v_np))
  expected = reweighted_attention(q_keep, k_keep, v_keep, mask[keep][:, keep])
  tol = 1e-6 if dtype == jnp.float32 else 1e-2
  np.testing.assert_allclose(
    np.asarray(out, np.float32)[:, keep], np.asarray(expected, np.float32), atol=tol
  )
  grad = jax.jit(
    jax.grad(lambda lw: jnp.sum(reweighted_attention(q, k, v, mask, lw).astype(jnp.float32)))
  )(log_w)
  assert np.all(np.isfinite(grad))


def test_prompt_weighting_baseline(bundle):
  ids, _ = bundle.tokenize(["a photo of a red striped circle"], with_weights=True)
  plain = np.asarray(bundle.encode_text(ids))
  ones = np.ones(ids.shape, np.float32)
  np.testing.assert_allclose(
    bundle.encode_text(ids, ones, method="prompt_weighting"), plain, atol=1e-6
  )
  emphasised = ones.copy()
  emphasised[0, 5] = 2.0
  pw = np.asarray(bundle.encode_text(ids, emphasised, method="prompt_weighting"))
  stori = np.asarray(bundle.encode_text(ids, emphasised))
  assert np.abs(pw - plain).max() > 1e-3 and np.abs(pw - stori).max() > 1e-3
  with pytest.raises(ValueError, match="method must be"):
    bundle.encode_text(ids, emphasised, method="other")


def test_encode_prompts_equals_tokenize_then_encode(bundle):
  prompt = "a woman with (blonde hair:1.5), wearing (eyeglasses:0.5)"
  ids, weights = bundle.tokenize([prompt], with_weights=True)
  assert sorted(set(weights[0].tolist())) == [0.5, 1.0, 1.5]
  np.testing.assert_array_equal(bundle.encode_prompts([prompt]), bundle.encode_text(ids, weights))


def test_reweighted_block_range_is_validated(bundle, tokens):
  ids, weights = tokens
  with pytest.raises(ValueError, match="outside the text tower's blocks 1..6"):
    bundle.encode_text(ids, weights, start_block=7)
  with pytest.raises(ValueError, match="outside"):
    bundle.encode_text(ids, weights, start_block=4, stop_block=3)


@pytest.mark.parametrize("first", [0, 3, 5, 6])
def test_cached_prefix_and_eot_only_last_block_are_exact(bundle, tokens, first):
  """The training fast path equals the plain forward pass."""
  ids, weights = tokens
  model = CLIP(CONFIG)
  variables = {"params": bundle.params}
  log_w = jnp.log(jnp.asarray(weights))
  blocks = tuple(range(max(first, 3), CONFIG.text.layers))
  hidden = model.apply(variables, ids, first, method=CLIP.text_prefix)
  fast = model.apply(variables, hidden, ids, first, log_w, blocks, method=CLIP.encode_text_from)
  full = model.apply(variables, ids, log_w, blocks, method=CLIP.encode_text)
  np.testing.assert_allclose(fast, full, rtol=0, atol=2e-6 * float(jnp.abs(full).max()))
  # Cutting the rows after the longest EOT changes nothing either (causal mask).
  cut = int(np.argmax(ids == CONFIG.text.eot_token_id, axis=1).max()) + 1
  short = model.apply(
    variables,
    model.apply(variables, ids[:, :cut], first, method=CLIP.text_prefix),
    ids[:, :cut],
    first,
    log_w[:, :cut],
    blocks,
    method=CLIP.encode_text_from,
  )
  np.testing.assert_allclose(short, full, rtol=0, atol=2e-6 * float(jnp.abs(full).max()))
