"""report.html of `mutual.analyze` (mutual/report_html.py): a small analysis of the embedded
world in this process, its page parsed (one row per image, the values of the JSON files, every
link resolving, data strings escaped) and opened from disk in headless Chromium (no console
error or failed request, the figures decoded, sorting by a column header).

The screenshot in docs/mutual.md (docs/images/mutual_report.png) is this page for its command
(`configs/mutual_synthetic.py`): `report.html#img-1` in a 1600 x 1400 px viewport of the
`_page` helper, scrolled back to the top.
"""

import html.parser
import json
import os
import urllib.parse

import pytest

import stori_jax
from mutual.analysis import runner as analysis
from mutual import report, report_html
from stori_jax.plumbing.config_files import load_config

# The explorer's headless Chromium (skipped when absent, a failure with CI=true): one helper.
from test_explore import _need_chromium, _page

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = ("pca", "kmeans")


class _Page(html.parser.HTMLParser):
  """What the tests read off the page: the tables' rows (their cells' data-value), img srcs,
  hrefs, element ids and the script elements."""

  def __init__(self, text: str):
    super().__init__(convert_charrefs=True)
    self.tables: dict[str, list[dict]] = {}
    self.images, self.links, self.ids, self.scripts = [], [], [], 0
    self._table = self._row = None
    self.feed(text)

  def handle_starttag(self, tag, attrs):
    a = dict(attrs)
    if "id" in a:
      self.ids.append(a["id"])
    if tag == "table":
      self._table = self.tables.setdefault(a.get("id", ""), [])
    elif tag == "tr" and self._table is not None:
      self._row = dict(attrs=a, values=[])
    elif tag in ("td", "th") and self._row is not None and "data-value" in a:
      self._row["values"].append(a["data-value"])
    elif tag == "img":
      self.images.append(a["src"])
    elif tag == "a":
      self.links.append(a["href"])
    elif tag == "script":
      self.scripts += 1

  def handle_endtag(self, tag):
    if tag == "tr" and self._row is not None:
      if self._row["values"]:  # a header row has none
        self._table.append(self._row)
      self._row = None
    elif tag == "table":
      self._table = None


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tiny_synthetic):
  """The smoke config on two classes of 3 images: figures for the first class's first 2 only
  (the other images' sections have no figure)."""
  config = load_config(os.path.join(ROOT, "configs/mutual_synthetic.py"), "smoke")
  config.data.classes = (2, 7)
  config.data.images_per_class = 3
  config.figure_classes = 1
  config.figures_per_class = 2
  out = tmp_path_factory.mktemp("mutual_report")
  with pytest.MonkeyPatch.context() as patch:  # the session's model, not a second load
    patch.setattr(stori_jax, "load", lambda source: tiny_synthetic)
    analysis.run(config, str(out), progress=False)
  return out


def _records(workdir):
  paths = sorted(workdir.glob("per_image/*/*.json"))
  return [json.loads(p.read_text()) for p in paths], paths


@pytest.mark.slow
def test_rows_and_summaries_are_the_json_files(workdir):
  text = (workdir / "report.html").read_text(encoding="utf-8")
  page = _Page(text)
  results = json.loads((workdir / "results.json").read_text())
  records, _ = _records(workdir)
  rows = page.tables["images"]
  assert len(rows) == len(records) == results["dataset"]["images"] == 6
  for n, (row, record) in enumerate(zip(rows, records)):
    index, image, name, predicted, correct, *numbers = row["values"]
    assert (int(index), image, name) == (n, record["id"], record["class_name"])
    assert (predicted, int(correct)) == (record["predicted_name"], record["correct"])
    want = [record["methods"][m][k] for m in METHODS for k in ("mi", "auc")]
    assert [float(v) for v in numbers] == want
  classes = page.tables["classes"]
  assert sorted(r["values"][0] for r in classes) == sorted(results["classes"])
  for row in classes:
    s = results["classes"][row["values"][0]]
    want = [s["images"], s["top1"]] + [s[m][k] for m in METHODS for k in ("mi", "auc")]
    assert [float(v) for v in row["values"][1:]] == want
  for row in page.tables["dataset-summary"]:
    s = results["dataset"][row["attrs"]["data-method"]]
    keys = ("mi", "auc", "mean_image_auc", "visual_descriptors", "mutual_descriptors")
    assert [float(v) for v in row["values"][:5]] == [s[k] for k in keys]
  # every image has its section, with each concept's descriptors and the three columns
  assert [f"img-{n}" for n in range(6)] == [i for i in page.ids if i.startswith("img-")]
  for descriptor in records[0]["methods"]["kmeans"]["concepts"][0]["descriptors"]:
    assert descriptor in text
  assert text.count('class="col mutual"') == 6 * len(METHODS)
  assert "http:" not in text and "https:" not in text  # nothing from the network


