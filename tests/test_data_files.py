"""The readers of users' small files (stori_jax.data.files): a key named twice in one object and
absurd nesting are refused with the path, not silently merged or a RecursionError traceback."""

import pytest

from stori_jax.data.files import read_json
from stori_jax.errors import InputError


def test_a_key_named_twice_is_refused_naming_it(tmp_path):
  path = tmp_path / "descriptors.json"
  path.write_text('{"cat": ["whiskers"], "dog": ["a tail"], "cat": ["fur"]}', encoding="utf-8")
  with pytest.raises(InputError, match=r"names the key 'cat' twice") as error:
    read_json(path, "descriptor file")
  assert str(path) in str(error.value) and "Merge the two entries" in str(error.value)
  # Nested objects too, and equal keys in different objects are fine.
  path.write_text('{"a": {"x": 1, "x": 2}}', encoding="utf-8")
  with pytest.raises(InputError, match="'x' twice"):
    read_json(path)
  path.write_text('{"a": {"x": 1}, "b": {"x": 2}}', encoding="utf-8")
  assert read_json(path) == {"a": {"x": 1}, "b": {"x": 2}}


def test_nesting_a_hundred_thousand_deep_is_a_clear_error(tmp_path):
  path = tmp_path / "deep.json"
  path.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
  with pytest.raises(InputError, match="nests its lists or objects too deeply") as error:
    read_json(path, "descriptor file")
  assert str(path) in str(error.value)
