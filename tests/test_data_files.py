"""The readers of users' small files (stori_jax.data.files): a key named twice in one object and
absurd nesting are refused with the path, not silently merged or a RecursionError traceback;
text files name a line that is not UTF-8; JSON name lists are checked."""

import pytest

from stori_jax.data.files import (
  DatasetMissingError,
  check_name_lists,
  read_json,
  read_text_lines,
)
from stori_jax.plumbing.errors import InputError, UserError


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


def test_an_integer_of_five_thousand_digits_is_an_input_error_naming_the_file(tmp_path):
  """Issue 44 row 11: json.loads raises a plain ValueError (Python's 4,300-digit limit on int
  conversion), which was a traceback from every reader of a user's JSON."""
  path = tmp_path / "descriptors.json"
  path.write_text('{"cat": ["whiskers"], "count": ' + "7" * 5000 + "}", encoding="utf-8")
  with pytest.raises(InputError) as error:
    read_json(path, "descriptor file")
  message = str(error.value)
  assert message.startswith(f"The descriptor file {path} cannot be read as JSON (")
  assert "4300" in message and "\n" not in message
  assert "Check that it is the file meant" in message
  path.write_text('{"count": ' + "7" * 4000 + "}", encoding="utf-8")
  assert read_json(path)["count"] == int("7" * 4000)  # under the limit: read as written


def test_text_lines_drop_a_byte_order_mark_and_name_a_bad_line(tmp_path):
  path = tmp_path / "names.txt"
  path.write_bytes("\ufeffa\r\nb\n".encode())
  assert read_text_lines(path) == ["a", "b"]
  path.write_bytes(b"a\nb\n\xff\n")
  with pytest.raises(InputError, match=r"The class list .* is not UTF-8 \(line 3\)"):
    read_text_lines(path, "class list")


@pytest.mark.parametrize(
  "value, allow_empty, match",
  [
    ({"cat": []}, False, r"the classes 'cat' have no descriptors"),
    ({}, False, r"expected a non-empty JSON object \{class name: \[descriptor, ...\]\}"),
    (["cat"], False, "is not a descriptor file"),
    ({"cat": ["ok", 3]}, False, "is not a descriptor file"),
    ({"cat": "whiskers"}, True, r"expected a JSON object \{class name: \[descriptor, ...\]\}\.$"),
  ],
)
def test_name_lists_are_checked(value, allow_empty, match):
  with pytest.raises(InputError, match=match):
    check_name_lists(
      value, "d.json", what="descriptor file", entry="descriptor", allow_empty=allow_empty
    )


def test_well_formed_name_lists_pass():
  kw = dict(what="descriptor file", entry="descriptor")
  assert check_name_lists({"cat": ["whiskers"]}, "d.json", **kw) == {"cat": ["whiskers"]}
  assert check_name_lists({}, "d.json", allow_empty=True, **kw) == {}
  assert check_name_lists({"cat": []}, "d.json", allow_empty=True, **kw) == {"cat": []}


def test_a_missing_dataset_is_a_user_error_and_a_file_not_found_error():
  assert issubclass(DatasetMissingError, UserError)
  assert issubclass(DatasetMissingError, FileNotFoundError)
