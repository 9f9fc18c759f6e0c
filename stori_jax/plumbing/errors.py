"""The project's user-facing errors.

`UserError` is a mistake a user can fix (a bad config value, a missing or malformed file, a
workdir made by another run, a prompt syntax error): command lines print its message as one
paragraph and exit 2 (`stori_jax.plumbing.cli.run`). Any other exception is the project's own bug and
keeps its traceback.
"""

from __future__ import annotations

import errno

#: The errno values that mean a disk (or the user's quota on it) is full.
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class UserError(Exception):
  """A mistake the user can fix; the message names the problem and the fix."""


class InputError(UserError, ValueError):
  """An input file, image, array or request that cannot be used as given."""


class NonFiniteError(UserError, FloatingPointError):
  """A NaN or infinity where a result must be finite (a diverged run, NaN weights)."""


class DiskFullError(UserError, OSError):
  """A result file could not be written: its disk or quota is full."""
