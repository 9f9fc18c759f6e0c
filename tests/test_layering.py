"""The import graph as docs/design.md draws it ("Naming" and "Layering rules"): every import of
`stori_jax` and `mutual`, function-local ones included, points down the layers; no cycle; only
commands end with a `__main__` guard, no library imports a command, and no library shares a
command's name; the stori_jax root holds commands only, no two modules of a folder name one idea
twice, and every command's library is in design.md's table."""

from __future__ import annotations

import ast
import collections
import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("stori_jax", "mutual")

#: The layers of docs/design.md, lowest first. A unit is a top-level module or a subpackage
#: (`stori_jax.fewshot`, `mutual.pipeline`); it may import units of lower layers only.
LAYERS = (
  (
    "stori_jax.plumbing",
    "stori_jax.clip",
    "stori_jax.plumbing.errors",
    "stori_jax.plumbing.profiling",
  ),
  ("stori_jax.plumbing.paths",),
  ("stori_jax.plumbing.jsonio",),
  (
    "stori_jax.plumbing.plotting",
    "stori_jax.plumbing.config_files",
    "stori_jax.clip.preprocess",
    "stori_jax.tokenizer",
    "stori_jax.models",
  ),
  ("stori_jax.plumbing.multihost", "stori_jax.data"),
  ("stori_jax.plumbing.run_identity", "stori_jax.checkpoints", "stori_jax.clip.bundle"),
  ("stori_jax.plumbing.cli", "stori_jax.clip.loading", "stori_jax.trainloop"),
  ("stori_jax", "stori_jax.clip.encoding", "stori_jax.reference"),
  ("stori_jax.retrieval", "stori_jax.fewshot"),
  ("stori_jax.world_evaluation", "stori_jax.explorer"),
  ("stori_jax.pretraining",),
  ("stori_jax.grid",),
  # mutual builds on stori_jax; its stages first, then what runs them. `mutual.reference` (the
  # authors' pipeline in PyTorch) imports nothing of mutual: it is the independent check.
  # mt19937 replays the reference's generators for the stages.
  ("mutual.mt19937",),
  (
    "mutual.reference",
    "mutual.ellipse",
    "mutual.information",
    "mutual.transport",
    "mutual.descriptors",
    "mutual.features",
    "mutual.foreground",
    "mutual.concepts",
  ),
  ("mutual.crf", "mutual.visual_prompts"),
  ("mutual.xai", "mutual.report", "mutual.data"),
  ("mutual.paper_config", "mutual.report_html"),
  ("mutual.pipeline", "mutual.baselines"),
  ("mutual.protocols", "mutual.run_flags"),
  (
    "mutual",
    "mutual.analysis",
    "mutual.evaluation",
    "mutual.sweep",
    "mutual.text_bank",
    "mutual.explanation",
  ),
  # Commands: thin entries over everything below.
  (
    "stori_jax.train",
    "stori_jax.pretrain",
    "stori_jax.retrieve",
    "stori_jax.explore",
    "stori_jax.embed",
    "stori_jax.convert",
    "stori_jax.parity",
    "stori_jax.start_block",
    "stori_jax.list_models",
    "stori_jax.evaluate_world",
    "stori_jax.run_grid",
    "stori_jax.contrast",
    "mutual.analyze",
    "mutual.explain",
    "mutual.evaluate",
    "mutual.export",
  ),
)
LEVEL = {unit: level for level, units in enumerate(LAYERS) for unit in units}

#: The modules run with `python -m`: they and only they end with a `__main__` guard.
COMMANDS = {unit for unit in LAYERS[-1]} | {"mutual.sweep.__main__"}
#: Packages that group modules of several layers: each of their modules is a unit of its own.
CONTAINERS = ("stori_jax.plumbing", "stori_jax.clip")


def _modules() -> dict[str, str]:
  """Dotted module name -> file path, for every module of the two packages."""
  found = {}
  for package in PACKAGES:
    for folder, _, files in os.walk(os.path.join(REPO, package)):
      for name in files:
        if not name.endswith(".py"):
          continue
        path = os.path.join(folder, name)
        parts = os.path.relpath(path, REPO)[:-3].split(os.sep)
        if parts[-1] == "__init__":
          parts = parts[:-1]
        found[".".join(parts)] = path
  return found


