"""mutual.export / mutual.text_bank: the descriptor bank and the text classifiers as files, read
back equal to what the analysis computes; mistakes refused before the model loads."""

import json
import os

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from mutual import data, text_bank, pipeline
from stori_jax.plumbing.config_files import ConfigError, load_config
from stori_jax.plumbing.errors import InputError, UserError
from test_cli import assert_ends_with_outputs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs/mutual_synthetic.py")


def _config():
  return load_config(CONFIG)


def test_exported_arrays_equal_the_pipeline_and_names_keep_their_order(tmp_path, tiny_synthetic):
  config = _config()
  output, bank = text_bank.export_text_bank(config, str(tmp_path / "bank"), progress=False)
  read = text_bank.load_text_bank(output)
  # What mutual.analyze computes for this config (its classifier: config.analysis.class_prompts).
  dataset = data.prepare(config)
  want = pipeline.encode_config_bank(tiny_synthetic, config, dataset, progress=False)
  assert read.descriptors == want.descriptors and len(read.descriptors) == 48
  assert read.class_names == want.class_names == tuple(dataset.names)
  np.testing.assert_array_equal(read.descriptor_embeddings, want.descriptor_embeddings)
  assert read.analysis_classifier == config.analysis.class_prompts == "descriptors"
  np.testing.assert_array_equal(read.classifiers["descriptors"], want.class_embeddings)
  # The other classifier: the template ensemble of config.analysis.templates.
  a = config.analysis
  templates = pipeline.encode_bank(
    tiny_synthetic,
    list(dataset.names),
    dataset.lists(),
    list(want.descriptors),
    mode="templates",
    templates=tuple(a.templates),
    descriptor_template=a.descriptor_template,
    batch_size=config.batch_size,
    progress=False,
  )
  np.testing.assert_array_equal(read.classifiers["templates"], templates.class_embeddings)
  assert not np.allclose(read.classifiers["templates"], read.classifiers["descriptors"])
  for array in (read.descriptor_embeddings, *read.classifiers.values()):
    assert array.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(array, axis=1), 1.0, atol=1e-5)
  # The TextBank the pipeline takes, and the JSON's names and settings.
  loaded_bank = read.text_bank()
  np.testing.assert_array_equal(loaded_bank.class_embeddings, want.class_embeddings)
  assert loaded_bank.descriptors == want.descriptors
  names = json.loads((tmp_path / "bank" / text_bank.NAMES_FILE).read_text())
  assert names["class_descriptors"] == dataset.lists()
  assert names["classifiers"]["descriptors"]["descriptor_template"] == "{c}, which has {d}."
  assert names["bank_template"] == "a photo showing {d}"  # App. L
  assert names["classifiers"]["templates"]["templates"] == list(a.templates)
  assert names["model"] == {"source": "tiny-synthetic", "name": "tiny-synthetic"}
  assert names["shapes"] == {
    "descriptor_embeddings": [48, 64],
    "class_embeddings_descriptors": [12, 64],
    "class_embeddings_templates": [12, 64],
  }
  np.testing.assert_array_equal(bank.descriptor_embeddings, read.descriptor_embeddings)


def test_a_descriptor_file_gives_its_classes_in_file_order(tmp_path, tiny_synthetic):
  per_class = {"zebra": ["black and white stripes", "four legs"], "apple": ["red", "four legs"]}
  path = tmp_path / "descriptors.json"
  path.write_text(json.dumps(per_class))
  config = _config()
  with config.unlocked():
    config.data.source, config.data.descriptors = "folder", str(path)
    config.data.root = str(tmp_path / "no_images_needed")
  _, bank = text_bank.export_text_bank(config, str(tmp_path / "bank"), progress=False)
  assert bank.class_names == ("zebra", "apple")  # the file's order, not sorted
  assert bank.descriptors == ("black and white stripes", "four legs", "red")  # duplicates once
  assert bank.class_descriptors == (tuple(per_class["zebra"]), tuple(per_class["apple"]))
  names, lists = ["zebra", "apple"], list(per_class.values())
  want = pipeline.encode_bank(tiny_synthetic, names, lists, list(bank.descriptors), progress=False)
  np.testing.assert_array_equal(bank.classifiers["descriptors"], want.class_embeddings)
  np.testing.assert_array_equal(bank.descriptor_embeddings, want.descriptor_embeddings)
  assert bank.names["data"]["descriptors"] == str(path)
  assert len(bank.names["data"]["descriptors_sha256"]) == 64


