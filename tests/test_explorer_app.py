"""The explorer app and server (stori_jax.explorer): every bad input and abusive request gets a
short JSON answer.

In-process through Flask's test client: body size (413), prompt length checked before
tokenizing, short error bodies, Host and Origin allowlist (DNS rebinding), JSON 404/405/500,
one weight rule for /api/parse and /api/rank, unreadable images skipped and named, the
index cache keyed by file contents and rebuilt when corrupt. Then a bounded load test of a
real server on loopback, and the command line's exit code for a bad --port. Then the
explorer rows at the end: the compiled text programs bounded over 400 settings, slow clients
timed out on a bounded pool of threads, a FIFO among the images, a weight of 4,000 digits.
"""

from __future__ import annotations

import concurrent.futures
import functools
import http.client
import json
import logging
import multiprocessing
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from PIL import Image

from stori_jax.plumbing.errors import InputError
from stori_jax.explorer import folder as explorer_folder
from stori_jax.explorer.app import create_app, host_is_local
from stori_jax.explorer.index import build_explorer
from stori_jax.explorer.limits import MAX_BODY_BYTES, MAX_PROMPT_CHARS
from stori_jax.explorer.world import MAX_IMAGES_PER_COMBINATION
from stori_jax.models.text import default_start_block
from stori_jax.retrieval import index as index_lib
from stori_jax.tokenizer import Tokenizer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True, scope="module")
def _load_the_model_once():
  """Every build_explorer here loads the same shipped model: load it once."""
  import stori_jax

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(stori_jax, "load", functools.lru_cache(maxsize=None)(stori_jax.load))
    yield


def _error(response, status):
  assert response.status_code == status, (response.status_code, response.data[:300])
  assert response.mimetype == "application/json"
  return response.get_json()["error"]


# ---------------------------------------------------------------------------------------------
# Sizes and lengths (issue rows 4, 5).


def test_body_over_the_limit_is_413_before_it_is_read(client):
  prompt = "red " * (3 * 1024 * 1024)  # the 10 MB prompt (12 MB here)
  start = time.perf_counter()
  response = client.post("/api/parse", json={"prompt": prompt})
  message = _error(response, 413)
  assert time.perf_counter() - start < 5
  assert f"at most {MAX_BODY_BYTES} bytes" in message
  assert len(response.data) < 500 and "red red red" not in message
  # one 64 KB word to /api/rank (issue row 4): refused by size, no BPE run
  word = "a" * 65536
  message = _error(client.post("/api/rank", json={"words": [{"text": word, "weight": 1}]}), 413)
  assert "at most" in message and word[:100] not in message


def test_prompt_length_is_checked_before_tokenizing(client, monkeypatch):
  def no_tokenizing(*args, **kwargs):
    raise AssertionError("tokenized a prompt that is over the length limit")

  monkeypatch.setattr(Tokenizer, "encode_with_spans", no_tokenizing)
  monkeypatch.setattr(Tokenizer, "encode", no_tokenizing)
  word = "b" * 60000  # fits the body limit, not the prompt limit
  for path, body in [
    ("/api/parse", {"prompt": word}),
    ("/api/rank", {"words": [{"text": word, "weight": 1.0}]}),
    ("/api/rank", {"words": [{"text": "red ", "weight": 1.0}] * 600}),
  ]:
    start = time.perf_counter()
    message = _error(client.post(path, json=body), 400)
    assert time.perf_counter() - start < 1, path
    assert f"at most {MAX_PROMPT_CHARS}" in message or "at most 200" in message, message
    assert word[:100] not in message


def test_error_bodies_are_short(client, explorer):
  prompt = "a photo of " * 150 + "(red:abc)"  # 1,659 characters, a syntax error at the end
  response = client.post("/api/parse", json={"prompt": prompt})
  message = _error(response, 400)
  assert "not a number" in message and f"({len(prompt)} characters)" in message
  assert prompt not in message and len(response.data) < 800
  # over the context: a caret at the first token that does not fit, the prompt not echoed
  prompt = "word " * 300
  message = _error(client.post("/api/parse", json={"prompt": prompt}), 400)
  context = explorer.bundle.config.text.context_length
  assert f"context length is {context}" in message and "(1500 characters)" in message
  assert len(message) < 800


