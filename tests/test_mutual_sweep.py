"""The sweep over models (mutual.sweep): the language stages batched across models equal the
per-model ones, the models share their compiled towers and the pool frees what it drops, and the
offline sweep on random-weight instances of the study's architectures equals the per-model
pipeline and writes Table 3 and the Figure 3 fits."""

import functools
import json
import math
import os
import time
import weakref

import huggingface_hub.constants
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mutual import data, pipeline, report, sweep
from stori_jax.clip.bundle import CLIPBundle
from stori_jax.checkpoints import CheckpointError, hub
from stori_jax.plumbing import config_files
from stori_jax.plumbing.config_files import ConfigError, load_config
from stori_jax.models import registry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Fast test (configs/mutual_sweep.py:smoke): one model per tower kind, shrunk 16x in width:
#: embedding dims 32 / 64 / 40 and feature dims 48 / 128 / 64 on one 2 x 2 grid, so both paddings
#: are exercised; and a second ViT-B/32 (DataComp's) whose patch features have the first's shape,
#: so the foreground split batched across models (config.spectral_across_models) batches a pair.
FAST_MODELS = (
  "openai-vit-b-32",
  "datacomp-vit-b-32",
  "openai-rn50",
  "laion-aesthetic-convnext-base-w",
)


def _config(argument="random"):
  return load_config(os.path.join(ROOT, "configs/mutual_sweep.py"), argument)


def _unit(x):
  return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# (a) Batched across models == per model.


def test_zero_padding_leaves_cosine_scores_unchanged():
  rng = np.random.default_rng(0)
  a, b = _unit(rng.normal(size=(4, 12))), _unit(rng.normal(size=(6, 12)))
  padded = sweep.pad_stack([a], 20)[0]
  padded_b = sweep.pad_stack([b], 20)[0]
  assert padded.shape == (4, 20)
  np.testing.assert_array_equal(padded[:, :12], a)
  assert not np.asarray(padded[:, 12:]).any()
  # Equal up to summation order (numpy sums 12 and 20 entries in different blocks).
  np.testing.assert_allclose(np.linalg.norm(padded, axis=-1), np.linalg.norm(a, axis=-1), atol=1e-7)
  np.testing.assert_allclose(padded @ padded_b.T, a @ b.T, atol=1e-6)


def test_language_stages_batched_across_models_equal_per_model():
  """Two models with embedding dims 16 and 40 (zero-padded to 40), stacked: every output of
  language_stages equals the model's own call (ott's Sinkhorn; the reference loop in the sweep
  test below)."""
  rng = np.random.default_rng(1)
  b, l, d, c = 3, 5, 60, 4
  inputs = []
  for e in (16, 40):
    desc = _unit(rng.normal(size=(d, e)))
    image = _unit(rng.normal(size=(b, e)) + desc[:4].sum(0))
    concepts = (0.7 * image[:, None] + 0.3 * _unit(rng.normal(size=(b, l, e)))).astype(np.float32)
    valid = rng.random((b, l)) > 0.2
    valid[:, 0] = True
    classes = _unit(rng.normal(size=(c, e)))
    predicted = rng.integers(0, c, size=b)
    inputs.append((concepts, valid, image, desc, classes, predicted))
  options = dict(top_k=25, u=10, solver="ott")
  batched = sweep.batched_language_stages(*zip(*inputs), **options)
  for m, args in enumerate(inputs):
    single = pipeline.language_stages(*map(jnp.asarray, args), **options)
    assert set(single) == set(batched)
    for key, value in single.items():
      got, want = np.asarray(batched[key][m]), np.asarray(value)
      if np.issubdtype(want.dtype, np.floating):
        np.testing.assert_allclose(got, want, atol=1e-5, err_msg=key)
      else:
        np.testing.assert_array_equal(got, want, err_msg=key)
    assert np.asarray(single["n_visual"]).sum() > 0 and np.asarray(single["curve"]).max() > 0


