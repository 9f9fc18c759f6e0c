"""stori_jax.plumbing.paths: local paths and gs:// URLs (a local GCS emulator) behave alike;
a URL is never made a local path; the check before any work names a missing bucket, missing
credentials and a refused write in one paragraph."""

import os

import pytest

from stori_jax.plumbing import paths

import gcs_emulator as emulator_helpers


def test_a_url_stays_a_url():
  assert paths.is_remote("gs://b/x") and paths.is_url("gs://b/x")
  assert not paths.is_remote("/tmp/x") and not paths.is_remote("gs:/x")
  assert paths.absolute("gs://b/run") == "gs://b/run"
  assert paths.absolute("run") == os.path.abspath("run")
  assert paths.join("gs://b/run/", "checkpoints", "4") == "gs://b/run/checkpoints/4"
  assert paths.parent("gs://b/run/metrics.json") == "gs://b/run"
  assert str(paths.as_path("gs://b/run") / "x") == "gs://b/run/x"
  with pytest.raises(paths.StorageError, match="not file://"):
    paths.absolute("file:///tmp/x")
  with pytest.raises(paths.StorageError, match="ftp://"):
    paths.check_location("ftp://host/x")


@pytest.mark.parametrize("where", ["local", "gs"])
def test_files_and_folders(where, tmp_path, request):
  if where == "gs":
    root = f"gs://{request.getfixturevalue('gcs_bucket')}/run"
  else:
    root = str(tmp_path / "run")
  paths.makedirs(root)
  target = paths.join(root, "a", "b.json")
  paths.makedirs(paths.parent(target))
  paths.write_text_atomic(target, '{"x": 1}\n')
  assert paths.exists(target) and paths.isfile(target) and not paths.isdir(target)
  assert paths.isdir(paths.join(root, "a")) and paths.read_text(target) == '{"x": 1}\n'
  paths.append_text(target, "more\n")
  assert paths.read_text(target) == '{"x": 1}\nmore\n'
  with paths.open(target) as f:
    assert f.readline() == '{"x": 1}\n'
  assert paths.size(target) == len('{"x": 1}\nmore\n')
  assert sorted(paths.listdir(root)) == ["a"]
  walked = [
    (os.path.relpath(f, root) if where == "local" else f[len(root) :], d, n)
    for f, d, n in paths.walk(root)
  ]
  assert [w[1:] for w in walked] == [(["a"], []), ([], ["b.json"])]
  paths.move(paths.join(root, "a"), paths.join(root, "c"))
  assert paths.listdir(root) == ["c"] and paths.read_text(paths.join(root, "c", "b.json"))
  local = paths.local_copy(paths.join(root, "c", "b.json"))
  assert open(local, encoding="utf-8").read().startswith('{"x": 1}')
  paths.rmtree(root)
  assert not paths.exists(paths.join(root, "c", "b.json"))


def test_a_figure_goes_to_a_bucket(gcs_bucket, gcs_emulator):
  from stori_jax.plumbing.plotting import pyplot, save_figure

  plt = pyplot()
  fig, ax = plt.subplots()
  ax.plot([0, 1], [1, 0])
  save_figure(fig, f"gs://{gcs_bucket}/fig.png", dpi=50)
  plt.close(fig)
  assert gcs_emulator.read(gcs_bucket, "fig.png")[:8] == b"\x89PNG\r\n\x1a\n"


def test_conditional_writes(gcs_bucket, tmp_path):
  for path in (f"gs://{gcs_bucket}/lock", str(tmp_path / "lock")):
    assert paths.read_object(path) is None
    paths.write_object(path, b"one", if_generation=0)
    data, generation = paths.read_object(path)
    assert data == b"one"
    assert (generation is None) == (not path.startswith("gs://"))
    if not path.startswith("gs://"):  # the emulator does not check preconditions; GCS does
      with pytest.raises(paths.PreconditionFailed):
        paths.write_object(path, b"two", if_generation=0)
    assert paths.delete_object(path, generation) and paths.read_object(path) is None


def test_the_check_passes_on_a_writable_bucket(gcs_bucket, gcs_emulator):
  paths.check_location(f"gs://{gcs_bucket}/run")
  assert gcs_emulator.objects(gcs_bucket) == []  # the probe object is gone


