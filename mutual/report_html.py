"""The analysis as one self-contained HTML page: `report.html` in `mutual.analyze`'s workdir.

`render(results, records, methods, ...)` turns what the run already holds (results.json's
aggregates, the per-image records of `mutual.report.image_records`) into the page's text; it
reads and writes no file (the analysis run writes it). The page shows, from the top:

- the dataset summary (Top-1, and per concept method MI, AUC, descriptor counts, OT entropy)
  with the dataset's MI curve, then one row per class;
- a sortable, filterable table of the images: class, prediction, MI and AUC per method;
- per image (click a row: the URL's #img-N shows its section, CSS `:target`, so it works with
  scripts off too): per method the class's concept figure when this image is in it, the patch
  concept map, each concept's descriptors, the vision-only / mutual / language-only columns,
  and the image's MI curves.

Figures are referenced by relative path, not embedded: they already sit beside the page in the
workdir (30-50 KB each; base64 would add a third and copy every class figure into the page), so
the page opens from disk as long as it stays in its workdir. What only the records hold (the
concept maps and the MI curves) is drawn as inline SVG: a few hundred bytes per image, and
present for every image, not only those of the figure classes. Nothing is loaded from the
network (a Content-Security-Policy forbids it) and every string from the data is escaped and
isolated (`text`: a `<bdi>` element, or Unicode's isolate marks where no element may go), so
that a right-to-left name or a bidi control character in one (U+202E, RIGHT-TO-LEFT OVERRIDE)
cannot reorder the text, cells or links around it.
"""

from __future__ import annotations

import html
import urllib.parse
from typing import Any, Collection, Mapping, Sequence

from mutual import concept_methods
from mutual.report import COLOURS

#: Images with a detail section; past it, a row links to its per-image JSON (a page of 50,000
#: sections would be hundreds of MB).
MAX_DETAILS = 1000
#: Line colours of the MI curves per method (matplotlib's first two, as figures/curves*.png).
CURVE_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728")


def e(value: Any) -> str:
  """Escapes text or an attribute value (quotes included): data strings are user data."""
  return html.escape(str(value), quote=True)


def text(value: Any) -> str:
  """A string from the data (a class, image or descriptor name) as element content: escaped
  and isolated in `<bdi>`, so that its own direction, or a bidi control character in it
  (U+202E), stays inside it."""
  return f"<bdi>{e(value)}</bdi>"


def plain(value: Any) -> str:
  """A string from the data where no element may go (an attribute shown to the user, the
  page's <title>): escaped and isolated between FIRST STRONG ISOLATE and POP DIRECTIONAL
  ISOLATE (U+2068 ... U+2069), the marks <bdi> stands for."""
  return f"\u2068{e(value)}\u2069"


def _url(path: str) -> str:
  """A relative path as an escaped URL (a folder name may hold spaces or '#')."""
  return e(urllib.parse.quote(path.replace("\\", "/"), safe="/"))


def _num(value: float, digits: int = 3) -> str:
  return f"{float(value):.{digits}f}"


def _hex(rgb) -> str:
  return "#" + "".join(f"{round(255 * float(c)):02x}" for c in rgb)


def concept_colour(concept: int) -> str:
  """The colour of a concept id: the one `mutual.report.plot_concepts` paints it."""
  return _hex(COLOURS[int(concept) % len(COLOURS)])


def concept_figures(label: int, methods: Sequence[str]) -> dict[str, str]:
  """{method: the class's concept figure}, relative to the workdir, as mutual.analysis.runner names
  them (its first `figures_per_class` images side by side)."""
  return {method: f"figures/concepts_{method}_{label:04d}.png" for method in methods}


# ---------------------------------------------------------------------------------------------
# SVG drawings of what the records hold.