def test_foreground_batched_across_models_groups_them_by_shape(monkeypatch):
  """Issue 41: five models' patch features of one class in three shapes (two pairs, not
  adjacent, and one alone): each shape with more than one model is one batched split, a model
  alone is split on its own, and every mask equals the model's own `pipeline.split_foreground`."""
  rng = np.random.default_rng(7)
  shapes = [(2, 3, 3, 16), (2, 2, 2, 24), (2, 3, 3, 16), (2, 4, 4, 8), (2, 2, 2, 24)]
  patches = [rng.normal(size=s).astype(np.float32) for s in shapes]
  analysis = _config("smoke").analysis
  batches = []
  across = pipeline.split_foreground_across

  def counting(group, analysis):
    batches.append([np.shape(p) for p in group])
    return across(group, analysis)

  monkeypatch.setattr(pipeline, "split_foreground_across", counting)
  masks = sweep.batched_foreground(patches, analysis)
  assert batches == [[shapes[0], shapes[2]], [shapes[1], shapes[4]]]
  assert sweep.batched.shape_groups(shapes) == [[0, 2], [1, 4], [3]]
  assert len(masks) == 5
  for mask, features in zip(masks, patches):
    assert mask.shape == features.shape[:3]
    np.testing.assert_array_equal(mask, pipeline.split_foreground(features, analysis))


def test_spectral_across_models_is_true_false_or_auto_by_backend():
  """config.spectral_across_models: True / False as given (also as the strings a command line
  may leave), "auto" the measured faster way of the backend (an unmeasured one: per model) where
  the pool holds every model, and anything else a ConfigError naming the three values, raised
  by the sweep's config check."""
  resolve = sweep.batched.spectral_across_models
  assert resolve(True) is True and resolve(False) is False
  assert resolve("True") is True and resolve("false") is False
  for backend, faster in sweep.batched.SPECTRAL_ACROSS_MODELS_AUTO.items():
    assert resolve("auto", backend) is faster
    # A pool that drops models would reload them for the second visit: per model then.
    assert resolve("auto", backend, holds_all=False) is False
    assert resolve(True, backend, holds_all=False) is True
  assert sweep.batched.SPECTRAL_ACROSS_MODELS_AUTO["cpu"] is True  # measured faster (0.81, 0.85)
  assert set(sweep.batched.SPECTRAL_ACROSS_MODELS_AUTO) == {"cpu", "gpu"}
  assert resolve("auto", "tpu") is False
  for name in (
    "configs/mutual_sweep.py",
    "configs/mutual_table2_models.py",
    "configs/mutual_appg.py",
  ):
    assert load_config(os.path.join(ROOT, name), "smoke").spectral_across_models == "auto", name
  config = _config("smoke")
  config.spectral_across_models = True  # any of the three values is accepted by the config
  sweep.check_config(config)
  config.spectral_across_models = "batched"
  with pytest.raises(ConfigError, match=r'spectral_across_models must be True .* or "auto"'):
    sweep.check_config(config)


# ---------------------------------------------------------------------------------------------
# Models, the pool and the fits.


def test_random_instances_keep_the_architectures_at_small_sizes():
  sizes = {}
  for name in registry.mutual_knowledge_models():
    entry = registry.get(name)
    size = sweep.small_image_size(entry.config, 64)
    grid = size // entry.config.vision.patch_size
    assert grid >= 2 and size % entry.config.vision.patch_size == 0
    sizes[name] = size
    shrunk = sweep.shrink_config(entry.config, 16)
    assert sweep.family(shrunk) == sweep.family(entry.config)
    assert shrunk.vision_kind == entry.config.vision_kind
    assert shrunk.embed_dim == entry.config.embed_dim // 16
  assert sizes["openai-vit-b-16"] == 64 and sizes["openai-vit-l-14"] == 70
  assert (
    sizes["openai-rn50x16"] == 64
    and sweep.shrink_config(registry.get("openai-rn50").config, 1)
    == registry.get("openai-rn50").config
  )
  a = sweep.random_params(sweep.shrink_config(registry.get("openai-rn50").config, 16), seed=(0, 1))
  b = sweep.random_params(sweep.shrink_config(registry.get("openai-rn50").config, 16), seed=(0, 1))
  leaves = zip(*(sorted(_leaves(p)) for p in (a, b)))
  for (ka, va), (kb, vb) in leaves:
    assert ka == kb
    np.testing.assert_array_equal(va, vb)
  assert float(a["logit_scale"]) == pytest.approx(math.log(1 / 0.07))


def _leaves(params):
  import jax

  return [
    (jax.tree_util.keystr(k), np.asarray(v)) for k, v in jax.tree_util.tree_leaves_with_path(params)
  ]


