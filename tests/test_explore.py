"""The explorer: Python API, JSON API, and the page end to end in headless Chromium.

The end-to-end colour-slider test runs the command line (`python -m stori_jax.explore`) on
the model in $STORI_EXPLORE_SOURCE (default: the shipped tiny-synthetic; set it to check
another checkpoint) and, when $STORI_EXPLORE_SCREENSHOT names a file (a .png), saves the page
there with the colour at 0, and before the move beside it (`<name>-before.png`).
"""

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import types
import urllib.request

import numpy as np
import pytest

from stori_jax.explorer.app import create_app
from stori_jax.explorer.index import build_explorer
from stori_jax.explorer.ranking import Explorer
from stori_jax.explorer.world import WORLD_FAMILIES, world_data
from stori_jax.models.config import TextConfig
from stori_jax.models.text import default_start_block
from stori_jax.retrieval import metrics

CHROMIUM = "/usr/bin/chromium"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT = "a photo of a red checkered heart"
FAVOURED = "red, checkered, heart"
#: Images of the top 12 that the colour slider at 0 must replace, a third (the issue: "0 or 1").
MIN_REPLACED = 4


def _words(explorer, prompt):
  return [(w["text"], w["weight"]) for w in explorer.parse(prompt)]


def _body(words, **extra):
  return {"words": [{"text": t, "weight": w} for t, w in words], **extra}


def test_parse_splits_words_and_keeps_weights():
  words = Explorer.parse("a photo of a (red star:1.5) please")
  assert "".join(w["text"] for w in words) == "a photo of a red star please"
  assert [w["weight"] for w in words] == [1, 1, 1, 1, 1.5, 1.5, 1]
  with pytest.raises(ValueError, match="unbalanced parentheses"):
    Explorer.parse("(red:abc")
  with pytest.raises(ValueError, match="not a number"):
    Explorer.parse("(red:abc)")
  with pytest.raises(ValueError, match="empty"):
    Explorer.parse("   ")


def test_top_k_is_the_head_of_the_full_ranking(explorer):
  rng = np.random.default_rng(0)
  text = rng.normal(size=explorer.embeddings.shape[1]).astype(np.float32)
  indices, scores = explorer.top_k(text / np.linalg.norm(text), 10)
  np.testing.assert_array_equal(indices, metrics.ranking(explorer.embeddings @ text)[:10])
  assert np.all(np.diff(scores) <= 0)
  # ties are broken by index, as metrics.ranking does
  tied = Explorer(explorer.bundle, np.ones((6, 4), np.float32) / 2, list("abcdef"))
  np.testing.assert_array_equal(tied.top_k(np.ones(4, np.float32) / 2, 3)[0], [0, 1, 2])


def test_world_index_holds_every_combination(explorer):
  from stori_jax.data import synthetic

  families = [explorer.attributes[f] for f in WORLD_FAMILIES]
  combinations = set(zip(*families))
  assert len(explorer.keys) == 8 * 4 * 8 == len(combinations)
  assert {c for c, _, _ in combinations} == set(synthetic.COLOURS)
  assert explorer.keys[0] == "red-plain-circle/0"
  assert explorer.default_prompt == PROMPT
  assert explorer.description.startswith(
    "8 colours x 4 patterns x 8 shapes, 1 image each, 256 images, synthetic world"
  )
  # the ground truth is what the images show: one thumbnail per colour, the object's pixels
  data, attributes = world_data(1, 64)
  image = data.load(np.asarray([0]), 64)[0]
  assert attributes["colour"][0] == "red" and image.shape == (64, 64, 3)


