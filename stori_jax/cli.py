"""Command-line plumbing shared by every `python -m stori_jax.X` / `mutual.X` entry point.

`run(main)` runs an absl main: a `UserError` (bad config, missing or malformed file, a workdir
made by another run, a prompt syntax error) prints `error: <message>` as one paragraph on stderr
and exits 2; any other exception is the project's own bug and keeps its traceback. Library INFO
logs (orbax, JAX's backend probe) are off unless `--verbosity` is given.
"""

from __future__ import annotations

import sys
from typing import Callable

from absl import app, flags
from absl import logging as absl_logging

from stori_jax.errors import UserError

EXIT_USER_ERROR = 2


def user_error_exit(error: BaseException) -> "SystemExit":
  """The SystemExit that reports `error` as a user's mistake (message on stderr, code 2)."""
  message = str(error).strip() or type(error).__name__
  print(f"error: {message}", file=sys.stderr)
  return SystemExit(EXIT_USER_ERROR)


def _verbosity_given(argv: list[str]) -> bool:
  return any(a == "-v" or a.startswith(("--verbosity", "-v=", "--v=")) for a in argv[1:])


def run(main: Callable[[list[str]], object], argv: list[str] | None = None) -> None:
  """app.run(main) with user errors turned into one paragraph and exit code 2."""
  argv = list(sys.argv if argv is None else argv)
  quiet = not _verbosity_given(argv)

  def wrapped(args):
    if quiet:
      absl_logging.set_verbosity(absl_logging.WARNING)
    try:
      return main(args)
    except UserError as error:
      raise user_error_exit(error) from None

  app.run(wrapped, argv=argv)


def require_flags(*names: str, example: str) -> None:
  """Stops with a user error when a required flag is missing (an example command line shown)."""
  missing = [n for n in names if flags.FLAGS[n].value in (None, "")]
  if missing:
    raise UserError(
      f"missing {', '.join('--' + n for n in missing)}; for example: {example}"
    )