def test_malformed_bodies_are_400(client):
  for data, content_type, fragment in [
    ("[" * 20000, "application/json", "nested too deeply"),
    (b"\xff\xfe{", "application/json", "not valid JSON"),
    ('{"prompt": "a red', "application/json", "not valid JSON"),
    ('{"prompt": "a red circle"}', "text/plain", "Content-Type: application/json"),
    ("nonsense", None, "Content-Type: application/json"),
  ]:
    response = client.post("/api/parse", data=data, content_type=content_type)
    assert fragment in _error(response, 400), data[:20]
  assert "must be" in _error(client.post("/api/parse", json={"prompt": 3}), 400)
  for weight in [float("nan"), float("inf"), "1.5", True, None]:
    body = json.dumps({"words": [{"text": "red", "weight": weight}]})
    response = client.post("/api/rank", data=body, content_type="application/json")
    assert "weight" in _error(response, 400), weight


# ---------------------------------------------------------------------------------------------
# Host and Origin (issue row 6).


def test_host_header_allowlist(client):
  for host in [
    "attacker.example",
    "attacker.example:8000",
    "127.0.0.1.nip.io",
    "10.0.0.2",
    "localhost.attacker.example",
    "0.0.0.0:8000",
    "[::2]:80",
    "127.0.0.1:http",
  ]:
    for path in ["/thumb/3", "/", "/health"]:
      message = _error(client.get(path, headers={"Host": host}), 403)
      assert "DNS rebinding" in message and "localhost" in message
    response = client.post("/api/parse", json={"prompt": "a red circle"}, headers={"Host": host})
    _error(response, 403)
  for host in [
    "localhost",
    "LOCALHOST:5000",
    "localhost.",
    "127.0.0.1",
    "127.0.0.2:8000",
    "[::1]:8000",
    "[::ffff:127.0.0.1]:80",
  ]:
    response = client.get("/thumb/3", headers={"Host": host})
    assert response.status_code == 200 and response.data[:4] == b"\x89PNG", host


def test_cross_origin_requests_are_refused(client):
  body = {"prompt": "a red circle"}
  for origin in ["http://attacker.example", "null", "http://127.0.0.1.attacker.example"]:
    response = client.post("/api/parse", json=body, headers={"Origin": origin})
    assert "cross-origin" in _error(response, 403)
  for origin in ["http://127.0.0.1:8000", "http://localhost:1234"]:
    assert client.post("/api/parse", json=body, headers={"Origin": origin}).status_code == 200


def test_host_is_local():
  assert host_is_local("127.0.0.1:65535") and host_is_local("[::1]")
  assert not host_is_local("") and not host_is_local(None)
  assert not host_is_local("[::1") and not host_is_local("[::1]x")
  assert not host_is_local("localhost:80:80")


# ---------------------------------------------------------------------------------------------
# JSON for every error (issue row 17).


def test_404_405_and_500_are_json(client, explorer, monkeypatch):
  message = _error(client.get("/nope"), 404)
  assert "/nope" in message and "POST /api/rank" in message
  assert "no image 999999" in _error(client.get("/thumb/999999"), 404)
  message = _error(client.get("/api/rank"), 405)
  assert "GET is not allowed on /api/rank; use POST" == message
  _error(client.delete("/api/parse"), 405)

  def broken(*args, **kwargs):
    raise RuntimeError("a bug")

  monkeypatch.setattr(explorer, "rank", broken)
  response = client.post("/api/rank", json={"words": [{"text": "a red circle", "weight": 1}]})
  message = _error(response, 500)
  assert "internal error (RuntimeError)" in message and "Traceback" not in message


def test_parse_and_rank_accept_and_refuse_the_same_weights(client):
  for text in ["0", "0.5", "5", "5.0", "5.0001", "6", "1e20", "-1", "-0", "1e-400", "1e999"]:
    parse = client.post("/api/parse", json={"prompt": f"a ({text}:{text}) circle"})
    value = float(text)
    rank = client.post("/api/rank", json={"words": [{"text": "a red circle", "weight": value}]})
    assert parse.status_code == rank.status_code, (text, parse.get_json(), rank.get_json())
    if parse.status_code == 200:
      assert parse.get_json()["words"][1]["weight"] == value
    else:
      assert "must lie in [0, 5]" in parse.get_json()["error"]
      assert "must lie in [0, 5]" in rank.get_json()["error"]
  # full-width digits are not a weight (issue row 17)
  message = _error(client.post("/api/parse", json={"prompt": "a (red:\uff11.\uff15) circle"}), 400)
  assert "not a number in ASCII digits" in message and message.rstrip().endswith("^")


# ---------------------------------------------------------------------------------------------
# Image folders and the index cache (issue rows 7, 10, 11).


def _folder(root, colours):
  root.mkdir(exist_ok=True)
  for name, colour in colours.items():
    image = Image.new("RGB", (40, 30), colour)
    image.save(root / name, quality=95)
  return root


