"""Every relative link of README.md and docs/*.md resolves: its file exists, and a `#anchor` into
a markdown page names one of that page's headings as GitHub makes their anchors. Links inside code
(fenced blocks, inline spans) and HTML comments are not links; web addresses are not checked."""

import glob
import os
import re
import unicodedata

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]

#: [text](target) and ![alt](target); the target ends at the first space or closing parenthesis.
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_COMMENT = re.compile(r"<!--.*?-->", re.S)


def prose(text: str) -> str:
  """`text` without fenced code, inline code and HTML comments: what GitHub renders as links."""
  return _INLINE_CODE.sub("", _COMMENT.sub("", _FENCE.sub("", text)))


def slug(heading: str) -> str:
  """GitHub's anchor of a heading: lower case, markdown's code marks and punctuation dropped
  (letters, digits, '-', '_' and spaces kept), spaces made hyphens."""
  text = heading.strip().lower()
  kept = "".join(
    c for c in text if c in "-_ " or unicodedata.category(c)[0] in ("L", "N")
  )  # `code`, (parentheses), dots, commas and colons go
  return kept.replace(" ", "-")


def anchors(text: str) -> set[str]:
  """The anchors of a markdown page's headings (outside code), repeated ones numbered -1, -2."""
  seen: dict[str, int] = {}
  out = set()
  for line in _FENCE.sub("", text).splitlines():
    heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
    if not heading:
      continue
    base = slug(heading.group(1))
    n = seen.get(base, 0)
    seen[base] = n + 1
    out.add(base if n == 0 else f"{base}-{n}")
  return out


def relative_links(path: str) -> list[str]:
  with open(path, encoding="utf-8") as f:
    text = f.read()
  links = _LINK.findall(prose(text))
  return [t for t in links if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]  # http:, mailto:, ...


def test_the_slugs_are_github_s():
  assert slug("One class against others (Fig. 3, `python -m stori_jax.contrast`)") == (
    "one-class-against-others-fig-3-python--m-stori_jaxcontrast"
  )
  assert slug("Workdirs in a bucket (`gs://`)") == "workdirs-in-a-bucket-gs"
  assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}
  text = "[x](a.md) `[y](b.md)` <!-- [z](c.md) -->\n```\n[w](d.md)\n```\n![v](e.png)"
  assert _LINK.findall(prose(text)) == ["a.md", "e.png"]


def test_the_pages_are_found_and_link_to_each_other():
  names = {os.path.relpath(p, ROOT) for p in PAGES}
  assert {"README.md", "docs/design.md", "docs/fewshot.md", "docs/mutual.md"} <= names
  readme = relative_links(PAGES[0])
  # The front door links every docs page.
  for page in PAGES[1:]:
    assert any(link.split("#")[0] == os.path.relpath(page, ROOT) for link in readme), page


@pytest.mark.parametrize("page", PAGES, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_relative_link_resolves(page):
  broken = []
  folder = os.path.dirname(page)
  for link in relative_links(page):
    target, _, anchor = link.partition("#")
    path = os.path.normpath(os.path.join(folder, target)) if target else page
    if not os.path.exists(path):
      broken.append(f"{link}: no file {os.path.relpath(path, ROOT)}")
      continue
    if anchor and path.endswith(".md"):
      with open(path, encoding="utf-8") as f:
        if anchor not in anchors(f.read()):
          broken.append(f"{link}: {os.path.relpath(path, ROOT)} has no heading #{anchor}")
  assert not broken, f"{os.path.relpath(page, ROOT)}: " + "; ".join(broken)