def concept_map_svg(concept_map: Sequence[Sequence[int]], size: int = 128) -> str:
  """The patch grid's concepts (-1: background), one run of equal ids per rect, on a dark
  ground (the concept colours are light, as the figures' outlines)."""
  rows = len(concept_map)
  cols = len(concept_map[0]) if rows else 0
  rects = []
  for r, row in enumerate(concept_map):
    c = 0
    while c < cols:
      value, start = int(row[c]), c
      while c < cols and int(row[c]) == value:
        c += 1
      if value >= 0:
        rects.append(
          f'<rect x="{start}" y="{r}" width="{c - start}" height="1" '
          f'fill="{concept_colour(value)}"/>'
        )
  return (
    f'<svg class="map" viewBox="0 0 {cols} {rows}" width="{size}" height="{size}" '
    f'role="img" aria-label="patch concept map" shape-rendering="crispEdges">'
    f'<rect width="{cols}" height="{rows}" fill="#222"/>{"".join(rects)}</svg>'
  )


def curves_svg(curves: Mapping[str, Sequence[float]], width: int = 340, height: int = 190) -> str:
  """MI curves (MI after removing the t most important visual descriptors), one per method."""
  left, right, top, bottom = 36, 10, 10, 34
  points = max((len(c) for c in curves.values()), default=1)
  top_value = max((max(c) for c in curves.values() if len(c)), default=1.0) or 1.0
  span_x, span_y = width - left - right, height - top - bottom

  def x(i):
    return left + span_x * i / max(points - 1, 1)

  def y(v):
    return top + span_y * (1 - float(v) / top_value)

  parts = [
    f'<line x1="{left}" y1="{top + span_y}" x2="{left + span_x}" y2="{top + span_y}" '
    'stroke="#555"/>',
    f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + span_y}" stroke="#555"/>',
    f'<text x="{left - 4}" y="{top + 4}" text-anchor="end">{_num(top_value, 1)}</text>',
    f'<text x="{left - 4}" y="{top + span_y}" text-anchor="end">0</text>',
    f'<text x="{left}" y="{height - 18}">0</text>',
    f'<text x="{left + span_x}" y="{height - 18}" text-anchor="end">{points - 1}</text>',
    f'<text x="{left + span_x / 2:.1f}" y="{height - 4}" text-anchor="middle">'
    "visual descriptors removed</text>",
    f'<text x="10" y="{top + span_y / 2:.1f}" transform="rotate(-90 10 {top + span_y / 2:.1f})" '
    'text-anchor="middle">MI</text>',
  ]
  for k, (method, curve) in enumerate(curves.items()):
    colour = CURVE_COLOURS[k % len(CURVE_COLOURS)]
    line = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(curve))
    parts.append(
      f'<polyline data-method="{e(method)}" points="{line}" fill="none" stroke="{colour}" '
      'stroke-width="1.5"/>'
    )
    parts.append(
      f'<text x="{left + span_x}" y="{top + 12 + 12 * k}" text-anchor="end" '
      f'style="fill: {colour}">'
      f"{e(concept_methods.title(method))}</text>"
    )
  return (
    f'<svg class="curve" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
    f'role="img" aria-label="MI curves">{"".join(parts)}</svg>'
  )


# ---------------------------------------------------------------------------------------------
# Tables.


def _cell(value: float, digits: int = 3) -> str:
  """A number cell: shown rounded, sorted (and tested) on the exact value of the JSON."""
  return f'<td class="num" data-value="{e(repr(float(value)))}">{_num(value, digits)}</td>'


def _head(label: str, kind: str = "number") -> str:
  """A sortable column's header (the script sorts on its cells' data-value)."""
  return f'<th data-type="{kind}"><button type="button">{e(label)}</button></th>'


def _dataset_summary(summary: Mapping[str, Any], methods: Sequence[str]) -> str:
  head = [
    "Method",
    "MI",
    "AUC (mean curve)",
    "mean image AUC",
    "visual descriptors",
    "mutual descriptors",
    "OT entropy",
    "entropy without OT",
  ]
  rows = []
  for method in methods:
    m = summary[method]
    cells = "".join(
      _cell(m[k])
      for k in (
        "mi",
        "auc",
        "mean_image_auc",
        "visual_descriptors",
        "mutual_descriptors",
        "entropy",
        "entropy_without_ot",
      )
    )
    rows.append(
      f'<tr data-method="{e(method)}"><th scope="row">{e(concept_methods.title(method))}</th>{cells}</tr>'
    )
  return (
    '<table id="dataset-summary"><thead><tr>'
    + "".join(f"<th>{e(h)}</th>" for h in head)
    + f"</tr></thead><tbody>{''.join(rows)}</tbody></table>"
  )


