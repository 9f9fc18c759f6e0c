"""App. A.1's Fig. 1 (mutual.protocols.layers): the [CLS] token's similarity across layers, its
inputs from the ViT tower (block outputs and per-block keys), the matrices, and the figure."""

import types

import numpy as np
import pytest

import stori_jax
from mutual import data, features, protocols
from mutual.paper_config import analysis_config
from mutual.protocols import layers
from stori_jax.plumbing.config_files import ConfigError
from stori_jax.data.preprocess import normalize


@pytest.fixture(scope="module")
def bundle():
  return stori_jax.load("tiny-synthetic")


def _images(bundle, count=3):
  images = next(data.synthetic_classes(count, seed=3, classes=(2,))).images
  return normalize(images, bundle.preprocess_config.mean, bundle.preprocess_config.std)


def test_cosine_matrices_of_hand_checked_vectors():
  vectors = np.array([[[1.0, 0.0], [0.0, 2.0], [3.0, 3.0]]])
  m = layers.cosine_matrices(vectors)
  h = np.sqrt(0.5)
  np.testing.assert_allclose(m[0], [[1, 0, h], [0, 1, h], [h, h, 1]], atol=1e-12)
  s = layers.summary(m[0])
  assert s["last_vs_earlier"] == pytest.approx(h, abs=1e-4)  # layer 3 against 1 and 2
  assert s["among_earlier"] == 0.0  # layers 1 and 2 are orthogonal
  assert layers.summary(np.ones((2, 2)))["among_earlier"] is None


def test_class_token_layers_are_the_block_outputs_and_keys(bundle):
  """Tokens: the class token of each block's output; keys: ln_1(block input) @ W_k (no bias)
  at the class token, per block; the last block's equals the keys the analysis reads."""
  x = _images(bundle)
  tokens, keys = features.class_token_layers(bundle, x, per_pass=2)
  n_layers, width = bundle.config.vision.layers, bundle.config.vision.width
  assert tokens.shape == keys.shape == (3, n_layers, width)
  _, details = bundle.image_details(x)
  hidden = details["hidden_states"]
  for layer in range(n_layers):
    np.testing.assert_allclose(tokens[:, layer], hidden[layer + 1][:, 0], rtol=1e-6, atol=1e-6)
    block = bundle.params["vision"][f"resblocks_{layer}"]
    h = np.asarray(hidden[layer][:, 0], np.float64)
    normed = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-5)
    normed = normed * block["ln_1"]["scale"] + block["ln_1"]["bias"]
    expected = normed @ np.asarray(block["attn"]["key"]["kernel"], np.float64)
    np.testing.assert_allclose(keys[:, layer], expected, rtol=1e-4, atol=1e-4)
  np.testing.assert_array_equal(keys[:, -1], np.asarray(details["keys"])[:, 0])


def test_cnn_towers_are_refused():
  resnet = types.SimpleNamespace(config=types.SimpleNamespace(vision_kind="resnet"))
  with pytest.raises(ConfigError, match="ViT.*layer_similarity"):
    layers.check_model(resnet)
  with pytest.raises(ValueError, match="ViT"):
    features.class_token_layers(resnet, np.zeros((1, 8, 8, 3), np.float32))


def test_layer_similarity_on_the_embedded_world_and_its_figure(bundle, tmp_path, monkeypatch):
  """Three classes x 4 images of the embedded world. Measured on the full evaluation set (12 x
  16): tokens' last layer 0.700 against the earlier layers (0.752 among them); keys -0.043
  (-0.039): the tiny model's [CLS] keys of different blocks are near orthogonal."""
  classes = data.synthetic_classes(4, classes=(0, 5, 9))
  result = protocols.layer_similarity(bundle, classes, analysis_config(), progress=False)
  n_layers = bundle.config.vision.layers
  assert result["layers"] == n_layers and result["images"] == 12
  for name in layers.FEATURES:
    m = np.asarray(result[name])
    assert m.shape == (n_layers, n_layers)
    np.testing.assert_allclose(np.diag(m), 1.0, atol=1e-6)
    np.testing.assert_allclose(m, m.T, atol=1e-6)
    assert (m <= 1 + 1e-6).all() and (m >= -1 - 1e-6).all()
  # The tokens flow through the residual stream: neighbouring layers stay similar (> 0.5);
  # the keys of different blocks are projected by different weights (|cos| < 0.3 here).
  t, k = np.asarray(result["tokens"]), np.asarray(result["keys"])
  assert min(t[i, i + 1] for i in range(n_layers - 1)) > 0.5
  assert np.abs(k[~np.eye(n_layers, dtype=bool)]).max() < 0.3
  table = protocols.markdown("layer_similarity", {"tiny-synthetic": result})
  s = result["summary"]["tokens"]
  assert f"| tiny-synthetic | {n_layers} | {s['last_vs_earlier']:.3f} |" in table

  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  closed, close = [], plt.close
  monkeypatch.setattr(plt, "close", lambda fig=None: (closed.append(fig), close(fig)))
  path = tmp_path / "layer_similarity.png"
  protocols.plot_layer_similarity(str(path), result, title="run: tiny-synthetic")
  assert path.stat().st_size > 10_000
  (fig,) = closed
  panels = [ax for ax in fig.axes if ax.get_title()]
  assert [ax.get_title().split(":")[0] for ax in panels] == [
    "(a) token features",
    "(b) key features",
  ]
  for ax in panels:
    assert ax.get_xlabel() and ax.get_ylabel()
    assert len(ax.texts) == n_layers**2  # every cell labelled with its value
  bars = [ax for ax in fig.axes if ax not in panels]
  assert len(bars) == 2 and all("cosine" in ax.get_ylabel() for ax in bars)
  assert "tiny-synthetic" in fig._suptitle.get_text()