def test_a_missing_bucket_is_one_paragraph(gcs_bucket):
  with pytest.raises(paths.StorageError, match="the bucket gs://no-such-bucket does not exist"):
    paths.check_location("gs://no-such-bucket/run")


@pytest.mark.parametrize(
  "mode,match",
  [("unauthenticated", "no valid credentials"), ("read_only", "refused it \\(403")],
)
def test_refusals_are_one_paragraph(gcs_bucket, gcs_emulator, monkeypatch, mode, match):
  proxy = emulator_helpers.RefusingProxy(gcs_emulator.url, mode)
  try:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
    with pytest.raises(paths.StorageError, match=match) as raised:
      paths.check_location(f"gs://{gcs_bucket}/run")
    assert "\n" not in str(raised.value)
  finally:
    proxy.stop()


def test_missing_default_credentials_are_one_paragraph(gcs_bucket, monkeypatch, tmp_path):
  import fsspec.config

  monkeypatch.setitem(fsspec.config.conf, "gcs", {"token": "google_default"})
  monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "absent.json"))
  with pytest.raises(paths.StorageError, match="no valid credentials"):
    paths.check_location(f"gs://{gcs_bucket}/run")


def test_a_refused_read_of_an_input_is_one_paragraph(gcs_bucket, gcs_emulator, monkeypatch):
  """Inputs (a prompt file, a dataset root) are read before a workdir is claimed: their
  storage failures are StorageErrors too, not the client's traceback."""
  paths.write_text_atomic(f"gs://{gcs_bucket}/prompts.json", "{}")
  proxy = emulator_helpers.RefusingProxy(gcs_emulator.url, "unauthenticated")
  try:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
    for read in (paths.isfile, paths.read_bytes, paths.listdir):
      with pytest.raises(paths.StorageError, match="no valid credentials"):
        read(f"gs://{gcs_bucket}/prompts.json")
  finally:
    proxy.stop()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.url)
  with pytest.raises(FileNotFoundError):
    paths.read_bytes(f"gs://{gcs_bucket}/absent.json")


def test_appends_to_an_object_are_coalesced_and_flushed(gcs_bucket, gcs_emulator, monkeypatch):
  """GCS takes about one write per second to an object: appends in between wait in memory and
  are written by the next rewrite, flush_appends, or a read of the object."""
  url = f"gs://{gcs_bucket}/history.jsonl"
  monkeypatch.setattr(paths, "APPEND_INTERVAL_S", 3600.0)
  paths.append_text(url, "1\n")  # the first append writes at once
  paths.append_text(url, "2\n")
  assert gcs_emulator.read(gcs_bucket, "history.jsonl") == b"1\n"
  paths.flush_appends()
  assert gcs_emulator.read(gcs_bucket, "history.jsonl") == b"1\n2\n"
  paths.append_text(url, "3\n")
  assert paths.read_text(url) == "1\n2\n3\n"  # a read here sees the waiting append
  paths.write_text_atomic(url, "1\n")  # a rewrite (a resumed run's truncation) starts afresh
  paths.append_text(url, "2\n")
  paths.flush_appends()
  assert gcs_emulator.read(gcs_bucket, "history.jsonl") == b"1\n2\n"


def test_a_prefix_whose_objects_come_and_go_is_never_a_file(gcs_bucket):
  """Another process's write probe appears and vanishes under a workdir's prefix: between
  an existence check and a folder check the prefix can exist and then not list as a folder.
  Only an object named as the path itself makes it a file."""
  import threading

  root = f"gs://{gcs_bucket}/run"
  stop = threading.Event()

  def churn():
    while not stop.is_set():
      probe = paths.join(root, f"{paths.PROBE_PREFIX}x")
      paths.write_bytes_atomic(probe, b"probe")
      paths.delete_object(probe)

  worker = threading.Thread(target=churn)
  worker.start()
  try:
    seen = [paths.isfile(root) for _ in range(300)]
  finally:
    stop.set()
    worker.join()
  assert not any(seen), f"{sum(seen)} of 300 checks called a bare prefix a file"
  paths.write_text_atomic(root, "an object named as the prefix\n")
  assert paths.isfile(root)


@pytest.fixture
def temp_root(tmp_path, monkeypatch):
  """The system's temp folder, made a fresh one: what local_copy leaves there is seen."""
  import tempfile

  root = tmp_path / "system_tmp"
  root.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(root))
  return root


