"""CLIP BPE tokenizer: parity with open_clip's default tokenizer and API behaviour."""

from __future__ import annotations

import html
import json
import os
import random
import time
from pathlib import Path

import ftfy
import numpy as np
import pytest

from stori_jax.tokenizer import Tokenizer, default_tokenizer
from stori_jax.tokenizer.bpe import clean_text

REPO_ROOT = Path(__file__).resolve().parents[1]
# Shared reference data (CuPL prompts) lives outside the repo and carries no licence:
# read it in place, never copy it in.
SHARED_DATA = Path(os.environ.get("STORI_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))
CUPL_DIR = SHARED_DATA / "cupl"
CUPL_SKIP_REASON = (
  f"shared data folder absent ({CUPL_DIR}); set STORI_SHARED_DATA to the folder holding cupl/*.json"
)

CORPUS = [
  "",
  " ",
  "a photo of a cat.",
  "A Photo Of A CAT",
  "  leading and trailing spaces   ",
  "tabs\tand\nnewlines\r\nand\x0bvertical\x0cfeeds",
  "café crème brûlée, naïve façade, Ångström, São Paulo, Łódź",
  "e\u0301 combining accent (NFC by ftfy)",
  "日本語のテキストと中文字符",
  "한국어 문장도 있습니다",
  "emoji 😀🎉👍🏽 and flags 🇫🇷 and zwj 👩‍👩‍👧",
  "html &amp; entities &#39;quoted&#39; &lt;b&gt; &quot;x&quot; &amp;amp; &nbsp;nbsp",
  "mojibake: cafÃ© and â€œquotesâ€\x9d",
  "“curly quotes” and ‘single’ — dashes – … ellipsis",
  "ﬁne ligatures ﬂow and ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３",
  "numbers 1234567890 3.14159 1,000,000 2nd 21st 1e-5 0x1F",
  "punctuation runs!!! ??? ... --- *** ### $$$ %%% ^^^ ~~~ ``` ''' \"\"\"",
  "it's can't they're we've I'm you'll he'd IT'S CAN'T THEY'RE",
  "rock'n'roll o'clock ma'am y'all 'tis",
  "'s 't 're 've 'm 'll 'd",
  "ſ long s: it'ſ",
  "İstanbul ΣΊΣΥΦΟΣ ΟΔΟΣ straße",
  "<start_of_text> literal special strings <end_of_text>",
  "control\x00chars\x07here\x1b[31mred\x1b[0m",
  "url https://example.com/path?query=1&b=2#frag and email a.b@c.de",
  "mixed123abc456 snake_case camelCase kebab-case",
  "\u200b zero width \u200d joiner \ufeff bom",
  "a" * 300,
  " ".join(["word"] * 100),
  "supercalifragilisticexpialidocious antidisestablishmentarianism",
  (
    "The identifying characteristics of a southern black widow include:*A black or dark "
    "brown body\n*A red or orange hourglass-shaped marking on the underside of the abdomen "
    "and many other long descriptive words that keep going well past the seventy seven "
    "token context window of CLIP so that truncation must happen here."
  ),
]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
  return default_tokenizer()


@pytest.fixture(scope="module")
def open_clip():
  try:
    import open_clip as oc
  except ImportError:
    pytest.skip("open_clip_torch not installed (pip install -e .[torch])")
  return oc


def _cupl_files() -> list[Path]:
  return sorted(CUPL_DIR.glob("*.json")) if CUPL_DIR.is_dir() else []


def _sentences(path: Path) -> list[str]:
  data = json.loads(path.read_text(encoding="utf-8"))
  return [s for sentences in data.values() for s in sentences]


# ---------------------------------------------------------------------- parity
def test_parity_builtin_corpus(tok, open_clip):
  ours = tok(CORPUS)
  ref = open_clip.tokenize(CORPUS).numpy()
  assert ours.shape == ref.shape == (len(CORPUS), 77)
  for k, text in enumerate(CORPUS):
    np.testing.assert_array_equal(ours[k], ref[k], err_msg=repr(text))
  # the tokenizer open_clip picks for an OpenAI-style model is the same one
  ref_model = open_clip.get_tokenizer("ViT-B-32")(CORPUS).numpy()
  np.testing.assert_array_equal(ours, ref_model)


@pytest.mark.parametrize("context_length", [2, 5, 16, 77, 100])
def test_parity_context_lengths_and_truncation(tok, open_clip, context_length):
  ours = tok(CORPUS, context_length=context_length)
  ref = open_clip.tokenize(CORPUS, context_length=context_length).numpy()
  np.testing.assert_array_equal(ours, ref)


def test_parity_encode_decode(tok, open_clip):
  from open_clip.tokenizer import SimpleTokenizer

  ref = SimpleTokenizer()
  for text in CORPUS:
    assert tok.encode(text) == ref.encode(text), repr(text)
    ids = tok.encode(text)
    assert tok.decode(ids, skip_special_tokens=False) == ref.decode(ids).strip(), repr(text)


def _check_cupl_parity(tok, open_clip, stride: int):
  files = _cupl_files()
  if not files:
    pytest.skip(CUPL_SKIP_REASON)
  for path in files:
    sentences = sorted(set(_sentences(path)))[::stride]
    ours = tok(sentences)
    ref = open_clip.tokenize(sentences).numpy()
    bad = np.flatnonzero((ours != ref).any(axis=1))
    assert bad.size == 0, f"{path.name}: {bad.size} mismatches, e.g. {sentences[bad[0]]!r}"


def test_parity_cupl_sample(tok, open_clip):
  # every 10th distinct sentence of every CuPL file (~5,000): fast enough for every run
  _check_cupl_parity(tok, open_clip, stride=10)


@pytest.mark.slow
def test_parity_cupl_all(tok, open_clip):
  # all ~52,000 distinct CuPL sentences (about 10 s, mostly open_clip's own tokenizer)
  _check_cupl_parity(tok, open_clip, stride=1)


def test_imagenet_cupl_tokenization_time(record_property):
  path = CUPL_DIR / "imagenet_prompts_base.json"
  if not path.is_file():
    pytest.skip(CUPL_SKIP_REASON)
  sentences = _sentences(path)
  t0 = time.perf_counter()
  fresh = Tokenizer()  # empty BPE cache: measures a cold run
  t1 = time.perf_counter()
  ids = fresh(sentences)
  t2 = time.perf_counter()
  ids_warm = fresh(sentences)
  t3 = time.perf_counter()
  np.testing.assert_array_equal(ids, ids_warm)
  assert ids.shape == (len(sentences), 77)
  msg = (
    f"ImageNet CuPL: {len(sentences)} sentences; vocab load {t1 - t0:.2f}s, "
    f"tokenize cold {t2 - t1:.2f}s, warm {t3 - t2:.2f}s"
  )
  record_property("imagenet_cupl_tokenize_s", round(t2 - t1, 3))
  print(msg)


# ---------------------------------------------------------------------- behaviour
def test_vocabulary_constants(tok):
  assert tok.vocab_size == 49408
  assert tok.sot_token_id == 49406 and tok.eot_token_id == 49407 and tok.pad_token_id == 0
  assert tok.context_length == 77
  assert default_tokenizer() is tok  # cached


def test_call_shapes_and_framing(tok):
  single = tok("a photo of a cat")
  assert single.shape == (1, 77) and single.dtype == np.int32
  batch = tok(["a cat", "a dog", ""])
  assert batch.shape == (3, 77)
  row = batch[0]
  n = len(tok.encode("a cat"))
  assert row[0] == tok.sot_token_id and row[n + 1] == tok.eot_token_id
  assert (row[n + 2 :] == 0).all()
  assert list(batch[2, :3]) == [tok.sot_token_id, tok.eot_token_id, 0]
  assert tok([]).shape == (0, 77)


def test_truncation(tok):
  text = " ".join(f"w{i}" for i in range(200))
  ids = tok.encode(text)
  row = tok(text)[0]
  assert row[0] == tok.sot_token_id and row[-1] == tok.eot_token_id
  np.testing.assert_array_equal(row[1:-1], ids[:75])
  with pytest.raises(ValueError) as info:
    tok(["short", text], truncate=False)
  msg = str(info.value)
  assert f"{len(ids) + 2} tokens" in msg and "77" in msg and "w0 w1 w2" in msg
  assert "texts[1]" in msg
  tok(" ".join(["x"] * 75), truncate=False)  # exactly 77 with SOT/EOT fits


def test_decode_and_token_strings(tok):
  row = tok("A photo of eyeglasses, café!")[0]
  assert tok.decode(row) == "a photo of eyeglasses , café !"
  strings = tok.token_strings(row)
  assert len(strings) == 77
  assert strings[:8] == ["<start_of_text>", "a", "photo", "of", "eye", "glasses", ",", "café"]
  assert strings[-1] == "<pad>"
  joined = "".join(tok.token_strings(tok.encode("eyeglasses, café"), word_end=" "))
  assert joined == "eyeglasses , café "


def test_encode_with_spans(tok):
  text = "  A Photo of  EYEGLASSES,\tcafé 日本 it's"
  ids, spans = tok.encode_with_spans(text)
  assert ids == tok.encode(text)
  pieces = [text[a:b] for a, b in spans]
  assert pieces[:6] == ["A", "Photo", "of", "EYE", "GLASSES", ","]
  assert "café" in pieces and pieces[-2:] == ["it", "'s"]
  # a multi-byte character split over byte tokens: each token spans the whole character
  assert all(
    p in ("日", "本") for p, t in zip(pieces, ids) if len(tok.token_bytes(t)) < 3 and p in "日本"
  )
  # text that cleaning rewrites: ids stay exact, spans stay inside the text and ordered
  messy = "Salt &amp; PEPPER ﬁne"
  ids, spans = tok.encode_with_spans(messy)
  assert ids == tok.encode(messy)
  assert all(0 <= a < b <= len(messy) for a, b in spans)
  assert [a for a, _ in spans] == sorted(a for a, _ in spans)
  assert messy[spans[0][0] : spans[0][1]] == "Salt"


def test_ascii_fast_path_matches_full_cleaning():
  # clean_text skips ftfy/html for plain ASCII without '&' or control characters; check
  # that the shortcut gives exactly CLIP's full cleaning on random ASCII text.
  rng = random.Random(0)
  alphabet = [chr(c) for c in range(32, 127)] + [
    "\t",
    "\n",
    "\r",
    "&",
    "&amp;",
    "&#39;",
    "\x1b[0m",
    "\x00",
    "\x0c",
    "é",
    "Ã©",
  ]
  for _ in range(3000):
    text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
    full = " ".join(html.unescape(html.unescape(ftfy.fix_text(text))).strip().split()).lower()
    assert clean_text(text) == full, repr(text)


def test_cache_does_not_change_results(tok):
  fresh = Tokenizer()
  texts = ["hummingbird hummingbirds", "hummingbird"]
  np.testing.assert_array_equal(fresh(texts), tok(texts))
  np.testing.assert_array_equal(fresh(texts), fresh(texts))


def test_bad_inputs(tok):
  with pytest.raises(TypeError):
    tok(["ok", 3])
  with pytest.raises(ValueError):
    tok("x", context_length=1)
