"""Errors raised while reading checkpoints."""

from __future__ import annotations

from typing import Iterable

from stori_jax.plumbing.errors import UserError


class CheckpointError(UserError, ValueError):
  """A checkpoint cannot be read: the message names the file and the fix."""


class CheckpointMismatchError(CheckpointError):
  """Converted parameters do not match the architecture."""

  def __init__(
    self,
    source: str,
    missing: Iterable[str] = (),
    unexpected: Iterable[str] = (),
    shape_mismatches: Iterable[tuple[str, tuple, tuple]] = (),
  ):
    self.missing = sorted(missing)
    self.unexpected = sorted(unexpected)
    self.shape_mismatches = sorted(shape_mismatches)
    lines = [f"Checkpoint {source} does not match the architecture:"]
    if self.missing:
      lines.append(
        f"  missing keys ({len(self.missing)}): "
        + ", ".join(self.missing[:20])
        + (" ..." if len(self.missing) > 20 else "")
      )
    if self.unexpected:
      lines.append(
        f"  unexpected keys ({len(self.unexpected)}): "
        + ", ".join(self.unexpected[:20])
        + (" ..." if len(self.unexpected) > 20 else "")
      )
    for key, got, want in self.shape_mismatches[:20]:
      lines.append(f"  shape mismatch at {key}: checkpoint {got}, architecture expects {want}")
    lines.append("Check that the architecture name (or config) belongs to this checkpoint.")
    super().__init__("\n".join(lines))
