"""The explorer: Python API, JSON API, and the page end to end in headless Chromium."""

import os
import socket
import threading

import numpy as np
import pytest

from stori_jax import explore
from stori_jax.retrieval import metrics

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def explorer():
  return explore.build_explorer("tiny-synthetic", cache_dir=None, images_per_category=16)


@pytest.fixture(scope="module")
def client(explorer):
  return explore.create_app(explorer).test_client()


def _words(explorer, prompt):
  return [(w["text"], w["weight"]) for w in explorer.parse(prompt)]


def test_parse_splits_words_and_keeps_weights():
  words = explore.Explorer.parse("a photo of a (red star:1.5) please")
  assert "".join(w["text"] for w in words) == "a photo of a red star please"
  assert [w["weight"] for w in words] == [1, 1, 1, 1, 1.5, 1.5, 1]
  with pytest.raises(ValueError, match="unbalanced parentheses"):
    explore.Explorer.parse("(red:abc")
  with pytest.raises(ValueError, match="not a number"):
    explore.Explorer.parse("(red:abc)")
  with pytest.raises(ValueError, match="empty"):
    explore.Explorer.parse("   ")


def test_top_k_is_the_head_of_the_full_ranking(explorer):
  rng = np.random.default_rng(0)
  text = rng.normal(size=explorer.embeddings.shape[1]).astype(np.float32)
  indices, scores = explorer.top_k(text / np.linalg.norm(text), 10)
  np.testing.assert_array_equal(indices, metrics.ranking(explorer.embeddings @ text)[:10])
  assert np.all(np.diff(scores) <= 0)
  # ties are broken by index, as metrics.ranking does
  tied = explore.Explorer(explorer.bundle, np.ones((6, 4), np.float32) / 2, list("abcdef"))
  np.testing.assert_array_equal(tied.top_k(np.ones(4, np.float32) / 2, 3)[0], [0, 1, 2])


def test_rank_follows_the_weights(explorer):
  words = _words(explorer, explorer.default_prompt)
  plain = explorer.rank(words, 16)
  assert len(plain["results"]) == 16
  assert sum(b["share"] for b in plain["bars"]) == pytest.approx(1.0)
  # the prompt's own category leads the plain ranking
  assert plain["bars"][7]["share"] == max(b["share"] for b in plain["bars"])
  # the scores are the cosine similarities to the SToRI text embedding
  text = np.asarray(explorer.bundle.encode_prompts([explorer.default_prompt]))[0]
  cos = explorer.embeddings @ (text / np.linalg.norm(text))
  top = [r["index"] for r in plain["results"]]
  np.testing.assert_allclose([r["score"] for r in plain["results"]], cos[top], atol=1e-5)
  # removing the shape word changes the ranking
  words[-1] = (words[-1][0], 0.0)
  assert [r["index"] for r in explorer.rank(words, 16)["results"]] != top


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
  page = client.get("/").get_data(as_text=True)
  assert explorer.default_prompt in page and 'id="sliders"' in page


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.fixture()
def server(explorer):
  from werkzeug.serving import make_server

  httpd = make_server("127.0.0.1", _free_port(), explore.create_app(explorer), threaded=True)
  thread = threading.Thread(target=httpd.serve_forever, daemon=True)
  thread.start()
  yield f"http://127.0.0.1:{httpd.server_port}"
  httpd.shutdown()
  thread.join(5)


def test_page_in_headless_chromium(explorer, server):
  if not os.path.exists(CHROMIUM):
    message = f"{CHROMIUM} is absent; install it with `apt-get install -y chromium chromium-driver`"
    if os.environ.get("CI", "").lower() in ("true", "1"):
      pytest.fail(message + " (.ci/run does)")
    pytest.skip(message)
  from playwright.sync_api import sync_playwright

  prompt = "a photo of a red checkered heart"
  words = _words(explorer, prompt)
  expected_before = [r["index"] for r in explorer.rank(words, 12)["results"]]
  moved = list(words)
  moved[-1] = (moved[-1][0], 0.0)  # the slider of "heart" to 0
  expected_after = [r["index"] for r in explorer.rank(moved, 12)["results"]]
  assert expected_after != expected_before  # the move must matter for the test to mean much

  def shown(page):
    return [
      int(i) for i in page.eval_on_selector_all("#results img", "e => e.map(x => x.dataset.index)")
    ]

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
      page = browser.new_page()
      page.goto(server)
      page.fill("#prompt", prompt)
      page.click("#search")
      page.wait_for_function(
        "n => document.querySelectorAll('#sliders input[type=range]').length === n",
        arg=len(words),
      )
      page.wait_for_function(
        "want => [...document.querySelectorAll('#results img')].map(x => +x.dataset.index)"
        ".join() === want",
        arg=",".join(map(str, expected_before)),
      )
      assert shown(page) == expected_before
      labels = page.eval_on_selector_all("#sliders label", "e => e.map(x => x.textContent)")
      assert labels == [w.strip() for w, _ in words]
      page.locator("#sliders input[type=range]").nth(len(words) - 1).fill("0")
      page.wait_for_function(
        "want => [...document.querySelectorAll('#results img')].map(x => +x.dataset.index)"
        ".join() === want",
        arg=",".join(map(str, expected_after)),
      )
      assert shown(page) == expected_after
      assert page.locator("#bars .bar").count() == 8
      assert page.evaluate("document.querySelector('#results img').naturalWidth") > 0
      # a bad prompt: the page shows the parse error and the server keeps answering
      page.fill("#prompt", "(red:abc")
      page.click("#search")
      page.wait_for_function("document.querySelector('#error').textContent.length > 0")
      error = page.text_content("#error")
      assert "unbalanced parentheses" in error and "(red:abc\n    ^" in error
      page.fill("#prompt", prompt)
      page.click("#search")
      page.wait_for_function("document.querySelector('#error').textContent === ''")
      page.wait_for_function(
        "want => [...document.querySelectorAll('#results img')].map(x => +x.dataset.index)"
        ".join() === want",
        arg=",".join(map(str, expected_before)),
      )
    finally:
      browser.close()


def test_explorer_on_an_image_folder(tmp_path):
  from PIL import Image

  for i, colour in enumerate([(200, 30, 30), (30, 200, 30), (30, 30, 200)]):
    (tmp_path / "sub").mkdir(exist_ok=True)
    Image.new("RGB", (80, 50), colour).save(tmp_path / ("sub" if i else ".") / f"im{i}.png")
  folder = explore.build_explorer("tiny-synthetic", images=str(tmp_path), cache_dir=None)
  assert folder.keys == ["im0.png", "sub/im1.png", "sub/im2.png"]
  result = folder.rank([("a red circle", 1.0)], 3)
  assert result["bars"] is None and len(result["results"]) == 3
  png = folder.thumbnail(2)
  assert png[:4] == b"\x89PNG"
  with pytest.raises(ValueError, match="not a folder of images"):
    explore.build_explorer("tiny-synthetic", images=str(tmp_path / "none"), cache_dir=None)
  (tmp_path / "empty").mkdir()
  with pytest.raises(ValueError, match="no images"):
    explore.build_explorer("tiny-synthetic", images=str(tmp_path / "empty"), cache_dir=None)