def test_local_copies_are_removed_and_checked_before_download(gcs_bucket, temp_root):
  folder = f"gs://{gcs_bucket}/model"
  paths.write_text_atomic(f"{folder}/weights.bin", "x" * 1000)
  with pytest.raises(paths.StorageError, match=f"{folder} is a folder in object storage where a"):
    paths.local_copy(folder, expect="file")
  with pytest.raises(paths.StorageError, match="is a file in object storage where a folder"):
    paths.local_copy(f"{folder}/weights.bin", expect="folder")
  with pytest.raises(FileNotFoundError):
    paths.local_copy(f"gs://{gcs_bucket}/absent.json", expect="file")
  assert list(temp_root.iterdir()) == []  # nothing downloaded, nothing left
  kept = paths.local_copy(f"{folder}/weights.bin", expect="file")
  assert os.path.getsize(kept) == 1000 and os.path.dirname(os.path.dirname(kept)) == str(temp_root)
  paths.remove_local_copies()
  assert list(temp_root.iterdir()) == []
  # copied_locally: removed on leaving the block, a raised UserError names the URL.
  from stori_jax.plumbing.errors import InputError

  with pytest.raises(InputError) as raised:
    with paths.copied_locally(folder, expect="folder") as local:
      assert os.path.isfile(os.path.join(local, "weights.bin"))
      raise InputError(f"{os.path.join(local, 'weights.bin')} is not a weights file")
  assert str(raised.value) == f"{folder}/weights.bin is not a weights file"
  assert list(temp_root.iterdir()) == []


def test_a_command_leaves_no_local_copy_however_it_ends(
  gcs_bucket, temp_root, run_command, tmp_path
):
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  with open(os.path.join(repo, "configs", "grid_synthetic.py"), "rb") as f:
    paths.write_bytes_atomic(f"gs://{gcs_bucket}/configs/grid.py", f.read())
  paths.write_text_atomic(f"gs://{gcs_bucket}/configs/bad.py", "def get_config():\n  x = y\n")
  # A copy made before the commands (an enclosing script's) is not theirs to remove.
  outer = temp_root / os.path.basename(
    os.path.dirname(paths.local_copy(f"gs://{gcs_bucket}/configs/bad.py"))
  )
  done = run_command(
    "stori_jax.run_grid", f"--config=gs://{gcs_bucket}/configs/grid.py", "--dry_run"
  )
  assert done.returncode == 0, done.stderr[-3000:]
  assert list(temp_root.iterdir()) == [outer]
  failed = run_command("stori_jax.run_grid", f"--config=gs://{gcs_bucket}/configs/bad.py")
  assert failed.returncode == 2 and f"gs://{gcs_bucket}/configs/bad.py" in failed.stderr
  assert str(temp_root) not in failed.stderr
  assert list(temp_root.iterdir()) == [outer]
  # A model folder of no known layout is refused by its URL before anything is downloaded.
  paths.write_text_atomic(f"gs://{gcs_bucket}/notes/readme.txt", "not a model\n")
  refused = run_command(
    "stori_jax.train", "--config=configs/demo.py", f"--workdir={tmp_path / 'run'}",
    f"--config.model.source=gs://{gcs_bucket}/notes",
  )  # fmt: skip
  assert refused.returncode == 2, refused.stderr[-3000:]
  assert f"gs://{gcs_bucket}/notes is a directory without" in refused.stderr
  assert list(temp_root.iterdir()) == [outer]
  # A weights file that is no weights file: named by its URL; its download removed.
  paths.write_text_atomic(f"gs://{gcs_bucket}/broken/model.pt", "not a checkpoint\n")
  broken = run_command(
    "stori_jax.train", "--config=configs/demo.py", f"--workdir={tmp_path / 'run2'}",
    f"--config.model.source=gs://{gcs_bucket}/broken/model.pt",
  )  # fmt: skip
  assert broken.returncode == 2, broken.stderr[-3000:]
  assert f"gs://{gcs_bucket}/broken/model.pt" in broken.stderr
  assert str(temp_root) not in broken.stderr
  assert list(temp_root.iterdir()) == [outer]
  paths.remove_local_copies()
  assert list(temp_root.iterdir()) == []