def _no_model(monkeypatch):
  def refuse(*_, **__):
    raise AssertionError("the model loaded before the input was checked")

  monkeypatch.setattr(text_bank.stori_jax, "load", refuse)


def test_mistakes_are_refused_before_the_model_loads(tmp_path, monkeypatch):
  _no_model(monkeypatch)
  config = _config()
  taken = tmp_path / "taken"
  taken.mkdir()
  (taken / text_bank.ARRAYS_FILE).write_bytes(b"old")
  with pytest.raises(UserError, match="already holds a text bank.*--overwrite"):
    text_bank.export_text_bank(config, str(taken))
  assert (taken / text_bank.ARRAYS_FILE).read_bytes() == b"old"
  (tmp_path / "a_file").write_text("x")
  with pytest.raises(UserError, match="is a file"):
    text_bank.export_text_bank(config, str(tmp_path / "a_file"))
  with config.unlocked():
    config.data.source = "folder"
    config.data.descriptors = str(tmp_path / "descriptors_imagenet.json")
    config.data.dataset = "imagenet"
  with pytest.raises(data.DatasetMissingError, match="descriptors_imagenet.json.*does not exist"):
    text_bank.export_text_bank(config, str(tmp_path / "out"))
  config.data.descriptors = ""
  with pytest.raises(ConfigError, match="config.data.descriptors is empty"):
    text_bank.export_text_bank(config, str(tmp_path / "out"))
  config = _config()
  config.analysis.templates = ("a photo of a {class}.",)
  with pytest.raises(ConfigError, match=r"write the class as \{c\}"):
    text_bank.export_text_bank(config, str(tmp_path / "out"))
  config = _config()
  config.analysis.class_prompts = "both"
  with pytest.raises(ConfigError, match="class_prompts must be one of"):
    text_bank.export_text_bank(config, str(tmp_path / "out"))
  assert not (tmp_path / "out").exists()


def test_reading_refuses_missing_or_inconsistent_files(tmp_path, tiny_synthetic):
  with pytest.raises(InputError, match="holds no text bank.*mutual.export"):
    text_bank.load_text_bank(tmp_path)
  output, _ = text_bank.export_text_bank(_config(), str(tmp_path / "bank"), progress=False)
  arrays_path = os.path.join(output, text_bank.ARRAYS_FILE)
  arrays = load_file(arrays_path)
  arrays["class_embeddings_templates"] = arrays["class_embeddings_templates"][:5]
  save_file(arrays, arrays_path)
  with pytest.raises(InputError, match="class_embeddings_templates has shape \\[5, 64\\]"):
    text_bank.load_text_bank(output)
  with open(arrays_path, "wb") as f:
    f.write(b"\0" * 10)
  with pytest.raises(InputError, match="not a readable safetensors file"):
    text_bank.load_text_bank(output)


def test_command_writes_the_files_and_refuses_to_overwrite(tmp_path, run_command):
  output = tmp_path / "bank"
  done = run_command("mutual.export", f"--config={CONFIG}", f"--output={output}")
  assert done.returncode == 0, done.stderr[-3000:]
  assert "48 descriptors, 12 classes, embedding dim 64" in done.stdout
  paths = assert_ends_with_outputs(done.stdout, *text_bank.FILES)
  assert len(paths) == 2
  before = os.stat(output / text_bank.ARRAYS_FILE).st_mtime_ns
  again = run_command("mutual.export", f"--config={CONFIG}", f"--output={output}")
  assert again.returncode == 2 and "--overwrite" in again.stderr and "Traceback" not in again.stderr
  assert os.stat(output / text_bank.ARRAYS_FILE).st_mtime_ns == before
  done = run_command("mutual.export", f"--config={CONFIG}", f"--output={output}", "--overwrite")
  assert done.returncode == 0, done.stderr[-3000:]
  missing = run_command("mutual.export", f"--config={CONFIG}")
  assert missing.returncode == 2 and "missing --output" in missing.stderr


# Issue 36 row 3: the two files are one unit, and what is read back is checked.


def _export_pair(tmp_path, run_command, name, *overrides):
  output = tmp_path / name
  done = run_command("mutual.export", f"--config={CONFIG}", f"--output={output}", *overrides)
  assert done.returncode == 0, done.stderr[-3000:]
  return output