def test_pool_holds_at_most_max_loaded_and_alternates_direction():
  loads = []

  def model(i):
    return sweep.SweepModel(registry.get("openai-rn50"), lambda: loads.append(i) or f"bundle{i}")

  pool = sweep.ModelPool([model(i) for i in range(4)], max_loaded=2)
  for i in pool.order():
    assert pool.get(i) == f"bundle{i}"
  assert pool.order() == [3, 2, 1, 0]
  for i in [3, 2, 1, 0]:
    pool.get(i)
  # Backwards after a forward pass: 3 and 2 were still held.
  assert loads == [0, 1, 2, 3, 1, 0] and pool.loads == 6
  unlimited = sweep.ModelPool([model(i) for i in range(3)])
  for _ in range(2):
    for i in unlimited.order():
      unlimited.get(i)
  assert unlimited.loads == 3


def test_pool_frees_the_weights_it_drops():
  """With one model held, the dropped bundle is gone (no reference cycle keeps its weights)
  before the next one is made."""
  alive = []

  def load(name):
    bundle = sweep.random_bundle(name, 64, 16)
    alive.append(weakref.ref(bundle.params["logit_scale"]))
    return bundle

  models = [sweep.SweepModel(registry.get(n), functools.partial(load, n)) for n in FAST_MODELS]
  pool = sweep.ModelPool(models, max_loaded=1)
  for i in pool.order():
    bundle = pool.get(i)
    bundle.encode_image(np.zeros((1, *[bundle.config.vision.image_size] * 2, 3), np.float32))
    del bundle
    # Only the held model's weights are alive.
    assert [r() is not None for r in alive] == [j == i for j in range(i + 1)]


def test_sweep_bundles_share_compiled_towers_and_match_the_plain_bundle():
  """Two instances of one architecture share their jitted towers (a reloaded model is not
  compiled again); their features equal the plain CLIPBundle's bitwise."""
  a = sweep.random_bundle("openai-vit-b-32", 64, 16)
  b = sweep.random_bundle("openai-vit-b-32", 64, 16, seed=1)
  assert isinstance(a, sweep.SweepBundle) and a._image_fn is b._image_fn
  assert a._text_fn is b._text_fn
  assert a._image_fn is not sweep.random_bundle("openai-rn50", 64, 16)._image_fn
  # Names are not architectures: ViT-L/14 and ViT-L/14@336px at one input size share theirs.
  l14, l336 = (sweep.random_bundle(n, 64, 16) for n in ("openai-vit-l-14", "openai-vit-l-14-336"))
  assert l14.config.name != l336.config.name and l14._image_fn is l336._image_fn
  assert not np.array_equal(*(_leaves(b.params)[-1][1] for b in (l14, l336)))  # own weights
  plain = CLIPBundle(a.config, a.params, a.dtype, a.preprocess_config, a.source)
  images = np.random.default_rng(5).normal(size=(2, 64, 64, 3)).astype(np.float32)
  np.testing.assert_array_equal(a.encode_image(images), plain.encode_image(images))
  np.testing.assert_array_equal(
    a.image_details(images)[1]["feature_map"], plain.image_details(images)[1]["feature_map"]
  )
  ids = a.tokenize(["a red square", "a photo of a cat"])
  np.testing.assert_array_equal(a.encode_text(ids), plain.encode_text(ids))
  assert sweep.SweepBundle.of(plain)._image_fn is a._image_fn


def test_fits_are_least_squares_and_pearson():
  rng = np.random.default_rng(4)
  rows = []
  for i, fam in enumerate(["ViT"] * 4 + ["ResNet"] * 3 + ["ConvNeXt"] * 2):
    auc = 3 + rng.random()
    rows.append(
      dict(
        name=f"m{i}",
        label=f"M{i}",
        family=fam,
        top1=10 * auc + rng.normal(),
        reported_top1=dict(paper=None if i == 0 else 60.0 + i, open_clip=None),
        pca=dict(auc=auc),
      )
    )
  fits = sweep.auc_accuracy_fits(rows, ("pca",))
  x = np.array([r["pca"]["auc"] for r in rows])
  y = np.array([r["top1"] for r in rows])
  slope, intercept = np.polyfit(x, y, 1)
  assert fits["pca"]["all"]["slope"] == pytest.approx(slope)
  assert fits["pca"]["all"]["intercept"] == pytest.approx(intercept)
  assert fits["pca"]["all"]["pearson_r"] == pytest.approx(np.corrcoef(x, y)[0, 1])
  vit = [r for r in rows if r["family"] == "ViT"]
  assert fits["pca"]["ViT"]["slope"] == pytest.approx(
    np.polyfit([r["pca"]["auc"] for r in vit], [r["top1"] for r in vit], 1)[0]
  )
  assert fits["pca"]["ConvNeXt"]["slope"] is None and fits["pca"]["ConvNeXt"]["n"] == 2
  paper = sweep.auc_accuracy_fits(rows, ("pca",), accuracy="paper")
  assert paper["pca"]["all"]["n"] == 8 and "m0" not in paper["pca"]["all"]["models"]
  flat = [dict(r, top1=50.0) for r in rows]
  assert sweep.auc_accuracy_fits(flat, ("pca",))["pca"]["all"]["pearson_r"] is None