MODULES = _modules()


def _unit(module: str) -> str:
  parts = module.split(".")
  return ".".join(parts[:3] if ".".join(parts[:2]) in CONTAINERS else parts[:2])


def _imports(module: str, path: str) -> list[tuple[str, int]]:
  """(imported module of the two packages, line) for every import in the file."""
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read())
  package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parts = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(parts + ([base] if base else []))
      names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
    else:
      continue
    found += [(name, node.lineno) for name in names if name.split(".")[0] in PACKAGES]
  return found


EDGES = [
  (module, target, line)
  for module, path in sorted(MODULES.items())
  for target, line in _imports(module, path)
]


def test_every_unit_has_a_layer():
  missing = sorted({_unit(m) for m in MODULES} - set(LEVEL))
  assert not missing, f"units with no layer (add them to LAYERS and docs/design.md): {missing}"


def test_imports_point_down_the_layers():
  wrong = [
    f"{MODULES[module]}:{line}: {_unit(module)} -> {_unit(target)}"
    for module, target, line in EDGES
    if _unit(module) != _unit(target) and LEVEL.get(_unit(target), 0) >= LEVEL.get(_unit(module), 0)
  ]
  assert not wrong, "imports that run up or across the layers:\n" + "\n".join(wrong)


def test_stori_jax_never_imports_mutual():
  wrong = [
    f"{module}:{line} -> {target}"
    for module, target, line in EDGES
    if module.startswith("stori_jax") and target.startswith("mutual")
  ]
  assert not wrong, wrong


def test_no_cycle_between_units():
  graph = collections.defaultdict(set)
  for module, target, _ in EDGES:
    if _unit(module) != _unit(target):
      graph[_unit(module)].add(_unit(target))
  done, active = set(), []

  def visit(unit):
    if unit in active:
      raise AssertionError("cycle: " + " -> ".join(active[active.index(unit) :] + [unit]))
    if unit in done:
      return
    active.append(unit)
    for target in sorted(graph[unit]):
      visit(target)
    active.pop()
    done.add(unit)

  for unit in sorted(graph):
    visit(unit)


def _has_main_guard(path: str) -> bool:
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read())
  return any(
    isinstance(node, ast.If)
    and isinstance(node.test, ast.Compare)
    and isinstance(node.test.left, ast.Name)
    and node.test.left.id == "__name__"
    for node in tree.body
  )


def test_only_commands_have_a_main_guard():
  guarded = {module for module, path in MODULES.items() if _has_main_guard(path)}
  assert guarded == COMMANDS, (
    f"main guard but not a command: {sorted(guarded - COMMANDS)}; "
    f"command without one: {sorted(COMMANDS - guarded)}"
  )


def test_no_library_imports_a_command():
  wrong = [
    f"{module}:{line} -> {target}"
    for module, target, line in EDGES
    if target in COMMANDS and module not in COMMANDS
  ]
  assert not wrong, wrong


def test_configs_import_no_command():
  wrong = []
  for name in sorted(os.listdir(os.path.join(REPO, "configs"))):
    if name.endswith(".py"):
      path = os.path.join(REPO, "configs", name)
      wrong += [
        f"{name}:{line} -> {t}"
        for t, line in _imports("configs." + name[:-3], path)
        if t in COMMANDS
      ]
  assert not wrong, wrong


def test_no_library_module_shares_a_command_name():
  stems = {command.split(".")[-1] for command in COMMANDS if not command.endswith("__main__")}
  clashes = sorted(
    module for module in MODULES if module not in COMMANDS and module.split(".")[-1] in stems
  )
  assert not clashes, f"library modules named like a command: {clashes}"


@pytest.mark.parametrize(
  "unit", ["stori_jax.models", "stori_jax.tokenizer", "stori_jax.plumbing.errors"]
)
def test_the_bottom_layers_import_nothing_above_them(unit):
  # The rule the layers encode, spelled out for the layers every other one builds on.
  above = [t for m, t, _ in EDGES if _unit(m) == unit and LEVEL[_unit(t)] > LEVEL[unit]]
  assert not above, above