def _rewrite_names(output, change):
  path = output / text_bank.NAMES_FILE
  record = json.loads(path.read_text())
  change(record)
  path.write_text(json.dumps(record))


def _rewrite_arrays(output, change):
  """Changes the arrays and records their new digest: a consistent pair, but bad values."""
  path = str(output / text_bank.ARRAYS_FILE)
  with text_bank.safe_open(path, framework="numpy") as f:
    metadata = f.metadata()
  arrays = load_file(path)
  change(arrays)
  save_file(arrays, path, metadata=metadata)
  _rewrite_names(output, lambda r: r.update(arrays_sha256=text_bank.arrays_digest(arrays)))


def test_arrays_from_another_export_are_refused(tmp_path, run_command):
  """What a SIGKILL between the two writes of `mutual.export --overwrite` leaves: the new
  arrays beside the old names file."""
  first = _export_pair(tmp_path, run_command, "first")
  other = _export_pair(tmp_path, run_command, "other", "--config.analysis.templates=('a {c}.',)")
  text_bank.load_text_bank(first)  # the untouched pair reads back
  (first / text_bank.ARRAYS_FILE).write_bytes((other / text_bank.ARRAYS_FILE).read_bytes())
  with pytest.raises(
    InputError,
    match=r"text_bank.safetensors does not hold the arrays .*"
    r"text_bank.json was written with.*--overwrite",
  ):
    text_bank.load_text_bank(first)


def test_names_reordered_are_refused(tmp_path, run_command):
  output = _export_pair(tmp_path, run_command, "bank")
  _rewrite_names(output, lambda r: r["descriptors"].reverse())
  with pytest.raises(InputError, match=r"text_bank.json: .* not the rows .*reordered or edited"):
    text_bank.load_text_bank(output)


@pytest.mark.parametrize(
  "change, message",
  [
    (
      lambda a: a["descriptor_embeddings"].__setitem__((3, 5), np.nan),
      r"descriptor_embeddings"
      r" holds 1 NaN or infinite values \(the first in row 3\)",
    ),
    (
      lambda a: a["class_embeddings_templates"].__imul__(1000),
      r"class_embeddings_templates "
      r"has rows that are not unit vectors \(row \d+ has norm 1000",
    ),
  ],
  ids=["nan", "scaled"],
)
def test_non_finite_or_non_unit_arrays_are_refused(tmp_path, run_command, change, message):
  output = _export_pair(tmp_path, run_command, "bank")
  _rewrite_arrays(output, change)
  with pytest.raises(InputError, match=r"text_bank.safetensors: " + message):
    text_bank.load_text_bank(output)


@pytest.mark.parametrize(
  "change, message",
  [
    (
      lambda r: r.update(class_names=list(range(len(r["class_names"])))),
      r"'class_names' must be a non-empty list of strings, got \[0, 1",
    ),
    (
      lambda r: r.pop("descriptors"),
      r"'descriptors' must be .* got nothing \(the entry is "
      r"missing\)",
    ),
    (lambda r: r.pop("class_descriptors"), r"'class_descriptors' must be a list of lists"),
    (lambda r: r.pop("shapes"), r"'shapes' must map each array to its \[rows, width\]"),
    (lambda r: r.update(shapes=[1, 2]), r"'shapes' must map .* got \[1, 2\]"),
    (lambda r: r.update(classifiers=["descriptors"]), r"'classifiers' must map"),
  ],
  ids=[
    "integer_class_names",
    "no_descriptors",
    "no_class_descriptors",
    "no_shapes",
    "shapes_a_list",
    "classifiers_a_list",
  ],
)
def test_a_names_file_with_a_missing_or_mistyped_entry_is_refused(
  tmp_path, run_command, change, message
):
  output = _export_pair(tmp_path, run_command, "bank")
  _rewrite_names(output, change)
  with pytest.raises(InputError, match=r"text_bank.json: " + message + r".*mutual.export"):
    text_bank.load_text_bank(output)


def test_the_arrays_file_is_as_readable_as_the_names_file(tmp_path, run_command):
  old = os.umask(0o022)
  try:
    output = _export_pair(tmp_path, run_command, "bank")
  finally:
    os.umask(old)
  modes = {n: os.stat(output / n).st_mode & 0o777 for n in text_bank.FILES}
  assert modes == {text_bank.ARRAYS_FILE: 0o644, text_bank.NAMES_FILE: 0o644}