def _class_table(classes: Mapping[str, Any], methods: Sequence[str]) -> str:
  head = [_head("Class", "text"), _head("Images"), _head("Top-1 (%)")]
  for method in methods:
    head += [
      _head(f"MI {concept_methods.title(method)}"),
      _head(f"AUC {concept_methods.title(method)}"),
    ]
  rows = []
  for name, s in classes.items():
    cells = [
      f'<td data-value="{e(name)}">{text(name)}</td>',
      f'<td class="num" data-value="{int(s["images"])}">{int(s["images"])}</td>',
      _cell(s["top1"], 2),
    ]
    for method in methods:
      cells += [_cell(s[method]["mi"]), _cell(s[method]["auc"])]
    rows.append(f"<tr>{''.join(cells)}</tr>")
  return (
    f'<table id="classes" class="sortable"><thead><tr>{"".join(head)}</tr></thead>'
    f"<tbody>{''.join(rows)}</tbody></table>"
  )


def _image_table(records, methods, targets) -> str:
  head = [
    _head("#"),
    _head("Image", "text"),
    _head("Class", "text"),
    _head("Prediction", "text"),
    _head("Correct"),
  ]
  for method in methods:
    head += [
      _head(f"MI {concept_methods.title(method)}"),
      _head(f"AUC {concept_methods.title(method)}"),
    ]
  rows = []
  for n, (record, target) in enumerate(zip(records, targets)):
    search = " ".join([str(record["id"]), record["class_name"], record["predicted_name"]]).lower()
    correct = int(bool(record["correct"]))
    link = f'<a href="{target}">{text(record["id"])}</a>' if target else text(record["id"])
    cells = [
      f'<td class="num" data-value="{n}">{n}</td>',
      f'<td class="id" data-value="{e(record["id"])}" title="{plain(record["id"])}">{link}</td>',
      f'<td class="name" data-value="{e(record["class_name"])}">{text(record["class_name"])}</td>',
      f'<td class="name" data-value="{e(record["predicted_name"])}">'
      f"{text(record['predicted_name'])}</td>",
      f'<td data-value="{correct}" class="{"ok" if correct else "wrong"}">'
      f"{'yes' if correct else 'no'}</td>",
    ]
    for method in methods:
      m = record["methods"][method]
      cells += [_cell(m["mi"]), _cell(m["auc"])]
    rows.append(
      f'<tr data-index="{n}" data-correct="{correct}" data-search="{e(search)}">'
      f"{''.join(cells)}</tr>"
    )
  return (
    f'<table id="images" class="sortable"><thead><tr>{"".join(head)}</tr></thead>'
    f"<tbody>{''.join(rows)}</tbody></table>"
  )


# ---------------------------------------------------------------------------------------------
# One image's section.


def _items(items: Sequence[str], scores: Sequence[float] | None = None) -> str:
  if not items:
    return '<p class="none">none</p>'
  out = []
  for k, item in enumerate(items):
    score = f' <span class="score">{_num(scores[k])}</span>' if scores is not None else ""
    out.append(f"<li>{text(item)}{score}</li>")
  return f"<ol>{''.join(out)}</ol>"


def _columns(m: Mapping[str, Any]) -> str:
  """Fig. 6's three columns: vision only (in importance order, with relevance), mutual,
  language only."""
  mutual = set(m["mutual_descriptors"])
  scores = dict(zip(m["visual_descriptors"], m.get("visual_scores", ())))
  vision = [d for d in m["visual_descriptors"] if d not in mutual]
  language = [d for d in m["language_descriptors"] if d not in mutual]
  vision_scores = (
    [scores[d] for d in vision] if len(scores) == len(m["visual_descriptors"]) else None
  )
  columns = [
    ("vision", "vision only", vision, vision_scores),
    ("mutual", "mutual", list(m["mutual_descriptors"]), None),
    ("language", "language only", language, None),
  ]
  return (
    '<div class="columns">'
    + "".join(
      f'<div class="col {kind}"><h4>{title} ({len(items)})</h4>{_items(items, s)}</div>'
      for kind, title, items, s in columns
    )
    + "</div>"
  )


