"""scripts/readme_figures.py: the marked regions are replaced and nothing else, a missing marker
is an error naming its region, --check prints a diff and writes nothing, a region is found and
rewritten in whichever of README.md and docs/*.md holds it (its image links relative to that
page), and README + docs hold every section's region exactly once (the sections stubbed); a
section's generator gives what the command beside it prints (start_block and world, on a tiny
probe set); and no figure of the regenerated spans is typed by hand outside a region."""

import importlib.util
import json
import os
import re
import sys

import pytest

from stori_jax.plumbing import cli
from stori_jax.plumbing.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def figures():
  spec = importlib.util.spec_from_file_location(
    "readme_figures", os.path.join(ROOT, "scripts", "readme_figures.py")
  )
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # dataclasses look their module up while it is executed
  try:
    spec.loader.exec_module(module)
    yield module
  finally:
    sys.modules.pop(spec.name, None)


TEXT = """# Title

Before the table. <!-- figures:table -->
Measured in about 10 s:

| a | b |
|---|---|
| 1 | 2 |

<!-- /figures:table -->

A sentence with <!-- figures:words -->old words<!-- /figures:words --> inside it.
"""


def test_a_region_is_replaced_and_the_rest_untouched(figures):
  new = figures.replace_regions(
    TEXT, {"table": "Measured in about 20 s:\n\n| a | b |\n|---|---|\n| 3 | 4 |\n", "words": "new"}
  )
  assert new == TEXT.replace("10 s", "20 s").replace("| 1 | 2 |", "| 3 | 4 |").replace(
    "old words", "new"
  )
  # The same figures again change nothing.
  assert figures.replace_region(new, "words", "new") == new


@pytest.mark.parametrize(
  "text",
  [
    TEXT.replace("<!-- figures:words -->", ""),
    TEXT.replace("<!-- /figures:words -->", ""),
    TEXT + "<!-- figures:words -->",
    TEXT.replace(
      "<!-- figures:words -->old words<!-- /figures:words -->",
      "<!-- /figures:words --><!-- figures:words -->",
    ),
  ],
  ids=["no opening", "no closing", "twice", "reversed"],
)
def test_a_missing_marker_names_the_region(figures, text):
  with pytest.raises(UserError, match="'words'"):
    figures.replace_regions(text, {"table": "x", "words": "y"})


def test_check_prints_the_diff_and_writes_nothing(figures, tmp_path, monkeypatch, capsys):
  readme = tmp_path / "README.md"
  readme.write_text(TEXT, encoding="utf-8")
  stub = figures.Section(lambda: {"words": "measured words"}, ("words",), "a stub")
  monkeypatch.setattr(figures, "SECTIONS", {"stub": stub})
  args = ["--readme", str(readme)]
  assert cli.run_in_process(figures, [*args, "--check"]) == 1
  out = capsys.readouterr().out
  assert "-A sentence with <!-- figures:words -->old words" in out
  assert "+A sentence with <!-- figures:words -->measured words" in out
  assert readme.read_text(encoding="utf-8") == TEXT
  assert cli.run_in_process(figures, args) == 0
  assert readme.read_text(encoding="utf-8") == TEXT.replace("old words", "measured words")
  assert cli.run_in_process(figures, [*args, "--check"]) == 0  # now up to date


def test_check_passes_when_only_a_timing_differs(figures, tmp_path, monkeypatch, capsys):
  readme = tmp_path / "README.md"
  readme.write_text(TEXT, encoding="utf-8")
  table = "Measured in about {} s:\n\n| a | b |\n|---|---|\n| {} | 2 |\n"
  for seconds, cell, code in ((20, 1, 0), (20, 3, 1)):
    stub = figures.Section(lambda: {"table": table.format(seconds, cell)}, ("table",), "a stub")
    monkeypatch.setattr(figures, "SECTIONS", {"stub": stub})
    assert cli.run_in_process(figures, ["--readme", str(readme), "--check"]) == code
    assert "+Measured in about 20 s:" in capsys.readouterr().out
  assert readme.read_text(encoding="utf-8") == TEXT
  assert figures.without_timings("about 150 s, about 11 minutes") == "about ? s, about ? s"


