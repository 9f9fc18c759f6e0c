"""configs/paper_items.py, the index of every table and figure of both papers: its structure
(every config a command names loads, every module imports, every override names a key, no item
twice, the papers' items all there) and, marked slow, every distinct `smoke` command run
in-process, each entry's outputs found in its workdir."""

import fnmatch
import importlib
import importlib.util
import json
import os
import re
import time

import pytest

from configs import paper_items
from stori_jax.plumbing import cli
from stori_jax.plumbing.config_files import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Every item with a result in either paper (diagrams and lists of inputs left out).
EXPECTED = {
  "SToRI": {"Fig. 2", "Fig. 3", "Fig. 4", "Fig. 5", "Fig. 6", "Fig. 7", "Fig. 8", "Fig. 9"}
  | {"Fig. 10"}
  | {f"Table {k}" for k in range(1, 9)},
  "MK": {"Table 1", "Table 2", "Table 3", "Fig. 3", "Fig. 4", "Fig. 5", "Fig. 6"}
  | {f"App. Table {k}" for k in range(1, 8)}
  | {f"App. Fig. {k}" for k in (1, 2, 3, 6, 7, 8, 9, 10)},
}


def _parts(command: str):
  return paper_items.split_commands(command)


def _overrides(words):
  """The --config.KEY=VALUE overrides of a command: [(dotted key, value)]."""
  return [tuple(w[len("--config.") :].split("=", 1)) for w in words if w.startswith("--config.")]


def test_the_index_holds_each_papers_items_once():
  keys = [item.key for item in paper_items.ITEMS]
  assert len(keys) == len(set(keys)), [k for k in keys if keys.count(k) > 1]
  for paper, expected in EXPECTED.items():
    assert {i.item for i in paper_items.ITEMS if i.paper == paper} == expected, paper
  for item in paper_items.ITEMS:
    assert re.fullmatch(r"(App\. )?(Table|Fig\.) \d+", item.item), item.item
    assert item.what and item.outputs, item.key
    assert all(d.endswith((".", ")")) and len(d) > 20 for d in item.deviations), item.key


def test_every_command_names_an_importable_module_and_configs_that_load():
  loaded = {}
  for item in paper_items.ITEMS:
    commands, smokes = _parts(item.command), _parts(item.smoke)
    # The smoke command is the same command: the same module or script, on the embedded world.
    program = lambda words: words[:3] if paper_items.module_of(words) else words[:2]
    assert [program(w) for w in smokes] == [program(w) for w in commands][: len(smokes)], item.key
    for words in commands + smokes:
      assert words[0] == "python", (item.key, words)
      module = paper_items.module_of(words)
      if module:
        importlib.import_module(module)
      else:
        assert os.path.isfile(os.path.join(ROOT, words[1])), (item.key, words[1])
      assert paper_items.WORKDIR in " ".join(words), (item.key, "no workdir")
      named = paper_items.config_of(words)
      if named is None:
        continue
      path, argument = named
      if named not in loaded:
        loaded[named] = load_config(os.path.join(ROOT, path), argument)
      config = loaded[named]
      for key, _ in _overrides(words):
        node = config
        for part in key.split("."):
          assert part in node, (item.key, key)  # an override names a key the config has
          node = node[part]
  # The commands of issue 41's items without a command before.
  by_key = {i.key: i for i in paper_items.ITEMS}
  assert "configs/mutual_appa1.py" in by_key["MK App. Table 1"].command
  assert "configs/mutual_appa3.py" in by_key["MK App. Table 3"].command
  assert "configs/mutual_appa4.py" in by_key["MK App. Table 4"].command
  assert "mutual.analyze" in by_key["MK App. Fig. 2"].command
  assert "mutual_imagenet.py:fig5" in by_key["MK Fig. 5"].command
  fig5 = loaded[("configs/mutual_imagenet.py", "fig5")]
  assert tuple(fig5.data.classes) == ("sock", "siamang", "crayfish")
  assert fig5.figure_classes == 3


