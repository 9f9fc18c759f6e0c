"""Downloading small public JSON files (prompt and descriptor banks) when the network allows."""

from __future__ import annotations

import json
import os
import urllib.request
from typing import Any, Callable

from stori_jax.plumbing import paths


def fetch_json(
  url: str,
  path: str | os.PathLike,
  *,
  validate: Callable[[Any, str], Any],
  on_error: Callable[[Exception], Exception],
  timeout: float = 30.0,
) -> str:
  """Downloads the JSON file at `url` to `path` unless `path` exists; returns the path.

  Args:
    url: where to fetch from.
    path: destination file; its folder is created. An existing file is kept as is.
    validate: called as validate(parsed_json, url); raises ValueError on a wrong file.
    on_error: builds the exception to raise from the download / parse / validation error;
      its message should say what to download by hand and where to put it.
    timeout: seconds before the connection attempt gives up.
  """
  path = os.fspath(path)
  if paths.isfile(path):
    return path
  try:
    with urllib.request.urlopen(url, timeout=timeout) as response:
      payload = response.read()
    validate(json.loads(payload.decode("utf-8")), url)
  except (OSError, ValueError) as error:  # URLError, HTTPError and timeouts are OSErrors
    raise on_error(error) from error
  paths.makedirs(paths.parent(path))
  # Whole or not at all (a temporary file renamed; one upload), so an interrupted download
  # never leaves a truncated file behind.
  paths.write_bytes_atomic(path, payload)
  return path