def _concepts(m: Mapping[str, Any]) -> str:
  """Each concept's colour, size and descriptors; a concept of the patch map that the CRF left
  no pixel of has no region to prompt, hence no descriptor (said, since the map shows it)."""
  rows = []
  for c in m["concepts"]:
    swatch = f'<span class="swatch" style="background:{concept_colour(c["concept"])}"></span>'
    rows.append(
      f'<li data-concept="{int(c["concept"])}">{swatch}<b>concept {int(c["concept"])}</b> '
      f"({int(c['patches'])} patches): "
      f"{', '.join(text(d) for d in c['descriptors']) or 'no descriptor'}</li>"
    )
  listed = {int(c["concept"]) for c in m["concepts"]}
  for c in sorted({int(v) for row in m["concept_map"] for v in row} - listed - {-1}):
    swatch = f'<span class="swatch" style="background:{concept_colour(c)}"></span>'
    rows.append(
      f'<li class="dropped" data-concept="{c}">{swatch}concept {c}: no pixel left after the '
      "CRF, not prompted</li>"
    )
  return f'<ul class="concepts">{"".join(rows)}</ul>' if rows else '<p class="none">no concept</p>'


def _figure(path: str, caption: str, alt: str) -> str:
  return (
    f'<figure><img src="{_url(path)}" alt="{e(alt)}" loading="eager">'
    f"<figcaption>{caption}</figcaption></figure>"
  )


def _detail(n, record, position, methods, figures, panels, record_path) -> str:
  names = concept_figures(int(record["label"]), methods)
  verdict = "correct" if record["correct"] else "wrong"
  json_link = f' · <a href="{_url(record_path)}">per-image JSON</a>' if record_path else ""
  parts = [
    f'<section class="detail" id="img-{n}" data-index="{n}">',
    f"<h2>{text(record['id'])}</h2>",
    f'<p>class <b>{text(record["class_name"])}</b> · predicted <b class="{verdict}">'
    f"{text(record['predicted_name'])}</b> ({verdict}) · "
    f"{int(record['foreground_patches'])} foreground patches{json_link}</p>",
    '<div class="methods">',
  ]
  for method in methods:
    m = record["methods"][method]
    title = concept_methods.title(method)
    parts.append(
      f'<div class="method" data-method="{e(method)}"><h3>{e(title)} '
      f'<span class="stats">MI {_num(m["mi"])} · AUC {_num(m["auc"])} · '
      f"OT entropy {_num(m['entropy'])}</span></h3>"
    )
    concepts = names[method]
    if position < panels and concepts in figures:
      parts.append(
        _figure(
          concepts,
          f"{e(concepts)}: panel {position + 1} of the class's first {panels} images "
          "(concepts on the CRF-refined pixels)",
          f"{title} concepts of \u2068{record['id']}\u2069",  # isolated, as `plain`
        )
      )
    parts.append(
      '<div class="map-row">'
      + concept_map_svg(m["concept_map"])
      + '<div><p class="note">patch concepts (before the CRF\'s pixel refinement)</p>'
      + _concepts(m)
      + "</div></div>"
    )
    # (figures/mutual_*.png draws these columns for a class's first image: not repeated here)
    parts.append(_columns(m))
    parts.append("</div>")
  curves = {method: record["methods"][method]["curve"] for method in methods}
  parts.append(f"</div><h3>MI curves</h3>{curves_svg(curves)}</section>")
  return "".join(parts)


