"""The sweep's multi-model studies besides Table 3: Table 2 (App. K) over the paper's 8 models,
equal model by model to the single-model protocol that `mutual.evaluate` runs, and App. G's
tables grouped by model size and pretraining data (Places365, Food-101)."""

import functools
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from mutual import data, pipeline, protocols, sweep
from stori_jax.plumbing.config_files import ConfigError, load_config
from stori_jax.models import registry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: random_bundle memoised: the sweep and the per-model reference use the same (deterministic)
#: bundles, so their compiled encoders are shared.
_BUNDLES = functools.lru_cache(maxsize=None)(sweep.random_bundle)


@pytest.fixture
def shared_bundles(monkeypatch):
  monkeypatch.setattr(sweep.models, "random_bundle", _BUNDLES)  # where sweep_models reads it
  return _BUNDLES


def _config(name, argument):
  return load_config(os.path.join(ROOT, "configs", name), argument)


# ---------------------------------------------------------------------------------------------
# The configs hold the paper's models and groups.


def test_table2_config_has_the_papers_eight_models_in_its_order():
  config = _config("mutual_table2_models.py", "imagenet")
  labels = [registry.get(n).label for n in config.models]
  # Table 2: ResNets left, ViTs right, each column in the paper's row order.
  assert labels == [
    "RN50",
    "RN50x4",
    "RN50x16",
    "RN101",
    "ViT-B/16",
    "ViT-B/32",
    "ViT-L/14",
    "ViT-L/14@336",
  ]
  assert config.table2 and not config.random_weights
  # The single-model protocol's settings (mutual.evaluate's configs/mutual_eval_imagenet.py).
  imagenet = _config("mutual_eval_imagenet.py", None)
  assert config.protocols.table2.to_dict() == imagenet.protocols.table2.to_dict()
  smoke = _config("mutual_table2_models.py", "smoke")
  synthetic = _config("mutual_eval_synthetic.py", None)
  assert smoke.protocols.table2.to_dict() == synthetic.protocols.table2.to_dict()
  # The same analysis, but for how many regions go through the tower per call.
  assert {**smoke.analysis.to_dict(), "prompt_chunk": 0} == {
    **synthetic.analysis.to_dict(),
    "prompt_chunk": 0,
  }


def test_appg_configs_hold_tables_6_and_7():
  places = _config("mutual_appg.py", "places365")
  groups = {
    title: [registry.get(n).label for n in members] for title, members in places.table_groups
  }
  assert groups == {
    "Model Size": ["ViT-B/32", "ViT-B/16", "ViT-L/14", "ViT-L/14@336"],
    "Pretrain Data": ["ViT-B/32", "ViT-B/32-dcp", "ViT-B/16-dcp", "ViT-B/16-dfn"],
  }
  assert len(places.models) == 7 and places.data.dataset == "places365"
  # Paper Table 8's Places365 templates.
  assert "a scene taken in a {c}." in places.analysis.templates
  food = _config("mutual_appg.py", "food101")
  assert [registry.get(n).label for n in food.models] == [
    "ViT-B/32-dcp",
    "ViT-B/16-dcp",
    "ViT-B/16-dfn",
  ]
  assert food.data.dataset == "food101" and tuple(food.analysis.templates) == (
    "a photo of {c}, a type of food.",
  )


def test_a_group_must_name_models_of_the_sweep():
  config = _config("mutual_appg.py", "smoke")
  config.table_groups = (("Model Size", ("openai-vit-b-32", "openai-vit-l-14")),)
  with pytest.raises(ConfigError, match=r"names \['openai-vit-l-14'\], which config.models"):
    sweep.check_config(config)
  config.table_groups = (("Model Size", "openai-vit-b-32"),)
  with pytest.raises(ConfigError, match="holds \\(title, \\(model, ...\\)\\) pairs"):
    sweep.check_config(config)
  config = _config("mutual_table2_models.py", "smoke")
  config.protocols.table2.recipient = "everyone"
  with pytest.raises(ConfigError, match="recipient must be one of"):
    sweep.check_config(config)


# ---------------------------------------------------------------------------------------------
# The tables' layouts.


def _row(name, top1=50.0, mi=3.0, auc=2.0):
  entry = registry.get(name)
  return dict(
    name=name,
    label=entry.label,
    family=sweep.family(entry.config),
    data=entry.data,
    top1=top1,
    **{m: dict(mi=mi, auc=auc) for m in ("pca", "kmeans")},
  )