# ---------------------------------------------------------------------------------------------
# Table 3 and Figure 3 as a reader sees them.


def _study_rows(seed=0):
  """Rows of the 13 study models as a random-weight sweep gives them: Top-1 of 0-25 %."""
  rng = np.random.default_rng(seed)
  rows = []
  for name in registry.mutual_knowledge_models():
    entry = registry.get(name)
    row = dict(
      name=name,
      label=entry.label,
      family=sweep.family(entry.config),
      data=entry.data,
      top1=float(rng.choice([0.0, 12.5, 25.0])),
      reported_top1=dict(paper=entry.imagenet_paper, open_clip=entry.imagenet_open_clip),
    )
    for method in ("pca", "kmeans"):
      curve = np.append(np.sort(rng.random(9) * 3)[::-1], 0.0)
      row[method] = dict(mi=float(curve[0]), auc=float(curve.mean()), curve=curve.tolist())
    rows.append(row)
  return rows


def _figures(monkeypatch):
  """The figures the plot functions close (their titles, legends and axes stay readable)."""
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  closed, close = [], plt.close
  monkeypatch.setattr(plt, "close", lambda fig=None: (closed.append(fig), close(fig)))
  return closed


def _texts(fig) -> list[str]:
  """Every title and legend text of a figure."""
  out = [fig._suptitle.get_text()] if fig._suptitle is not None else []
  for ax in fig.axes:
    out.append(ax.get_title())
    if ax.get_legend() is not None:
      out += [t.get_text() for t in ax.get_legend().get_texts()]
  for legend in fig.legends:
    out += [t.get_text() for t in legend.get_texts()]
  return out


def test_random_weights_are_said_in_the_table_and_every_figure_title(tmp_path, monkeypatch):
  """A random-weight sweep's rows keep the trained models' names: its table, figure titles and
  log must say that the weights are random."""
  rows, methods = _study_rows(), ("pca", "kmeans")
  table = sweep.markdown_table(rows, methods, random_weights=True)
  body = table.strip().splitlines()[2:]
  assert len(body) == 13 and all("| random weights |" in line for line in body)
  assert "WIT-400M" not in table and "Top-1 paper, trained weights (%)" in table
  assert "random weights" not in sweep.markdown_table(rows, methods)
  figures = _figures(monkeypatch)
  fits = sweep.auc_accuracy_fits(rows, methods)
  for random_weights in (True, False):
    sweep.plot_auc_vs_accuracy(
      str(tmp_path / "fig.png"), rows, fits, methods, title="s", random_weights=random_weights
    )
    sweep.plots.plot_curves(
      str(tmp_path / "curves.png"), rows, "pca", title="s", random_weights=random_weights
    )
  for fig in figures[:2]:
    heading = fig._suptitle.get_text() if fig._suptitle else fig.axes[0].get_title()
    assert "random weights" in heading, heading
  for fig in figures[2:]:
    assert not any("random weights" in t for t in _texts(fig))