def _count_encodes(monkeypatch):
  calls = []
  encode = index_lib.encode_data

  def counted(bundle, data, batch_size=256):
    calls.append(len(data.keys))
    return encode(bundle, data, batch_size)

  monkeypatch.setattr(index_lib, "encode_data", counted)
  return calls


def test_truncated_jpeg_is_skipped_and_named(tmp_path, caplog, monkeypatch):
  root = _folder(tmp_path / "images", {"a.png": (200, 0, 0), "b.jpg": (0, 200, 0)})
  data = (root / "b.jpg").read_bytes()
  (root / "broken.jpg").write_bytes(data[: len(data) // 2])  # the truncated JPEG
  (root / "empty.png").write_bytes(b"")
  (root / "text.png").write_text("not an image")
  calls = _count_encodes(monkeypatch)
  cache = tmp_path / "cache"
  with caplog.at_level(logging.WARNING):
    folder = build_explorer("tiny-synthetic", images=str(root), cache_dir=str(cache))
  assert folder.keys == ["a.png", "b.jpg"] and calls == [2]
  warning = "\n".join(r.getMessage() for r in caplog.records)
  assert "Skipping 3 of the 5 images" in warning
  for name in ["broken.jpg", "empty.png", "text.png"]:
    assert str(root / name) in warning
  assert "truncated" in warning
  assert folder.rank([("a red circle", 1.0)], 2)["results"][0]["key"] in ("a.png", "b.jpg")
  # the next start reuses the check and the index: no image decoded, nothing encoded
  caplog.clear()
  monkeypatch.setattr(
    explorer_folder, "_image_problem", lambda path: pytest.fail("decoded " + path)
  )
  with caplog.at_level(logging.WARNING):
    again = build_explorer("tiny-synthetic", images=str(root), cache_dir=str(cache))
  assert again.keys == folder.keys and calls == [2]
  assert "broken.jpg" in caplog.text
  np.testing.assert_array_equal(again.embeddings, folder.embeddings)


def test_folder_without_readable_images(tmp_path):
  root = tmp_path / "bad"
  root.mkdir()
  (root / "x.jpg").write_bytes(b"\xff\xd8\xff")
  with pytest.raises(InputError, match=r"none of the 1 images under .*bad can be read: x.jpg"):
    build_explorer("tiny-synthetic", images=str(root), cache_dir=None)
  with pytest.raises(InputError, match="not a folder of images"):
    build_explorer("tiny-synthetic", images=str(tmp_path / "none"), cache_dir=None)


def test_replaced_image_rebuilds_the_index(tmp_path, monkeypatch):
  root = _folder(tmp_path / "images", {"a.png": (200, 0, 0), "b.png": (0, 0, 200)})
  cache = tmp_path / "cache"
  calls = _count_encodes(monkeypatch)
  first = build_explorer("tiny-synthetic", images=str(root), cache_dir=str(cache))
  same = build_explorer("tiny-synthetic", images=str(root), cache_dir=str(cache))
  assert calls == [2]  # the second start used the cache
  np.testing.assert_array_equal(same.embeddings, first.embeddings)
  # the reproducer: another image under the same name (same size, same mtime even)
  stat = os.stat(root / "a.png")
  Image.new("RGB", (40, 30), (0, 200, 0)).save(root / "a.png")
  os.utime(root / "a.png", ns=(stat.st_atime_ns, stat.st_mtime_ns))
  replaced = build_explorer("tiny-synthetic", images=str(root), cache_dir=str(cache))
  assert calls == [2, 2]
  fresh = build_explorer("tiny-synthetic", images=str(root), cache_dir=None)
  np.testing.assert_allclose(replaced.embeddings, fresh.embeddings, atol=1e-6)
  assert not np.allclose(replaced.embeddings[0], first.embeddings[0], atol=1e-3)
  np.testing.assert_allclose(replaced.embeddings[1], first.embeddings[1], atol=1e-6)
  # every cache file is whole (written through a temporary file and a rename)
  assert not [p for p in os.listdir(cache) if p.endswith(".tmp")]


def test_truncated_index_cache_is_rebuilt_with_a_warning(tmp_path, caplog, monkeypatch):
  root = _folder(tmp_path / "images", {"a.png": (200, 0, 0), "b.png": (0, 0, 200)})
  cache = tmp_path / "cache"
  calls = _count_encodes(monkeypatch)
  first = build_explorer("tiny-synthetic", images=str(root), cache_dir=str(cache))
  (npz,) = [cache / p for p in os.listdir(cache) if p.endswith(".npz")]
  for corrupt in [npz.read_bytes()[: npz.stat().st_size // 2], b"", b"not a zip file"]:
    npz.write_bytes(corrupt)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
      again = build_explorer("tiny-synthetic", images=str(root), cache_dir=str(cache))
    assert f"The index cache {npz} is unusable" in caplog.text and "rebuilding it" in caplog.text
    np.testing.assert_allclose(again.embeddings, first.embeddings, atol=1e-6)
  assert calls == [2, 2, 2, 2]
  # the rebuilt file is good again: the next start reads it, silently
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    build_explorer("tiny-synthetic", images=str(root), cache_dir=str(cache))
  assert calls == [2, 2, 2, 2] and "unusable" not in caplog.text
  # a corrupt record of the image check is redone, with a warning
  (record,) = [cache / p for p in os.listdir(cache) if p.endswith(".images.json")]
  record.write_text('{"images": 2, "unread')
  with caplog.at_level(logging.WARNING):
    build_explorer("tiny-synthetic", images=str(root), cache_dir=str(cache))
  assert f"The image check record {record} is unusable" in caplog.text
  assert json.loads(record.read_text())["unreadable"] == {}


def test_bad_options_are_user_errors():
  import stori_jax

  for count in [0, MAX_IMAGES_PER_COMBINATION + 1]:
    with pytest.raises(InputError, match=r"--images_per_combination must lie in \[1, 16\]"):
      build_explorer("tiny-synthetic", images_per_combination=count, cache_dir=None)
  # the blocks are checked before the index is built, against the model's text tower
  config = stori_jax.load("tiny-synthetic").config
  layers, start = config.text.layers, default_start_block(config.text)
  with pytest.raises(InputError, match=f"^--start_block 99: Reweighting blocks 99..{layers} are "):
    build_explorer("tiny-synthetic", start_block=99, cache_dir=None)
  with pytest.raises(InputError, match=f"^--stop_block 99: Reweighting blocks {start}..99 are "):
    build_explorer("tiny-synthetic", stop_block=99, cache_dir=None)
  with pytest.raises(InputError, match="^--start_block 5 --stop_block 4: Reweighting blocks 5..4"):
    build_explorer("tiny-synthetic", start_block=5, stop_block=4, cache_dir=None)


def test_cli_port_out_of_range_exits_2():
  result = subprocess.run(
    [sys.executable, "-m", "stori_jax.explore", "--port", "99999", "--cache_dir="],
    capture_output=True,
    text=True,
    cwd=REPO,
    timeout=300,
    check=False,
  )
  assert result.returncode == 2, result.stderr
  assert "error: --port must lie in [0, 65535] (0 picks a free port), got 99999" in result.stderr
  assert "Traceback" not in result.stderr


@pytest.mark.parametrize("missing", ["werkzeug", "flask"])
def test_cli_without_the_explore_extra_exits_2(missing):
  """`pip install -e .` has no flask: the command names the extra to install, no traceback."""
  # None in sys.modules makes `import <missing>` fail as if it were not installed.
  program = (
    f"import runpy, sys; sys.modules[{missing!r}] = None; "
    "sys.argv = ['explore', '--cache_dir=']; "
    "runpy.run_module('stori_jax.explore', run_name='__main__')"
  )
  result = subprocess.run(
    [sys.executable, "-c", program],
    capture_output=True,
    text=True,
    cwd=REPO,
    timeout=300,
    check=False,
  )
  assert result.returncode == 2, result.stderr
  assert f"({missing} is not installed)" in result.stderr
  assert 'pip install "stori-jax[explore]"' in result.stderr
  assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------------
# Load: 500 requests, 20 at a time, a fifth malformed or oversized.


def _peak_rss_kb() -> int:
  with open("/proc/self/status", encoding="ascii") as f:
    return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def _request(port, method, path, body=None, headers=None):
  connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
  try:
    connection.request(method, path, body=body, headers=headers or {})
    response = connection.getresponse()
    return response.status, response.getheader("Content-Type"), response.read()
  finally:
    connection.close()


def _load_run() -> dict:
  """The load test's body, run in a fresh process so that its peak RSS is the server's and
  the clients', not that of whatever else the test session loaded."""
  from werkzeug.serving import make_server

  logging.getLogger("werkzeug").setLevel(logging.WARNING)  # as the command line sets it
  explorer = build_explorer("tiny-synthetic", cache_dir=None, images_per_combination=1)
  reference = [("a photo of a ", 1.0), ("red ", 2.0), ("striped circle", 1.0)]
  expected_reference = [r["index"] for r in explorer.rank(reference, 12)["results"]]
  # the well-formed requests: 10 weightings of the default prompt, with their answers
  words = [(w["text"], w["weight"]) for w in explorer.parse(explorer.default_prompt)]
  rng = np.random.default_rng(0)
  good = []
  for _ in range(10):
    weighted = [(t, float(np.round(rng.uniform(0, 3) / 0.05) * 0.05)) for t, _ in words]
    k = int(rng.integers(1, 20))
    expected = explorer.rank(weighted, k)["results"]
    body = {"words": [{"text": t, "weight": w} for t, w in weighted], "k": k}
    good.append((body, [r["index"] for r in expected], [r["score"] for r in expected]))
  parse_expected = explorer.parse("a (red:2) striped circle")
  big = json.dumps({"prompt": "x" * (MAX_BODY_BYTES + 10)})
  bad = [  # (method, path, body, headers, status, fragment of the error)
    ("POST", "/api/rank", big, None, 413, "at most 65536 bytes"),
    ("POST", "/api/parse", '{"prompt": "a (red:abc)"}', None, 400, "not a number"),
    ("POST", "/api/parse", json.dumps({"prompt": "y" * 5000}), None, 400, "at most 2000"),
    ("POST", "/api/rank", '{"words": [{"text": "red", "weight": 1e999}]}', None, 400, "not finite"),
    ("POST", "/api/rank", "[" * 20000, None, 400, "nested too deeply"),
    ("GET", "/thumb/1", None, {"Host": "attacker.example"}, 403, "DNS rebinding"),
    ("GET", "/api/rank", None, None, 405, "use POST"),
    ("GET", "/missing", None, None, 404, "no such page"),
    ("POST", "/api/rank", json.dumps({**good[0][0], "stop_block": 99}), None, 400, "blocks 1.."),
  ]

  def one(n):
    kind = n % 5
    if kind == 4:  # a fifth: malformed or oversized
      method, path, body, headers, status, fragment = bad[(n // 5) % len(bad)]
      headers = {"Content-Type": "application/json", **(headers or {})}
      got = _request(port, method, path, body, headers)
      assert got[0] == status and got[1] == "application/json", (path, got[0], got[2][:200])
      assert fragment in json.loads(got[2])["error"], (fragment, got[2][:200])
      return "bad"
    if kind == 3 and n % 2:
      got = _request(
        port,
        "POST",
        "/api/parse",
        json.dumps({"prompt": "a (red:2) striped circle"}),
        {"Content-Type": "application/json"},
      )
      assert got[0] == 200 and json.loads(got[2])["words"] == parse_expected
      return "parse"
    if kind == 3:
      got = _request(port, "GET", f"/thumb/{n % len(explorer.keys)}")
      assert got[0] == 200 and got[2][:4] == b"\x89PNG"
      return "thumb"
    body, indices, scores = good[n % len(good)]
    got = _request(
      port, "POST", "/api/rank", json.dumps(body), {"Content-Type": "application/json"}
    )
    assert got[0] == 200, got[2][:300]
    results = json.loads(got[2])["results"]
    assert [r["index"] for r in results] == indices
    np.testing.assert_allclose([r["score"] for r in results], scores, atol=1e-6)
    return "rank"

  httpd = make_server("127.0.0.1", 0, create_app(explorer), threaded=True)
  port = httpd.port
  thread = threading.Thread(target=httpd.serve_forever, daemon=True)
  thread.start()
  try:
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(20) as pool:
      kinds = list(pool.map(one, range(500)))
    seconds = time.perf_counter() - start
  finally:
    httpd.shutdown()
    thread.join(10)
    httpd.server_close()
  after = [r["index"] for r in explorer.rank(reference, 12)["results"]]
  return {
    "kinds": kinds,
    "seconds": seconds,
    "peak_mb": _peak_rss_kb() / 1024,
    "reference_unchanged": after == expected_reference,
  }


@pytest.mark.slow
def test_load_on_loopback():
  context = multiprocessing.get_context("spawn")
  with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
    result = pool.submit(_load_run).result(timeout=600)  # a failed check raises here
  kinds = result["kinds"]
  print(f"500 requests in {result['seconds']:.1f} s, peak RSS {result['peak_mb']:.0f} MB")
  assert len(kinds) == 500 and kinds.count("bad") == 100 and kinds.count("rank") == 300
  assert result["peak_mb"] < 1024
  assert result["reference_unchanged"]


# ---------------------------------------------------------------------------------------------
# Issue 26, the explorer's rows: compiled settings (7), slow clients (8), a FIFO in --images
# (14), a weight of 4,000 digits (10).

#: The text programs an explorer may compile, whatever blocks its requests choose: one per
#: padded length (`length_buckets`: 5 for a 77-token context).
TEXT_PROGRAM_BOUND = 5
#: What 400 distinct settings may add to the process's resident memory once the explorer has
#: compiled its programs. Before, each setting compiled a program and kept it: 40 settings of
#: this 16-block model added 594 MB (about 15 MB each), 400 would have held some 6 GB.
SETTINGS_RSS_BOUND_MB = 100


def _rss_mb() -> float:
  with open("/proc/self/status", encoding="ascii") as f:
    return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


@pytest.mark.slow
def test_compiled_programs_stay_bounded_over_400_settings():
  """Row 7: every distinct (start block, stop block, length bucket) compiled a text program
  and kept it. Now the blocks are data: one program per length bucket, measured here as XLA
  compilations and resident memory over 400 distinct settings, every k from 1 to 100."""
  import jax

  from stori_jax.clip.bundle import CLIPBundle
  from stori_jax.explorer.ranking import Explorer, length_buckets
  from stori_jax.models import CLIPConfig, TextConfig, VisionConfig, init_params

  layers = 16  # 136 block ranges x 5 lengths: 680 settings to draw 400 from
  config = CLIPConfig(
    embed_dim=16,
    text=TextConfig(context_length=77, width=16, layers=layers, heads=2),
    vision=VisionConfig(image_size=32, patch_size=16, width=16, layers=1, heads=2),
  )
  bundle = CLIPBundle(config, init_params(config, seed=0))
  rng = np.random.default_rng(0)
  embeddings = rng.normal(size=(300, 16)).astype(np.float32)
  embeddings /= np.linalg.norm(embeddings, axis=1, keepdims=True)
  explorer = Explorer(bundle, embeddings, [f"im{i}" for i in range(300)])
  buckets = length_buckets(77)
  assert len(buckets) == TEXT_PROGRAM_BOUND
  # a prompt in each bucket: "red " and "blue" are a token each, plus start and end of text
  prompts = {b: [("red " * (b - 3 - (b > 16) * 4), 1.0), ("blue", 0.5)] for b in buckets}
  for b, words in prompts.items():
    used = int((np.asarray(bundle.tokenize([words], with_weights=True)[0]) != 0).sum())
    assert b - 16 < used <= b, (b, used)
  ranges = [(s, t) for s in range(1, layers + 1) for t in range(s, layers + 1)]
  settings = [(s, t, b) for s, t in ranges for b in buckets]
  settings = [settings[i] for i in rng.permutation(len(settings))[:400]]
  assert len(set(settings)) == 400
  # the program equals the model's own encoder, which compiles the blocks in (a few settings)
  for s, t, b in settings[:3]:
    text = "".join(f"({w.strip()}:{x})" if x != 1 else w for w, x in prompts[b])
    expected = np.asarray(bundle.encode_prompts([text], s, t))[0]
    np.testing.assert_allclose(
      explorer.encode(prompts[b], s, t), expected / np.linalg.norm(expected), atol=1e-6
    )
  for b in buckets:  # warm: every program compiled once
    explorer.rank(prompts[b], 12, 1, layers)
  compiles = []

  def on_event(event, duration, **kwargs):
    if event == "/jax/core/compile/backend_compile_duration":
      compiles.append(duration)

  jax.monitoring.register_event_duration_secs_listener(on_event)
  try:
    before = _rss_mb()
    for n, (s, t, b) in enumerate(settings):
      answer = explorer.rank(prompts[b], n % 100 + 1, s, t)
      assert answer["blocks"] == [s, t] and len(answer["results"]) == n % 100 + 1
    grown = _rss_mb() - before
  finally:
    jax.monitoring.unregister_event_duration_listener(on_event)
  print(f"400 settings: {len(compiles)} compilations, resident memory +{grown:.0f} MB")
  assert compiles == [], f"{len(compiles)} programs compiled for settings already served"
  assert explorer.compiled_text_programs() <= TEXT_PROGRAM_BOUND
  assert grown < SETTINGS_RSS_BOUND_MB


def _serve(app, **options):
  """A bounded explorer server on a free loopback port, serving on a thread; (server, thread)."""
  from stori_jax.explorer.server import make_server

  server = make_server("127.0.0.1", 0, app, **options)
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  return server, thread


def _closed_by_server(sock, timeout: float) -> bool:
  """True when the server closes `sock` within `timeout` seconds."""
  sock.settimeout(timeout)
  try:
    while sock.recv(4096):
      pass
    return True
  except ConnectionResetError:
    return True
  except TimeoutError:
    return False


@pytest.mark.slow
def test_slow_clients_hold_bounded_threads_and_time_out(explorer):
  """Row 8: 300 connections sending half a header held 300 threads, with no timeout. Now at
  most `threads` handler threads, and each connection is closed once its header deadline
  (from acceptance) passes; a request queued behind them is still answered."""
  import socket

  server, thread = _serve(
    create_app(explorer), threads=8, header_timeout=1.0, body_timeout=1.0, max_pending=1000
  )
  base = threading.active_count()
  slow = []
  try:
    start = time.monotonic()
    for _ in range(300):
      sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
      sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: sl")  # half a header
      slow.append(sock)
    # a whole request, queued behind the 300: answered once its turn comes
    status, _, body = _request(server.port, "GET", "/health")
    assert status == 200 and json.loads(body)["ok"], body
    assert threading.active_count() - base <= 8
    # every slow connection closed by the server: 1 s for the first 8, then the expired ones
    assert all(_closed_by_server(sock, 10) for sock in slow)
    elapsed = time.monotonic() - start
    assert elapsed < 10, f"the slow connections were closed after {elapsed:.1f} s"
    assert threading.active_count() - base <= 8
    # a body that stops halfway: 408, with the reason
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    slow.append(sock)
    sock.sendall(
      b"POST /api/rank HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
      b'Content-Length: 100\r\n\r\n{"words": '
    )
    sock.settimeout(10)
    answer = b""
    while chunk := sock.recv(65536):  # until the server closes it (Connection: close)
      answer += chunk
    answer = answer.decode()
    assert answer.startswith("HTTP/1.1 408"), answer[:300]
    assert "the request's body did not arrive within 1 s" in answer
    # and the server still answers
    status, _, body = _request(
      server.port,
      "POST",
      "/api/rank",
      json.dumps({"words": [{"text": "a red circle", "weight": 1}], "k": 3}),
      {"Content-Type": "application/json"},
    )
    assert status == 200 and len(json.loads(body)["results"]) == 3
  finally:
    for sock in slow:
      sock.close()
    server.shutdown()
    thread.join(10)
    server.server_close()


def test_connections_beyond_the_queue_are_closed_at_once(explorer):
  import socket

  server, thread = _serve(create_app(explorer), threads=1, header_timeout=5.0, max_pending=1)
  socks = []
  try:
    for _ in range(3):  # one served (waiting for its header), one queued, one refused
      socks.append(socket.create_connection(("127.0.0.1", server.port), timeout=10))
      socks[-1].sendall(b"GET /health HTTP/1.1\r\n")
      time.sleep(0.2)
    assert _closed_by_server(socks[2], 2)
    assert not _closed_by_server(socks[1], 0.5)
  finally:
    for sock in socks:
      sock.close()
    server.shutdown()
    thread.join(10)
    server.server_close()


def test_fifo_in_the_image_folder_is_skipped_not_read(tmp_path, caplog):
  """Row 14: a FIFO named x.png hung start-up forever (opening it waits for a writer). It is
  refused by the one image reader the mutual reader uses, and skipped, named."""
  root = _folder(tmp_path / "images", {"a.png": (200, 0, 0)})
  fifo = root / "x.png"
  os.mkfifo(fifo)
  outcome = {}

  def build():
    try:
      outcome["explorer"] = build_explorer("tiny-synthetic", images=str(root), cache_dir=None)
    except Exception as e:  # pylint: disable=broad-except
      outcome["error"] = e

  with caplog.at_level(logging.WARNING):
    builder = threading.Thread(target=build, daemon=True)
    builder.start()
    builder.join(240)
  if builder.is_alive():
    with open(fifo, "wb"):  # a writer lets the blocked open return
      pass
    pytest.fail("build_explorer blocks on the FIFO")
  assert "error" not in outcome, outcome.get("error")
  assert outcome["explorer"].keys == ["a.png"]
  assert "Skipping 1 of the 2 images" in caplog.text
  assert f"{fifo}: x.png is not an image file" in caplog.text
  # a folder holding only the FIFO: one clear error, no hang
  (root / "a.png").unlink()
  with pytest.raises(InputError, match=r"none of the 1 images .* can be read: x\.png \(x\.png is "):
    build_explorer("tiny-synthetic", images=str(root), cache_dir=None)


def test_weight_of_4000_digits_is_400(client):
  """Row 10: a weight written as a 4,000-digit integer overflowed float(): HTTP 500."""
  digits = "1" + "0" * 3999
  for weight in [digits, "-" + digits]:
    response = client.post(
      "/api/rank",
      data='{"words": [{"text": "a red circle", "weight": %s}]}' % weight,
      content_type="application/json",
    )
    message = _error(response, 400)
    assert message == (
      "the weight of words[0] 'a red circle' is an integer of about 4000 digits, too large: "
      "weights must lie in [0, 5] (0 removes the words)"
    )
  # past Python's 4,300 digits the JSON itself is refused; in the prompt syntax it is infinite
  response = client.post(
    "/api/rank",
    data='{"words": [{"text": "red", "weight": 1%s}]}' % ("0" * 5000),
    content_type="application/json",
  )
  assert "the body is not valid JSON" in _error(response, 400)
  message = _error(client.post("/api/parse", json={"prompt": f"a (red:{digits}) circle"}), 400)
  assert "the explorer takes at most 2000" in message
  message = _error(client.post("/api/parse", json={"prompt": f"a (red:{digits[:1000]})"}), 400)
  assert "is not finite: weights must lie in [0, 5]" in message
  # a block or k of 4,000 digits: 400 as well
  for extra in [{"start_block": 10**3999}, {"stop_block": -(10**3999)}, {"k": 10**3999}]:
    body = {"words": [{"text": "a red circle", "weight": 1}], **extra}
    _error(client.post("/api/rank", json=body), 400)


# ---------------------------------------------------------------------------------------------
# Issue 36 row 5: a chunked body (no Content-Length) over the limit is 413, not cut and parsed.


def _chunked(client, body: bytes):
  """POST /api/parse with `body` as a chunked stream, as a server that dechunks passes it
  (wsgi.input_terminated, no Content-Length)."""
  import io

  return client.post(
    "/api/parse",
    input_stream=io.BytesIO(body),
    headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"},
    environ_overrides={"wsgi.input_terminated": True},
  )


def _padded(size: int) -> bytes:
  """A valid /api/parse body of exactly `size` bytes (trailing whitespace)."""
  body = json.dumps({"prompt": "a red circle"}).encode()
  return body + b" " * (size - len(body))


def test_a_chunked_body_over_the_limit_is_413_in_the_app(client):
  big = _padded(2 * 1024 * 1024)  # valid JSON in its first 64 KB: it used to get 200
  message = _error(_chunked(client, big), 413)
  assert f"over the limit; the explorer takes at most {MAX_BODY_BYTES} bytes" in message
  valid = json.dumps({"prompt": "a" * 70_000}).encode()  # used to fail at column 65,537
  assert "at most" in _error(_chunked(client, valid), 413)
  assert "at most" in _error(_chunked(client, _padded(MAX_BODY_BYTES + 1)), 413)
  exact = _chunked(client, _padded(MAX_BODY_BYTES))
  assert exact.status_code == 200, exact.data[:300]
  assert [w["text"] for w in exact.get_json()["words"]] == ["a ", "red ", "circle"]


def _raw_chunked(port: int, body: bytes) -> bytes:
  """POST /api/parse with `body` in 16 KB chunks over a raw socket; the whole answer."""
  import socket

  sock = socket.create_connection(("127.0.0.1", port), timeout=30)
  try:
    sock.sendall(
      b"POST /api/parse HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
      b"Transfer-Encoding: chunked\r\n\r\n"
    )
    try:
      for i in range(0, len(body), 16384):
        piece = body[i : i + 16384]
        sock.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
      sock.sendall(b"0\r\n\r\n")
    except OSError:  # the server may answer and close before the whole body is sent
      pass
    answer = b""
    try:
      while chunk := sock.recv(65536):  # until the server closes it (Connection: close)
        answer += chunk
    except ConnectionResetError:
      pass
    return answer
  finally:
    sock.close()


def test_a_chunked_body_over_the_limit_is_413_from_the_server(explorer):
  server, thread = _serve(create_app(explorer))
  try:
    for body in (_padded(2 * 1024 * 1024), json.dumps({"prompt": "a" * 70_000}).encode()):
      start = time.monotonic()
      answer = _raw_chunked(server.port, body).decode()
      # answered, the rest of the body dropped and the connection closed within seconds (not
      # held until the body's deadline)
      assert time.monotonic() - start < 5
      assert answer.startswith("HTTP/1.1 413"), answer[:300]
      assert f"the explorer takes at most {MAX_BODY_BYTES} bytes" in answer
    answer = _raw_chunked(server.port, _padded(MAX_BODY_BYTES)).decode()
    assert answer.startswith("HTTP/1.1 200"), answer[:300]
    assert '"text":"circle"' in answer
  finally:
    server.shutdown()
    thread.join(10)
    server.server_close()