def test_grouped_tables_list_each_group_with_its_models():
  rows = [
    _row("openai-vit-b-32", 38.25, 8.252, 2.658),
    _row("openai-vit-b-16", 38.82, 8.655, 2.872),
    _row("datacomp-vit-b-32", 41.92, 8.454, 2.681),
  ]
  groups = (
    ("Model Size", ("openai-vit-b-32", "openai-vit-b-16")),
    ("Pretrain Data", ("openai-vit-b-32", "ViT-B/32-dcp")),  # a label works too
  )
  text = sweep.table.grouped_tables(rows, groups, ("pca", "kmeans"))
  lines = text.strip().splitlines()
  assert lines[0] == "| Model | Data | Top-1 (%) | MI PCA | AUC PCA | MI K-means | AUC K-means |"
  assert lines[2].startswith("| *Model Size* |") and lines[5].startswith("| *Pretrain Data* |")
  assert lines[3] == "| ViT-B/32 | WIT-400M | 38.25 | 8.252 | 2.658 | 8.252 | 2.658 |"
  assert lines[7].startswith("| ViT-B/32-dcp | DataComp-1B | 41.92 |")
  assert lines[6].startswith("| ViT-B/32 |") and lines[7].startswith("| ViT-B/32-dcp |")
  assert len(lines) == 8
  untitled = sweep.table.grouped_tables(rows, (("", ("openai-vit-b-16",)),), ("pca",), True)
  assert untitled.strip().splitlines()[2] == "| ViT-B/16 | random weights | 38.82 | 8.655 | 2.872 |"


def test_table2_paper_layout_puts_resnets_beside_vits():
  names = ("openai-rn50", "openai-rn101", "openai-vit-b-16")
  rows = [_row(n) for n in names]
  table2 = {
    n: dict(
      base=dict(top1=60.0 + i),
      methods=dict(pca=dict(top1=62.5 + i, delta=2.5), kmeans=dict(top1=59.0 + i, delta=-1.0)),
    )
    for i, n in enumerate(names)
  }
  text = sweep.table.table2_paper_tables(rows, table2)
  pca, kmeans = text.split("Ours: K-means concepts")
  assert "Ours: PCA concepts" in pca
  lines = [x for x in pca.splitlines() if x.startswith("|")]
  assert lines[0] == "| ResNets | Base | Ours | Δ | ViTs | Base | Ours | Δ |"
  assert lines[2] == "| RN50 | 60.00 | 62.50 | +2.50 | ViT-B/16 | 62.00 | 64.50 | +2.50 |"
  assert lines[3] == "| RN101 | 61.00 | 63.50 | +2.50 |  |  |  |  |"
  assert "| RN50 | 60.00 | 59.00 | -1.00 |" in kmeans


# ---------------------------------------------------------------------------------------------
# The drivers end to end, offline.


def _table2_of_one_model(config, bundle, methods):
  """The single-model path of mutual.evaluate's Table 2: the concept pass (analyze_class and
  protocols.image_embeddings, class by class), then table2_descriptor_accuracy."""
  dataset = data.prepare(config)
  bank = pipeline.encode_config_bank(bundle, config, dataset, progress=False)
  classes = dataset.classes(bundle.config.vision.image_size)
  concepts = protocols.concept_pass(
    bundle, classes, bank, config.analysis, methods=methods, progress=False
  )
  return protocols.table2_descriptor_accuracy(
    bundle,
    concepts,
    list(dataset.names),
    dataset.lists(),
    settings=config.protocols.table2,
    progress=False,
  )


