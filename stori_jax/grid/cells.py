"""A grid config expanded into cells: one full few-shot train config per (dataset, shots,
method, seed).

A grid config (configs/grid_synthetic.py, configs/table2.py) holds:

* `base.config_file`: the few-shot config file of a cell, `path[:argument]`, where `{dataset}`
  and `{shots}` are replaced per cell (`configs/{dataset}.py:shots={shots}`); a path relative to
  the current folder, as `--config` takes it;
* `base.overrides`: config values set in every cell (nested like the few-shot config:
  `overrides.model.source`, `overrides.epochs`);
* `datasets`, `shots`, `seeds`: the axes (the grid sets `shots` and `seed` of each cell; a
  cell's `data.name` must be its dataset);
* `methods`: the table's rows, in order, each named in `method_settings`: a label, the prompts
  it uses (the paper's "Text" column), its own `overrides` (`method=taskres`,
  `prompts.use_cupl=False`), and which accuracy of a cell's metrics.json it reports: "trained",
  or "zero_shot" read from the cells of the trained method `reads` names (the zero-shot
  classifier of the same prompts, all weights 1, which every run measures before training);
* `std_ddof`: the ddof of the standard deviation over seeds (0: numpy's default, as Dassl's
  tools/parse_test_res.py, which CoOp and TaskRes use; the paper does not say);
* optionally `sweep` (`key`, `values`, `label`): one more axis, a few-shot config key set to
  each of `values` in turn (configs/fig10.py: `start_block` 1..12). Every method becomes one row
  per value, named `<method>_<leaf of key><value>` (`stori_start_block7`, so the cells live in
  `<dataset>/<shots>shot/stori_start_block7/seed<k>`) and shown as `<label> (<sweep label> =
  <value>)`; a zero-shot row reads the row of its method at the same value. The driver then
  also draws accuracy against the values (`grid.figure`). Without `sweep` (or with an empty
  `sweep.key`) the rows are config.methods as they are;
* optionally `average_column` (default True): whether the tables end with the average of the
  datasets (SToRI Table 2 has one, Table 1 none).

Each cell's learning rate is the paper's rule (`paper_config.resolve_learning_rate`, App. A.1),
filled in here as the trainer would; a rate the config sets is kept, and the cell records
whether it is the paper's (`Cell.lr_source`), which the tables show.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import os
import re
from typing import Any, Iterator

import ml_collections
from absl import logging

from stori_jax.plumbing import paths
from stori_jax.plumbing.config_files import ConfigChecks, ConfigError, load_config
from stori_jax.fewshot import methods, paper_config, trainer

#: The most cells a grid builds and runs unless told otherwise (run_grid's --max_cells): the
#: paper's largest grid (Table 2, either backbone) has 270.
MAX_CELLS = 10_000
#: What a row reports from a cell's metrics.json.
ACCURACIES = ("trained", "zero_shot")
#: Few-shot config keys the grid sets per cell: an override of them is refused.
AXES = ("shots", "seed", "data.name")
#: What a sweep value may be written as in a cell's folder name.
_SWEEP_VALUE = re.compile(r"[A-Za-z0-9.+-]+")


@dataclasses.dataclass(frozen=True)
class Method:
  """A row of the tables."""

  name: str
  label: str
  text: str  # the prompts (the paper's "Text" column: "Base", "Base+CuPL")
  accuracy: str  # "trained" or "zero_shot"
  reads: str  # the trained method whose cells hold its accuracy (its own name when trained)
  overrides: ml_collections.ConfigDict
  sweep_value: Any = None  # the row's value of config.sweep.key (None: the grid has no sweep)
  family: str = ""  # the config.methods entry the row is one value of ("": its own name)

  @property
  def trained(self) -> bool:
    return self.reads == self.name


@dataclasses.dataclass(frozen=True)
class Cell:
  """One few-shot run of the grid."""

  dataset: str
  shots: int
  method: str
  seed: int
  config: ml_collections.ConfigDict  # the full few-shot config, its learning rate filled in
  base_file: str  # config.base.config_file for this cell (path[:argument])
  lr: float  # the learning rate the run trains with
  lr_key: str  # the method's learning-rate key (`FewShotMethod.lr_key`: "optim.lr", "taskres.lr")
  paper_lr: float | None  # App. A.1's rate for the cell, None where the paper gives none

  @property
  def path(self) -> str:
    """The cell's workdir below the grid's: <dataset>/<shots>shot/<method>/seed<k>."""
    return os.path.join(self.dataset, f"{self.shots}shot", self.method, f"seed{self.seed}")

  @property
  def lr_source(self) -> str:
    """ "paper" when the rate is App. A.1's for the cell, else "config"."""
    return "paper" if self.paper_lr is not None and self.lr == self.paper_lr else "config"


