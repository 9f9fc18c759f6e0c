"""Command-line plumbing shared by every `python -m stori_jax.X` / `mutual.X` entry point.

Every command module follows one convention:

  def define_flags(values: flags.FlagValues = flags.FLAGS) -> None: ...  # its flags, on `values`
  def main(argv: list[str], values: flags.FlagValues = flags.FLAGS) -> None: ...  # reads `values`
  if __name__ == "__main__":
    define_flags()
    cli.run(main)

Importing a command module defines no flag, so that commands with flags of the same name
(`--config`, `--workdir`) live in one process; `run_in_process(module, args)` runs one there
on fresh flags, with the same handling as `run`.

`run(main)` runs an absl main: a `UserError` (bad config, missing or malformed file, a workdir
made by another run, a prompt syntax error) prints `error: <message>` as one paragraph on stderr
and exits 2; any other exception is the project's own bug and keeps its traceback. Mistakes on
the command line itself are user errors too: a bad flag value, a missing config file, and an
override of a config key that does not exist (`--config.lr=...`: the nearest valid key is
named). Library INFO logs (orbax, JAX's backend probe) are off unless `--verbosity` is given.

Every command compiles a program once per machine: JAX's persistent compilation cache is on
(`profiling.use_compilation_cache`: ~/.cache/stori_jax/jax_cache, or the user's
JAX_COMPILATION_CACHE_DIR), unless `--compilation_cache=false` (a flag every command takes) or
STORI_COMPILATION_CACHE=0. A command that claimed a workdir writes `<workdir>/compilation.json`
when it ends (process 0): the programs it needed, those read from the cache, and the seconds
spent compiling (`profiling.compilation_record`).

A command that writes files ends its output with one "Wrote:" block, every path on its own
line (`print_outputs`), so that a user (or a script, `written_paths`) finds all of them.
"""

from __future__ import annotations

import copy
import difflib
import os
import re
import sys
from types import ModuleType
from typing import Any, Callable, Iterator, Sequence

from absl import app, flags
from absl import logging as absl_logging
from ml_collections.config_flags import config_flags, config_path

from stori_jax.plumbing import jsonio, profiling, run_identity
from stori_jax.plumbing import paths as storage
from stori_jax.plumbing.errors import UserError

EXIT_USER_ERROR = 2
#: What a command that claimed a workdir writes there about its compilations.
COMPILATION_FILE = "compilation.json"


def user_error_exit(error: BaseException) -> "SystemExit":
  """The SystemExit that reports `error` as a user's mistake (message on stderr, code 2)."""
  message = str(error).strip() or type(error).__name__
  print(f"error: {message}", file=sys.stderr)
  return SystemExit(EXIT_USER_ERROR)


def _verbosity_given(argv: Sequence[str]) -> bool:
  return any(a == "-v" or a.startswith(("--verbosity", "-v=", "--v=")) for a in argv[1:])


def _config_flags(values: flags.FlagValues) -> list[Any]:
  """The ml_collections config-file flags (--config and the like) defined in `values`."""
  # is_config_flag is meant for users but not re-exported by the package.

  found = [values[name] for name in values]
  return [
    f
    for f in found
    if config_flags.is_config_flag(f) and isinstance(f.parser, config_flags.ConfigFileFlagParser)
  ]


def _flag_argument(argv: Sequence[str], name: str) -> str | None:
  """The value given to --name (as --name=VALUE or --name VALUE), the last one wins."""
  value = None
  for i, arg in enumerate(argv[1:], start=1):
    match = re.fullmatch(rf"--?{re.escape(name)}(=(.*))?", arg)
    if match:
      value = match.group(2) if match.group(1) else (argv[i + 1] if i + 1 < len(argv) else None)
  return value


def _leaf_keys(tree: Any, prefix: str = "") -> Iterator[str]:
  """The dotted keys of the values of a (nested) ConfigDict or dict."""
  for key, value in tree.items():
    if hasattr(value, "items") and len(value):
      yield from _leaf_keys(value, f"{prefix}{key}.")
    else:
      yield prefix + str(key)


def _nearest_keys(key: str, known: list[str]) -> list[str]:
  """Known keys nearest to `key`: by the whole dotted path, else by its last part
  (`lr` -> `optim.lr`), the closest first."""
  near = difflib.get_close_matches(key, known, n=2, cutoff=0.6)
  if near:
    return near
  leaf = key.rsplit(".", 1)[-1]
  leaves = {k: k.rsplit(".", 1)[-1] for k in known}
  close = set(difflib.get_close_matches(leaf, list(leaves.values()), n=3, cutoff=0.6))
  ranked = [k for k in known if leaves[k] in close]
  return sorted(ranked, key=lambda k: -difflib.SequenceMatcher(None, key, k).ratio())[:2]