def test_the_index_prints_as_a_table_markdown_and_json(capsys):
  assert paper_items.main([]) == 0
  table = capsys.readouterr().out.splitlines()
  count = len(paper_items.ITEMS)
  deviating = len(paper_items.with_deviations())
  assert len(table) == count + 2  # head, one line per item, the count
  assert table[-1].startswith(f"{count} items, {deviating} with deviations")
  assert max(len(line) for line in table) <= 160  # one screen
  assert paper_items.main(["--markdown"]) == 0
  rows = [x for x in capsys.readouterr().out.splitlines() if x.startswith("| ")]
  assert len(rows) == count + 1 and rows[0].startswith("| paper | item |")
  assert paper_items.main(["--json"]) == 0
  entries = json.loads(capsys.readouterr().out)
  assert [e["item"] for e in entries] == [i.item for i in paper_items.ITEMS]
  assert set(entries[0]) == {"paper", "item", "what", "command", "smoke", "outputs", "deviations"}
  assert paper_items.main(["--item", "MK App. Table 4"]) == 0
  assert "configs/mutual_appa4.py" in capsys.readouterr().out
  assert paper_items.main(["--item", "MK Table 99"]) == 2
  assert "No item 'MK Table 99'" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# Every smoke command, run.


def _distinct_smokes():
  """{smoke command: [items]}: items that share a smoke command share its run."""
  out = {}
  for item in paper_items.ITEMS:
    out.setdefault(item.smoke, []).append(item)
  return out


SMOKES = _distinct_smokes()


def _entry(words):
  """The command's in-process entry: a command module, or a script's module by its path (both
  have define_flags and main)."""
  module = paper_items.module_of(words)
  if module:
    found = importlib.import_module(module)
    if hasattr(found, "__path__"):  # a package: python -m runs its __main__
      found = importlib.import_module(f"{module}.__main__")
    return found, words[3:]
  spec = importlib.util.spec_from_file_location(
    os.path.splitext(os.path.basename(words[1]))[0], os.path.join(ROOT, words[1])
  )
  found = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(found)
  return found, words[2:]


@pytest.mark.slow
@pytest.mark.parametrize(
  "smoke", list(SMOKES), ids=[" + ".join(i.key for i in items) for items in SMOKES.values()]
)
def test_every_smoke_command_writes_its_items_outputs(smoke, tmp_path, monkeypatch, capsys):
  workdir = str(tmp_path / "run")
  os.makedirs(workdir)  # a script's --json names a file in it (the commands claim it as is)
  monkeypatch.chdir(ROOT)  # configs/... paths resolve, as from the repository root
  start = time.perf_counter()
  for words in _parts(smoke.replace(paper_items.WORKDIR, workdir)):
    module, args = _entry(words)
    code = cli.run_in_process(module, args)
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
  seconds = time.perf_counter() - start
  written = [
    os.path.relpath(os.path.join(folder, name), workdir)
    for folder, _, names in os.walk(workdir)
    for name in names
  ]
  for item in SMOKES[smoke]:
    for output in item.outputs:
      pattern = re.sub(r"<[a-z]+>", "*", output)
      found = [w for w in written if fnmatch.fnmatch(w, pattern)]
      assert found, (item.key, output, sorted(written)[:40])
      assert all(os.path.getsize(os.path.join(workdir, w)) > 0 for w in found)
  print(f"{seconds:.1f} s: {smoke}")


def test_the_design_document_holds_the_generated_index(tmp_path, capsys):
  with open(os.path.join(ROOT, "docs", "design.md"), encoding="utf-8") as f:
    text = f.read()
  assert paper_items.docs_region(text) == paper_items.markdown_table().strip("\n")
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    readme = f.read()
  compact = paper_items.docs_region(readme, paper_items.COMPACT_MARKERS)
  assert compact == paper_items.compact_table().strip("\n")
  assert len(compact.splitlines()) == 2 + len(paper_items.ITEMS)
  # --write_docs rewrites only the region; a document without the markers is refused.
  stale = tmp_path / "doc.md"
  stale.write_text(f"head\n{paper_items.MARKERS[0]}\nold\n{paper_items.MARKERS[1]}\ntail\n")
  assert paper_items.main(["--write_docs", str(stale)]) == 0
  written = stale.read_text()
  assert written.startswith("head\n") and written.endswith("tail\n")
  assert paper_items.docs_region(written) == paper_items.markdown_table().strip("\n")
  bare = tmp_path / "bare.md"
  bare.write_text("no markers\n")
  capsys.readouterr()
  assert paper_items.main(["--write_docs", str(bare)]) == 2
  assert "needs <!-- paper_items -->" in capsys.readouterr().err