def test_check_passes_a_paragraph_re_wrapped_by_a_longer_timing(
  figures, tmp_path, monkeypatch, capsys
):
  """A timing that grew a digit moves a paragraph's line breaks: --check exits 0 (timings are
  not figures, the wrapping is not either), and says only the timings differ."""
  sentence = (
    "The demo on the shipped tiny CLIP trains in {} and reaches 95.17% with weights within "
    "1e-5 of one process's."
  )
  short, long = sentence.format("about 35 s"), sentence.format("about 110 s")
  # A width at which the longer timing moves a line break (not only the timing's own line).
  width = next(
    w for w in range(30, 90) if figures.fill(short, w).replace("35", "110") != figures.fill(long, w)
  )
  old, new = figures.fill(short, width), figures.fill(long, width)
  readme = tmp_path / "README.md"
  readme.write_text(f"<!-- figures:demo -->\n{old}\n<!-- /figures:demo -->\n", encoding="utf-8")
  for measured, code in ((new, 0), (new.replace("95.17", "95.18"), 1)):
    stub = figures.Section(lambda: {"demo": "\n" + measured + "\n"}, ("demo",), "a stub")
    monkeypatch.setattr(figures, "SECTIONS", {"stub": stub})
    assert cli.run_in_process(figures, ["--readme", str(readme), "--check"]) == code
    out = capsys.readouterr().out
    assert ("1 of 1 regions differ, 1 of them in timings (or wrapping) only" in out) == (code == 0)
    assert ("Only the measured timings differ" in out) == (code == 0)
    assert ("Figures drifted in demo." in out) == (code == 1)
  assert figures.without_timings("about 4 ms,\n  about 8 hours") == "about ? s, about ? s"


def test_a_measured_difference_is_stated_as_its_bound(figures):
  """Two machines of one kind measure 2.6e-6 and 3.8e-6: both state "within 1e-5"."""
  assert [figures.bound(x) for x in (2.6e-6, 3.8e-6, 1e-5)] == ["1e-5"] * 3
  assert [figures.bound(x) for x in (1.2e-5, 0.0, 0.4, 3.0)] == ["1e-4", "0", "1", "10"]
  one, other = (
    f"their weights within {figures.bound(x)} of one process's." for x in (2.6e-6, 3.8e-6)
  )
  assert one == other and figures.same_figures(one, other)


def test_a_section_s_images_are_written_beside_the_readme(figures, tmp_path, monkeypatch, capsys):
  readme = tmp_path / "README.md"
  readme.write_text(TEXT, encoding="utf-8")
  image, png = "docs/images/measured.png", b"\x89PNG\r\n\x1a\nmeasured"
  stub = figures.Section(
    lambda: {"words": "old words", image: png}, ("words",), "a stub", images=(image,)
  )
  monkeypatch.setattr(figures, "SECTIONS", {"stub": stub})
  args = ["--readme", str(readme)]
  # --check reports the image and writes nothing; the text is unchanged, so it passes.
  assert cli.run_in_process(figures, [*args, "--check"]) == 0
  assert "measured.png: the measured image differs" in capsys.readouterr().out
  assert not (tmp_path / "docs").exists()
  assert cli.run_in_process(figures, args) == 0
  assert (tmp_path / image).read_bytes() == png and readme.read_text(encoding="utf-8") == TEXT
  assert "and 1 images" in capsys.readouterr().out
  assert cli.run_in_process(figures, args) == 0  # the same image again: left as it is
  assert "differs" not in capsys.readouterr().out
  missing = figures.Section(lambda: {"words": "w"}, ("words",), "a stub", images=(image,))
  monkeypatch.setattr(figures, "SECTIONS", {"stub": missing})
  with pytest.raises(AssertionError, match="measured.png"):  # the script's own bug
    cli.run_in_process(figures, args)


def test_a_readme_without_the_markers_stops_before_measuring(
  figures, tmp_path, monkeypatch, capsys
):
  readme = tmp_path / "README.md"
  readme.write_text("# No regions\n", encoding="utf-8")

  def measure():
    raise AssertionError("measured although the README lacks the region")

  monkeypatch.setattr(figures, "SECTIONS", {"stub": figures.Section(measure, ("words",), "")})
  assert cli.run_in_process(figures, ["--readme", str(readme)]) == 2
  assert "'words'" in capsys.readouterr().err
  assert cli.run_in_process(figures, ["--only", "nope", "--readme", str(readme)]) == 2


def _pages(figures):
  """{path: text} of README.md and docs/*.md, the files the script rewrites."""
  return figures.read_texts(figures.figure_files(os.path.join(ROOT, "README.md")))