def test_rank_follows_the_weights(explorer):
  words = _words(explorer, explorer.default_prompt)
  plain = explorer.rank(words, 16)
  assert len(plain["results"]) == 16
  assert sum(b["share"] for b in plain["bars"]) == pytest.approx(1.0)
  # the prompt's own category (one image here) leads the plain ranking
  assert plain["results"][0]["category"] == FAVOURED
  # the scores are the cosine similarities to the SToRI text embedding
  text = np.asarray(explorer.bundle.encode_prompts([explorer.default_prompt]))[0]
  cos = explorer.embeddings @ (text / np.linalg.norm(text))
  top = [r["index"] for r in plain["results"]]
  np.testing.assert_allclose([r["score"] for r in plain["results"]], cos[top], atol=1e-5)
  # removing the shape word changes the ranking
  words[-1] = (words[-1][0], 0.0)
  assert [r["index"] for r in explorer.rank(words, 16)["results"]] != top


def test_api_returns_the_category_curves(client, explorer):
  """App. B's curves over the whole ranking, [C, N], for the prompt's attribute words."""
  words = _words(explorer, PROMPT)
  words[4] = ("red ", 0.5)
  answer = client.post("/api/rank", json=_body(words, k=12)).get_json()
  curves = answer["curves"]
  n = len(explorer.keys)
  shares = np.asarray(curves["shares"])
  assert shares.shape == (8, n) and curves["n"] == n
  np.testing.assert_allclose(shares.sum(axis=0), 1.0, atol=1e-4)  # at every n
  assert curves["attributes"] == ["red", "checkered", "heart"]
  assert curves["names"][0] == "not red, not checkered, not heart"
  assert curves["names"][5] == "red, not checkered, heart" and curves["names"][7] == FAVOURED
  # ground truth of 1 image per combination: 7 other colours, 3 other patterns, 7 other shapes
  assert curves["sizes"] == [147, 21, 49, 7, 21, 3, 7, 1]
  # the curves and their AUC are the library's, over the ranking of the reweighted prompt
  text = explorer.encode(words)
  scores = explorer.embeddings @ text
  labels = np.stack(
    [
      explorer.attributes["colour"] == "red",
      explorer.attributes["pattern"] == "checkered",
      explorer.attributes["shape"] == "heart",
    ],
    axis=1,
  )
  codes = metrics.category_codes(labels)
  np.testing.assert_allclose(shares, metrics.category_curves(scores, codes, 8), atol=1e-4)
  np.testing.assert_allclose(curves["auc"], metrics.category_auc(scores, codes, 8), atol=1e-4)
  # the bars are the top k's composition, the curves at n = k
  np.testing.assert_allclose([b["share"] for b in answer["bars"]], shares[:, 11], atol=1e-4)
  assert [r["category"] for r in answer["results"]] == [
    curves["names"][codes[r["index"]]] for r in answer["results"]
  ]
  # a weight does not change the categories: 0 on "red" keeps the red categories
  words[4] = ("red ", 0.0)
  zero = client.post("/api/rank", json=_body(words)).get_json()["curves"]
  assert zero["names"] == curves["names"] and zero["sizes"] == curves["sizes"]


def test_categories_follow_the_prompts_words(explorer):
  task, note = explorer.task(["Stripes, ", "a ", "BLUE ", "moon. ", "blue ", "{x}"])
  assert note is None and task.phrases == ("Stripes", "BLUE", "moon")
  assert task.prompt() == "Stripes, a BLUE moon. blue {x}"  # the prompt, rebuilt
  assert task.category_names[-1] == "stripes, blue, moon"
  assert task.labels.sum(axis=0).tolist() == [64, 32, 32]  # striped, blue, moon images
  task, note = explorer.task(["a ", "photo"])
  assert task is None and "names no colour, pattern, shape" in note
  # at most MAX_ATTRIBUTES words define categories; the others are named
  task, note = explorer.task(["red ", "blue ", "green ", "pink ", "teal"])
  assert task.n_categories == 16 and "not ['teal']" in note