@pytest.mark.slow
def test_table2_over_models_equals_the_single_model_protocol(tmp_path, shared_bundles):
  """configs/mutual_table2_models.py:smoke (a ResNet and a ViT, random weights): each model's
  Table 2 (base and augmented Top-1 / Top-5, the concepts added per class, the neighbours)
  equals the protocol run on that model alone; the paper-layout table holds one column block
  per family with those numbers; a run in two chunks with one model held gives the same."""
  config = _config("mutual_table2_models.py", "smoke")
  config.analysis.solver = "reference"  # the sweep test's choice: exact equality across paths
  methods = tuple(config.analysis.methods)
  results = sweep.run(config, str(tmp_path / "one"), progress=False)
  r = config.random_models
  assert list(results["table2"]) == list(config.models)
  for name in config.models:
    bundle = shared_bundles(name, r.image_size, r.shrink, r.seed, jnp.float32)
    want = json.loads(json.dumps(_table2_of_one_model(config, bundle, methods)))
    got = results["table2"][name]
    assert json.loads(json.dumps(got)) == want, name
    assert got["images"] == 4 and any(got["added"][m] for m in methods)
  written = json.loads((tmp_path / "one" / "table2.json").read_text())
  assert written == json.loads(json.dumps(results["table2"]))
  table = (tmp_path / "one" / "table2.md").read_text()
  assert "| ResNets | Base | Ours | Δ | ViTs | Base | Ours | Δ |" in table
  rn50, vit = (results["table2"][n] for n in config.models)
  cells = [f"{rn50['base']['top1']:.2f}", f"{rn50['methods']['pca']['top1']:.2f}"]
  cells += ["", f"{vit['base']['top1']:.2f}", f"{vit['methods']['pca']['top1']:.2f}"]
  line = next(x for x in table.splitlines() if x.startswith("| RN50 | ") and "ViT-B/32" in x)
  parts = [p.strip() for p in line.strip("|").split("|")]
  assert parts[1:3] == cells[:2] and parts[5:7] == cells[3:] and parts[4] == "ViT-B/32"
  assert "Guarded (PCA)" in table and "random weights" not in table.split("\n")[0]
  # Chunks of one class and one model held: the concept passes fill across chunks.
  config.classes_per_chunk, config.max_loaded_models = 1, 1
  again = sweep.run(config, str(tmp_path / "two"), progress=False)
  assert json.loads(json.dumps(again["table2"])) == json.loads(json.dumps(results["table2"]))
  # Resumed (issue 36): a kept chunk gives Table 2 its concepts back from its file.
  os.remove(tmp_path / "two" / "shards" / "chunk_00001.json")
  resumed = sweep.run(config, str(tmp_path / "two"), progress=False)
  assert json.loads(json.dumps(resumed["table2"])) == json.loads(json.dumps(results["table2"]))


@pytest.mark.slow
def test_appg_smoke_writes_the_grouped_table(tmp_path, shared_bundles, run_command):
  """configs/mutual_appg.py:smoke through the command: table_groups.md holds each group's
  models with the numbers of results.json (the sweep's per-model rows, which
  tests/test_mutual_sweep.py finds equal to the per-model pipeline)."""
  done = run_command(
    "mutual.sweep",
    "--config",
    os.path.join(ROOT, "configs/mutual_appg.py:smoke"),
    f"--workdir={tmp_path}",
  )
  assert done.returncode == 0, done.stderr[-3000:]
  assert str(tmp_path / "table_groups.md") in done.stdout
  results = json.loads((tmp_path / "results.json").read_text())
  config = _config("mutual_appg.py", "smoke")
  lines = (tmp_path / "table_groups.md").read_text().splitlines()
  body = [x for x in lines if x.startswith("| ") and not x.startswith("| Model |")]
  expected = []
  for title, members in config.table_groups:
    expected.append(f"| *{title}* |")
    for name in members:
      row = results["models"][name]
      cells = [row["label"], "random weights", f"{row['top1']:.2f}"]
      for method in ("pca", "kmeans"):
        cells += [f"{row[method]['mi']:.3f}", f"{row[method]['auc']:.3f}"]
      expected.append("| " + " | ".join(cells) + " |")
  assert len(body) == len(expected)
  for got, want in zip(body, expected):
    assert got.startswith(want), (got, want)
  assert np.isfinite([results["models"][n]["pca"]["auc"] for n in config.models]).all()


# ---------------------------------------------------------------------------------------------
# App. A.1's Table 1 and App. A.3's Table 3 over models (config.model_protocols).