def test_readme_and_docs_hold_every_section_s_region_exactly_once(figures):
  texts = _pages(figures)
  assert os.path.join(ROOT, "docs", "fewshot.md") in texts  # the docs pages are searched
  regions = [r for section in figures.SECTIONS.values() for r in section.regions]
  assert len(regions) == len(set(regions))
  homes = figures.region_homes(texts, regions)  # raises unless each is in exactly one file
  for name in regions:
    opening, closing = figures.OPEN.format(name), figures.CLOSE.format(name)
    assert sum(t.count(opening) + t.count(closing) for t in texts.values()) == 2, name
  # `make test`'s figures stay on the front door.
  assert homes["suite.default"] == homes["suite.all"] == os.path.join(ROOT, "README.md")
  # No marker names a region that no section rewrites.
  marked = {m for t in texts.values() for m in re.findall(r"<!-- figures:([\w.]+) -->", t)}
  assert marked == set(regions)
  # A marker inside a paragraph must not start a line: GitHub would end the paragraph there and
  # show the rest of the line as raw HTML.
  for text in texts.values():
    for line in text.splitlines():
      if line.startswith("<!-- ") and "figures:" in line:
        assert line.strip().endswith("-->") and line.count("-->") == 1, line


def test_a_region_is_rewritten_in_the_docs_page_that_holds_it(
  figures, tmp_path, monkeypatch, capsys
):
  readme = tmp_path / "README.md"
  readme.write_text("# Front door\n\nSee docs/page.md.\n", encoding="utf-8")
  (tmp_path / "docs").mkdir()
  page = tmp_path / "docs" / "page.md"
  page.write_text(TEXT, encoding="utf-8")
  image, png = "docs/images/measured.png", b"\x89PNG\r\n\x1a\nmeasured"
  body = f"measured words ![a figure]({image})"
  stub = figures.Section(lambda: {"words": body, image: png}, ("words",), "a stub", images=(image,))
  monkeypatch.setattr(figures, "SECTIONS", {"stub": stub})
  args = ["--readme", str(readme)]
  assert cli.run_in_process(figures, [*args, "--check"]) == 1
  out = capsys.readouterr().out
  assert "docs/page.md (measured)" in out and page.read_text(encoding="utf-8") == TEXT
  assert cli.run_in_process(figures, args) == 0
  # The link is relative to the page (docs/), the image written beside the README.
  want = TEXT.replace("old words", "measured words ![a figure](images/measured.png)")
  assert page.read_text(encoding="utf-8") == want
  assert readme.read_text(encoding="utf-8") == "# Front door\n\nSee docs/page.md.\n"
  assert (tmp_path / image).read_bytes() == png
  assert "rewrote " in capsys.readouterr().out
  assert cli.run_in_process(figures, [*args, "--check"]) == 0  # now up to date
  # The same region in the README too: refused before measuring, naming both files.
  readme.write_text("<!-- figures:words -->x<!-- /figures:words -->\n", encoding="utf-8")
  assert cli.run_in_process(figures, args) == 2
  err = capsys.readouterr().err
  assert "'words'" in err and "README.md" in err and "page.md" in err
  assert page.read_text(encoding="utf-8") == want


def test_about_rounds_a_noisy_time(figures):
  assert figures.about(3.4) == "about 3 s"
  assert figures.about(27.0) == "about 25 s"
  assert figures.about(111.0) == "about 110 s"
  assert figures.about(900.0) == "about 15 minutes"
  assert figures.signed(-0.1234) == "\u22120.123" and figures.signed(0.045) == "+0.045"


def test_fill_never_starts_a_line_with_a_markdown_block(figures):
  text = "word " * 19 + "+ plus and - minus 1. one > quote # hash | bar <b> " * 6
  lines = figures.fill(text).splitlines()
  assert " ".join(lines) == " ".join(text.split()) and max(map(len, lines)) <= 100
  assert not any(figures._BLOCK_START.match(line) for line in lines)


def test_listed_names_runs_and_lists(figures):
  assert figures.listed([1, 2, 3, 4]) == "1-4"
  assert figures.listed([5, 6]) == "5 and 6" and figures.listed([6]) == "6"
  assert figures.listed([1, 3, 4]) == "1, 3 and 4"
  assert figures.listed(["Keys", "Tokens", "Ensemble"]) == "Keys, Tokens and Ensemble"


def _table5(top1):
  """Table 5's results (bottlenecks.table5's layout) with the given top-1 per row and a labeler."""
  from mutual.protocols import bottlenecks  # pylint: disable=import-outside-toplevel

  rows = {}
  for name, value in top1.items():
    flags = bottlenecks.ROWS.get(name, (None, None, None))
    paper = bottlenecks.PAPER.get(name, (None, None))
    rows[name] = dict(
      top1=value,
      top5=min(100.0, value + 10),
      vision=flags[0],
      language=flags[1],
      multimodal_bottleneck=flags[2],
      paper_top1=paper[0],
      paper_top5=paper[1],
    )
  labeler = dict(
    top_all=12.5,
    top_10=40.0,
    top_all_recall=50.0,
    top_10_recall=70.0,
    images=192,
    images_without_descriptors=0,
    paper_top_all=65.76,
    paper_top_10=83.84,
  )
  return dict(rows=rows, images=192, labeler=labeler)


