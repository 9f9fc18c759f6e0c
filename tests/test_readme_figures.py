"""scripts/readme_figures.py: the README's marked regions are replaced and nothing else, a
missing marker is an error naming its region, --check prints a diff and writes nothing, and the
README holds every section's markers (the sections stubbed); a section's generator gives what
the command beside it prints (start_block and world, on a tiny probe set); and no figure of the
README's regenerated spans is typed by hand outside a region."""

import importlib.util
import os
import re
import sys

import pytest

from stori_jax import cli
from stori_jax.errors import UserError

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


def test_the_readme_has_every_section_s_markers(figures):
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    text = f.read()
  regions = [r for section in figures.SECTIONS.values() for r in section.regions]
  assert len(regions) == len(set(regions))
  figures.check_regions(text, regions)
  # A marker inside a paragraph must not start a line: GitHub would end the paragraph there and
  # show the rest of the line as raw HTML.
  for line in text.splitlines():
    if line.startswith("<!-- ") and "figures:" in line:
      assert line.strip().endswith("-->") and line.count("-->") == 1, line


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

#: (from, to): README spans whose figures readme_figures regenerates; every number in them
#: outside a region must be in ALLOWED.
COVERED = (
  ("## The embedded synthetic world", "## Preference retrieval"),  # world, start_block
  ("The paper's ablations, on the demo's", "What matters ("),  # ablations (Fig. 10, Table 1)
  ("### Evaluation protocols", "## Model zoo"),  # mutual_evaluate
  ("Done: CLIP towers", "The few-shot demo beats"),  # world.status
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


def test_every_covered_figure_of_the_readme_is_in_a_generated_region(figures):
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    text = f.read()
  regions = {r for section in figures.SECTIONS.values() for r in section.regions}
  outside = _REGION.sub("", text)
  used, stray = set(), []
  for start, end in COVERED:
    i = outside.index(start)
    span = outside[i : outside.index(end, i)]
    for number in _NUMBER.findall(span):
      if number in ALLOWED:
        used.add(number)
      else:
        stray.append(f"{number!r} in the span from {start!r}")
  assert not stray, "hand-typed figures outside a generated region: " + "; ".join(stray)
  assert used == set(ALLOWED), f"stale allowlist entries: {sorted(set(ALLOWED) - used)}"
  # The scan sees the regions it removes: each generated region of these spans is one of the
  # sections' (so a figure cannot hide in a region no section rewrites).
  for start, end in COVERED:
    i = text.index(start)
    for name in re.findall(r"<!-- figures:([\w.]+) -->", text[i : text.index(end, i)]):
      assert name in regions, name