def test_every_link_resolves_and_the_figures_are_the_analysis(workdir):
  page = _Page((workdir / "report.html").read_text(encoding="utf-8"))
  _, paths = _records(workdir)
  for src in page.images + [h for h in page.links if not h.startswith("#")]:
    assert not urllib.parse.urlsplit(src).scheme, src  # relative: the page opens from disk
    assert (workdir / urllib.parse.unquote(src)).is_file(), src
  for href in (h for h in page.links if h.startswith("#")):
    assert href[1:] in page.ids, href
  # class 2's first 2 images are the panels of its concept figures; nothing else has one
  assert sorted(page.images) == sorted(
    [f"figures/concepts_{m}_0002.png" for m in METHODS for _ in range(2)]
  )
  json_links = [h for h in page.links if h.endswith(".json")]
  assert json_links == [os.path.relpath(p, workdir) for p in paths]


def _record(class_name, label, descriptor, image_id):
  m = dict(
    concept_map=[[-1, 0], [1, -1]],
    concepts=[
      dict(concept=0, patches=1, bbox_patches=[0, 1, 0, 1], descriptors=[descriptor]),
      dict(concept=1, patches=1, bbox_patches=[1, 0, 1, 0], descriptors=["plain"]),
    ],
    visual_descriptors=[descriptor, "plain"],
    visual_scores=[0.5, 0.4],
    language_descriptors=[descriptor, "other"],
    mutual_descriptors=[descriptor],
    candidates=3,
    mi=1.5,
    curve=[1.5, 0.5, 0.0],
    auc=2 / 3,
    entropy=0.7,
    entropy_without_ot=0.6,
  )
  return dict(
    id=image_id,
    label=label,
    class_name=class_name,
    predicted=label,
    predicted_name=class_name,
    correct=True,
    foreground_patches=2,
    methods=dict(pca=m, kmeans=m),
  )


def test_data_strings_are_escaped():
  """Class names, descriptors, image ids and skipped classes are user data: none can add an
  element or an attribute to the page."""
  evil = "<script>alert(1)</script>"
  attribute = '"><img src=x onerror=alert(2)>'
  records = [
    _record(evil, 0, attribute, "a&b/0"),
    _record("fine", 1, "plain", 'q"uote/0'),
  ]
  results = report.aggregate(records, METHODS)
  results.update(model=evil, skipped_classes={evil: attribute}, config=dict(name=attribute))
  text = report_html.render(results, records, METHODS, record_paths=["a b#/0.json", "x.json"])
  for raw in (evil, attribute, "a&b/0", 'q"uote'):
    assert raw not in text
  assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text and "a&amp;b/0" in text
  page = _Page(text)
  assert page.scripts == 1 and page.images == []  # the page's own script; no injected img
  assert page.tables["images"][0]["values"][2] == evil  # the text itself survives, as text
  assert "a%20b%23/0.json" in page.links  # paths are URL-quoted
  # past max_details a row links to its JSON, and has no section
  text = report_html.render(
    results, records, METHODS, record_paths=["a.json", "b.json"], max_details=1
  )
  page = _Page(text)
  assert "img-0" in page.ids and "img-1" not in page.ids
  assert "#img-0" in page.links and "b.json" in page.links


def test_page_in_headless_chromium(workdir):
  _need_chromium()
  records, _ = _records(workdir)
  url = (workdir / "report.html").as_uri()
  problems = []
  with _page() as page:
    page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else 0)
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.on("requestfailed", lambda request: problems.append(f"failed: {request.url}"))
    page.goto(url)
    page.wait_for_load_state("load")
    widths = page.eval_on_selector_all("img", "e => e.map(x => x.complete && x.naturalWidth)")
    assert len(widths) == 4 and all(w > 0 for w in widths), widths

    def order():
      return [
        int(i)
        for i in page.eval_on_selector_all("#images tbody tr", "e => e.map(x => x.dataset.index)")
      ]

    assert order() == list(range(6))
    mi = [r["methods"]["pca"]["mi"] for r in records]
    header = page.locator("#images th", has_text="MI PCA")
    header.locator("button").click()
    assert order() == sorted(range(6), key=lambda n: mi[n])
    assert header.get_attribute("aria-sort") == "ascending"
    header.locator("button").click()
    assert order() == sorted(range(6), key=lambda n: mi[n], reverse=True)
    page.locator("#images th", has_text="Class").locator("button").click()
    names = [records[n]["class_name"] for n in order()]
    assert names == sorted(names)
    # a row's click shows that image's section (and only it)
    page.locator("#images tbody tr[data-index='4'] td").nth(2).click()
    assert page.evaluate("location.hash") == "#img-4"
    assert page.is_visible("#img-4") and not page.is_visible("#img-0")
    assert records[4]["id"] in page.text_content("#img-4 h2")
    # the filter keeps one class
    page.fill("#filter", records[4]["class_name"])
    shown = page.eval_on_selector_all("#images tbody tr:not([hidden])", "e => e.length")
    assert shown == 3 and page.text_content("#shown") == "3 of 6 images"
  assert problems == []


# Issue 36 row 10: a name holding U+202E (RIGHT-TO-LEFT OVERRIDE) is isolated, not only escaped.

RLO = "\u202e"