def test_blocks_are_chosen_and_validated(client, explorer):
  layers = explorer.bundle.config.text.layers
  default = default_start_block(explorer.bundle.config.text)
  assert (explorer.layers, explorer.start_block, explorer.stop_block) == (layers, default, layers)
  words = [("a photo of a ", 1.0), ("red ", 0.0), ("checkered heart", 1.0)]
  answer = client.post("/api/rank", json=_body(words, k=5)).get_json()
  assert answer["blocks"] == [default, layers]
  chosen = client.post("/api/rank", json=_body(words, k=5, start_block=1, stop_block=2))
  assert chosen.status_code == 200 and chosen.get_json()["blocks"] == [1, 2]
  # the chosen blocks are the ones the encoder reweights
  text = explorer.bundle.encode_prompts(["a photo of a (red:0) checkered heart"], 1, 2)[0]
  cos = explorer.embeddings @ (np.asarray(text) / np.linalg.norm(text))
  results = chosen.get_json()["results"]
  np.testing.assert_allclose(
    [r["score"] for r in results], cos[[r["index"] for r in results]], atol=1e-5
  )
  assert [r["index"] for r in results] != [r["index"] for r in answer["results"]]
  for blocks, message in [
    ({"start_block": 0}, f"outside the text tower's blocks 1..{layers}"),
    ({"stop_block": layers + 1}, f"outside the text tower's blocks 1..{layers}"),
    ({"start_block": layers + 1}, f"start_block {layers + 1}, stop_block {layers}: "),
    ({"start_block": 3, "stop_block": 2}, "Reweighting blocks 3..2 are outside"),
    (
      {"start_block": 2.5},
      f"start_block must be an integer, a block of the text tower in [1, {layers}], got 2.5",
    ),
    ({"stop_block": "6"}, "stop_block must be an integer"),
    ({"start_block": True}, "start_block must be an integer"),
  ]:
    response = client.post("/api/rank", json=_body(words, **blocks))
    assert response.status_code == 400, blocks
    assert message in response.get_json()["error"], (blocks, response.get_json())
  # the model's own default start block, when its config stores one
  stub = types.SimpleNamespace(
    config=types.SimpleNamespace(text=TextConfig(layers=12, default_start_block=3))
  )
  assert default_start_block(stub.config.text) == 3
  assert Explorer(stub, np.eye(2, dtype=np.float32), ["a", "b"]).start_block == 3
  stub.config.text = TextConfig(layers=12)
  assert Explorer(stub, np.eye(2, dtype=np.float32), ["a", "b"]).start_block == 7
  with pytest.raises(ValueError, match="outside the text tower's blocks 1..12"):
    Explorer(stub, np.eye(2, dtype=np.float32), ["a", "b"], stop_block=13)


def test_json_api_validates_input(client, explorer):
  ok = client.post("/api/parse", json={"prompt": "a (red:2) circle"})
  assert ok.status_code == 200 and ok.get_json()["words"][1] == {"text": "red", "weight": 2.0}
  bad = client.post("/api/parse", json={"prompt": "(red:abc"})
  assert bad.status_code == 400 and "unbalanced parentheses" in bad.get_json()["error"]
  assert client.post("/api/parse", data="nonsense").status_code == 400
  words = [{"text": "a red circle", "weight": 1.0}]
  for body, message in [
    ({"words": []}, "non-empty"),
    ({"words": [{"text": "red", "weight": -1}]}, "must lie in"),
    ({"words": [{"text": "red", "weight": "abc"}]}, "must be a number"),
    ({"words": [{"text": "red", "weight": 99}]}, "must lie in"),
    ({"words": [{"text": 3, "weight": 1}]}, "text: str"),
    ({"words": words, "k": 0}, "k must be"),
    ({"words": [{"text": "red " * 200, "weight": 1}]}, "context"),
    ([1, 2], "JSON object"),
  ]:
    response = client.post("/api/rank", json=body)
    assert response.status_code == 400, body
    assert message in response.get_json()["error"], (body, response.get_json())
  good = client.post("/api/rank", json={"words": words, "k": 5}).get_json()
  expected = explorer.rank([("a red circle", 1.0)], 5)["results"]
  assert [r["index"] for r in good["results"]] == [r["index"] for r in expected]
  png = client.get(f"/thumb/{good['results'][0]['index']}")
  assert png.status_code == 200 and png.data[:4] == b"\x89PNG"
  assert client.get("/thumb/100000").status_code == 404