def _unknown_config_key(argv: Sequence[str], values: flags.FlagValues) -> str | None:
  """The message for an override of a config key that does not exist, if there is one."""
  for flag in _config_flags(values):
    source = _flag_argument(argv, flag.name)
    if source is None:
      continue
    try:
      config = flag.parser.parse(source)
    except Exception:  # pylint: disable=broad-except
      continue  # the file itself does not load: absl reports that
    known = list(_leaf_keys(config))
    for arg in argv[1:]:
      match = re.match(rf"--?(?:no)?{re.escape(flag.name)}\.([^=]+)", arg)
      if not match:
        continue
      key = match.group(1)
      try:
        config_path.get_value(key, config)
        continue
      except (AttributeError, KeyError, IndexError, ValueError):
        pass
      near = _nearest_keys(key, known)
      if near:
        hint = f"; did you mean --{flag.name}.{near[0]}" + (
          f" (or --{flag.name}.{near[1]})?" if len(near) > 1 else "?"
        )
      else:
        hint = f" (its keys: {', '.join(known[:40])}{', ...' if len(known) > 40 else ''})."
      return (
        f"{arg}: the config {source} has no key {key!r}{hint} Overrides must name an existing "
        f"key; nothing was run."
      )
  return None


def _missing_config_file(argv: Sequence[str], values: flags.FlagValues) -> str | None:
  """The message for a config flag naming a file that does not exist, if there is one."""
  for flag in _config_flags(values):
    source = _flag_argument(argv, flag.name)
    path = None if source is None else source.split(":", 1)[0]
    if path is not None and not os.path.isfile(path):
      return f"--{flag.name}: no config file {path}; pass the path of a .py config."
  return None


def _config_file_path(source: str) -> str:
  """The file of a config flag's value `source` (`file.py[:ARGUMENT]`, a URL's scheme kept)."""
  if storage.is_url(source):
    head, rest = source.split("://", 1)
    return f"{head}://{rest.split(':', 1)[0]}"
  return source.split(":", 1)[0]


def _not_a_config_file(argv: Sequence[str], values: flags.FlagValues) -> str | None:
  """The message for a config flag given a file that is no config file (a run record, a
  README, a JSON file), if there is one: named before the file is read or downloaded."""
  for flag in _config_flags(values):
    source = _flag_argument(argv, flag.name)
    if source is None:
      continue
    path = _config_file_path(source)
    if path.endswith(".py"):
      continue
    if os.path.basename(path.rstrip("/")) == run_identity.RUN_FILE:
      what = (
        f" {path} is the record a run keeps in its workdir (what it was run with, for the "
        "next run there to compare); to run it again, pass the config file it was started "
        "with and the same --workdir, which resumes it."
      )
    else:
      what = ""
    return (
      f"--{flag.name}: {path} is not a config file. A config file is a Python file (.py) "
      f"whose get_config() returns the settings, e.g. configs/demo.py (configs/ holds one per "
      f"experiment); values are changed with --{flag.name}.KEY=VALUE.{what} Nothing was run."
    )
  return None


def _broken_config_file(
  error: BaseException, given: Sequence[str], argv: Sequence[str], values: flags.FlagValues
) -> str | None:
  """The message for a config file that fails as Python (a syntax error, an unknown name)
  while it is loaded, naming the file as the user gave it (a URL, not its local copy) and the
  line; None when `error` was not raised by a config file's own code."""
  files = {}
  for flag in _config_flags(values):
    source, loaded = _flag_argument(given, flag.name), _flag_argument(argv, flag.name)
    if source is not None and loaded is not None:
      files[os.path.realpath(_config_file_path(loaded))] = (flag.name, _config_file_path(source))
  line = None
  if isinstance(error, SyntaxError) and error.filename:
    where = files.get(os.path.realpath(error.filename))
    line = error.lineno
  else:
    where, tb = None, error.__traceback__
    while tb is not None:  # the innermost frame in a config file
      found = files.get(os.path.realpath(tb.tb_frame.f_code.co_filename))
      if found:
        where, line = found, tb.tb_lineno
      tb = tb.tb_next
  if where is None:
    return None
  name, path = where
  text = error.msg if isinstance(error, SyntaxError) else str(error)
  return (
    f"--{name}: the config file {path} fails as Python at line {line} "
    f"({type(error).__name__}: {text}). A config file is a Python file whose get_config() "
    "returns the settings (e.g. configs/demo.py): fix that line. Nothing was run."
  )