def test_table5_is_the_printed_table_without_its_flag_columns(figures):
  from mutual.protocols import bottlenecks  # pylint: disable=import-outside-toplevel

  top1 = {"Standard": 80.0, "LF-CBM": 50.0, "MM-CBM": 39.0, "MM-ProtoSim": 73.0, "zero-shot": 99.0}
  result = _table5(top1)
  printed = "## Table 1\n\n| a |\n\n## Table 5 (App. D): x\n\n"
  printed += bottlenecks.table5_markdown(result, "tiny")
  text = figures._table5(printed, result)
  table = [line for line in text.splitlines() if line.startswith("|")]
  assert table[0] == "| Model | Top-1 | Top-5 | Paper Top-1 | Paper Top-5 |"
  assert table[2] == "| Standard | 80.00 | 90.00 | 73.36 | 92.75 |"
  assert table[-1].startswith("| Zero-shot CLIP (untrained reference) | 99.00 | 100.00 |")
  assert len(table) == 2 + len(top1)  # the labeler's table is left to the sentence
  prose = " ".join(text.split())
  assert "does not reproduce" in prose and "Standard 80.00 > MM-ProtoSim 73.00" in prose
  assert "on 12.50% of the 192 images (top-all; paper 65.76)" in prose
  assert "on 40.00% (top-10; paper 83.84)" in prose
  paper_order = {"MM-ProtoSim": 79.0, "MM-CBM": 78.0, "Standard": 74.0, "LF-CBM": 72.0}
  result = _table5(paper_order)
  text = figures._table5("## Table 5\n\n" + bottlenecks.table5_markdown(result, "m"), result)
  assert "order of Table 5 holds here" in " ".join(text.split())


def _corloc(gdc, pca):
  return dict(
    corloc={f: {"gdc": g, "pca": p} for f, g, p in zip(("ensemble", "keys", "tokens"), gdc, pca)},
    trivial={"centre": 14.0625, "whole_image": 0.0},
    images=192,
    iou_threshold=0.5,
  )


def _layers(tokens, keys):
  summary = lambda pair: dict(last_vs_earlier=pair[0], among_earlier=pair[1])  # noqa: E731
  return dict(layers=4, summary={"tokens": summary(tokens), "keys": summary(keys)})


def test_app_a1_reads_corloc_and_the_layer_similarity_against_the_paper(figures):
  table, prose = figures._app_a1(
    _corloc((13.0, 5.2, 21.4), (78.6, 72.9, 75.0)), _layers((0.7, 0.75), (-0.04, -0.04))
  )
  rows = [line for line in table.splitlines() if line.startswith("| ")]
  assert rows == [  # the paper's facet order, though protocols.json sorts its keys
    "| Facet | GDC | PCA |",
    "| Keys | 5.2 | 72.9 |",
    "| Tokens | 21.4 | 75.0 |",
    "| Ensemble | 13.0 | 78.6 |",
  ]
  prose = " ".join(prose.split())
  assert "PCA localises better than GDC on every facet, the reverse" in prose
  assert "0.0% (the whole image) and 14.1% (the centred half-side box)" in prose
  assert "its key \u22120.040" in prose and "does not show here" in prose
  _, prose = figures._app_a1(
    _corloc((60.0, 70.0, 65.0), (30.0, 20.0, 70.0)), _layers((0.2, 0.8), (0.9, 0.9))
  )
  prose = " ".join(prose.split())
  assert "better than GDC on the Tokens facet, against" in prose and prose.endswith("shows here.")


# ---------------------------------------------------------------------------------------------
# The generated figures are the commands' own: a section's generator, run on a tiny setting,
# gives what the command beside it prints on that setting.

#: A probe set of 2 prompts x 8 categories x 2 images (the README's: configs/retrieval_synthetic.py).
TINY_PROBE = """import ml_collections


def get_config():
  config = ml_collections.ConfigDict()
  config.data = ml_collections.ConfigDict(
    {"source": "synthetic", "n_triples": 2, "images_per_category": 2, "seed": (7, 7)}
  )
  return config
"""