def test_page_states_the_index_and_the_controls(client, explorer):
  page = client.get("/").get_data(as_text=True)
  assert explorer.default_prompt in page and 'id="sliders"' in page
  assert "index: 8 colours x 4 patterns x 8 shapes, 1 image each, 256 images, synthetic world" in (
    page
  )
  assert "multiplies the attention" in page and "from the start block to the stop block" in page
  assert "share of the top n images for n = 1 to N" in page
  layers, start = explorer.layers, explorer.start_block
  assert re.search(f'id="start_block" type="number" min="1" max="{layers}" value="{start}"', page)
  assert re.search(
    f'id="stop_block" type="number" min="1" max="{layers}"\\s+value="{layers}"', page
  )
  assert "__" not in page  # every placeholder filled
  assert '<link rel="icon" href="data:,">' in page  # no request for a missing /favicon.ico


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.fixture()
def server(explorer):
  """The explorer's app on a free port: (url, [(path, status)] of every request answered)."""
  from flask import request
  from werkzeug.serving import make_server

  app, answered = create_app(explorer), []

  @app.after_request
  def _record(response):
    answered.append((request.path, response.status_code))
    return response

  httpd = make_server("127.0.0.1", _free_port(), app, threaded=True)
  thread = threading.Thread(target=httpd.serve_forever, daemon=True)
  thread.start()
  yield f"http://127.0.0.1:{httpd.server_port}", answered
  httpd.shutdown()
  thread.join(5)


def _need_chromium():
  if not os.path.exists(CHROMIUM):
    message = f"{CHROMIUM} is absent; install it with `apt-get install -y chromium chromium-driver`"
    if os.environ.get("CI", "").lower() in ("true", "1"):
      pytest.fail(message + " (.ci/run does)")
    pytest.skip(message)


@contextlib.contextmanager
def _page():
  """A page of headless Chromium (Debian's, driven by playwright-core)."""
  from playwright.sync_api import sync_playwright

  args = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
  ]
  with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=CHROMIUM, args=args)
    try:
      yield browser.new_page(viewport={"width": 1240, "height": 960})
    finally:
      browser.close()


def _shown(page):
  return [
    int(i) for i in page.eval_on_selector_all("#results img", "e => e.map(x => x.dataset.index)")
  ]


def _wait_for_images(page, indices):
  page.wait_for_function(
    "want => [...document.querySelectorAll('#results img')].map(x => +x.dataset.index)"
    ".join() === want",
    arg=",".join(map(str, indices)),
  )


def _wait_for_rank(page, n: int):
  """Until the page shows its n-th ranking and has no other on its way."""
  page.wait_for_function(
    "n => +document.querySelector('#status').dataset.done === n && latest === n", arg=n
  )


def _chart(page):
  """What the chart shows: its title, every curve's points, the legend's names and AUCs."""
  return page.evaluate(
    """() => ({
      title: document.querySelector('#chart .title')?.textContent,
      curves: [...document.querySelectorAll('#chart polyline')].map(
        x => [x.dataset.category, x.getAttribute('points')]),
      legend: Object.fromEntries([...document.querySelectorAll('#legend li')].map(
        x => [x.dataset.category, +x.dataset.auc])),
      axes: [...document.querySelectorAll('#chart text')].map(x => x.textContent),
    })"""
  )