def test_thirteen_models_get_distinct_colours_and_markers_grouped_by_family(tmp_path, monkeypatch):
  rows = _study_rows()
  styles = sweep.plots.model_styles(rows)
  assert len(styles) == 13
  assert len({c for c, _ in styles.values()}) == 13  # colours alone tell models apart
  assert len({m for _, m in styles.values()}) == 13  # and so do markers (grey-scale print)
  # A model keeps its style in a subset of the study.
  assert sweep.plots.model_styles(rows[4:9])["openai-rn50"] == styles["openai-rn50"]
  figures = _figures(monkeypatch)
  sweep.plots.plot_curves(str(tmp_path / "curves.png"), rows, "pca")
  (legend,) = figures[0].legends
  labels = [t.get_text() for t in legend.get_texts()]
  heads = [labels.index(f"{fam}:") for fam in ("ViT", "ResNet", "ConvNeXt")]
  assert heads == sorted(heads) and len(labels) == 13 + 3
  family_of = {r["label"]: r["family"] for r in rows}
  for fam, start, stop in zip(("ViT", "ResNet", "ConvNeXt"), heads, heads[1:] + [len(labels)]):
    members = [label.split(" (AUC")[0] for label in labels[start + 1 : stop]]
    assert members and all(family_of[m] == fam for m in members)
  # Each line is drawn in its model's (colour, marker).
  lines = figures[0].axes[0].get_lines()
  assert len({(line.get_color(), line.get_marker()) for line in lines}) == 13


def test_fit_lines_print_a_minus_sign_not_plus_minus(tmp_path, monkeypatch):
  fit = dict(slope=11.24, intercept=-7.72, pearson_r=0.5, n=13)
  assert sweep.table.fit_equation(fit) == "11.24 AUC - 7.72"
  assert sweep.table.fit_equation(dict(fit, intercept=25.97)) == "11.24 AUC + 25.97"
  assert sweep.table.signed(-0.001) == "+ 0.00"  # no "- 0.00"
  assert sweep.table.fit_equation(dict(fit, slope=-0.001)) == "0.00 AUC - 7.72"
  rows = [dict(r, top1=30.0 * r["pca"]["auc"] - 20.0) for r in _study_rows()]  # intercept -20
  fits = sweep.auc_accuracy_fits(rows, ("pca",))
  assert fits["pca"]["all"]["intercept"] == pytest.approx(-20.0)
  figures = _figures(monkeypatch)
  sweep.plot_auc_vs_accuracy(str(tmp_path / "fig.png"), rows, fits, ("pca",))
  legend = [t for t in _texts(figures[0]) if "AUC" in t and "r =" in t]
  assert legend and not any("+ -" in t for t in legend)
  # No text labels on the points: they overlapped where AUCs were close.
  assert not figures[0].axes[0].texts


# ---------------------------------------------------------------------------------------------
# (b) The offline sweep end to end.


#: random_bundle memoised: the sweeps and the per-model reference use the same (deterministic)
#: bundles, so their compiled encoders are shared.
_BUNDLES = functools.lru_cache(maxsize=None)(sweep.random_bundle)


@pytest.fixture
def shared_bundles(monkeypatch):
  monkeypatch.setattr(sweep.models, "random_bundle", _BUNDLES)  # where sweep_models reads it
  return _BUNDLES


def _reference(config, name, bundle, methods):
  """The per-model path: mutual.analyze's pipeline on each class, aggregated by mutual.report."""
  size = bundle.config.vision.image_size
  dataset = data.prepare(config)
  names = list(dataset.names)
  bank = pipeline.encode_config_bank(bundle, config, dataset, progress=False)
  records = []
  for cls in dataset.classes(size):
    result = pipeline.analyze_class(bundle, cls.images, bank, config.analysis, methods)
    records += report.image_records(cls, result, bank.descriptors, names, methods)
  return records


def _check_outputs(workdir, results, names, methods):
  table = (workdir / "table.md").read_text()
  assert table.startswith("| Family | Model | Data | Top-1 (%) | MI PCA | MI K-means |")
  for name in names:
    entry = registry.get(name)
    data = "random weights" if results["weights"] == "random" else entry.data
    assert f"| {entry.label} | {data} |" in table, name
    row = results["models"][name]
    assert row["images"] == results["images_per_model"] > 0
    assert row["reported_top1"]["paper"] == entry.imagenet_paper
    for method in methods:
      assert math.isfinite(row[method]["mi"]) and math.isfinite(row[method]["auc"])
      assert row[method]["auc"] <= row[method]["mi"] + 1e-6  # the curve starts at the MI
  assert len(table.strip().splitlines()) >= len(names) + 2
  assert (workdir / "fig3_auc_vs_accuracy.png").stat().st_size > 5000
  for method in methods:
    assert (workdir / f"fig3_curves_{method}.png").stat().st_size > 1000
    assert (workdir / f"fig3_{method}.png").stat().st_size > 5000  # the paper's three panels
    fit = results["fits"][method]["all"]
    assert fit["n"] == len(names) and fit["models"]
    x = [results["models"][n][method]["auc"] for n in names]
    y = [results["models"][n]["top1"] for n in names]
    if np.ptp(x) > 0 and np.ptp(y) > 0:
      assert fit["slope"] == pytest.approx(np.polyfit(x, y, 1)[0], rel=1e-6)
      assert fit["pearson_r"] == pytest.approx(np.corrcoef(x, y)[0, 1], rel=1e-6)
  written = json.loads((workdir / "results.json").read_text())
  assert written["fits"] == json.loads(json.dumps(results["fits"]))
  assert written["order"][0] in names and "seconds" not in written


