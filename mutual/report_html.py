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

The page is the Jinja2 template mutual/templates/report.html (with report.css and report.js
beside it), rendered with autoescape on: every value from the data is escaped by the template
engine, never by hand. Figures are referenced by relative path, not embedded: they already sit beside the page in the
workdir (30-50 KB each; base64 would add a third and copy every class figure into the page), so
the page opens from disk as long as it stays in its workdir. What only the records hold (the
concept maps and the MI curves) is drawn as inline SVG: a few hundred bytes per image, and
present for every image, not only those of the figure classes. Nothing is loaded from the
network (a Content-Security-Policy forbids it) and every string from the data is escaped and
isolated (the `bdi` filter: a `<bdi>` element; `isolate`: Unicode's isolate marks where no
element may go), so
that a right-to-left name or a bidi control character in one (U+202E, RIGHT-TO-LEFT OVERRIDE)
cannot reorder the text, cells or links around it.
"""

from __future__ import annotations

import functools
import urllib.parse
from typing import Any, Collection, Mapping, Sequence

import jinja2
import markupsafe

from mutual import concept_methods
from mutual.report import COLOURS

#: Images with a detail section; past it, a row links to its per-image JSON (a page of 50,000
#: sections would be hundreds of MB).
MAX_DETAILS = 1000
#: Line colours of the MI curves per method (matplotlib's first two, as figures/curves*.png).
CURVE_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728")


def bdi(value: Any) -> markupsafe.Markup:
  """A string from the data (a class, image or descriptor name) as element content: escaped
  and isolated in `<bdi>`, so that its own direction, or a bidi control character in it
  (U+202E), stays inside it."""
  return markupsafe.Markup("<bdi>{}</bdi>").format(str(value))


def isolate(value: Any) -> markupsafe.Markup:
  """A string from the data where no element may go (an attribute shown to the user, the
  page's <title>): escaped and isolated between FIRST STRONG ISOLATE and POP DIRECTIONAL
  ISOLATE (U+2068 ... U+2069), the marks <bdi> stands for."""
  return markupsafe.Markup("\u2068{}\u2069").format(str(value))


def _url(path: str) -> str:
  """A relative path as a URL (a folder name may hold spaces or '#'); escaped by the template."""
  return urllib.parse.quote(path.replace("\\", "/"), safe="/")


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


@functools.cache
def _environment() -> jinja2.Environment:
  """The templates beside this module (package data), autoescaped, with the page's filters."""
  environment = jinja2.Environment(
    loader=jinja2.PackageLoader("mutual", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
  )
  environment.filters.update(
    bdi=bdi, isolate=isolate, num=_num, url=_url, exact=lambda v: repr(float(v))
  )
  return environment


# ---------------------------------------------------------------------------------------------
# What the SVG drawings of the records hold (the template draws them).


def concept_map_svg(concept_map: Sequence[Sequence[int]], size: int = 128) -> dict[str, Any]:
  """The patch grid's concepts (-1: background), one run of equal ids per rect, on a dark
  ground (the concept colours are light, as the figures' outlines): the template's map_svg."""
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
        rects.append(dict(x=start, y=r, width=c - start, colour=concept_colour(value)))
  return dict(rows=rows, cols=cols, size=size, rects=rects)


def curves_svg(
  curves: Mapping[str, Sequence[float]], width: int = 340, height: int = 190
) -> dict[str, Any]:
  """MI curves (MI after removing the t most important visual descriptors), one per method:
  the template's curves_svg."""
  left, right, top, bottom = 36, 10, 10, 34
  points = max((len(c) for c in curves.values()), default=1)
  top_value = max((max(c) for c in curves.values() if len(c)), default=1.0) or 1.0
  span_x, span_y = width - left - right, height - top - bottom

  def x(i):
    return left + span_x * i / max(points - 1, 1)

  def y(v):
    return top + span_y * (1 - float(v) / top_value)

  middle = f"{top + span_y / 2:.1f}"
  labels = [
    dict(x=left - 4, y=top + 4, anchor="end", text=_num(top_value, 1)),
    dict(x=left - 4, y=top + span_y, anchor="end", text="0"),
    dict(x=left, y=height - 18, text="0"),
    dict(x=left + span_x, y=height - 18, anchor="end", text=str(points - 1)),
    dict(
      x=f"{left + span_x / 2:.1f}", y=height - 4, anchor="middle", text="visual descriptors removed"
    ),
    dict(x=10, y=middle, anchor="middle", transform=f"rotate(-90 10 {middle})", text="MI"),
  ]
  lines = []
  for k, (method, curve) in enumerate(curves.items()):
    lines.append(
      dict(
        method=method,
        title=concept_methods.title(method),
        colour=CURVE_COLOURS[k % len(CURVE_COLOURS)],
        points=" ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(curve)),
        x=left + span_x,
        y=top + 12 + 12 * k,
      )
    )
  for label in labels:
    label.setdefault("anchor", "")
    label.setdefault("transform", "")
  return dict(
    width=width,
    height=height,
    axes=[
      (left, top + span_y, left + span_x, top + span_y),
      (left, top, left, top + span_y),
    ],
    labels=labels,
    curves=lines,
  )


# ---------------------------------------------------------------------------------------------
# One image's section.


def _columns(m: Mapping[str, Any]) -> list[dict[str, Any]]:
  """Fig. 6's three columns: vision only (in importance order, with relevance), mutual,
  language only."""
  mutual = set(m["mutual_descriptors"])
  scores = dict(zip(m["visual_descriptors"], m.get("visual_scores", ())))
  vision = [d for d in m["visual_descriptors"] if d not in mutual]
  language = [d for d in m["language_descriptors"] if d not in mutual]
  vision_scores = (
    [scores[d] for d in vision] if len(scores) == len(m["visual_descriptors"]) else None
  )
  return [
    dict(kind="vision", title="vision only", names=vision, scores=vision_scores),
    dict(kind="mutual", title="mutual", names=list(m["mutual_descriptors"]), scores=None),
    dict(kind="language", title="language only", names=language, scores=None),
  ]


def _dropped(m: Mapping[str, Any]) -> list[dict[str, Any]]:
  """The concepts of the patch map that the CRF left no pixel of: no region to prompt, hence
  no descriptor (said, since the map shows them)."""
  listed = {int(c["concept"]) for c in m["concepts"]}
  present = {int(v) for row in m["concept_map"] for v in row}
  return [dict(concept=c, colour=concept_colour(c)) for c in sorted(present - listed - {-1})]


def _detail(n, record, position, methods, figures, panels, record_path) -> dict[str, Any]:
  names = concept_figures(int(record["label"]), methods)
  shown = []
  for method in methods:
    m = record["methods"][method]
    concepts = names[method]
    shown.append(
      dict(
        method=method,
        title=concept_methods.title(method),
        stats=m,
        figure=concepts if position < panels and concepts in figures else "",
        map=concept_map_svg(m["concept_map"]),
        concepts=[
          dict(
            concept=int(c["concept"]),
            colour=concept_colour(c["concept"]),
            patches=int(c["patches"]),
            descriptors=list(c["descriptors"]),
          )
          for c in m["concepts"]
        ],
        dropped=_dropped(m),
        columns=_columns(m),
      )
    )
  return dict(
    n=n,
    record=record,
    position=position,
    panels=panels,
    verdict="correct" if record["correct"] else "wrong",
    record_path=record_path,
    methods=shown,
    curves=curves_svg({method: record["methods"][method]["curve"] for method in methods}),
  )


# ---------------------------------------------------------------------------------------------
# The page.

# No request leaves the page: scripts and styles inline, images from the workdir or data: URLs.
_CSP = (
  "default-src 'none'; img-src 'self' file: data:; style-src 'unsafe-inline'; "
  "script-src 'unsafe-inline'"
)
#: The dataset summary's columns: (header, results.json key).
_SUMMARY = (
  ("MI", "mi"),
  ("AUC (mean curve)", "auc"),
  ("mean image AUC", "mean_image_auc"),
  ("visual descriptors", "visual_descriptors"),
  ("mutual descriptors", "mutual_descriptors"),
  ("OT entropy", "entropy"),
  ("entropy without OT", "entropy_without_ot"),
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
  """The report page's HTML text (the template mutual/templates/report.html).

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
  figures = set(figures)
  record_paths = list(record_paths) if record_paths is not None else [""] * len(records)
  if len(record_paths) != len(records):
    raise ValueError(f"{len(record_paths)} record paths for {len(records)} records")
  positions, seen = [], {}
  for record in records:  # the image's index within its class
    positions.append(seen.get(record["label"], 0))
    seen[record["label"]] = positions[-1] + 1
  detailed = min(len(records), max(int(max_details), 0))
  image_rows = []
  for n, (record, path) in enumerate(zip(records, record_paths)):
    search = " ".join([str(record["id"]), record["class_name"], record["predicted_name"]])
    image_rows.append(
      dict(
        n=n,
        record=record,
        correct=int(bool(record["correct"])),
        search=search.lower(),
        target=f"#img-{n}" if n < detailed else (_url(path) if path else ""),
      )
    )
  dataset = results["dataset"]
  more = (
    f" Sections for the first {detailed}; the other rows link to their per-image JSON."
    if detailed < len(records)
    else ""
  )
  return (
    _environment()
    .get_template("report.html")
    .render(
      csp=_CSP,
      name=config.get("name", "analysis"),
      model=results.get("model", ""),
      dataset=dataset,
      n_classes=len(results["classes"]),
      methods=[dict(name=m, title=concept_methods.title(m)) for m in methods],
      summary_head=["Method", *(label for label, _ in _SUMMARY)],
      summary_keys=[key for _, key in _SUMMARY],
      dataset_curves=curves_svg({method: dataset[method]["curve"] for method in methods}),
      skipped=dict(results.get("skipped_classes") or {}),
      classes=results["classes"],
      image_rows=image_rows,
      more=more,
      details=[
        _detail(n, records[n], positions[n], methods, figures, panels, record_paths[n])
        for n in range(detailed)
      ],
    )
  )