def test_page_in_headless_chromium(explorer, server):
  _need_chromium()
  words = _words(explorer, PROMPT)
  expected_before = [r["index"] for r in explorer.rank(words, 12)["results"]]
  moved = list(words)
  moved[-1] = (moved[-1][0], 0.0)  # the slider of "heart" to 0
  expected_after = [r["index"] for r in explorer.rank(moved, 12)["results"]]
  assert expected_after != expected_before  # the move must matter for the test to mean much
  expected_early = [r["index"] for r in explorer.rank(moved, 12, start_block=1)["results"]]
  with _page() as page:
    url, answered = server
    page.goto(url)
    page.fill("#prompt", PROMPT)
    page.click("#search")
    page.wait_for_function(
      "n => document.querySelectorAll('#sliders input[type=range]').length === n",
      arg=len(words),
    )
    _wait_for_images(page, expected_before)
    assert _shown(page) == expected_before
    labels = page.eval_on_selector_all("#sliders label", "e => e.map(x => x.textContent)")
    assert labels == [w.strip() for w, _ in words]
    page.locator("#sliders input[type=range]").nth(len(words) - 1).fill("0")
    _wait_for_images(page, expected_after)
    assert _shown(page) == expected_after
    chart = _chart(page)
    assert chart["title"] == "Share of each category among the top n of 256 images"
    assert len(chart["curves"]) == 8 and len(chart["legend"]) == 8
    assert chart["curves"][0][0] == FAVOURED  # drawn first, bold
    assert "n (images retrieved, by rank)" in chart["axes"] and "top 12" in chart["axes"]
    page.check("#log_n")  # a log scale for n: drawn again from the same answer
    logged = _chart(page)
    assert "n (images retrieved, by rank, log scale)" in logged["axes"]
    assert logged["curves"] != chart["curves"] and logged["legend"] == chart["legend"]
    page.uncheck("#log_n")
    assert page.evaluate("document.querySelector('#results img').naturalWidth") > 0
    # the start block is chosen in the page; one outside the tower is refused, named
    page.fill("#start_block", "1")
    page.dispatch_event("#start_block", "change")
    _wait_for_images(page, expected_early)
    assert f"blocks 1 to {explorer.layers}" in page.text_content("#status")
    page.fill("#start_block", "99")
    page.dispatch_event("#start_block", "change")
    page.wait_for_function("document.querySelector('#error').textContent.length > 0")
    assert f"outside the text tower's blocks 1..{explorer.layers}" in page.text_content("#error")
    page.fill("#start_block", str(explorer.start_block))
    page.dispatch_event("#start_block", "change")
    _wait_for_images(page, expected_after)
    # a bad prompt: the page shows the parse error and the server keeps answering
    page.fill("#prompt", "(red:abc")
    page.click("#search")
    page.wait_for_function("document.querySelector('#error').textContent.length > 0")
    error = page.text_content("#error")
    assert "unbalanced parentheses" in error and "(red:abc\n    ^" in error
    page.fill("#prompt", PROMPT)
    page.click("#search")
    page.wait_for_function("document.querySelector('#error').textContent === ''")
    _wait_for_images(page, expected_before)
  # Issue 29: every request the page made found its resource (Chromium asked for a
  # /favicon.ico the app does not serve); the API's 400s for bad input above are answers.
  assert answered and not [a for a in answered if a[1] == 404], answered


@pytest.fixture()
def command_line(tmp_path):
  """`python -m stori_jax.explore` on a free port: (url, source)."""
  source = os.environ.get("STORI_EXPLORE_SOURCE", "tiny-synthetic")
  stderr = open(tmp_path / "stderr.txt", "w+", encoding="utf-8")
  command = [sys.executable, "-m", "stori_jax.explore", "--source", source, "--port", "0"]
  process = subprocess.Popen(
    [*command, "--cache_dir", str(tmp_path / "cache")],
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=stderr,
    text=True,
  )
  try:
    match, line = None, ""  # line stays "" when the program prints nothing
    for line in process.stdout:  # until the server listens (or the program ends)
      match = re.search(r"on (http://\S+) \(index: ", line)
      if match:
        break
    if not match:
      process.wait(60)
      stderr.seek(0)
      pytest.fail(f"the explorer did not start: {line!r}\n{stderr.read()[-3000:]}")
    yield match.group(1), source
  finally:
    process.terminate()
    process.wait(30)
    stderr.close()