class _Isolation(html.parser.HTMLParser):
  """Each text run holding U+202E, and whether it sits inside a <bdi> (or between U+2068 and
  U+2069 in an attribute or the title, where no element may go)."""

  def __init__(self, text: str):
    super().__init__(convert_charrefs=True)
    self.stack, self.runs, self.attributes = [], [], []
    self.feed(text)

  def handle_starttag(self, tag, attrs):
    self.stack.append(tag)
    for name, value in attrs:
      if name in ("title", "alt") and value and RLO in value:  # shown: a tooltip, alt text
        self.attributes.append(value)

  def handle_endtag(self, tag):
    while self.stack and self.stack.pop() != tag:
      pass

  def handle_data(self, data):
    if RLO in data:
      self.runs.append((data, "bdi" in self.stack or "title" in self.stack and "\u2068" in data))


def _isolated(runs):
  return all(inside for _, inside in runs)


@pytest.mark.slow
def test_names_with_a_bidi_override_are_isolated(
  tmp_path, run_command, tiny_synthetic, monkeypatch
):
  """mutual.analyze on an image folder whose class folder and image files hold U+202E: every
  place report.html shows such a name wraps it in <bdi> (the title and tooltips in isolate
  marks), so it cannot reorder the cells and words around it."""
  from PIL import Image

  evil_class = f"evil{RLO}class"
  per_class = {evil_class: ["stripes", f"fur{RLO}tail"], "plain class": ["round", "red"]}
  (tmp_path / "descriptors.json").write_text(json.dumps(per_class), encoding="utf-8")
  images = _world_images()
  for c, name in enumerate((evil_class, "plain_class")):
    os.makedirs(tmp_path / "images" / name)
    for i in range(2):
      Image.fromarray(images[2 * c + i]).save(tmp_path / "images" / name / f"x{RLO}{i}.png")
  monkeypatch.setattr(stori_jax, "load", lambda *_, **__: tiny_synthetic)
  workdir = tmp_path / "run"
  done = run_command(
    "mutual.analyze",
    "--config=configs/mutual_food101.py",
    f"--workdir={workdir}",
    "--config.model.source=tiny-synthetic",
    f"--config.data.root={tmp_path / 'images'}",
    f"--config.data.descriptors={tmp_path / 'descriptors.json'}",
    "--config.analysis.top_k=4",
    "--config.analysis.u=2",
    "--config.figures_per_class=1",
    "--config.figure_classes=1",
  )
  assert done.returncode == 0, done.stderr[-3000:]
  text = (workdir / "report.html").read_text(encoding="utf-8")
  assert f"<bdi>{evil_class}</bdi>" in text
  assert f"<bdi>{evil_class}/x{RLO}0.png</bdi>" in text
  page = _Isolation(text)
  assert page.runs and _isolated(page.runs), [r for r in page.runs if not r[1]][:5]
  assert page.attributes and all(
    v.count("\u2068") == v.count("\u2069") >= 1 for v in page.attributes
  ), page.attributes


def _world_images():
  """Four drawings of the embedded world (as tests/test_mutual_pipeline.py's image folder)."""
  from mutual import data

  return next(data.synthetic_classes(4, seed=5, classes=(0,))).images


def test_a_bidi_override_is_isolated_in_rendered_names_and_descriptors():
  records = [
    _record(f"a{RLO}b", 0, f"d{RLO}e", f"f{RLO}g/0"),
    _record("fine", 1, "plain", "ok/0"),
  ]
  results = report.aggregate(records, METHODS)
  results.update(model=f"m{RLO}n", skipped_classes={f"s{RLO}t": "no images"})
  results["config"] = dict(name=f"r{RLO}s", figures_per_class=0)
  text = report_html.render(results, records, METHODS, record_paths=["a.json", "b.json"])
  page = _Isolation(text)
  shown = {run for run, _ in page.runs}
  for name in (f"a{RLO}b", f"d{RLO}e", f"f{RLO}g/0", f"m{RLO}n", f"s{RLO}t", f"r{RLO}s"):
    assert name in shown or any(name in run for run in shown), name
    assert f"<bdi>{name}</bdi>" in text
  assert _isolated(page.runs), [r for r in page.runs if not r[1]]
  assert f"<title>Mutual knowledge: \u2068r{RLO}s\u2069 (\u2068m{RLO}n\u2069)</title>" in text
  assert f'title="\u2068f{RLO}g/0\u2069"' in text


def test_fewshot_interpretability_page_isolates_class_names_and_words(tmp_path):
  """fewshot's interpretability.html prints class names and prompt words: each in <bdi>."""
  import types

  from stori_jax.fewshot import report as fewshot_report

  bank = types.SimpleNamespace(class_names=[f"red{RLO}circle", "blue square"], text_class=[0, 1])
  words = [[(f"a{RLO}b", 1.0), ("photo", 2.0)], [("a", 1.0), ("blue", 0.5), ("photo", 1.0)]]
  fewshot_report.write_interpretability(str(tmp_path), bank, words, per_class=1, max_classes=2)
  page = (tmp_path / "interpretability.html").read_text(encoding="utf-8")
  assert f"<h2><bdi>red{RLO}circle</bdi></h2>" in page
  assert f">a{RLO}b</bdi></span>" in page and "<bdi>blue</bdi>" in page
  assert _isolated(_Isolation(page).runs)