def _strings(checks: ConfigChecks, key: str) -> tuple[str, ...] | None:
  value = checks.get(key)
  ok = (
    isinstance(value, (tuple, list))
    and len(value) > 0
    and all(isinstance(v, str) and v.strip() for v in value)
    and len(set(value)) == len(value)
  )
  if not ok:
    checks.problem(f"config.{key} must be a tuple of one or more distinct names, got {value!r}")
    return None
  return tuple(value)


def _leaves(tree: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
  """(dotted key, value) of every leaf of a nested ConfigDict or dict."""
  for key, value in tree.items():
    if hasattr(value, "items"):
      yield from _leaves(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}", value


def sweep_key(grid: ml_collections.ConfigDict) -> str:
  """config.sweep.key: the few-shot config key the grid sweeps ("" when it has no sweep)."""
  sweep = grid.get("sweep")
  return str(sweep.get("key") or "") if hasattr(sweep, "get") else ""


def _check_sweep(checks: ConfigChecks, grid: ml_collections.ConfigDict) -> str:
  """The sweep's key ("" for none) after checking config.sweep's values."""
  if "sweep" not in grid:
    return ""
  if not hasattr(grid.sweep, "items"):
    checks.problem(f"config.sweep must be a ConfigDict (key, values, label), got {grid.sweep!r}")
    return ""
  key = checks.text("sweep.key")
  if not key:
    return ""
  checks.text("sweep.label", nonempty=True)
  if key in AXES or key == "name":
    checks.problem(
      f"config.sweep.key is {key!r}, which the grid sets per cell already (config.datasets, "
      f"config.shots, config.seeds); sweep another few-shot config key"
    )
  values = checks.get("sweep.values")
  ok = isinstance(values, (tuple, list)) and len(values) > 0
  ok = ok and all(isinstance(v, (bool, int, float, str)) for v in values)
  ok = ok and len({value_text(v) for v in values}) == len(values)
  if not ok:
    checks.problem(
      f"config.sweep.values must be a tuple of one or more distinct numbers, booleans or "
      f"strings, got {values!r}"
    )
  else:
    bad = [v for v in values if not _SWEEP_VALUE.fullmatch(value_text(v))]
    if bad:
      checks.problem(
        f"config.sweep.values {bad!r} cannot name a cell's folder (letters, digits, '.', '+' "
        f"and '-' only)"
      )
  return key


def value_text(value: Any) -> str:
  """A sweep value as rows, folders and figures show it (a float in %g)."""
  return f"{value:g}" if isinstance(value, float) else str(value)


def validate_config(grid: ml_collections.ConfigDict) -> None:
  """Checks the grid's own values before any cell is built; one ConfigError names them all."""
  checks = ConfigChecks(grid)
  swept = _check_sweep(checks, grid)
  if "average_column" in grid:
    checks.boolean("average_column")
  checks.text("name")
  template = checks.text("base.config_file", nonempty=True)
  if template is not None:
    try:
      template.format(dataset="d", shots=1)
    except (KeyError, IndexError, ValueError) as e:
      checks.problem(
        f"config.base.config_file {template!r} may hold only {{dataset}} and {{shots}} "
        f"(replaced per cell), got an error formatting it: {e!r}"
      )
  overrides = checks.get("base.overrides")
  if not hasattr(overrides, "items"):
    checks.problem(f"config.base.overrides must be a ConfigDict, got {overrides!r}")
  _strings(checks, "datasets")
  checks.integers("shots", minimum=1, distinct=True)
  checks.integers("seeds", minimum=0, distinct=True)
  checks.integer("std_ddof", minimum=0, maximum=1)
  methods = _strings(checks, "methods") or ()
  settings = checks.get("method_settings", {})
  for name in methods:
    if name not in settings:
      near = difflib.get_close_matches(name, list(settings), n=1)
      checks.problem(
        f"config.methods names {name!r}, which config.method_settings does not define"
        + (f" (did you mean {near[0]!r}?)" if near else f" (it defines {sorted(settings)})")
      )
      continue
    key = f"method_settings.{name}"
    checks.text(f"{key}.label", nonempty=True)
    checks.text(f"{key}.text")
    checks.choice(f"{key}.accuracy", ACCURACIES)
    reads = checks.text(f"{key}.reads")
    if reads and reads != name:
      source = settings.get(reads)
      if reads not in methods or source is None or source.get("reads", "") not in ("", reads):
        checks.problem(
          f"config.{key}.reads is {reads!r}: it must name a trained method of config.methods "
          f"(one whose own reads is ''), whose cells hold this row's accuracy"
        )
    method_overrides = checks.get(f"{key}.overrides")
    if not hasattr(method_overrides, "items"):
      checks.problem(f"config.{key}.overrides must be a ConfigDict, got {method_overrides!r}")
    elif reads and reads != name and len(method_overrides):
      checks.problem(
        f"config.{key} reads the cells of {reads!r} and runs none of its own, so its overrides "
        f"would change nothing; leave them empty"
      )
  for where, tree in [("base.overrides", overrides)] + [
    (f"method_settings.{n}.overrides", settings[n].get("overrides"))
    for n in methods
    if n in settings
  ]:
    if hasattr(tree, "items"):
      for key, _ in _leaves(tree):
        if key in AXES or key == "name":
          checks.problem(
            f"config.{where}.{key}: the grid sets {key} per cell (config.datasets, config.shots, "
            f"config.seeds); change the grid's axis instead"
          )
        elif swept and (key == swept or key.startswith(swept + ".")):
          checks.problem(
            f"config.{where}.{key}: the grid sets {swept} per row (config.sweep.values); "
            f"change the sweep's values instead"
          )
  checks.raise_if_any()


def _with_leaf(overrides: Any, key: str, value: Any) -> ml_collections.ConfigDict:
  """A copy of the nested `overrides` with the dotted `key` set to `value` (the grid's configs
  are locked: a key cannot be added to them in place)."""
  tree = overrides.to_dict() if hasattr(overrides, "to_dict") else copy.deepcopy(dict(overrides))
  node = tree
  parts = key.split(".")
  for part in parts[:-1]:
    node = node.setdefault(part, {})
  node[parts[-1]] = value
  return ml_collections.ConfigDict(tree)


def swept_name(name: str, key: str, value: Any) -> str:
  """The row (and cell folder) name of method `name` at a sweep value: stori_start_block7."""
  return f"{name}_{key.rpartition('.')[2]}{value_text(value)}"


def grid_methods(grid: ml_collections.ConfigDict) -> list[Method]:
  """The rows of the tables, in config.methods' order; with a sweep, each method's rows follow
  one another in config.sweep.values' order."""
  key = sweep_key(grid)
  methods = []
  for name in grid.methods:
    setting = grid.method_settings[name]
    method = Method(
      name=name,
      label=setting.label,
      text=setting.get("text", ""),
      accuracy=setting.accuracy,
      reads=setting.get("reads") or name,
      overrides=setting.get("overrides", ml_collections.ConfigDict()),
    )
    if not key:
      methods.append(method)
      continue
    # ["values"]: ConfigDict's attribute `values` is its dict method.
    for value in grid.sweep["values"]:
      # A row that reads another method's cells runs none of its own: no overrides.
      overrides = _with_leaf(method.overrides, key, value) if method.trained else method.overrides
      methods.append(
        dataclasses.replace(
          method,
          name=swept_name(name, key, value),
          reads=swept_name(method.reads, key, value),
          overrides=overrides,
          sweep_value=value,
          family=name,
        )
      )
  return methods


def base_file(grid: ml_collections.ConfigDict, dataset: str, shots: int) -> str:
  """config.base.config_file for one cell: `{dataset}` and `{shots}` replaced."""
  return grid.base.config_file.format(dataset=dataset, shots=shots)


def load_base(spec: str) -> ml_collections.ConfigDict:
  """The few-shot config of `path[:argument]`, as `--config path[:argument]` builds it.

  Raises:
    ConfigError: no such file, or its get_config refuses the argument.
  """
  path, _, argument = spec.partition(":")
  if not paths.isfile(path):
    raise ConfigError(
      f"config.base.config_file: no config file {path} (from {spec!r}, in {os.getcwd()}); a "
      f"relative path is read from the current folder: run from the repository root or give "
      f"an absolute path"
    )
  try:
    return load_config(path, argument or None)
  except ConfigError as e:
    raise ConfigError(f"config.base.config_file {spec!r}: {e}") from None


def _all_keys(config: Any) -> list[str]:
  return [key for key, _ in _leaves(config)]


def apply_overrides(config: ml_collections.ConfigDict, overrides: Any, where: str) -> None:
  """Sets every leaf of the nested `overrides` in `config`; `where` names them in messages.

  Raises:
    ConfigError: a key the few-shot config does not have (the nearest named), or a value of
      another type than the config's.
  """
  for key, value in _leaves(overrides):
    node = config
    parts = key.split(".")
    for depth, part in enumerate(parts):
      last = depth == len(parts) - 1
      if part not in node or (not last and not hasattr(node[part], "items")):
        near = difflib.get_close_matches(key, _all_keys(config), n=1, cutoff=0.6)
        raise ConfigError(
          f"config.{where}.{key}: the few-shot config has no key {key!r}"
          + (f" (did you mean {near[0]!r}?)" if near else "")
          + "; overrides must name an existing key of config.base.config_file's config"
        )
      if not last:
        node = node[part]
    try:
      node[parts[-1]] = value
    except (TypeError, ValueError) as e:
      raise ConfigError(f"config.{where}.{key} = {value!r}: {e}") from None


def paper_learning_rate(config: ml_collections.ConfigDict) -> float | None:
  """App. A.1's learning rate for a cell's config (its method's `paper_learning_rate`: SToRI's
  by dataset, shots and backbone, TaskRes's by dataset), or None where the paper gives none
  (another dataset, shot count or model, or a method not in the paper)."""
  dataset, shots = str(config.data.name), int(config.shots)
  if dataset not in paper_config.DATASETS or shots not in paper_config.SHOTS:
    return None
  return methods.of(config).paper_learning_rate(config)


def make_cell(
  grid: ml_collections.ConfigDict,
  base: ml_collections.ConfigDict,
  spec: str,
  dataset: str,
  shots: int,
  method: Method,
  seed: int,
) -> Cell:
  """One cell: the base config with the grid's and the method's overrides, the cell's shots and
  seed, checked (`trainer.validate_config`) and its learning rate filled in.

  Raises:
    ConfigError: the cell's config is not a valid few-shot config, or is of another dataset.
  """
  config = copy.deepcopy(base)
  apply_overrides(config, grid.base.overrides, "base.overrides")
  apply_overrides(config, method.overrides, f"method_settings.{method.name}.overrides")
  path = os.path.join(dataset, f"{shots}shot", method.name, f"seed{seed}")
  if config.data.name != dataset:
    raise ConfigError(
      f"cell {path}: {spec!r} builds a config of the dataset {config.data.name!r}, not "
      f"{dataset!r} (config.datasets); config.base.config_file must give each dataset its own "
      f"config, e.g. 'configs/{{dataset}}.py:shots={{shots}}'"
    )
  config.shots = shots
  config.seed = seed
  config.name = f"{grid.get('name') or 'grid'}/{path}"
  try:
    trainer.validate_config(config)
  except ConfigError as e:
    raise ConfigError(f"cell {path} ({spec} with the grid's overrides): {e}") from None
  config = paper_config.resolve_learning_rate(config)
  lr_key = methods.of(config).lr_key
  lr = methods.of(config).learning_rate(config)
  paper_lr = paper_learning_rate(config)
  if paper_lr is not None and lr != paper_lr:
    logging.warning(
      "cell %s trains with config.%s = %g, not App. A.1's %g (set by the config)",
      path,
      lr_key,
      lr,
      paper_lr,
    )
  if dataset in paper_config.DATASETS and config.epochs != (200 if shots >= 8 else 100):
    logging.warning(
      "cell %s trains %d epochs; the paper trains 100 at 1/2/4 shots and 200 at 8/16 (does "
      "config.base.config_file pass {shots} to the config file?)",
      path,
      config.epochs,
    )
  return Cell(dataset, shots, method.name, seed, config, spec, lr, lr_key, paper_lr)


def count(grid: ml_collections.ConfigDict) -> int:
  """How many cells the grid trains, from its axes alone (no cell is built): datasets x shots
  x trained rows x seeds.

  Raises:
    ConfigError: a bad grid value.
  """
  validate_config(grid)
  rows = sum(1 for m in grid_methods(grid) if m.trained)
  return len(grid.datasets) * len(grid.shots) * rows * len(grid.seeds)


def check_size(grid: ml_collections.ConfigDict, max_cells: int) -> int:
  """The grid's cell count (`count`), refused when above `max_cells`: each cell is a whole
  few-shot run, and a grid of millions (a seed range written too wide) would fill the memory
  before the first cell trained.

  Raises:
    ConfigError: a bad grid value, or more than `max_cells` cells (the message gives the count,
      its factors and the flag that allows it).
  """
  total = count(grid)
  if total > max_cells:
    rows = sum(1 for m in grid_methods(grid) if m.trained)
    factors = [
      (len(grid.datasets), "dataset"),
      (len(grid.shots), "shot count"),
      (rows, "trained row"),
      (len(grid.seeds), "seed"),
    ]
    shown = " x ".join(f"{n:,} {what}{'s' if n != 1 else ''}" for n, what in factors)
    raise ConfigError(
      f"the grid has {total:,} cells ({shown}), more than --max_cells={max_cells:,}; each cell "
      f"is a whole few-shot run, so nothing was built or run. Shrink config.datasets, "
      f"config.shots, config.seeds or config.methods"
      + (" (or config.sweep.values)" if sweep_key(grid) else "")
      + f", or pass --max_cells={total} to go on all the same."
    )
  return total


def iter_cells(grid: ml_collections.ConfigDict) -> Iterator[Cell]:
  """`expand`'s cells one at a time, each built when it is asked for (a base config file is
  read once)."""
  validate_config(grid)
  bases: dict[str, ml_collections.ConfigDict] = {}
  methods = [m for m in grid_methods(grid) if m.trained]
  for dataset in grid.datasets:
    for shots in grid.shots:
      spec = base_file(grid, dataset, shots)
      if spec not in bases:
        bases[spec] = load_base(spec)
      for method in methods:
        for seed in grid.seeds:
          yield make_cell(grid, bases[spec], spec, dataset, shots, method, seed)


def plan(grid: ml_collections.ConfigDict) -> Iterator[Cell]:
  """The cells in `expand`'s order for a listing, one at a time: one full cell is built per
  dataset, shot count and row (the seed decides neither the checks nor the learning rate), and
  the others are that cell with their own seed and `config` None. A grid of millions of cells
  is listed in seconds, in constant memory.

  Raises:
    ConfigError: as `expand`.
  """
  validate_config(grid)
  bases: dict[str, ml_collections.ConfigDict] = {}
  methods = [m for m in grid_methods(grid) if m.trained]
  for dataset in grid.datasets:
    for shots in grid.shots:
      spec = base_file(grid, dataset, shots)
      if spec not in bases:
        bases[spec] = load_base(spec)
      for method in methods:
        first = make_cell(grid, bases[spec], spec, dataset, shots, method, grid.seeds[0])
        yield first
        for seed in grid.seeds[1:]:
          yield dataclasses.replace(first, seed=seed, config=None)


def expand(grid: ml_collections.ConfigDict, max_cells: int | None = None) -> list[Cell]:
  """Every cell that trains, dataset by dataset, then shots, method (rows' order) and seed.

  Rows that read another method's cells (the zero-shot row) add none.

  Args:
    grid: the grid config.
    max_cells: refuse a grid of more cells than this (`check_size`) before building any;
      None: no limit.

  Raises:
    ConfigError: a bad grid value, too many cells, or a cell whose config is not valid, before
      any work.
  """
  if max_cells is not None:
    check_size(grid, max_cells)
  return list(iter_cells(grid))