@pytest.mark.slow
def test_colour_slider_moves_the_chart_and_the_top_images(command_line):
  """The issue's end-to-end check, at the model's default blocks: typing the prompt and
  moving the colour word's slider to 0 changes the category chart and the top images."""
  _need_chromium()
  url, source = command_line
  with _page() as page:
    page.goto(url)
    assert "index: 8 colours x 4 patterns x 8 shapes, 2 images each, 512 images" in (
      page.text_content("#index-info")
    )
    _wait_for_rank(page, 1)  # the default prompt, ranked when the page opens
    page.fill("#prompt", PROMPT)
    page.click("#search")
    _wait_for_rank(page, 2)
    page.check("#log_n")  # the top of the ranking spread out
    assert len(_chart(page)["curves"]) == 8
    before, chart_before = _shown(page), _chart(page)
    screenshot = os.environ.get("STORI_EXPLORE_SCREENSHOT")
    if screenshot:
      stem, ext = os.path.splitext(screenshot)
      page.screenshot(path=f"{stem}-before{ext}", full_page=True)
    page.locator("#sliders input[aria-label='weight of red']").fill("0")
    _wait_for_rank(page, 3)
    after, chart_after = _shown(page), _chart(page)
    if screenshot:
      page.screenshot(path=screenshot, full_page=True)
    # what the page shows is the API's answer for red = 0
    words = [
      {"text": x, "weight": float(w)}
      for x, w in page.evaluate("words.map(w => [w.text, w.weight])")
    ]
    assert [w["weight"] for w in words if w["text"].strip() == "red"] == [0.0]
    request = urllib.request.Request(
      url + "/api/rank",
      json.dumps({"words": words, "k": 12}).encode(),
      {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
      answer = json.load(response)
  assert after == [r["index"] for r in answer["results"]]
  assert chart_after["curves"] != chart_before["curves"], "the category chart did not change"
  # a visible effect, not a swap of neighbours: images leave the top 12, and the favoured
  # category (red, checkered, heart) is retrieved later
  where = f"with {source} at its default blocks {answer['blocks']}, red = 0"
  replaced = len(set(before) - set(after))
  assert replaced >= MIN_REPLACED, f"{where} replaces {replaced} of the top 12 images"
  auc_before, auc_after = chart_before["legend"][FAVOURED], chart_after["legend"][FAVOURED]
  assert auc_after < auc_before, f"{where} leaves the AUC of {FAVOURED!r} at {auc_after:.4f}"


@pytest.mark.slow
def test_explorer_on_an_image_folder(tmp_path):
  from PIL import Image

  for i, colour in enumerate([(200, 30, 30), (30, 200, 30), (30, 30, 200)]):
    (tmp_path / "sub").mkdir(exist_ok=True)
    Image.new("RGB", (80, 50), colour).save(tmp_path / ("sub" if i else ".") / f"im{i}.png")
  folder = build_explorer("tiny-synthetic", images=str(tmp_path), cache_dir=None)
  assert folder.keys == ["im0.png", "sub/im1.png", "sub/im2.png"]
  result = folder.rank([("a red circle", 1.0)], 3)
  assert result["bars"] is None and len(result["results"]) == 3
  assert result["curves"] is None and "needs attribute labels" in result["curves_note"]
  page = create_app(folder).test_client().get("/").get_data(as_text=True)
  assert f"index: 3 images from {tmp_path} (an image folder, without labels)" in page
  assert "The category chart needs the images' attributes, and this index has no labels" in page
  png = folder.thumbnail(2)
  assert png[:4] == b"\x89PNG"
  with pytest.raises(ValueError, match="not a folder of images"):
    build_explorer("tiny-synthetic", images=str(tmp_path / "none"), cache_dir=None)
  (tmp_path / "empty").mkdir()
  with pytest.raises(ValueError, match="no images"):
    build_explorer("tiny-synthetic", images=str(tmp_path / "empty"), cache_dir=None)