def _local_imports(path: str) -> list[tuple[int, str, str]]:
  """(line, module, the import's line and the one above it) of every import inside a function."""
  with open(path, encoding="utf-8") as f:
    text = f.read()
  lines = text.splitlines()
  found = []
  for function in ast.walk(ast.parse(text)):
    if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
      for node in ast.walk(function):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not getattr(node, "level", 0):
          module = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
          context = lines[node.lineno - 2] + "\n" + lines[node.lineno - 1]
          found.append((node.lineno, module, context))
  return found


def test_function_local_imports_say_why():
  # Inside a function only an optional dependency (an extra) or a slow import that few paths
  # need, and the line says which ("# optional: ..." / "# lazy: ..."); never the project's own
  # modules, whose order the layers already fix.
  wrong = []
  for module, path in sorted(MODULES.items()):
    for line, imported, context in _local_imports(path):
      reason = "# optional:" in context or "# lazy:" in context
      own = imported.split(".")[0] in PACKAGES
      if reason and not (own and "# lazy: after jax.distributed" not in context):
        continue
      wrong.append(f"{path}:{line}: {imported}")
  assert not wrong, "function-local imports without a reason, or of the project:\n" + "\n".join(
    wrong
  )


#: Endings that make two names one idea ("analyze"/"analysis", "export"/"exported").
INFLECTIONS = {"", "e", "s", "es", "ed", "er", "or", "ing", "ion", "ions", "ation", "ze", "se"}
INFLECTIONS |= {"sis", "ive", "ment", "al"}


def _same_idea(a: str, b: str) -> bool:
  common = os.path.commonprefix([a, b])
  return len(common) >= 4 and {a[len(common) :], b[len(common) :]} <= INFLECTIONS


def test_no_two_modules_of_a_folder_differ_by_an_inflection():
  by_folder = collections.defaultdict(list)
  for module in MODULES:
    path = MODULES[module]
    if not path.endswith("__init__.py"):
      by_folder[os.path.dirname(path)].append(module.rsplit(".", 1)[-1])
  clashes = [
    f"{os.path.relpath(folder, REPO)}: {a}.py / {b}.py"
    for folder, names in sorted(by_folder.items())
    for i, a in enumerate(sorted(names))
    for b in sorted(names)[i + 1 :]
    if _same_idea(a, b)
  ]
  assert not clashes, "modules whose names say the same thing (name the library by its noun):\n" + (
    "\n".join(clashes)
  )


def test_the_inflection_rule_catches_what_it_should():
  assert _same_idea("analyze", "analysis") and _same_idea("export", "exported")
  assert _same_idea("evaluate", "evaluation")
  assert not _same_idea("report", "report_html") and not _same_idea("data", "datasets")


def test_the_stori_jax_root_holds_commands_only():
  root = [m for m in MODULES if m.count(".") == 1 and m.startswith("stori_jax.")]
  libraries = [m for m in root if m not in COMMANDS and os.path.isfile(MODULES[m])]
  libraries = [m for m in libraries if not MODULES[m].endswith("__init__.py")]
  assert not libraries, (
    f"library modules in the stori_jax root (move them to a subpackage): {libraries}"
  )


def _command_libraries() -> dict[str, list[str]]:
  """docs/design.md's "command | library" table: command -> the library paths it names."""
  with open(os.path.join(REPO, "docs", "design.md"), encoding="utf-8") as f:
    text = f.read()
  table = text[text.index("| command | library |") :].split("\n\n", 1)[0]
  found = {}
  for row in table.splitlines()[2:]:
    cells = [c.strip() for c in row.strip("| ").split("|")]
    commands = [c.strip("` ") for c in cells[0].split(",")]
    paths = re_paths(cells[1])
    for command in commands:
      found[command] = paths
  return found


def re_paths(cell: str) -> list[str]:
  return re.findall(r"`([\w/]+(?:\.py|/))`", cell)


def test_every_command_has_its_library_in_the_design_table():
  table = _command_libraries()
  commands = {c.replace("stori_jax.", "").replace(".__main__", "") for c in COMMANDS}
  assert set(table) == commands, set(table) ^ commands
  for command, paths in table.items():
    package = "mutual" if command.startswith("mutual.") else "stori_jax"
    assert paths, command
    for path in paths:
      full = os.path.join(REPO, path if path.startswith("mutual/") else f"{package}/{path}")
      assert os.path.exists(full.rstrip("/")), f"{command}: {path} does not exist"