def _local_config_files(argv: list[str], values: flags.FlagValues) -> list[str]:
  """`argv` with a config file given as a URL (--config=gs://.../x.py[:ARG]) replaced by a
  local copy of it: ml_collections imports config files from local paths only."""
  for flag in _config_flags(values):
    source = _flag_argument(argv, flag.name)
    if source is None or not storage.is_remote(source):
      continue
    path = _config_file_path(source)
    try:
      local = storage.local_copy(path, expect="file") + source[len(path) :]
    except FileNotFoundError:
      raise user_error_exit(UserError(f"--{flag.name}: no config file {path}")) from None
    except Exception as error:  # pylint: disable=broad-except  # classified, else raised
      problem = storage.describe_error(path, error, "read")
      if problem is None:
        raise
      raise user_error_exit(problem) from None
    argv = [a[: -len(source)] + local if a.endswith(f"={source}") else a for a in argv]
    argv = [local if a == source else a for a in argv]
  return argv


def parse_flags(argv: Sequence[str], values: flags.FlagValues = flags.FLAGS) -> list[str]:
  """absl's flag parsing of `argv` (program name first) into `values`, returning the other
  arguments, with command-line mistakes as one paragraph on stderr and exit code 2."""
  wrong = _not_a_config_file(argv, values)
  if wrong:
    raise user_error_exit(UserError(wrong))
  given = list(argv)
  argv = _local_config_files(list(argv), values)
  missing = _missing_config_file(argv, values)
  if missing:
    raise user_error_exit(UserError(missing))
  try:
    return values(argv)
  except (SyntaxError, NameError, TypeError, ImportError) as error:
    message = _broken_config_file(error, given, argv, values)
    if message is None:
      raise
    raise user_error_exit(UserError(message)) from None
  except flags.Error as error:
    # A config file's get_config raising (e.g. a bad `file.py:ARG`) arrives with the traceback
    # in the message: its last line names the problem.
    message = str(error)
    if "Error whilst parsing config file" in message:
      lines = [line for line in message.splitlines() if line.strip()]
      flag = message.split(": Error whilst", 1)[0]
      message = f"{flag}: the config file refused its argument: {lines[-1]}"
    raise user_error_exit(UserError(f"{message} (see --helpshort)")) from None
  except (AttributeError, KeyError, IndexError) as error:
    message = _unknown_config_key(argv, values)
    if message is None:
      raise
    raise user_error_exit(UserError(message)) from error


def define_compilation_cache_flag(values: flags.FlagValues) -> None:
  """--compilation_cache on `values` (once): every command takes it."""
  if "compilation_cache" not in values:
    flags.DEFINE_bool(
      "compilation_cache",
      profiling.compilation_cache_default(),
      "Keep compiled XLA programs in JAX's persistent compilation cache (JAX_COMPILATION_CACHE_DIR, "
      f"else {profiling.default_cache_dir()}), so that a second run of the same shapes on this "
      "machine compiles nothing. Default on, unless STORI_COMPILATION_CACHE=0.",
      flag_values=values,
    )


def _write_compilation_record(
  workdirs: Sequence[str],
  compiled: profiling.Compilations,
  cache_dir: str | None,
  off_reason: str | None = None,
) -> None:
  """compilation.json in the first workdir the command claimed (its own; a grid's cells come
  after it), on process 0 (the only one holding a claim)."""
  if not workdirs:
    return
  path = os.path.join(workdirs[0], COMPILATION_FILE)
  try:
    record = profiling.compilation_record(compiled, cache_dir, off_reason)
    jsonio.write_json(path, record, indent=1)
  except OSError as error:  # a record about the run, not a result: never fails the run
    absl_logging.warning("could not write %s: %s", path, error)


def _call_main(
  main: Callable[[list[str]], object],
  args: list[str],
  quiet: bool,
  compilation_cache: bool = True,
) -> object:
  """main(args) with library INFO logs off when `quiet`, the persistent compilation cache on
  (or off), a UserError as exit code 2, and compilation.json in the workdir it claimed."""
  if quiet:
    absl_logging.set_verbosity(absl_logging.WARNING)
  problem = profiling.cache_env_problem()
  if problem:
    raise user_error_exit(UserError(problem))
  cache_dir = profiling.use_compilation_cache(compilation_cache)
  if cache_dir is not None:
    off_reason = None
  elif profiling.cache_unusable_reason() is not None:
    off_reason = f"the folder {profiling.cache_unusable_reason()}"
  else:
    off_reason = "turned off (--compilation_cache=false or STORI_COMPILATION_CACHE=0)"
  held = set(run_identity.held_workdirs())
  copies = set(storage.local_copies())  # an enclosing command's (a script running commands)
  with profiling.compilations() as compiled:
    try:
      result = main(args)
    except UserError as error:
      raise user_error_exit(error) from None
    finally:
      # The downloads of gs:// inputs (a config file, a model in another layout): the run is
      # over, however it ended (a kill leaves them to the system's temp cleaning).
      storage.remove_local_copies([c for c in storage.local_copies() if c not in copies])
  _write_compilation_record(
    [w for w in run_identity.held_workdirs() if w not in held], compiled, cache_dir, off_reason
  )
  return result


