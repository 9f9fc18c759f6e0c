"""scripts/readme_figures.py: the README's marked regions are replaced and nothing else, a
missing marker is an error naming its region, --check prints a diff and writes nothing, and the
README holds every section's markers. Nothing is measured here (the sections are stubbed)."""

import importlib.util
import os
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