def test_appa1_and_appa3_configs_hold_the_papers_models_and_protocol_settings():
  imagenet = _config("mutual_eval_imagenet.py", None)
  appa1 = _config("mutual_appa1.py", "imagenet")
  assert [registry.get(n).label for n in appa1.models] == ["ViT-B/16", "ViT-L/14"]
  assert tuple(appa1.model_protocols) == ("corloc",) and not appa1.random_weights
  appa3 = _config("mutual_appa3.py", "imagenet")
  assert [registry.get(n).label for n in appa3.models] == [
    "ViT-B/32",
    "ViT-B/16",
    "ViT-L/14",
    "RN50",
    "RN101",
  ]
  assert tuple(appa3.model_protocols) == ("blur",)
  # The single-model protocols' settings (mutual.evaluate's configs/mutual_eval_imagenet.py).
  for config in (appa1, appa3):
    for name in ("corloc", "blur"):
      assert config.protocols[name].to_dict() == imagenet.protocols[name].to_dict()
    assert config.analysis.to_dict() == imagenet.analysis.to_dict()
  bad = _config("mutual_appa1.py", "smoke")
  bad.model_protocols = ("corloc", "table2")
  with pytest.raises(ConfigError, match=r"config.model_protocols names \['table2'\]"):
    sweep.runner.check_config(bad)


@pytest.mark.slow
def test_model_protocols_over_models_equal_the_single_model_protocols(
  tmp_path, shared_bundles, run_command
):
  """configs/mutual_appa1.py:smoke with App. A.3's blurring added (both protocols in one run):
  each model's CorLoc and blur results equal the protocol run on that model alone, as
  mutual.evaluate runs it; protocols.md holds App. Table 1 (one column per model) and App.
  Table 3 (one row per model) with those numbers; a second run keeps every result."""
  workdir = tmp_path / "run"
  done = run_command(
    "mutual.sweep",
    "--config",
    os.path.join(ROOT, "configs/mutual_appa1.py:smoke"),
    "--config.model_protocols=('corloc','blur')",
    f"--workdir={workdir}",
  )
  assert done.returncode == 0, done.stderr[-3000:]
  assert str(workdir / "protocols.md") in done.stdout
  config = _config("mutual_appa1.py", "smoke")
  r = config.random_models
  written = json.loads((workdir / "protocols.json").read_text())
  assert sorted(written) == ["blur", "corloc"]  # report.write_json sorts its keys
  dataset = data.prepare(config)
  for name in config.models:
    bundle = shared_bundles(name, r.image_size, r.shrink, r.seed, jnp.float32)
    classes = functools.partial(dataset.classes, bundle.config.vision.image_size)
    corloc = protocols.corloc(
      bundle, classes(), config.analysis, settings=config.protocols.corloc, progress=False
    )
    bank = pipeline.encode_config_bank(bundle, config, dataset, progress=False)
    blur = protocols.blur_accuracy(
      bundle,
      classes(),
      bank.class_embeddings,
      config.analysis,
      settings=config.protocols.blur,
      progress=False,
    )
    assert written["corloc"][name] == json.loads(json.dumps(corloc)), name
    assert written["blur"][name] == json.loads(json.dumps(blur)), name
    assert corloc["images"] == 4 and blur["base"]["top1"] is not None
  table = (workdir / "protocols.md").read_text()
  labels = [registry.get(n).label for n in config.models]
  assert f"| Facet (decomposition) | {' | '.join(labels)} |" in table
  first, second = (written["corloc"][n]["corloc"]["keys"]["gdc"] for n in config.models)
  assert f"| Keys (GDC) | {first:.1f} | {second:.1f} |" in table
  assert "| Model | Base | NN Interp. | +FCC | +CRF | Δ |" in table
  for name, label in zip(config.models, labels):
    b = written["blur"][name]
    cells = [f"{b[v]['top1']:.2f}" for v in ("base", "nn", "fcc", "crf")]
    assert f"| {label} | {' | '.join(cells)} | {b['delta']:+.2f} |" in table
  # Resumed: every (protocol, model) result is read back from protocols/<name>/<model>.json.
  files = sorted((workdir / "protocols").rglob("*.json"))
  assert len(files) == 4
  stamps = [f.stat().st_mtime_ns for f in files]
  again = run_command(
    "mutual.sweep",
    "--config",
    os.path.join(ROOT, "configs/mutual_appa1.py:smoke"),
    "--config.model_protocols=('corloc','blur')",
    f"--workdir={workdir}",
  )
  assert again.returncode == 0, again.stderr[-3000:]
  assert [f.stat().st_mtime_ns for f in files] == stamps
  assert json.loads((workdir / "protocols.json").read_text()) == written