class _Bars:
  """tqdm stand-in that records each bar's description and total."""

  def __init__(self):
    self.totals = {}

  def __call__(self, iterable=None, desc=None, total=None, **options):
    if total is None and iterable is not None:
      total = len(iterable)  # what tqdm would take; a generator has none
    self.totals[desc] = total

    class Bar:
      def __enter__(self):
        return self

      def __exit__(self, *exc):
        return False

      def __iter__(self):
        return iter(iterable)

      def update(self, n=1):
        pass

      def close(self):
        pass

      def set_postfix_str(self, text):
        pass

    return Bar()


@pytest.mark.slow
def test_offline_sweep_equals_the_per_model_pipeline(tmp_path, shared_bundles, monkeypatch):
  """Shrunk random instances of one model per tower kind (and a second ViT-B/32): the batched
  sweep's per-image records (concepts, descriptors, MI curves) and its Top-1, MI and AUC equal
  mutual.analyze's pipeline run model by model; the outputs are complete. The first run splits
  the foreground of the two ViT-B/32s as one batched eigh (config.spectral_across_models=True),
  the second (with progress bars, each with its total) model by model: the same results.json
  but for that setting, and the same table."""
  config = _config("smoke")
  assert config.models == FAST_MODELS and config.random_models.shrink == 16
  assert tuple(config.data.classes) == (0, 5) and config.data.images_per_class == 2
  config.classes_per_chunk = 1  # two chunks
  config.max_loaded_models = 2  # models reload between phases
  config.per_image = True
  config.analysis.solver = "reference"  # the other solver is in the language-stage test
  config.spectral_across_models = True
  methods = tuple(config.analysis.methods)
  batches = []
  across = pipeline.split_foreground_across

  def counting(patches, analysis):
    batches.append(len(patches))
    return across(patches, analysis)

  monkeypatch.setattr(pipeline, "split_foreground_across", counting)
  results = sweep.run(config, str(tmp_path), progress=False)
  assert batches == [2, 2]  # per chunk (one class each), the ViT-B/32 pair
  assert results["model_loads"] > 2 * len(FAST_MODELS)  # two visits per chunk, 2 held
  _check_outputs(tmp_path, results, FAST_MODELS, methods)
  bars = _Bars()
  monkeypatch.setattr(sweep.runner, "tqdm", bars)
  monkeypatch.setattr(sweep.chunk, "tqdm", bars)
  config.spectral_across_models = False
  sweep.run(config, str(tmp_path / "again"), progress=True)
  assert batches == [2, 2]  # no batched split in the second run
  assert bars.totals == {
    "class chunks": 2,
    "vision side: models": len(FAST_MODELS),
    "vision side: classes": 1,
    "language stages (batched)": 1,
  }
  assert (tmp_path / "again" / "table.md").read_bytes() == (tmp_path / "table.md").read_bytes()
  on, off = (json.loads((d / "results.json").read_text()) for d in (tmp_path, tmp_path / "again"))
  assert on["config"].pop("spectral_across_models") is True
  assert off["config"].pop("spectral_across_models") is False
  assert on == off
  r = config.random_models
  for name in FAST_MODELS:
    bundle = shared_bundles(name, r.image_size, r.shrink, r.seed, jnp.float32)
    records = _reference(config, name, bundle, methods)
    for k, record in enumerate(records):
      path = tmp_path / "per_image" / name / f"{record['label']:04d}" / f"{k % 2:05d}.json"
      assert json.loads(path.read_text()) == json.loads(json.dumps(record)), (name, k)
    want = report.aggregate(records, methods)["dataset"]
    got = results["models"][name]
    assert got["top1"] == want["top1"] and got["images"] == 4
    for method in methods:
      assert got[method]["mi"] == want[method]["mi"]
      assert got[method]["auc"] == want[method]["auc"]
      assert got[method]["curve"] == want[method]["curve"]