def _fenced(text):
  """The lines of the first ``` block of `text`."""
  return text.split("```\n", 2)[1].rstrip("\n")


@pytest.mark.slow
def test_the_start_block_section_is_what_the_command_prints(figures, run_command, tmp_path):
  probe = tmp_path / "tiny_probe.py"
  probe.write_text(TINY_PROBE, encoding="utf-8")
  model = "tiny-synthetic"
  region = figures.start_block_figures(models=(model, model), data_config=str(probe))
  body = region["start_block"]
  result = run_command(
    "stori_jax.start_block",
    "--model",
    model,
    "--data_config",
    probe,
    "--workdir",
    tmp_path / "start_block",
  )
  assert result.returncode == 0, result.stderr
  table = _fenced(body)
  assert len(table.splitlines()) == 2 + 6  # header and one row per block of the tiny CLIP
  assert table in result.stdout  # the recommended block's mark included


def _printed_numbers(line):
  """The means of a row of evaluate_world's markdown ("0.805 ± 0.120" -> 0.805), in order."""
  return [float(x) for x in re.findall(r"([+-]?\d+\.\d+) ±", line)]


def _region_numbers(line):
  return [float(x.replace("\u2212", "-")) for x in re.findall(r"[+\u2212-]?\d+\.\d+", line)]


@pytest.mark.slow
def test_the_world_section_is_what_evaluate_world_prints(figures, run_command, tmp_path):
  probe = tmp_path / "tiny_probe.py"
  probe.write_text(TINY_PROBE, encoding="utf-8")
  model = "tiny-synthetic"
  tiny = ["--n_images", "16", "--n_pairs", "16", "--n_triples", "2", "--images_per_category", "2"]
  regions = figures.world_figures(models=(model, model), eval_args=tiny, probe_config=str(probe))
  result = run_command(
    "stori_jax.evaluate_world", "--source", model, "--output_dir", tmp_path / "eval", *tiny
  )
  assert result.returncode == 0, result.stderr
  printed = result.stdout.splitlines()

  def row(first_cell, after=0):
    return next(line for line in printed[after:] if line.startswith(f"| {first_cell} |"))

  zero_shot = next(x for x in regions["world.zero_shot"].splitlines() if x.startswith(f"| {model}"))
  accuracy = [float(row(f).split("|")[-2]) for f in ("colour", "shape", "pattern", "size")]
  accuracy.append(float(row("position").split("|")[-2]))
  recall = [float(row(d).split("|")[2]) for d in ("text → image", "image → text")]
  assert _region_numbers(zero_shot) == accuracy + recall
  stori = next(i for i, line in enumerate(printed) if line.startswith("### Emphasis effect, SToRI"))
  table3 = regions["world.table3"].split("\n\n")[0].splitlines()[2:]
  for line in table3:
    family = line.split("|")[1].strip()
    ap05, d05, ap1, ap15, d15 = _printed_numbers(row(family, stori))
    # The README's row: AP at 0.5 / 1 / 1.5, Δ at 0.5 / 1.5, then the base model's Δ (here
    # the same model).
    assert _region_numbers(line) == [ap05, ap1, ap15, d05, d15, d05, d15]


# ---------------------------------------------------------------------------------------------
# Every embedded-world figure of the covered README sections is inside a generated region.

#: (page, from, to): spans of README.md / docs pages whose figures readme_figures regenerates
#: ("" to: the page's end); every number in them outside a region must be in ALLOWED.
COVERED = (
  ("docs/embedded_world.md", "# The embedded synthetic world", ""),  # world, start_block
  ("docs/fewshot.md", "The paper's ablations, on the demo's", "What matters ("),  # ablations
  ("docs/fewshot.md", "## Paper tables as one command", "## One class against others"),  # grid
  ("docs/fewshot.md", "## One class against others", ""),  # contrast
  ("docs/mutual.md", "## Evaluation protocols", ""),  # mutual_evaluate
  ("docs/status.md", "Done: CLIP towers", "The few-shot demo beats"),  # world.status
)
#: Numbers in the covered spans that are not measurements.
ALLOWED = {
  "4.2": "the paper's Sec. 4.2 (a section number)",
  "0.5": "a token weight (w = 0.5, AP(0.5)); also the size family's chance level",
  "1.5": "a token weight (w = 1.5, AP(1.5))",
  "7.6": "the shipped checkpoint's file size in MB (a fact of the file, not a measurement)",
  "0.125": "chance of the colour and shape families (1 / 8 values)",
  "0.25": "chance of the pattern family (1 / 4 values)",
  "0.2": "chance of the position family (1 / 5 values)",
}
_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?%|(?<![\w.])\d+\.\d+")
_REGION = re.compile(r"<!-- figures:([\w.]+) -->.*?<!-- /figures:\1 -->", re.S)