def run(main: Callable[[list[str]], object], argv: list[str] | None = None) -> None:
  """app.run(main) on the global flags, with user errors turned into one paragraph and exit
  code 2: the entry of `python -m` (after `define_flags()`)."""
  argv = list(sys.argv if argv is None else argv)
  quiet = not _verbosity_given(argv)
  define_compilation_cache_flag(flags.FLAGS)
  app.run(
    lambda args: _call_main(main, args, quiet, flags.FLAGS.compilation_cache),
    argv=argv,
    flags_parser=parse_flags,
  )


def _exit_code(code: object) -> int:
  """The exit status sys.exit(code) gives (None: 0; a message: printed, 1)."""
  if code is None or isinstance(code, bool):
    return int(bool(code))
  if isinstance(code, int):
    return code
  print(code, file=sys.stderr)
  return 1


def run_in_process(module: ModuleType, args: Sequence[str] = ()) -> int:
  """Runs the command `module` (its `define_flags` and `main`) in this process as
  `python -m module *args` would run it, on fresh flags; returns its exit status.

  Meant for tests: commands with flags of the same name run one after another in one process,
  and their output goes to sys.stdout / sys.stderr (capture it with capsys). The handling is
  `run`'s: a mistake on the command line or a UserError prints one paragraph and gives 2, a
  bug raises. absl's verbosity is put back afterwards, and sys.argv is `args` meanwhile
  (ml_collections reads config overrides from it).
  """
  argv = [module.__name__, *args]
  values = flags.FlagValues()
  # --verbosity as absl defines it, a copy: parsing it here must not touch the global flag.
  flags.DEFINE_flag(copy.deepcopy(flags.FLAGS["verbosity"]), values)
  saved_argv, saved_verbosity = sys.argv, absl_logging.get_verbosity()
  held = run_identity.held_workdirs()
  copies = set(storage.local_copies())
  sys.argv = argv
  try:
    module.define_flags(values)
    define_compilation_cache_flag(values)
    remaining = parse_flags(argv, values)
    quiet = not _verbosity_given(argv)
    if not quiet:
      absl_logging.set_verbosity(values.verbosity)
    code = _call_main(lambda a: module.main(a, values), remaining, quiet, values.compilation_cache)
  except SystemExit as error:
    code = error.code
  except app.UsageError as error:
    print(f"error: {error}", file=sys.stderr)
    code = error.exitcode
  finally:
    sys.argv = saved_argv
    absl_logging.set_verbosity(saved_verbosity)
    # The command's run ends here, not at the process's exit: free the workdirs it claimed,
    # and remove its downloads (a flag parse that failed leaves its config file's).
    run_identity.release_workdirs(keep=held)
    storage.remove_local_copies([c for c in storage.local_copies() if c not in copies])
  return _exit_code(code)


def require_flags(*names: str, example: str, values: flags.FlagValues = flags.FLAGS) -> None:
  """Stops with a user error when a required flag is missing (an example command line shown)."""
  missing = [n for n in names if values[n].value in (None, "")]
  if missing:
    raise UserError(f"missing {', '.join('--' + n for n in missing)}; for example: {example}")


WROTE_HEADING = "Wrote:"


def print_outputs(directory: str, names: Sequence[str]) -> list[str]:
  """Prints the "Wrote:" block that ends a command's output: each of `names` (relative to
  `directory`; a glob pattern stands for its matches; "" for `directory` itself) that exists,
  one path a line, a folder with the number of files in it. Names that do not exist are left
  out: outputs that a config turns off are named here all the same. Returns the paths shown."""
  paths = []
  for name in names:
    pattern = os.path.join(directory, name) if name else directory
    # A path that exists as written is no pattern (a user's file name may hold "[").
    matches = storage.glob(pattern) if not storage.exists(pattern) else [pattern]
    paths.extend(p for p in matches if storage.exists(p) and p not in paths)
  if not paths:
    return []
  lines = [WROTE_HEADING]
  for path in paths:
    if storage.isdir(path):
      count = sum(len(files) for _, _, files in storage.walk(path))
      lines.append(f"  {os.path.join(path, '')}  ({count} file{'s' if count != 1 else ''})")
    else:
      lines.append(f"  {path}")
  print("\n".join(lines), flush=True)
  return paths


def written_paths(output: str) -> list[str]:
  """The paths of the last "Wrote:" block in a command's `output` (what `print_outputs`
  printed), a folder's file count left off."""
  lines = output.splitlines()
  if WROTE_HEADING not in lines:
    return []
  start = len(lines) - lines[::-1].index(WROTE_HEADING)
  paths = []
  for line in lines[start:]:
    if not line.startswith("  "):
      break
    paths.append(re.sub(r"  \(\d+ files?\)$", "", line[2:]))
  return paths