@pytest.mark.slow
def test_foreground_batched_across_models_equals_per_model_on_the_smoke_sweep(shared_bundles):
  """Issue 41, on configs/mutual_sweep.py:smoke's chunk (2 classes through its 4 models, the two
  ViT-B/32s one batched split): every array of every model's class results (foreground, CRF,
  concept maps, descriptors, MI curves) equals the per-model split's, and the progress bars of
  the two visits count the models and classes."""
  config = _config("smoke")
  models = sweep.sweep_models(config)
  dataset = data.prepare(config)
  sizes = [sweep.model_image_size(config, m.entry) for m in models]
  streams = {size: list(dataset.classes(size)) for size in set(sizes)}
  class_images = [streams[size] for size in sizes]
  assert [len(c) for c in class_images] == [2] * 4
  encode = functools.partial(
    pipeline.encode_config_bank, config=config, dataset=dataset, progress=False
  )
  indices = list(range(len(models)))
  runs = {}
  for across in (False, True):
    pool = sweep.ModelPool(models, 0)
    runs[across] = sweep.analyze_classes(
      pool,
      indices,
      {},
      class_images,
      config.analysis,
      encode=encode,
      spectral_across_models=across,
    )
  for m in indices:
    for c in range(2):
      got, want = runs[True][m][c], runs[False][m][c]
      assert got["foreground"].shape == (2, 2, 2) and got["foreground"].any()
      flat_got, flat_want = jax.tree_util.tree_flatten(got), jax.tree_util.tree_flatten(want)
      assert flat_got[1] == flat_want[1]
      for a, b in zip(flat_got[0], flat_want[0]):
        np.testing.assert_array_equal(a, b, err_msg=f"{models[m].name}, class {c}")


@pytest.mark.slow
def test_the_same_sweep_keeps_its_finished_chunks(tmp_path, shared_bundles, monkeypatch):
  """Issue 36: the sweep resumes per class chunk (every model's records of the chunk in
  shards/chunk_<index>.json, written once the chunk is through every model): the same run
  again analyses no chunk and writes the same results; a chunk whose file is gone is run
  again, alone."""
  config = _config("smoke")
  config.classes_per_chunk = 1  # two chunks
  first = sweep.run(config, str(tmp_path), progress=False)
  written = (tmp_path / "results.json").read_bytes()
  assert sorted(os.listdir(tmp_path / "shards")) == ["chunk_00000.json", "chunk_00001.json"]
  chunks = []
  analyze_classes = sweep.runner.analyze_classes

  def counting(pool, indices, banks, class_images, *args, **kwargs):
    chunks.append([c.label for c in class_images[0]])
    return analyze_classes(pool, indices, banks, class_images, *args, **kwargs)

  monkeypatch.setattr(sweep.runner, "analyze_classes", counting)
  again = sweep.run(config, str(tmp_path), progress=False)
  assert chunks == [] and again["model_loads"] == 0
  assert (tmp_path / "results.json").read_bytes() == written
  os.remove(tmp_path / "shards" / "chunk_00001.json")
  sweep.run(config, str(tmp_path), progress=False)
  assert chunks == [[5]]  # the second chunk (class 5) alone
  assert (tmp_path / "results.json").read_bytes() == written
  assert first["images_per_model"] == again["images_per_model"] == 4


@pytest.fixture
def offline(monkeypatch, tmp_path):
  monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
  monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
  monkeypatch.delenv(hub.MODELS_DIR_ENV, raising=False)
  return tmp_path / "models"


def test_missing_weights_stop_with_the_registry_message_or_are_skipped(
  tmp_path, offline, monkeypatch
):
  config = _config("imagenet")
  assert config.models == tuple(registry.mutual_knowledge_models()) and len(config.models) == 13
  config.data = _config("random").data  # no descriptor file needed
  config.analysis = _config("random").analysis
  config.models = ("openai-rn50", "datacomp-vit-b-16")
  config.models_dir = str(offline)
  # Stops before any image or text work.
  monkeypatch.setattr(pipeline, "encode_config_bank", lambda *a, **k: pytest.fail("work began"))
  with pytest.raises(CheckpointError) as error:
    sweep.run(config, str(tmp_path / "out"), progress=False)
  message = str(error.value)
  assert "timm/resnet50_clip.openai" in message
  assert str(offline / "openai-rn50" / "open_clip_pytorch_model.bin") in message
  config.skip_missing = True
  with pytest.raises(CheckpointError, match="No model of config.models"):
    sweep.run(config, str(tmp_path / "out"), progress=False)
  config.models = ("openai-rn50", "not-a-model")
  with pytest.raises(ValueError, match="not a registered model"):
    sweep.run(config, str(tmp_path / "out"), progress=False)