def _span(text, start, end):
  i = text.index(start)
  return text[i : text.index(end, i) if end else len(text)]


def test_every_covered_figure_of_the_docs_is_in_a_generated_region(figures):
  regions = {r for section in figures.SECTIONS.values() for r in section.regions}
  used, stray = set(), []
  for page, start, end in COVERED:
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
      text = f.read()
    for number in _NUMBER.findall(_span(_REGION.sub("", text), start, end)):
      if number in ALLOWED:
        used.add(number)
      else:
        stray.append(f"{number!r} in {page}'s span from {start!r}")
    # The scan sees the regions it removes: each generated region of these spans is one of the
    # sections' (so a figure cannot hide in a region no section rewrites).
    for name in re.findall(r"<!-- figures:([\w.]+) -->", _span(text, start, end)):
      assert name in regions, name
  assert not stray, "hand-typed figures outside a generated region: " + "; ".join(stray)
  assert used == set(ALLOWED), f"stale allowlist entries: {sorted(set(ALLOWED) - used)}"


@pytest.mark.parametrize(
  "summary, want",
  [
    (
      "== 813 passed, 3 skipped, 116 deselected in 374.12s (0:06:14) ==",
      "about 6 minutes on 2 CPU cores (813 passed, 3 skipped)",
    ),
    ("==== 12 passed in 3.20s ====", "about 3 s on 2 CPU cores (12 passed, 0 skipped)"),
    (  # what pytest -q (as the section runs it) really prints: no "=" around it
      "1025 passed, 134 deselected, 9 warnings in 613.55s (0:10:13)",
      "about 10 minutes on 2 CPU cores (1025 passed, 0 skipped)",
    ),
  ],
)
def test_the_suite_section_reads_pytest_s_summary(figures, monkeypatch, summary, want):
  import subprocess  # pylint: disable=import-outside-toplevel

  runs = []

  def fake_run(args, **kwargs):
    cache = kwargs["env"]["STORI_TEST_COMPILATION_CACHE"]
    runs.append((args, kwargs["env"], os.listdir(cache)))
    with open(os.path.join(cache, f"program-{len(runs)}"), "w", encoding="utf-8") as f:
      f.write("compiled")
    last = summary if len(runs) == 1 else "1 passed in 15.20s"  # the run again, cache warm
    return subprocess.CompletedProcess(args, 0, stdout=f"....\n{last}\n", stderr="")

  monkeypatch.setattr(subprocess, "run", fake_run)
  monkeypatch.setattr(figures, "machine", lambda: "2 CPU cores")
  monkeypatch.setenv("CI", "true")
  monkeypatch.setenv("STORI_TEST_COMPILATION_CACHE", "0")
  assert figures.suite_figures() == {"suite.default": want, "suite.default_warm": "about 15 s"}
  # Both runs as `make test` runs them; the first on an empty cache, the second on what it left.
  assert [args[-2:] for args, _, _ in runs] == [["-m", "not slow"]] * 2
  assert all("CI" not in env for _, env, _ in runs)
  assert [listed for _, _, listed in runs] == [[], ["program-1"]]
  assert not os.path.exists(runs[0][1]["STORI_TEST_COMPILATION_CACHE"])  # removed after


def test_the_suite_section_refuses_a_failing_suite(figures, monkeypatch):
  import subprocess  # pylint: disable=import-outside-toplevel

  failed = "== 1 failed, 800 passed in 300.00s =="
  monkeypatch.setattr(
    subprocess, "run", lambda args, **kw: subprocess.CompletedProcess(args, 1, failed, "")
  )
  with pytest.raises(AssertionError, match="did not pass"):
    figures.suite_all_figures()


def test_check_allows_a_stated_tolerance_on_decimal_figures_only(figures):
  same = figures.same_figures
  old = "MI or AUC change on 28.1% (PCA) / 35.9% of the 192 images (about 480 s)"
  assert same(old, old.replace("480", "300"))  # a timing
  assert not same(old, old.replace("28.1", "30.7"))  # exact unless a tolerance is stated
  assert same(old, old.replace("28.1", "30.7").replace("35.9", "33.0"), 3.0)
  assert not same(old, old.replace("28.1", "31.2"), 3.0)
  assert not same(old, old.replace("192", "191"), 3.0)  # counts stay exact
  assert not same(old, old.replace("PCA", "K-means"), 3.0)
  assert not same(old, old.replace("28.1%", "28.1% / 28.4%"), 3.0)