# ---------------------------------------------------------------------------------------------
# The page.

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.2rem; color: #222; }
h1 { font-size: 1.4rem; margin: 0 0 .3rem; } h2 { font-size: 1.1rem; margin: .2rem 0; }
h3 { font-size: 1rem; margin: .6rem 0 .3rem; } h4 { font-size: .85rem; margin: 0 0 .2rem; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border-bottom: 1px solid #ddd; padding: 2px 6px; text-align: left; }
th { white-space: nowrap; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
th button { all: unset; cursor: pointer; font-weight: 600; }
th[aria-sort=ascending] button::after { content: " \\25B2"; }
th[aria-sort=descending] button::after { content: " \\25BC"; }
.summary { display: flex; gap: 2rem; flex-wrap: wrap; align-items: flex-start; }
.layout { display: grid; grid-template-columns: auto minmax(0, 1fr); gap: 1.2rem; }
@media (max-width: 1100px) { .layout { grid-template-columns: 1fr; } }
.list { max-height: 88vh; overflow: auto; }
#images td { white-space: nowrap; }
#images td.id, #images td.name { max-width: 8.5rem; overflow: hidden; text-overflow: ellipsis; }
#images tbody tr { cursor: pointer; } #images tbody tr:hover { background: #f3f6fb; }
#images tbody tr.selected { background: #dde8f7; }
.details { position: sticky; top: 0; max-height: 100vh; overflow: auto; }
.detail { display: none; } .detail:target { display: block; }
.details:has(.detail:target) .hint { display: none; }
.ok { color: #1a7f37; } .wrong { color: #c62828; } .correct { color: #1a7f37; }
.methods { display: grid; grid-template-columns: repeat(auto-fit, minmax(280px, 1fr)); gap: 1rem; }
.method { border: 1px solid #ddd; border-radius: 6px; padding: .4rem .6rem; }
.stats { font-weight: normal; color: #555; font-size: .85rem; }
.map-row { display: flex; gap: .8rem; align-items: flex-start; }
.map { border: 1px solid #ccc; flex: none; }
.concepts { list-style: none; padding: 0; margin: 0; } .concepts li { margin: .15rem 0; }
.swatch { display: inline-block; width: .8rem; height: .8rem; margin-right: .3rem;
  vertical-align: -1px; border: 1px solid #222; }
.columns { display: grid; grid-template-columns: repeat(3, 1fr); gap: .5rem; margin-top: .5rem; }
.col ol { margin: 0; padding-left: 1.2rem; font-size: 12px; }
.vision h4 { color: #1f77b4; } .mutual h4 { color: #7b3f9e; } .language h4 { color: #c62828; }
.score, .note, figcaption, .none, .dropped { color: #666; font-size: 11px; }
figure { margin: .4rem 0; } figure img { max-width: 100%; }
svg text { font-size: 10px; fill: #444; }
.controls { margin: .4rem 0; display: flex; gap: 1rem; align-items: center; }
"""

# Sorting (any table.sortable, on each cell's data-value; a second click reverses), the image
# filter, and a row click opening that image's section (the link in its Image cell).
_SCRIPT = """
"use strict";
for (const table of document.querySelectorAll("table.sortable")) {
  const heads = [...table.tHead.rows[0].cells];
  heads.forEach((th, col) => {
    const button = th.querySelector("button");
    if (!button) return;
    button.addEventListener("click", () => {
      const ascending = th.getAttribute("aria-sort") !== "ascending";
      heads.forEach(h => h.removeAttribute("aria-sort"));
      th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
      const numeric = th.dataset.type === "number";
      const key = row => {
        const v = row.cells[col].dataset.value;
        return numeric ? parseFloat(v) : v;
      };
      const body = table.tBodies[0];
      const rows = [...body.rows];
      rows.sort((a, b) => {
        const x = key(a), y = key(b);
        const c = numeric ? x - y : x.localeCompare(y);
        return ascending ? c : -c;
      });
      body.append(...rows);
    });
  });
}
const images = document.getElementById("images").tBodies[0];
const filter = document.getElementById("filter");
const wrongOnly = document.getElementById("wrong-only");
const shown = document.getElementById("shown");
function applyFilter() {
  const query = filter.value.trim().toLowerCase();
  let n = 0;
  for (const row of images.rows) {
    const keep = (!query || row.dataset.search.includes(query))
      && (!wrongOnly.checked || row.dataset.correct === "0");
    row.hidden = !keep;
    n += keep;
  }
  shown.textContent = `${n} of ${images.rows.length} images`;
}
filter.addEventListener("input", applyFilter);
wrongOnly.addEventListener("change", applyFilter);
images.addEventListener("click", event => {
  const row = event.target.closest("tr");
  const link = row && row.querySelector("a");
  if (link && !event.target.closest("a")) link.click();
});
function markSelected() {
  for (const row of images.querySelectorAll("tr.selected")) row.classList.remove("selected");
  const match = /^#img-(\\d+)$/.exec(location.hash);
  const row = match && images.querySelector(`tr[data-index="${match[1]}"]`);
  if (row) row.classList.add("selected");
}
window.addEventListener("hashchange", markSelected);
markSelected();
applyFilter();
"""

# No request leaves the page: scripts and styles inline, images from the workdir or data: URLs.
_CSP = (
  "default-src 'none'; img-src 'self' file: data:; style-src 'unsafe-inline'; "
  "script-src 'unsafe-inline'"
)


def render(
  results: Mapping[str, Any],
  records: Sequence[Mapping[str, Any]],
  methods: Sequence[str],
  *,
  record_paths: Sequence[str] | None = None,
  figures: Collection[str] = (),
  max_details: int = MAX_DETAILS,
) -> str:
  """The report page's HTML text.

  Args:
    results: results.json's content (`classes`, `dataset`, `model`; `config` and
      `skipped_classes` when present).
    records: the per-image records (`mutual.report.image_records`), in class order and, within
      a class, in image order (a figure's panels are a class's first images).
    methods: the concept methods, as the run's config.analysis.methods.
    record_paths: per record, its per-image JSON's path relative to the page (linked).
    figures: the figure files that exist, as paths relative to the page ("figures/...png"):
      only these are shown.
    max_details: images with a detail section (the first ones); the others' rows link to their
      per-image JSON.
  """
  config = results.get("config") or {}
  panels = int(config.get("figures_per_class", 0))
  name, model = config.get("name", "analysis"), results.get("model", "")
  figures = set(figures)
  record_paths = list(record_paths) if record_paths is not None else [""] * len(records)
  if len(record_paths) != len(records):
    raise ValueError(f"{len(record_paths)} record paths for {len(records)} records")
  positions, seen = [], {}
  for record in records:  # the image's index within its class
    positions.append(seen.get(record["label"], 0))
    seen[record["label"]] = positions[-1] + 1
  detailed = min(len(records), max(int(max_details), 0))
  targets = [
    f"#img-{n}" if n < detailed else (_url(p) if p else "") for n, p in enumerate(record_paths)
  ]
  dataset = results["dataset"]
  skipped = results.get("skipped_classes")
  skipped_html = ""
  if skipped:
    items = "".join(f"<li>{text(k)}: {e(v)}</li>" for k, v in dict(skipped).items())
    skipped_html = f"<h3>Skipped classes</h3><ul id='skipped'>{items}</ul>"
  more = (
    f" Sections for the first {detailed}; the other rows link to their per-image JSON."
    if detailed < len(records)
    else ""
  )
  details = "".join(
    _detail(n, records[n], positions[n], methods, figures, panels, record_paths[n])
    for n in range(detailed)
  )
  dataset_curves = {method: dataset[method]["curve"] for method in methods}
  return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{e(_CSP)}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>Mutual knowledge: {plain(name)} ({plain(model)})</title>
<style>{_STYLE}</style>
</head>
<body>
<h1>Mutual knowledge: {text(name)}</h1>
<p>Model <b>{text(model)}</b> · {int(dataset["images"])} images in {len(results["classes"])}
classes · Top-1 <b id="top1">{_num(dataset["top1"], 2)}%</b></p>
<div class="summary">
<div><h3>Dataset</h3>{_dataset_summary(dataset, methods)}</div>
<div><h3>Dataset MI curves</h3>{curves_svg(dataset_curves)}</div>
</div>
{skipped_html}
<h3>Classes</h3>
<div class="list" style="max-height: 30vh">{_class_table(results["classes"], methods)}</div>
<h3>Images</h3>
<div class="controls">
<label>Filter <input id="filter" type="search" placeholder="image, class or prediction"></label>
<label><input id="wrong-only" type="checkbox"> misclassified only</label>
<span id="shown"></span>
</div>
<div class="layout">
<div class="list">{_image_table(records, methods, targets)}</div>
<div class="details"><p class="hint">Click an image's row to see its concepts, descriptors and MI
curves.{more}</p>{details}</div>
</div>
<script>{_SCRIPT}</script>
</body>
</html>
"""
