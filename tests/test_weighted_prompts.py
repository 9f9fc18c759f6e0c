"""Weighted prompts: parsing, per-token weights, errors and token -> word mapping."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from stori_jax.tokenizer import (
  Segment,
  SplitTokenWarning,
  WeightedPromptError,
  default_tokenizer,
  parse_weighted,
  strip_weights,
  tokenize_weighted,
  word_weights,
  words_from_tokens,
)

EXAMPLE = "a photo of a woman with (blonde hair:1.5), wearing (eyeglasses:0.5)"


@pytest.fixture(scope="module")
def tok():
  return default_tokenizer()


def _caret_column(message: str) -> int:
  """Column of '^' relative to the displayed prompt line above it."""
  lines = message.splitlines()
  caret = next(i for i, line in enumerate(lines) if line.strip() == "^")
  return lines[caret].index("^") - 4  # both display lines are indented by 4


# ---------------------------------------------------------------------- parsing
def test_parse_example():
  assert parse_weighted(EXAMPLE) == [
    Segment("a photo of a woman with ", 1.0),
    Segment("blonde hair", 1.5),
    Segment(", wearing ", 1.0),
    Segment("eyeglasses", 0.5),
  ]
  assert strip_weights(EXAMPLE) == "a photo of a woman with blonde hair, wearing eyeglasses"


def test_parse_unweighted_and_literal_groups():
  assert parse_weighted("a cat") == [Segment("a cat", 1.0)]
  assert parse_weighted("") == []
  # a group without ':' is literal text (parentheses kept), weight 1.0: no implicit 1.1
  assert parse_weighted("a (cute) cat") == [Segment("a (cute) cat", 1.0)]
  assert parse_weighted("a () cat") == [Segment("a () cat", 1.0)]
  sentence = "The American robin (Turdus migratorius) is a songbird."
  assert strip_weights(sentence) == sentence


def test_parse_escapes_and_colons():
  assert parse_weighted(r"a \(literal\) paren, a \\ backslash") == [
    Segment(r"a (literal) paren, a \ backslash", 1.0)
  ]
  # escaped ':' keeps a group literal; the LAST unescaped ':' separates the weight
  assert parse_weighted(r"(note\: x) and (ratio 3:2:1.5)") == [
    Segment("(note: x) and ", 1.0),
    Segment("ratio 3:2", 1.5),
  ]
  assert parse_weighted(r"(a\(b\):2)") == [Segment("a(b)", 2.0)]
  # colons outside groups and other backslashes are plain text
  assert parse_weighted(r"time: 3\n") == [Segment(r"time: 3\n", 1.0)]


def test_parse_weight_formats():
  assert parse_weighted("( blonde hair : 1.5 )") == [Segment(" blonde hair ", 1.5)]
  for raw, value in [("2", 2.0), (".5", 0.5), ("1.", 1.0), ("1e-1", 0.1), ("+3", 3.0), ("0", 0.0)]:
    assert parse_weighted(f"(x:{raw})") == [Segment("x", value)]
  assert parse_weighted("(a:2)(b:3)") == [Segment("a", 2.0), Segment("b", 3.0)]


def test_programmatic_segments():
  pairs = [("a photo of a woman with ", 1), ("blonde hair", 1.5)]
  assert parse_weighted(pairs) == [
    Segment("a photo of a woman with ", 1.0),
    Segment("blonde hair", 1.5),
  ]
  assert parse_weighted([Segment("x", np.float32(2.0))]) == [Segment("x", 2.0)]
  # programmatic text is taken verbatim: no syntax inside
  assert strip_weights([("(not:2) parsed", 1.0)]) == "(not:2) parsed"
  with pytest.raises(WeightedPromptError, match="negative weight"):
    Segment("x", -1.0)
  with pytest.raises(WeightedPromptError, match="not finite"):
    Segment("x", float("nan"))
  with pytest.raises(TypeError):
    parse_weighted([("x", 1.0), "y"])


# ---------------------------------------------------------------------- errors
@pytest.mark.parametrize(
  "prompt, position, fragment",
  [
    ("a photo of (a cat:-0.5) here", 18, "negative weight -0.5"),
    ("a photo of (a cat:abc)", 18, "weight 'abc' is not a number"),
    ("a photo of (a cat:inf)", 18, "is not a number"),
    ("a photo of (a cat:)", 17, "missing weight"),
    ("a photo of (a cat:1.5", 11, "'(' is never closed"),
    ("a photo of a cat:1.5)", 20, "')' has no matching '('"),
    ("a photo of ((a cat:2))", 12, "nested parentheses"),
    ("a photo of ( :2)", 11, "no text"),
    ("(x:1e999)", 3, "not finite"),
  ],
)
def test_error_messages_quote_prompt_and_point(prompt, position, fragment):
  with pytest.raises(WeightedPromptError) as info:
    parse_weighted(prompt)
  err = info.value
  message = str(err)
  assert isinstance(err, ValueError)
  assert fragment in message
  assert repr(prompt) in message and prompt in message.splitlines()[-2]
  assert f"position {position}" in message and err.position == position
  assert _caret_column(message) == position


def test_error_caret_with_wide_and_control_characters():
  prompt = "猫と\t(犬:x)"
  with pytest.raises(WeightedPromptError) as info:
    parse_weighted(prompt)
  # 猫 and と are double width; the tab is shown as one visible character
  assert info.value.position == 6
  assert _caret_column(str(info.value)) == 2 + 2 + 1 + 1 + 2 + 1


def test_too_long_prompt_error(tok):
  prompt = "word " * 80 + "(end:2)"
  with pytest.raises(WeightedPromptError) as info:
    tokenize_weighted(tok, prompt)
  message = str(info.value)
  assert "83 tokens" in message and "context length is 77" in message
  assert repr(prompt) in message
  # the caret marks the first token that does not fit (the 76th word)
  assert info.value.position == 75 * 5
  # truncate=True cuts like the plain tokenizer
  ids, weights = tokenize_weighted(tok, prompt, truncate=True)
  np.testing.assert_array_equal(ids, tok(strip_weights(prompt)))
  assert (weights == 1).all()
  with pytest.raises(WeightedPromptError, match="10 tokens.*context length is 8"):
    tokenize_weighted(tok, [("one two three four five six seven eight", 1.0)], context_length=8)


# ---------------------------------------------------------------------- token weights
def test_token_weights_example(tok):
  ids, weights = tokenize_weighted(tok, EXAMPLE)
  assert ids.shape == weights.shape == (1, 77)
  assert ids.dtype == np.int32 and weights.dtype == np.float32
  np.testing.assert_array_equal(ids, tok(strip_weights(EXAMPLE)))
  strings = tok.token_strings(ids[0])
  by_token = dict(zip(strings[1:13], weights[0, 1:13]))
  assert by_token["blonde"] == by_token["hair"] == 1.5
  # "eyeglasses" is two BPE tokens: both carry the phrase weight
  assert strings[11:13] == ["eye", "glasses"]
  assert (weights[0, 11:13] == 0.5).all()
  assert by_token["woman"] == by_token[","] == by_token["wearing"] == 1.0
  eot = int(np.flatnonzero(ids[0] == tok.eot_token_id)[0])
  assert weights[0, 0] == 1.0 and weights[0, eot] == 1.0  # SOT, EOT
  assert (weights[0, eot + 1 :] == 1.0).all()  # padding


PROMPTS = [
  EXAMPLE,
  "",
  "(a:0)",
  "A  PHOTO\tof (a  Dog :2)   on\nthe beach",
  "(salt &amp; pepper:2) with \\(capers\\)",
  "(café crème:1.3) and (日本語:0.7) 😀 (🎉:3)",
  "it(')s (a:2)'s test, don't(n't:2) x",
  "foot(ball:2) and (foot:3)ball",
  "numbers (1234:2)5 and 3.(14:2)",
  "The American robin (Turdus migratorius) is a (migratory songbird:1.4).",
]


@pytest.mark.filterwarnings("ignore::stori_jax.tokenizer.SplitTokenWarning")
def test_ids_equal_plain_tokenization(tok):
  ids, weights = tokenize_weighted(tok, PROMPTS)
  assert ids.shape == weights.shape == (len(PROMPTS), 77)
  np.testing.assert_array_equal(ids, tok([strip_weights(p) for p in PROMPTS]))
  for row, prompt in enumerate(PROMPTS):
    single_ids, single_w = tokenize_weighted(tok, prompt)
    np.testing.assert_array_equal(single_ids[0], ids[row])
    np.testing.assert_array_equal(single_w[0], weights[row])
    if "(" not in prompt or ":" not in prompt:
      assert (weights[row] == 1).all()


def test_weights_follow_segments_through_cleaning(tok):
  ids, w = tokenize_weighted(tok, "A  PHOTO\tof (a  Dog :2) ok (salt &amp; pepper:3)")
  strings = tok.token_strings(ids[0])
  got = {s: float(x) for s, x in zip(strings, w[0]) if s not in ("<pad>",)}
  assert got["photo"] == 1.0 and got["dog"] == 2.0 and got["ok"] == 1.0
  assert got["salt"] == got["&"] == got["pepper"] == 3.0


def test_programmatic_prompts_and_batches(tok):
  segs = [("a photo of ", 1.0), Segment("a dog", 0.0), (" running", 2)]
  ids, w = tokenize_weighted(tok, segs)
  np.testing.assert_array_equal(ids, tok("a photo of a dog running"))
  assert list(w[0, :8]) == [1, 1, 1, 1, 0, 0, 2, 1]
  batch_ids, batch_w = tokenize_weighted(tok, [EXAMPLE, segs, [], "plain"])
  assert batch_ids.shape == (4, 77)
  np.testing.assert_array_equal(batch_ids[1], ids[0])
  np.testing.assert_array_equal(batch_w[1], w[0])
  assert list(batch_ids[2, :3]) == [tok.sot_token_id, tok.eot_token_id, 0]
  assert tokenize_weighted(tok, [])[0].shape == (0, 77)
  with pytest.raises(TypeError):
    tokenize_weighted(tok, ["ok", ("loose pair", 1.0)])


def test_boundary_inside_a_token(tok):
  assert tok.encode("blondes") == [tok.encode("blondes")[0]]  # one BPE token
  with pytest.warns(SplitTokenWarning, match="blondes"):
    _, w = tokenize_weighted(tok, "(blonde:1.5)s hair")
  assert w[0, 1] == 1.5  # most of its characters are in the weighted segment
  assert len(tok.encode("football")) == 1
  with pytest.warns(SplitTokenWarning, match="football"):
    _, w = tokenize_weighted(tok, "foot(ball:2)")
  assert w[0, 1] == 1.0  # 4 vs 4 characters: the earlier segment wins
  # a boundary between BPE tokens of one word is exact and silent
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    ids, w = tokenize_weighted(tok, "(eye:2)glasses")
  assert tok.token_strings(ids[0, 1:3]) == ["eye", "glasses"]
  assert list(w[0, 1:3]) == [2.0, 1.0]
  # equal weights on both sides: no warning
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    tokenize_weighted(tok, [("foot", 2.0), ("ball", 2.0)])


# ---------------------------------------------------------------------- words
def test_words_round_trip(tok):
  ids, w = tokenize_weighted(tok, EXAMPLE)
  words = words_from_tokens(tok, ids[0])
  assert [x.text for x in words] == [
    "a",
    "photo",
    "of",
    "a",
    "woman",
    "with",
    "blonde",
    "hair",
    ",",
    "wearing",
    "eyeglasses",
  ]
  assert " ".join(x.text for x in words) == tok.decode(ids[0])
  eyeglasses = words[-1]
  assert (eyeglasses.start, eyeglasses.end) == (11, 13)
  assert word_weights(tok, ids[0], w[0]) == [
    ("a", 1.0),
    ("photo", 1.0),
    ("of", 1.0),
    ("a", 1.0),
    ("woman", 1.0),
    ("with", 1.0),
    ("blonde", 1.5),
    ("hair", 1.5),
    (",", 1.0),
    ("wearing", 1.0),
    ("eyeglasses", 0.5),
  ]


def test_word_weights_reduce(tok):
  ids = tok("eyeglasses")[0]
  tw = np.ones(77, np.float32)
  tw[1:3] = [0.5, 2.0]
  assert word_weights(tok, ids, tw) == [("eyeglasses", 1.25)]
  assert word_weights(tok, ids, tw, reduce="max") == [("eyeglasses", 2.0)]
  assert word_weights(tok, ids, tw, reduce="min") == [("eyeglasses", 0.5)]
  assert word_weights(tok, ids, tw, reduce="sum") == [("eyeglasses", 2.5)]
  assert word_weights(tok, ids, tw, reduce=lambda x: x[-1]) == [("eyeglasses", 2.0)]
  with pytest.raises(ValueError, match="reduce"):
    word_weights(tok, ids, tw, reduce="median-ish")
  with pytest.raises(ValueError, match="align"):
    word_weights(tok, ids, tw[:10])


def test_words_multibyte_and_unterminated(tok):
  words = words_from_tokens(tok, tok("猫 café 😀")[0])
  assert [x.text for x in words] == ["猫", "café", "😀"]
  assert words[0].end - words[0].start == len(tok.encode("猫"))
  # encode() output (no SOT/EOT) and a row cut inside a word
  ids = tok.encode("eyeglasses case")
  assert [x.text for x in words_from_tokens(tok, ids)] == ["eyeglasses", "case"]
  assert [x.text for x in words_from_tokens(tok, ids[:1])] == ["eye"]
  with pytest.raises(ValueError, match="one row"):
    words_from_tokens(tok, tok(["a", "b"]))