def test_check_passes_a_region_within_its_tolerance(figures, tmp_path, monkeypatch, capsys):
  # The bf16 shares carry the tolerance the README states beside them.
  assert figures.SECTIONS["mutual_precision"].tolerance == figures.BF16_TOLERANCE == 7.0
  texts = _pages(figures)
  text = texts[figures.region_homes(texts, ["mutual_precision"])["mutual_precision"]]
  after = text[text.index("<!-- /figures:mutual_precision -->") :][:1000]
  assert "within 7 percentage points" in after
  readme = tmp_path / "README.md"
  readme.write_text("Shares: <!-- figures:shares -->28.1% / 14.6%<!-- /figures:shares -->.\n")
  for measured, code in (("30.7% / 12.5%", 0), ("31.2% / 14.6%", 1)):
    stub = figures.Section(lambda: {"shares": measured}, ("shares",), "a stub", tolerance=3.0)
    monkeypatch.setattr(figures, "SECTIONS", {"stub": stub})
    assert cli.run_in_process(figures, ["--readme", str(readme), "--check"]) == code
    out = capsys.readouterr().out
    assert ("within the tolerance" in out) == (code == 0)


def _reproducible_cpu():
  spec = importlib.util.spec_from_file_location(
    "reproducible_cpu", os.path.join(ROOT, "scripts", "reproducible_cpu.py")
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_the_figure_scripts_set_the_cpu_up_before_numpy_and_jax():
  import json  # pylint: disable=import-outside-toplevel
  import subprocess  # pylint: disable=import-outside-toplevel

  rc = _reproducible_cpu()
  assert rc.xla_flags("") == " ".join(rc.FLAGS)
  # A flag the user's XLA_FLAGS sets wins; the others are added.
  mine = "--xla_cpu_max_isa=AVX512 --xla_dump_to=/tmp/x"
  assert rc.xla_flags(mine) == mine + " " + " ".join(f for f in rc.FLAGS if "max_isa" not in f)
  # In a process of its own (it pins that process): flags, OpenBLAS's kernels, 2 cores (or a
  # note), and the suite's child gets the user's environment back.
  code = (
    "import json, os, reproducible_cpu as r; note = r.apply(); print(json.dumps([note, "
    "len(os.sched_getaffinity(0)), os.environ['XLA_FLAGS'], os.environ['OPENBLAS_CORETYPE'], "
    "r.original_env(os.environ).get('XLA_FLAGS')]))"
  )
  env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_FLAGS", "OPENBLAS_"))}
  env["XLA_FLAGS"] = "--xla_dump_to=/tmp/x"
  done = subprocess.run(
    [sys.executable, "-c", code],
    cwd=os.path.join(ROOT, "scripts"),
    env=env,
    capture_output=True,
    text=True,
    check=True,
  )
  note, cores, flags, coretype, child = json.loads(done.stdout)
  available = len(os.sched_getaffinity(0))
  assert cores == min(available, rc.CORES) and (note is None) == (available >= rc.CORES)
  assert flags == " ".join(["--xla_dump_to=/tmp/x", *rc.FLAGS])
  assert coretype == "Haswell" and child == "--xla_dump_to=/tmp/x"
  # Each script calls it before it imports NumPy, JAX or the package.
  for name in ("readme_figures.py", "mutual_precision.py", "embedded_world_figures.py"):
    with open(os.path.join(ROOT, "scripts", name), encoding="utf-8") as f:
      source = f.read()
    first = min(
      source.index(s)
      for s in ("import numpy", "import jax", "import stori_jax", "from stori_jax")
      if s in source
    )
    assert source.index("reproducible_cpu.apply()") < first, name


@pytest.mark.slow
def test_mutual_modes_compares_with_the_crf_off_on_both_sides(figures, tiny_synthetic):
  """Issue 44 row 14: without SimpleCRF the mutual_modes section said "CRF off on both sides"
  while the project's side kept its own CRF. The comparison it runs, with the CRF off on both
  sides (two classes of the embedded world, 4 images each, reference mode, the section's
  config otherwise): MI and AUC equal image for image, for PCA and K-means."""
  pytest.importorskip("kmeans_pytorch")
  from mutual import data, pipeline  # pylint: disable=import-outside-toplevel
  from mutual import reference as torch_reference  # pylint: disable=import-outside-toplevel
  from stori_jax.plumbing.config_files import load_config  # pylint: disable=import-outside-toplevel

  config = load_config(os.path.join(ROOT, "configs", "mutual_synthetic.py"))
  config.data.classes, config.data.images_per_class = (2, 7), 4
  a = config.analysis
  a.mode = "reference"
  assert a.crf  # the config's CRF is on: the comparison must turn the project's side off
  dataset = data.prepare(config)
  bank = pipeline.encode_config_bank(tiny_synthetic, config, dataset, progress=False)
  model = torch_reference.open_clip_from_bundle(tiny_synthetic)
  methods = tuple(a.methods)
  images = 0
  for cls in dataset.classes(int(tiny_synthetic.config.vision.image_size)):
    with_crf = pipeline.analyze_class(tiny_synthetic, cls.images, bank, a, methods)
    agree = figures.reference_agreement(
      tiny_synthetic, model, cls.images, bank, a, methods, False, with_crf
    )
    assert set(agree) == {"pca", "kmeans"}
    for method in methods:
      assert agree[method].shape == (4,) and agree[method].all(), (cls.label, method, agree)
    images += len(cls.images)
  assert images == 8
  assert a.crf  # the section's config is left as it was


def _limit_row(figures, what, seconds, ratio):
  return figures.LimitRow(
    what=what,
    unit="step",
    seconds=seconds,
    gflop=12.5,
    fraction=0.25,
    reference="a reference",
    reference_seconds=seconds * ratio,
    reference_fraction=0.1,
    ratio=ratio,
    rate_gflop_per_s=100.0,
    sizes="tiny",
  )


def test_the_machine_limit_table_takes_rows_from_every_producer(figures, monkeypatch):
  monkeypatch.setattr(figures, "machine", lambda: "2 CPU cores")
  producers = [
    lambda: [_limit_row(figures, "step A", 2.0, 1.5)],
    lambda: [_limit_row(figures, "analysis B", 0.5, 3.0), _limit_row(figures, "C", 1.0, 1.0)],
  ]
  table = figures.machine_limit_figures(producers)["machine_limit"]
  lines = table.splitlines()
  assert lines[2].startswith("| step A | 2.00 per step | 12.5 | 25.0% of 100.0 GFLOP/s |")
  assert lines[2].endswith("| a reference | 3.00 | 10.0% | **1.50x** |")
  assert [line.split("|")[1].strip() for line in lines[2:5]] == ["step A", "analysis B", "C"]
  assert lines[-1] == "On 2 CPU cores, one run: tiny."


def test_the_analysis_row_reads_mutual_throughputs_json(figures):
  """analysis_rows from a committed mutual_throughput run: ours per image against the per-image
  reference at equal work, the share being the towers' FLOPs over the whole analysis's time."""
  path = os.path.join(ROOT, "benchmarks", "results", "mutual_throughput_cpu_vitb16_towers.json")
  with open(path, encoding="utf-8") as f:
    result = json.load(f)
  (row,) = figures.analysis_rows(result)
  achieved, images = result["achieved"], result["images"]
  assert row.unit == "image" and "MK analysis" in row.what
  assert row.seconds == pytest.approx(achieved["jax_seconds"] / images, abs=1e-3)
  assert row.reference_seconds == pytest.approx(
    achieved["reference_equal_work_seconds"] / images, abs=1e-3
  )
  assert row.ratio == pytest.approx(row.reference_seconds / row.seconds, rel=0.01)
  assert row.ratio > 1.5  # that run: 2.47x
  assert row.fraction == achieved["jax_fraction_of_matmul"] and 0.3 < row.fraction < 1.5
  assert row.rate_gflop_per_s == max(
    result["matmul"]["jax_gflop_per_s"], result["matmul"]["torch_gflop_per_s"]
  )
  assert "ViT-B-16, 16 images of one class" in row.sizes


def test_check_passes_a_timed_region_whose_timings_moved(figures, tmp_path, monkeypatch, capsys):
  readme = tmp_path / "README.md"
  readme.write_text(
    "Step: <!-- figures:limit -->2.00 s, 25.0%, 12 prompts<!-- /figures:limit -->\n"
  )
  for measured, code in (("3.10 s, 19.5%, 12 prompts", 0), ("3.10 s, 19.5%, 13 prompts", 1)):
    stub = figures.Section(lambda: {"limit": measured}, ("limit",), "a stub", timed=True)
    monkeypatch.setattr(figures, "SECTIONS", {"stub": stub})
    assert cli.run_in_process(figures, ["--readme", str(readme), "--check"]) == code
    out = capsys.readouterr().out
    assert ("Only the measured timings differ" in out) == (code == 0)