def test_an_export_stopped_before_the_names_file_leaves_a_refused_pair(
  tmp_path, run_command, monkeypatch
):
  """`mutual.export --overwrite` killed between its two writes: the next read refuses the pair
  (the names file is written last)."""
  output = _export_pair(tmp_path, run_command, "bank")

  def killed(*_, **__):
    raise KeyboardInterrupt

  monkeypatch.setattr(text_bank.jsonio, "write_json", killed)
  with pytest.raises(KeyboardInterrupt):
    run_command(
      "mutual.export",
      f"--config={CONFIG}",
      f"--output={output}",
      "--overwrite",
      "--config.analysis.templates=('a {c}.',)",
    )
  monkeypatch.undo()
  with pytest.raises(InputError, match="does not hold the arrays"):
    text_bank.load_text_bank(output)


# Issue 44 row 11: every setting the arrays depend on is covered by a digest; issue 41 item 1: a
# run expecting a bank refuses one exported with another bank template.


@pytest.mark.parametrize(
  "change, named",
  [
    (lambda r: r.update(analysis_classifier="templates"), "'analysis_classifier'"),
    (lambda r: r["model"].update(source="openai/ViT-B-16"), "'model'"),
    (lambda r: r.pop("model"), "'model'"),
    (lambda r: r["classifiers"]["templates"].update(templates=["a {c}."]), "'classifiers'"),
    (
      lambda r: r["classifiers"]["descriptors"].update(descriptor_template="{c} has {d}."),
      "'classifiers'",
    ),
    (lambda r: r.update(bank_template="{d}"), "'bank_template'"),
    (lambda r: r["classifiers"].pop("templates"), "'classifiers'"),
    (lambda r: r["data"].update(source="folder"), "'data'"),
  ],
  ids=[
    "analysis_classifier",
    "model_changed",
    "model_removed",
    "templates",
    "descriptor_template",
    "bank_template",
    "classifier_dropped",
    "data",
  ],
)
def test_a_setting_edited_in_the_names_file_is_refused_by_name(
  tmp_path, run_command, change, named
):
  output = _export_pair(tmp_path, run_command, "bank")
  _rewrite_names(output, change)
  with pytest.raises(InputError) as error:
    text_bank.load_text_bank(output)
  message = str(error.value)
  assert f"text_bank.json: {named} is not what " in message
  assert "text_bank.safetensors was exported with" in message and "--overwrite" in message
  assert "\n" not in message  # one paragraph


def test_a_bank_of_another_bank_template_is_refused_where_a_run_expects_this_one(
  tmp_path, run_command
):
  raw = _export_pair(tmp_path, run_command, "raw", "--config.analysis.bank_template={d}")
  config = _config()
  read = text_bank.load_text_bank(raw)  # a consistent pair reads back on its own
  assert read.names["bank_template"] == "{d}"
  with pytest.raises(InputError) as error:
    text_bank.load_text_bank(raw, expect=config.analysis)
  message = str(error.value)
  assert "was exported with bank_template '{d}'" in message
  assert "config.analysis.bank_template is 'a photo showing {d}'" in message
  assert "--config.analysis.bank_template" in message and "\n" not in message
  assert isinstance(error.value, UserError)  # a command prints it as one paragraph, exit 2
  with config.unlocked():
    config.analysis.bank_template = "{d}"
  assert text_bank.load_text_bank(raw, expect=config.analysis).names["bank_template"] == "{d}"
  with config.unlocked():
    config.analysis.templates = ("a {c}.",)
  with pytest.raises(InputError, match=r"exported with templates \['a photo of a \{c\}.'\]"):
    text_bank.load_text_bank(raw, expect=config.analysis)


def test_a_huge_integer_in_the_names_file_is_one_paragraph_naming_it(tmp_path, run_command):
  """Issue 44 row 11: a 5,000-digit integer was a ValueError traceback from read_json."""
  output = _export_pair(tmp_path, run_command, "bank")
  path = output / text_bank.NAMES_FILE
  text = path.read_text()
  path.write_text(text.replace('"format_version": 3', '"format_version": ' + "9" * 5000))
  with pytest.raises(InputError) as error:
    text_bank.load_text_bank(output)
  assert f"The text bank names file {path} cannot be read as JSON" in str(error.value)
  assert "\n" not in str(error.value)