def test_cli_stops_with_the_message_and_no_traceback(tmp_path, offline, run_command):
  """The CLI (run in this process; tests/test_errors_inputs.py runs it as a program): a model
  without weights stops with the registry's message, an unknown name with the registered list."""
  args = [
    "--config",
    os.path.join(ROOT, "configs/mutual_sweep.py:random"),
    f"--workdir={tmp_path / 'out'}",
    "--config.random_weights=False",
    f"--config.models_dir={offline}",
  ]
  for models, expected in (
    ("('openai-rn50',)", str(offline / "openai-rn50/open_clip_pytorch_model.bin")),
    ("('openai-rn50','RN-51')", "'RN-51' is not a registered model"),
  ):
    done = run_command("mutual.sweep", *args, f"--config.models={models}")
    assert done.returncode != 0 and expected in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr


def test_real_config_reads_imagenet_paths():
  config = _config("imagenet")
  assert config.data.source == "folder" and config.data.dataset == "imagenet"
  assert config.analysis.top_k == 500 and config.analysis.u == 50
  assert config.analysis.class_prompts == "templates" and len(config.analysis.templates) == 8
  assert not config.random_weights and config.accuracy == "measured"
  with pytest.raises(ValueError, match="variant must be one of 'imagenet', 'random', 'smoke'"):
    _config("places")


def test_config_arguments_are_named_or_positional():
  """`file.py:random` and `file.py:variant=random` are the same config; unknown names, repeated
  names, values of the wrong type and positional values after named ones are named."""
  assert _config("variant=random").to_dict() == _config("random").to_dict()
  assert _config(None).to_dict() == _config("imagenet").to_dict()  # the default
  fields = dict(variant=("full", "smoke"), shots=16, scale=1.0, quick=False)
  values = config_files.config_arguments("smoke,4", "configs/x.py", **fields)
  assert values == dict(variant="smoke", shots=4, scale=1.0, quick=False)
  values = config_files.config_arguments(" quick=true , scale=0.5", "configs/x.py", **fields)
  assert values == dict(variant="full", shots=16, scale=0.5, quick=True)
  for argument, expected in (
    ("shot=4", "unknown name 'shot'"),
    ("shots=four", "shots must be an integer"),
    ("shots=4,shots=8", "shots is given twice"),
    ("shots=4,smoke", "'smoke' needs a name"),
    ("quick=maybe", "quick must be True or False"),
  ):
    with pytest.raises(ConfigError, match=expected) as error:
      config_files.config_arguments(argument, "configs/x.py", **fields)
    assert "configs/x.py takes :variant=full|smoke,shots=16,scale=1.0,quick=False" in str(
      error.value
    )
  with pytest.raises(ConfigError, match="unknown name 'shots'"):
    _config("shots=4")


@pytest.mark.slow
def test_offline_sweep_on_every_study_architecture(tmp_path):
  """Random-weight instances of all 13 study models at their real widths and depths, about
  64 px, through run(): a Table 3 row, finite MI / AUC and fits for every one."""
  config = _config("random")
  config.data.classes = (7,)
  config.data.images_per_class = 2
  config.max_loaded_models = 2  # bounds memory (ViT-L/14: 1.7 GB of weights)
  # 64 texts per call: the 48 descriptors and the 12 classes' descriptor prompts (~100) then
  # share one text program per architecture (64 and 128 rows compiled two: 11 compiles fewer).
  config.batch_size = 64
  start = time.perf_counter()
  results = sweep.run(config, str(tmp_path), progress=False)
  seconds = time.perf_counter() - start
  names = registry.mutual_knowledge_models()
  assert len(names) == 13 and set(results["models"]) == set(names)
  _check_outputs(tmp_path, results, names, tuple(config.analysis.methods))
  families = {results["models"][n]["family"] for n in names}
  assert families == {"ViT", "ResNet", "ConvNeXt"}
  assert {results["models"][n]["embed_dim"] for n in names} == {512, 640, 768, 1024}
  print(f"every-architecture sweep: {seconds:.0f} s")
