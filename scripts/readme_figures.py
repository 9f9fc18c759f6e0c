r"""Re-measures the embedded-world figures of README.md and docs/*.md and rewrites them in place.

  python scripts/readme_figures.py                      # every section (minutes on 2 CPU cores)
  python scripts/readme_figures.py --only demo,world    # some sections
  python scripts/readme_figures.py --check              # measure, print the diff, exit 1 if a
                                                        # figure differs (timings and the
                                                        # line breaks they move do not)
  python scripts/readme_figures.py --list               # the sections and their regions
  make readme-figures [FIGURES_FLAGS=--check]

Each figure region lies between `<!-- figures:NAME -->` and `<!-- /figures:NAME -->` (HTML
comments: invisible on GitHub) in README.md or in one page of docs/ beside it, whichever holds it
(`--list` says where each lives): a region moves with its page's text, and the script finds it
there; a region in no file or in two is an error before any work. A section measures once and returns the markdown of its
regions; only the text between a region's markers is replaced, the whitespace next to the
markers kept (a marker inside a paragraph must not start a line, or GitHub ends the paragraph
there). A figure shown beside a command comes from that command, run in this process with the
README's flags (scripts/embedded_world_figures.py's run_command: what it prints or the file it
writes), or from the library function it calls with the same arguments; a figure from another
command or other images says so in the README, naming the command. Timings are of this run,
rounded ("about N s"), since the machine is noisy.

Sections:
  demo             the few-shot demo's table (configs/demo.py, seeds 1-3) and the paper
                   objective's figures (log_weight_penalty = 0) after it
  world            `python -m stori_jax.evaluate_world` on both tiny CLIPs: the zero-shot table
                   and Table 3 with the base model's column; weight 0 and the Fig. 5 sweep on
                   the same images (scripts/embedded_world_figures.py); the Status summary
  start_block      `python -m stori_jax.start_block` on both tiny CLIPs: the shipped model's
                   table and the base model's slopes (configs/retrieval_synthetic.py's probe set)
  ablations        `python -m stori_jax.train` on the demo's two-colour task with
                   tiny-synthetic-base: Fig. 10 (start blocks 1-6) and Table 1 (rare tokens)
  grid             `python -m stori_jax.run_grid --config configs/grid_synthetic.py`: its tables
  grid_ablations   `python -m stori_jax.run_grid` on configs/table1.py:synthetic and
                   configs/fig10.py:synthetic: both tables, a sentence each against the paper,
                   and docs/images/fig10_synthetic.png
  contrast         `python -m stori_jax.contrast --config configs/pairwise_synthetic.py` (Fig. 3):
                   the pairings' accuracies, the anchor's words' mean trained weights, and
                   docs/images/fig3_pairwise.png
  mutual_analyze   mutual.analyze on configs/mutual_synthetic.py, plus the concept pixels on
                   objects and descriptors naming attributes (a second pass, as the test does)
  mutual_explain   `python -m mutual.explain` on an embedded-world image: what it prints, its
                   figure (docs/images/mutual_explain.png) and the input image
  mutual_modes     Table 3's row of configs/mutual_synthetic.py in both analysis modes, and
                   reference mode's per-image agreement with mutual/reference.py
  mutual_precision the images whose MI or AUC change with bfloat16 towers (both modes;
                   scripts/mutual_precision.py)
  mutual_evaluate  mutual.evaluate on configs/mutual_eval_synthetic.py: Table 1, Table 5 and the
                   concept labeler, the protocols (App. A.1's CorLoc and layer similarity,
                   A.2-A.4, Table 2)
  gcs              the README's gs:// commands (the demo on gs://demo/one twice, then on two
                   processes on gs://demo/two) against tests/gcs_emulator.py's local GCS
  machine_limit    `python benchmarks/train_step.py` at its default size (a subprocess with the
                   user's environment): the step at the paper's setting (fresh views) and on
                   cached features, seconds, GFLOP, the share of the matmul rate measured in the
                   same run and the ratio against PyTorch eager at equal work, in
                   docs/benchmarks.md; then `python benchmarks/mutual_throughput.py`
                   (ANALYSIS_ARGS): the MK analysis per image against the per-image reference at
                   equal work (MACHINE_LIMIT_ROWS lists the producers). Timed: --check compares
                   its words, not its figures
  suite            `make test`'s suite (pytest -m "not slow"): its time, passed and skipped
                   from a clean clone (its compilation cache empty), then its time run again
                   on the cache that run left
  suite_all        `make test-all`'s suite (slow tests too; tens of minutes): the same

A section may also draw images (docs/images/...; `--list` names them), written beside the README
with it and linked from its region relative to the page that holds the region; --check reports a
differing image but compares only the text.

Before NumPy and JAX start, the script sets the CPU up as scripts/reproducible_cpu.py says (XLA's
CPU code capped at AVX2, YNNPACK's consistent-arithmetic kernels, OpenBLAS's Haswell kernels, 2
threads), so that machines of one kind give the same figures. --check compares the figures
exactly, except a section's stated tolerance (Section.tolerance: the bf16 shares, whose rounding
still depends on the CPU's bf16 instructions), which the README states beside them. A timing
("about N s") is one run on a noisy machine, not a figure: --check never fails on one, nor on a
paragraph re-wrapped because a timing's width changed. A measured difference that the README
quotes as a guarantee (two processes' weights) is stated as its bound (`bound`: "within 1e-5"),
which machines of one kind share, not as the value one run measured.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import glob
import math
import os
import re
import shutil
import sys
import tempfile
import textwrap
import time
from typing import Any, Callable, Mapping, Sequence

from absl import flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # `python scripts/readme_figures.py` puts only scripts/ on the path
  sys.path.insert(0, ROOT)
if __name__ == "__main__":  # before NumPy and JAX start: the same figures on every x86-64 CPU
  import reproducible_cpu  # scripts/, beside this

  if note := reproducible_cpu.apply():
    print(note, file=sys.stderr)

from stori_jax.plumbing import cli, paths  # noqa: E402
from stori_jax.plumbing.errors import UserError  # noqa: E402

README = os.path.join(ROOT, "README.md")
CONFIGS = os.path.join(ROOT, "configs")
OPEN, CLOSE = "<!-- figures:{} -->", "<!-- /figures:{} -->"
MINUS = "\u2212"  # the README's minus sign in signed figures


# ---------------------------------------------------------------------------------------------
# Regions.


class MarkerError(UserError):
  """A region's markers are missing, repeated or out of order in the README or docs/."""


def region_span(text: str, name: str) -> tuple[int, int]:
  """(start, end) of the text between region `name`'s markers; MarkerError naming it if the
  markers are not there exactly once each, opening before closing."""
  opening, closing = OPEN.format(name), CLOSE.format(name)
  counts = (text.count(opening), text.count(closing))
  if counts != (1, 1):
    raise MarkerError(
      f"README region {name!r}: expected one {opening} and one {closing}, found "
      f"{counts[0]} and {counts[1]}; wrap the region's figures in them."
    )
  start = text.index(opening) + len(opening)
  end = text.index(closing)
  if end < start:
    raise MarkerError(f"README region {name!r}: {closing} comes before {opening}.")
  return start, end


def check_regions(text: str, names: Sequence[str]) -> None:
  """MarkerError naming every region of `names` whose markers are not in `text` as they must."""
  problems = []
  for name in names:
    try:
      region_span(text, name)
    except MarkerError as error:
      problems.append(str(error))
  if problems:
    raise MarkerError(" ".join(problems))


def replace_region(text: str, name: str, body: str) -> str:
  """`text` with region `name`'s content replaced by `body`; the whitespace just inside the
  markers (newlines for a block, none inside a sentence) is kept, everything else untouched."""
  start, end = region_span(text, name)
  inner = text[start:end]
  lead = inner[: len(inner) - len(inner.lstrip())]
  trail = inner[len(inner.rstrip()) :]
  return text[:start] + lead + body.strip() + trail + text[end:]


def replace_regions(text: str, bodies: Mapping[str, str]) -> str:
  """replace_region for every {name: body}; all markers are checked first."""
  check_regions(text, list(bodies))
  for name, body in bodies.items():
    text = replace_region(text, name, body)
  return text


def figure_files(readme: str) -> list[str]:
  """The files whose regions the script rewrites: `readme` and the pages of the docs/ folder
  beside it (docs/*.md, sorted; none when there is no such folder)."""
  docs = os.path.join(os.path.dirname(os.path.abspath(readme)), "docs")
  pages = sorted(glob.glob(os.path.join(docs, "*.md")))
  return [readme, *pages]


def region_homes(texts: Mapping[str, str], names: Sequence[str]) -> dict[str, str]:
  """{region: the file of `texts` ({path: text}) that holds it}, every region's markers checked
  there; MarkerError naming every region that no file holds, or that two files hold."""
  homes, problems = {}, []
  for name in names:
    holders = [
      path
      for path, text in texts.items()
      if OPEN.format(name) in text or CLOSE.format(name) in text
    ]
    shown = ", ".join(os.path.relpath(path) for path in texts)
    if not holders:
      problems.append(
        f"README region {name!r}: none of {shown} holds {OPEN.format(name)}; wrap the region's "
        f"figures in {OPEN.format(name)} and {CLOSE.format(name)} in the page that shows them."
      )
    elif len(holders) > 1:
      problems.append(
        f"README region {name!r} is in {' and '.join(os.path.relpath(p) for p in holders)}; "
        "keep it in one of them."
      )
    else:
      try:
        region_span(texts[holders[0]], name)
        homes[name] = holders[0]
      except MarkerError as error:
        problems.append(f"{os.path.relpath(holders[0])}: {error}")
  if problems:
    raise MarkerError(" ".join(problems))
  return homes


def linked_from(body: str, images: Sequence[str], root: str, home: str) -> str:
  """`body` with each markdown link to one of `images` (paths relative to `root`, the README's
  folder, as a section returns them) made relative to `home`, the page that holds the region."""
  for image in images:
    relative = os.path.relpath(os.path.join(root, image), os.path.dirname(os.path.abspath(home)))
    body = body.replace(f"]({image})", f"]({relative.replace(os.sep, '/')})")
  return body


def unified_diff(old: str, new: str, path: str) -> str:
  """The unified diff from `old` to `new` ('' when equal), labelled with `path`."""
  return "".join(
    difflib.unified_diff(
      old.splitlines(keepends=True),
      new.splitlines(keepends=True),
      fromfile=f"{path} (now)",
      tofile=f"{path} (measured)",
    )
  )


def write_atomic(path: str, content: str | bytes) -> None:
  """Replaces (or creates) the file in one step: a reader (or another editor) never sees half
  of it. Text is written as UTF-8, bytes as they are."""
  mode = os.stat(path).st_mode & 0o777 if os.path.exists(path) else None
  with paths.AtomicWrite(path) as f:
    f.write(content if isinstance(content, bytes) else content.encode("utf-8"))
    if mode is not None:  # the file keeps its mode (an executable script stays one)
      os.chmod(f.name, mode)


# ---------------------------------------------------------------------------------------------
# Formatting.


def about(seconds: float) -> str:
  """A measured time as the README states it: 'about N s', N rounded to about 2 significant
  figures (one run on a shared machine is not more precise than that)."""
  if seconds < 10:
    n = max(1, round(seconds))
  elif seconds < 100:
    n = 5 * round(seconds / 5)
  elif seconds < 600:
    n = 10 * round(seconds / 10)
  else:
    return f"about {round(seconds / 60)} minutes"
  return f"about {n} s"


#: A timing as `about` writes it (and the "about N ms" / "about N hours" of a rate or a cost).
_TIMING = re.compile(r"about \d[\d,]*(?:\.\d+)? (?:s|ms|minutes|hours)\b")


def without_timings(text: str) -> str:
  """`text` with every timing (`about`'s "about N s" / "about N minutes") blanked and its
  whitespace made single spaces: what --check compares, since a timing is one run on a noisy
  machine and not a figure that can drift, and a paragraph re-wrapped because a timing's
  width changed says the same."""
  return " ".join(_TIMING.sub("about ? s", text).split())


def bound(measured: float) -> str:
  """A measured difference stated as the bound it shows, the next power of ten at or above it
  ("1e-5" for 2.6e-6 and for 3.8e-6): what holds on every machine of the kind, where the
  measured value itself moves from run to run ("0" when there is no difference)."""
  if measured <= 0:
    return "0"
  exponent = math.ceil(math.log10(measured) - 1e-12)
  return f"1e{exponent}" if exponent < 0 else f"{10**exponent:g}"


#: A figure of a region's text: digits, with a fraction or not.
_FIGURE = re.compile(r"\d+(?:\.\d+)?")


def same_figures(old: str, new: str, tolerance: float = 0.0) -> bool:
  """Whether `new` says what `old` does, timings aside: the same words, the same whole numbers
  (counts) and each decimal figure within `tolerance` of the old one (equal when 0)."""
  old, new = without_timings(old), without_timings(new)
  if old == new:
    return True
  if _FIGURE.split(old) != _FIGURE.split(new):  # other words, or figures where there were none
    return False
  for a, b in zip(_FIGURE.findall(old), _FIGURE.findall(new)):
    if "." not in a or "." not in b:
      if a != b:
        return False
    elif abs(float(a) - float(b)) > tolerance + 1e-9:
      return False
  return True


def machine() -> str:
  """What the timings ran on, as the README says it ("2 CPU cores")."""
  import jax  # pylint: disable=import-outside-toplevel

  if jax.default_backend() == "cpu":
    return f"{len(os.sched_getaffinity(0))} CPU cores"
  return f"{jax.device_count()} {jax.devices()[0].device_kind}"


def signed(x: float, digits: int = 3) -> str:
  """+0.045 / −0.123, with the README's minus sign."""
  return f"{x:+.{digits}f}".replace("-", MINUS)


def slashed(values: Sequence[Any], fmt: str) -> str:
  """'a / b / c' of values formatted with `fmt` ("{:.3f}")."""
  return " / ".join(fmt.format(v) for v in values)


def percent2(x: float) -> str:
  """A percentage as the protocols print it, 100 without decimals."""
  return "100" if round(x, 2) == 100 else f"{x:.2f}"


#: What markdown would read as a list item, quote, heading, table row or HTML at a line start.
_BLOCK_START = re.compile(r"^(([-+*>#|]|\d{1,9}[.)])(\s|$)|<)")


def fill(text: str, width: int = 100) -> str:
  """`text` as one paragraph wrapped at `width` columns (narrower if a line would otherwise
  start with something markdown reads as a new block)."""
  for w in range(width, width - 20, -1):
    lines = textwrap.wrap(text, w, break_long_words=False, break_on_hyphens=False)
    if not any(_BLOCK_START.match(line) for line in lines):
      return "\n".join(lines)
  raise ValueError(f"cannot wrap without a line that starts a markdown block: {text!r}")


def seed_range(seeds: Sequence[int]) -> str:
  return f"{seeds[0]}-{seeds[-1]}" if len(seeds) > 1 else str(seeds[0])


@contextlib.contextmanager
def quiet():
  """Everything a measurement prints (progress bars, logs, XLA's own warnings) goes to a
  temporary file at the descriptor level; shown only if the measurement fails."""
  sys.stdout.flush()
  sys.stderr.flush()
  with tempfile.TemporaryFile() as log:
    saved = os.dup(1), os.dup(2)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    failed = False
    try:
      yield
    except BaseException:
      failed = True
      raise
    finally:
      sys.stdout.flush()
      sys.stderr.flush()
      os.dup2(saved[0], 1)
      os.dup2(saved[1], 2)
      os.close(saved[0])
      os.close(saved[1])
      if failed:
        log.seek(0)
        sys.stderr.write(log.read().decode("utf-8", "replace")[-20000:])
        sys.stderr.flush()


# ---------------------------------------------------------------------------------------------
# Sections: each measures once and returns {region name: markdown}.


def _ewf():
  """scripts/embedded_world_figures.py, imported on first use (it imports JAX and the models,
  which the region logic and its tests do not need)."""
  here = os.path.dirname(os.path.abspath(__file__))
  if here not in sys.path:
    sys.path.insert(0, here)
  import embedded_world_figures  # pylint: disable=import-outside-toplevel

  return embedded_world_figures


DEMO_SEEDS = (1, 2, 3)


def demo_figures() -> dict[str, str]:
  """configs/demo.py over seeds 1-3 with its log-weight prior (timed), then with the paper's
  objective (log_weight_penalty = 0)."""
  ewf = _ewf()
  start = time.perf_counter()
  runs = ewf.demo_runs(DEMO_SEEDS)
  seconds = time.perf_counter() - start
  paper = ewf.demo_runs(DEMO_SEEDS, penalty=0.0)
  first = runs[0]
  lines = [
    f"On the shipped tiny CLIP ({machine()}, {about(seconds)} in all), "
    f"{first['test_images']} test images, {first['shots']} shots:",
    "",
    "| seed | zero-shot | SToRI | word-rank AUC vs stated size/background | vs every other word "
    "| classes with a discriminating word in their top 3 |",
    "|---|---|---|---|---|---|",
  ]
  for r in runs:
    lines.append(
      f"| {r['seed']} | {r['zero_shot']:.2%} | {r['stori']:.2%} | {r['auc_nuisance']:.3f} | "
      f"{r['auc_other']:.3f} | {r['top3']} of {r['classes']} |"
    )
  paper_text = (
    f"seeds {seed_range(DEMO_SEEDS)} give SToRI\n"
    f"{slashed([100 * r['stori'] for r in paper], '{:.2f}')}%, AUC vs stated size/background "
    f"{slashed([r['auc_nuisance'] for r in paper], '{:.3f}')}, vs every other\n"
    f"word {slashed([r['auc_other'] for r in paper], '{:.3f}')}, and a discriminating word in "
    f"the top 3 of {slashed([r['top3'] for r in paper], '{}')} of {paper[0]['classes']} classes."
  )
  two = ewf.demo_runs(DEMO_SEEDS, classes="two_colours")
  two_text = (
    f"Seeds {seed_range(DEMO_SEEDS)}: zero-shot {100 * two[0]['zero_shot']:.2f}%, SToRI "
    f"{slashed([100 * r['stori'] for r in two], '{:.2f}')}%, AUC vs stated\n"
    f"size/background {slashed([r['auc_nuisance'] for r in two], '{:.3f}')}, a discriminating "
    f"word in the top 3 of {slashed([r['top3'] for r in two], '{}')} of {two[0]['classes']}\n"
    f"classes, but AUC vs every other word {slashed([r['auc_other'] for r in two], '{:.3f}')}"
  )
  return {"demo": "\n".join(lines), "demo.paper": paper_text, "demo.two_colours": two_text}


WORLD_MODELS = ("tiny-synthetic-base", "tiny-synthetic")


def world_figures(
  models: Sequence[str] = WORLD_MODELS, eval_args: Sequence[str] = (), probe_config: str = ""
) -> dict[str, str]:
  """Zero-shot quality and Table 3 of both tiny CLIPs, as `python -m stori_jax.evaluate_world
  --source M *eval_args` prints them (the command, run in this process); weight 0 and Fig. 5 on
  the same images (configs/retrieval_synthetic.py's probe set, or `probe_config`'s) by
  scripts/embedded_world_figures.py; and the Status section's summary of the shipped model.
  `models` is (base, shipped)."""
  import stori_jax  # pylint: disable=import-outside-toplevel

  ewf, m = _ewf(), {}
  for name in models:
    results = ewf.world_eval(name, eval_args)
    bundle = stori_jax.load(name)
    embeddings, tasks = ewf.probe_set(bundle, probe_config or ewf.RETRIEVAL_CONFIG)
    m[name] = dict(
      quality=ewf.zero_shot_quality(results),
      table3=ewf.table3(results),
      shares=ewf.colour_shares(bundle, embeddings, tasks),
      focus=ewf.fig5_focus(bundle, embeddings, tasks),
    )
  zero_shot = [
    "| model | colour | shape | pattern | size | position | R@1 text→image | R@1 image→text |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for name in models:
    q = m[name]["quality"]
    cells = [f"{q[k]:.3f}" for k in (*ewf.ZERO_SHOT_FAMILIES, "t2i", "i2t")]
    zero_shot.append(f"| {name} | " + " | ".join(cells) + " |")
  base, shipped = (m[name] for name in models)
  table = [
    "| emphasised word | AP w=0.5 | AP w=1.0 | AP w=1.5 | ΔAP 0.5 | ΔAP 1.5 | "
    f"{models[0]} ΔAP 0.5 / 1.5 |",
    "|---|---|---|---|---|---|---|",
  ]
  for family, row in shipped["table3"].items():
    ap, delta = row["ap"], row["delta"]
    b = base["table3"][family]["delta"]
    table.append(
      f"| {family} | {ap[0]:.3f} | {ap[1]:.3f} | {ap[2]:.3f} | {signed(delta[0])} | "
      f"{signed(delta[1])} | {signed(b[0])} / {signed(b[1])} |"
    )

  def ends(a: str, b: str, both: str) -> str:
    return f"{a} {both}" if a == b else f"{a} to {b}"

  s, sb = shipped["shares"], base["shares"]
  fb = base["focus"]
  effects = fill(
    "On the same images (`python scripts/embedded_world_figures.py`, which calls the retrieval "
    "protocol's functions on configs/retrieval_synthetic.py's probe set), weight 0 on the colour "
    "word drops the share of the prompt's colour among the top 16 images from "
    f"{s[0]:.1%} to {s[1]:.1%} ({models[0]}: "
    f"{ends(f'{sb[0]:.1%}', f'{sb[1]:.1%}', 'at both weights')}), "
    "and the Fig. 5 sweep (pattern w, colour 1 − w) moves the favoured category's AUC from "
    f"{shipped['focus'][0]:.3f} to {shipped['focus'][-1]:.3f} ({models[0]}: "
    f"{ends(f'{fb[0]:.3f}', f'{fb[-1]:.3f}', 'at both ends')})."
  )
  q = shipped["quality"]
  sizes = [abs(d) for row in shipped["table3"].values() for d in row["delta"]]
  status = fill(
    f"The tiny CLIP keeps the embedded world's targets (colour {q['colour']:.3f}, shape "
    f"{q['shape']:.3f}, pattern {q['pattern']:.3f}, R@1 {q['t2i']:.3f}) and now responds to "
    f"token weights at its default blocks (Table 3 ΔAP of {min(sizes):.3f} to {max(sizes):.3f} "
    f"in every family; weight 0 on the colour word: top 16 from {s[0]:.0%} to {s[1]:.0%} of "
    "that colour)."
  )
  return {
    "world.zero_shot": "\n".join(zero_shot),
    "world.table3": "\n".join(table) + "\n\n" + effects,
    "world.status": status,
  }


def start_block_figures(
  models: Sequence[str] = WORLD_MODELS, data_config: str | None = None
) -> dict[str, str]:
  """The table `python -m stori_jax.start_block --model <shipped>` prints (the command, run
  in this process, on configs/retrieval_synthetic.py's probe set unless `data_config`), and
  the base model's slopes from the same command with `--model <base>`. `models` is (base,
  shipped)."""
  ewf = _ewf()
  runs = {name: ewf.start_block_run(name, data_config) for name in models}
  base, shipped = models
  table, sweep = runs[shipped]
  slope = {r["start_block"]: r["ap_per_log_weight"] for r in runs[base][1]["blocks"]}
  default = sweep["recommended"]
  data = "`" + (data_config or "configs/retrieval_synthetic.py") + "`"
  head = (
    f"On {shipped} (the probe set of {data}: {sweep['n_tasks']} prompts, "
    f"{sweep['n_images']} images):"
  )
  tail = fill(
    f"With `--model {base}` the same slope is {signed(slope[1], 4)} from block 1 and "
    f"{signed(slope[default], 4)} from block {default} (recommended: block "
    f"{runs[base][1]['recommended']})."
  )
  return {"start_block": f"{head}\n\n```\n{table}\n```\n\n{tail}"}


ABLATION_BLOCKS = (1, 2, 3, 4, 5, 6)


def ablation_figures(blocks: Sequence[int] = ABLATION_BLOCKS) -> dict[str, str]:
  """The paper's ablations on the demo's two-colour task, as `python -m stori_jax.train` with
  scripts/embedded_world_figures.py's ABLATION_FLAGS runs them (the command, in this process):
  Fig. 10 per start block of `blocks`, Table 1 with five rare tokens at the default block."""
  ewf = _ewf()
  runs = ewf.ablation_runs(blocks)
  by_block, rare = runs["blocks"], runs["rare_tokens"]
  first, default = min(by_block), runs["default_block"]
  zero = {round(100 * r["zero_shot"]["accuracy"], 2) for r in by_block.values()}
  if len(zero) != 1:  # all weights 1: the start block cannot change zero-shot
    raise AssertionError(f"zero-shot differs between start blocks: {sorted(zero)}")
  plain = by_block.get(default)
  if plain is None:
    raise AssertionError(f"Table 1 runs at block {default}, which is not among {blocks}")
  shape = {b: r["median_word_weight"]["shape"] for b, r in by_block.items()}
  fig10 = (
    f"Fig. 10 (`--config.start_block=b`, b = {blocks[0]}..{blocks[-1]} of 6): SToRI "
    f"{slashed([100 * r['trained']['accuracy'] for r in by_block.values()], '{:.2f}')}% "
    f"against {zero.pop():.2f}% zero-shot, word-rank AUC vs stated size/background "
    f"{slashed([r['word_rank_auc']['nuisance'] for r in by_block.values()], '{:.3f}')} (vs "
    f"every other word "
    f"{slashed([r['word_rank_auc']['other'] for r in by_block.values()], '{:.3f}')}); the "
    f"shape words' median weight is {shape[first]:.2f} from block {first} and "
    f"{shape[default]:.2f} from block {default}."
  )
  table1 = (
    f"Table 1 (`{ewf.RARE_TOKENS_FLAG}`, at the default block {default}): five rare tokens "
    f"appended change zero-shot from {100 * plain['zero_shot']['accuracy']:.2f}% to "
    f"{100 * rare['zero_shot']['accuracy']:.2f}% and SToRI from "
    f"{100 * plain['trained']['accuracy']:.2f}% to {100 * rare['trained']['accuracy']:.2f}% "
    f"(AUC vs stated size/background {plain['word_rank_auc']['nuisance']:.3f} to "
    f"{rare['word_rank_auc']['nuisance']:.3f})."
  )
  return {"ablations": fill(fig10 + " " + table1)}


def concept_ground_truth(config) -> dict[str, Any]:
  """The analysis again, class by class, scored against the generator's ground truth as
  tests/test_mutual_pipeline.py scores it: the share of concept pixels on objects (and the
  objects' share of the image), and how often a concept's descriptors name its object's
  attributes per method (and the bank's share of such descriptors: chance)."""
  import numpy as np  # pylint: disable=import-outside-toplevel

  import stori_jax  # pylint: disable=import-outside-toplevel
  from mutual import data, pipeline  # pylint: disable=import-outside-toplevel

  dataset = data.prepare(config)
  bundle = stori_jax.load(config.model.source)
  bank = pipeline.encode_config_bank(bundle, config, dataset, progress=False)
  methods = tuple(config.analysis.methods)
  overlap, hits, chance = [], {m: [] for m in methods}, []
  for cls in dataset.classes(int(bundle.config.vision.image_size)):
    result = pipeline.analyze_class(bundle, cls.images, bank, config.analysis, methods)
    for method in methods:
      r = result[method]
      overlap.append(data.object_overlap(cls.truth, r["pixel_maps"]))
      hit, hit_chance = data.descriptor_hits(
        cls.truth, bank.descriptors, r["visual_ids"], r["visual_valid"]
      )
      hits[method].append(hit)
      chance.append(hit_chance)
  on_object, cover = np.mean(overlap, axis=0)
  return dict(
    on_object=float(on_object),
    cover=float(cover),
    hits={m: float(np.mean(h)) for m, h in hits.items()},
    chance=float(np.mean(chance)),
  )


def mutual_analyze_figures() -> dict[str, str]:
  """mutual.analyze on configs/mutual_synthetic.py (timed), its results.json's dataset row,
  and the ground-truth scores of its concepts."""
  import json  # pylint: disable=import-outside-toplevel

  from mutual.analysis import runner as analysis  # pylint: disable=import-outside-toplevel
  from stori_jax.plumbing.config_files import load_config  # pylint: disable=import-outside-toplevel

  config = load_config(os.path.join(CONFIGS, "mutual_synthetic.py"))
  run = analysis.run
  with tempfile.TemporaryDirectory() as workdir:
    start = time.perf_counter()
    run(config, workdir, progress=False)
    seconds = time.perf_counter() - start
    with open(os.path.join(workdir, "results.json"), encoding="utf-8") as f:
      results = json.load(f)
  truth = concept_ground_truth(config)
  ds = results["dataset"]
  pca, kmeans = ds["pca"], ds["kmeans"]
  n_classes, per_class = len(results["classes"]), int(config.data.images_per_class)
  text = (
    f"On the embedded world (tiny CLIP, {n_classes} classes × {per_class} images, per-image "
    "spectral split since the tiny\nmodel's joint split separates backgrounds; "
    f"{about(seconds)} on {machine()}): Top-1 {ds['top1']:.2f}, MI {pca['mi']:.3f}\n"
    f"(PCA) / {kmeans['mi']:.3f} (K-means), AUC {pca['auc']:.3f} / {kmeans['auc']:.3f}. "
    f"{100 * truth['on_object']:.1f}% of the concept pixels lie on objects (objects\ncover "
    f"{100 * truth['cover']:.1f}% of the image), and a concept's descriptors name its object's "
    f"attributes {100 * truth['hits']['pca']:.0f}% (PCA) /\n{100 * truth['hits']['kmeans']:.0f}% "
    f"(K-means) of the time against {100 * truth['chance']:.1f}% by chance (asserted)."
  )
  return {"mutual_analyze": text}


def reference_agreement(
  bundle, model, images, bank, analysis, methods, use_crf: bool, ours=None
) -> dict:
  """Whether reference mode's MI and AUC equal mutual/reference.py's, image by image, with the
  CRF on both sides (SimpleCRF's, `use_crf`) or off on both sides.

  Args:
    bundle: the model; model: its open_clip copy (`mutual.reference.open_clip_from_bundle`).
    images: uint8 [B, S, S, 3], one class's; bank: the pipeline's TextBank.
    analysis: config.analysis in reference mode; methods: the concept methods compared.
    use_crf: the CRF on both sides (SimpleCRF installed and config.analysis.crf on).
    ours: `pipeline.analyze_class(bundle, images, bank, analysis, methods)` already computed,
      reused when its CRF setting is `use_crf`; otherwise the project's side runs again with
      config.analysis.crf set to `use_crf` (its own CRF would else face a reference without).

  Returns:
    {method: bool [B]}, MI and AUC both within 1e-5.
  """
  import numpy as np  # pylint: disable=import-outside-toplevel

  from mutual import concept_methods, paper_config, pipeline  # pylint: disable=import-outside-toplevel
  from mutual import reference as torch_reference  # pylint: disable=import-outside-toplevel

  if ours is None or bool(analysis.crf) != use_crf:
    analysis = analysis.copy_and_resolve_references()
    analysis.crf = use_crf
    ours = pipeline.analyze_class(bundle, images, bank, analysis, methods)
  theirs = torch_reference.analyze_class(
    model,
    images,
    bundle.preprocess_config.mean,
    bundle.preprocess_config.std,
    bank.descriptor_embeddings,
    bank.class_embeddings,
    int(analysis.top_k),
    int(analysis.u),
    methods=concept_methods.reference_labelers(
      torch_reference, methods, paper_config.concept_settings(analysis)
    ),
    joint=bool(analysis.joint_foreground),
    crf=use_crf,
    ellipse_seed=int(analysis.ellipse_seed),
  )
  agree = {}
  for m in methods:
    mine = pipeline.summarise(ours, m)
    agree[m] = np.isclose(mine["mi"], theirs[m]["mi"], rtol=1e-5, atol=1e-5) & np.isclose(
      mine["auc"], theirs[m]["auc"], rtol=1e-5, atol=1e-5
    )
  return agree


EXPLAIN_INPUT = "docs/images/explain_input.png"
EXPLAIN_IMAGE = "docs/images/mutual_explain.png"
#: The embedded world's image the docs explain: class 2 (an orange striped circle), drawn by rule.
EXPLAIN_CLASS, EXPLAIN_SEED = 2, 7


def mutual_explain_figures() -> dict[str, Any]:
  """`python -m mutual.explain --image EXPLAIN_INPUT --workdir workdirs/explain` (the command,
  run in this process on an embedded-world image drawn by rule; timed): what it prints, its
  figure (EXPLAIN_IMAGE) and the input image itself (EXPLAIN_INPUT)."""
  import io  # pylint: disable=import-outside-toplevel

  from PIL import Image  # pylint: disable=import-outside-toplevel

  from mutual import data, explain  # pylint: disable=import-outside-toplevel

  ewf = _ewf()
  (cls,) = data.synthetic_classes(1, seed=EXPLAIN_SEED, image_size=64, classes=(EXPLAIN_CLASS,))
  encoded = io.BytesIO()
  Image.fromarray(cls.images[0]).save(encoded, format="PNG")
  name = os.path.basename(EXPLAIN_INPUT)
  with tempfile.TemporaryDirectory() as folder:
    image, workdir = os.path.join(folder, name), os.path.join(folder, "explain")
    with open(image, "wb") as f:
      f.write(encoded.getvalue())
    start = time.perf_counter()
    printed = ewf.run_command(explain, ["--image", image, "--workdir", workdir])
    seconds = time.perf_counter() - start
    with open(os.path.join(workdir, os.path.splitext(name)[0] + ".png"), "rb") as f:
      figure = f.read()
  printed = printed.replace(image, EXPLAIN_INPUT).replace(workdir, "workdirs/explain")
  command = f"python -m mutual.explain --image {EXPLAIN_INPUT} --workdir workdirs/explain"
  text = "\n".join(
    [
      f"On {machine()} ({about(seconds)}, the model's load and compilation included), the "
      f"embedded world's {cls.name} below:",
      "",
      "```",
      f"$ {command}",
      printed.rstrip(),
      "```",
      "",
      f"![mutual.explain on an embedded-world image]({EXPLAIN_IMAGE})",
    ]
  )
  return {"mutual_explain": text, EXPLAIN_INPUT: encoded.getvalue(), EXPLAIN_IMAGE: figure}


def mutual_modes_figures() -> dict[str, str]:
  """Table 3's row of the embedded world in both analysis modes (configs/mutual_synthetic.py
  with config.analysis.mode set; results aggregated as mutual.analyze aggregates them), and the
  per-image agreement of reference mode with mutual/reference.py (the reference's
  libraries, image by image; SimpleCRF where it is installed) on the same images and settings."""
  import numpy as np  # pylint: disable=import-outside-toplevel

  import stori_jax  # pylint: disable=import-outside-toplevel
  from mutual import concept_methods, data, pipeline, report  # pylint: disable=import-outside-toplevel
  from stori_jax.plumbing.config_files import load_config  # pylint: disable=import-outside-toplevel

  config = load_config(os.path.join(CONFIGS, "mutual_synthetic.py"))
  dataset = data.prepare(config)
  bundle = stori_jax.load(config.model.source)
  bank = pipeline.encode_config_bank(bundle, config, dataset, progress=False)
  methods = tuple(config.analysis.methods)
  size = int(bundle.config.vision.image_size)
  names = list(dataset.names)
  a = config.analysis
  try:
    from mutual import reference as torch_reference  # pylint: disable=import-outside-toplevel

    import kmeans_pytorch  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  except ImportError:
    torch_reference = None
  use_crf = bool(a.crf) and torch_reference is not None and torch_reference.have_crf()
  model = torch_reference.open_clip_from_bundle(bundle) if torch_reference else None
  rows, same = {}, {m: [] for m in methods}
  for mode in ("reference", "improved"):
    a.mode = mode
    records = []
    for cls in dataset.classes(size):
      result = pipeline.analyze_class(bundle, cls.images, bank, a, methods)
      records += report.image_records(cls, result, bank.descriptors, names, methods)
      if mode == "reference" and model is not None:
        agree = reference_agreement(bundle, model, cls.images, bank, a, methods, use_crf, result)
        for m in methods:
          same[m].append(agree[m])
    rows[mode] = report.aggregate(records, methods)["dataset"]
  head = ["mode", "Top-1 (%)"] + [f"MI {concept_methods.title(m)}" for m in methods]
  head += [f"AUC {concept_methods.title(m)}" for m in methods]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for mode, ds in rows.items():
    cells = [f"`{mode}`", f"{ds['top1']:.2f}"] + [f"{ds[m]['mi']:.3f}" for m in methods]
    lines.append("| " + " | ".join(cells + [f"{ds[m]['auc']:.3f}" for m in methods]) + " |")
  if model is None:
    prose = "(mutual/reference.py needs the torch extra and kmeans_pytorch: no agreement "
    prose += "figure measured.)"
  else:
    shares = {m: float(np.concatenate(v).mean()) for m, v in same.items()}
    n_images = sum(len(v) for v in same[methods[0]])
    split = "per-image" if not a.joint_foreground else "joint"
    prose = (
      f"Reference mode against `mutual/reference.py` on the same {n_images} images "
      f"({split} split, CRF {'on: SimpleCRF' if use_crf else 'off on both sides'}): identical "
      "MI and AUC on "
      + " / ".join(f"{100 * shares[m]:.1f}% ({concept_methods.title(m)})" for m in methods)
      + " of the images."
    )
  return {"mutual_modes": "\n".join(lines) + "\n\n" + fill(prose)}


METRIC_NAMES = {
  "deletion": "Deletion",
  "insertion": "Insertion",
  "acc_drop": "AccDrop",
  "acc_increase": "AccIncrease",
}
METHOD_NAMES = {"Ours (PCA)": "PCA", "Ours (K-means)": "K-means"}


#: --check's tolerance on the bf16 shares (percentage points). They count images whose MI or AUC
#: a last bit of bf16 moves, and one CPU's bf16 kernels against another's (XLA's defaults on an
#: AVX512-BF16 and on an AMX machine, and YNNPACK's consistent kernels) moved them by up to 6.8
#: points (reference mode, K-means: 35.9 / 36.5 / 29.7%). The README says so beside the figure.
BF16_TOLERANCE = 7.0


def mutual_precision_figures() -> dict[str, str]:
  """How often bfloat16 towers change MI or AUC per image (scripts/mutual_precision.py)."""
  import mutual_precision  # pylint: disable=import-outside-toplevel  (scripts/, beside this)

  runs = {m: mutual_precision.bf16_changes(m, progress=False) for m in ("reference", "improved")}
  parts = []
  for mode, r in runs.items():
    n = r["images"]
    parts.append(
      f"{mode} mode: MI or AUC change on {100 * r['pca']['either'] / n:.1f}% (PCA) / "
      f"{100 * r['kmeans']['either'] / n:.1f}% (K-means) of the {n} images, the prediction on "
      f"{100 * r['predicted'] / n:.1f}%"
    )
  text = (
    'With `config.analysis.compute_dtype="bfloat16"` (the towers in bf16; splits, fits '
    "and language stages in fp32) on configs/mutual_synthetic.py's images: "
    + "; ".join(parts)
    + ". A concept's patches and descriptors are discrete choices, and bf16 features move "
    "enough of them on this tiny model to change a curve; reproduce the paper's numbers in fp32."
  )
  return {"mutual_precision": fill(text)}


def _beats_random(beats: Mapping[str, Mapping[str, bool]]) -> str:
  """Where the method's concept order beats a random order of the same concepts: "on all four
  metrics", else per concept method ("on Deletion and Insertion for K-means")."""
  if all(all(v.values()) for v in beats.values()):
    return "on all four metrics"
  parts = []
  for method, v in beats.items():
    won = [METRIC_NAMES.get(k, k) for k, ok in v.items() if ok]
    if len(won) == len(v):
      what = "all four metrics"
    elif won:
      what = " and ".join([", ".join(won[:-1]), won[-1]]) if len(won) > 1 else won[0]
    else:
      what = "no metric"
    parts.append(f"on {what} for {METHOD_NAMES.get(method, method)}")
  return " and ".join(parts)


def _table2(table2: Mapping[str, Any]) -> str:
  """Table 2's sentence: the change of top-1 when the nearest classes' concepts are added."""
  from mutual import concept_methods  # pylint: disable=import-outside-toplevel

  # Rounded first: -0.001 and +0.001 both read "+0.00", one value.
  order = concept_methods.names()  # the paper's order (protocols.json sorts its keys)
  methods = sorted(table2["methods"], key=lambda m: order.index(m) if m in order else len(order))
  deltas = {m: round(table2["methods"][m]["delta"], 2) + 0.0 for m in methods}
  shown = {f"{d:+.2f}".replace("-", MINUS) for d in deltas.values()}
  if len(shown) == 1:
    change = shown.pop()
  else:
    change = " / ".join(f"{signed(d, 2)} ({concept_methods.title(m)})" for m, d in deltas.items())
  if max(deltas.values()) <= 0:
    return (
      f"Table 2 does not reproduce on this world ({change}: the tiny model's concepts are less "
      "similar to the images than the classes' own descriptors)."
    )
  return f"Table 2's gain shows on this world ({change} top-1 with the added concepts)."


MUTUAL_EVAL_CONFIG = "configs/mutual_eval_synthetic.py"


def mutual_evaluate_figures(config_path: str = MUTUAL_EVAL_CONFIG) -> dict[str, str]:
  """`python -m mutual.evaluate --config configs/mutual_eval_synthetic.py` (the command, run in
  this process; timed): Table 1's rows as it prints them, the rest from its table1.json and
  protocols.json."""
  from stori_jax.plumbing.config_files import load_config  # pylint: disable=import-outside-toplevel

  config = load_config(os.path.join(ROOT, config_path))
  start = time.perf_counter()
  run = _ewf().mutual_evaluate_run(config_path)
  seconds = time.perf_counter() - start
  results = {**run["table1"], "protocols": run["protocols"]}
  n_classes = results["images"] // int(config.data.images_per_class)
  lines = [
    fill(
      f"On the embedded world ({n_classes} classes × {config.data.images_per_class} images; "
      f"baselines trained on {config.baselines.data.images_per_class} other images per class; "
      f"{about(seconds)} on {machine()}):"
    ),
    "",
    "| Explanation | Delet.↓ | Insert.↑ | AccDrop↓ | AccInc↑ |",
    "|---|---|---|---|---|",
  ]
  # Table 1 as the command prints it (table1.md's first table; the Top-1 table follows).
  table1 = run["printed"].split("## Table 1", 1)[1].split("\n## ", 1)[0]
  rows = [line for line in table1.splitlines() if line.startswith("| ")][1:]  # below the head
  printed = {line.split("|")[1].strip(): line for line in rows}
  for name, line in printed.items():  # in the command's order (its JSON sorts the keys)
    cells = line.split("|")[1:-1]  # name, requires training, the four metrics
    lines.append(f"| {name} | " + " | ".join(c.strip() for c in cells[2:]) + " |")
  beats = {
    name: results["beats_random"][name] for name in printed if name in results["beats_random"]
  }
  top1 = results["top1"]
  p = results["protocols"]
  pca, kmeans = p["ot_entropy"]["methods"]["pca"], p["ot_entropy"]["methods"]["kmeans"]
  blur, bank = p["blur"], p["bank_quality"]
  prose = (
    f"The method beats a random order of its concepts {_beats_random(beats)} "
    "(Deletion and Insertion asserted) but by small margins: the tiny model's class score moves "
    "little when one region is blurred, and its baselines reach only "
    f"{top1['MM-CBM']:.0f}% (MM-CBM) and {top1['MM-ProtoSim']:.0f}% (MM-ProtoSim) top-1 against "
    f"{top1['zero-shot']:.2f}% zero-shot. Protocols: OT raises the descriptor entropy from "
    f"{pca['without_ot']:.2f} to {pca['with_ot']:.2f} (PCA) / {kmeans['without_ot']:.2f} to "
    f"{kmeans['with_ot']:.2f} (K-means) (paper: 1.70 → 2.33); A.3 base "
    f"{blur['base']['top1']:.2f}, NN {blur['nn']['top1']:.2f}, +component "
    f"{blur['fcc']['top1']:.2f}, +CRF {blur['crf']['top1']:.2f} (the reference's CRF "
    "parameters, set for 224-px photos, shrink the kept area of these 64-px drawings from "
    f"{100 * blur['kept']['fcc']:.0f}% to {100 * blur['kept']['crf']:.0f}%); A.4 top-1 "
    f"{percent2(bank['top1'])}, top-5 {percent2(bank['top5'])}, InterDiv "
    f"{bank['inter_div']:.3f}, IntraDiv {bank['intra_div']:.3f}. " + _table2(p["table2"])
  )
  parts = ["\n".join(lines), fill(prose), _table5(run["printed"], results["table5"])]
  parts += _app_a1(p["corloc"], p["layer_similarity"])
  return {"mutual_evaluate": "\n\n".join(parts)}


def _first_table(text: str) -> list[str]:
  """The lines of the first markdown table in `text` (header and separator included)."""
  lines = text.splitlines()
  start = next(i for i, line in enumerate(lines) if line.startswith("|"))
  end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
  return lines[start:end]


#: Table 5's rows in the paper's order of top-1 on ImageNet, best first (bottlenecks.PAPER).
TABLE5_ORDER = ("MM-ProtoSim", "MM-CBM", "Standard", "LF-CBM")


def _table5(printed: str, table5: Mapping[str, Any]) -> str:
  """Table 5 as mutual.evaluate prints it (table1.md), without its Vis. / Lan. / MMB columns,
  then a sentence on the paper's order and the concept labeler (table1.json)."""
  table = _first_table(printed.split("## Table 5", 1)[1])
  head = [c.strip() for c in table[0].split("|")[1:-1]]
  keep = [i for i, c in enumerate(head) if c not in ("Vis.", "Lan.", "MMB")]
  lines = []
  for line in table[:1] + table[2:]:  # the separator is rebuilt for the kept columns
    cells = [c.strip() for c in line.split("|")[1:-1]]
    lines.append("| " + " | ".join(cells[i] for i in keep) + " |")
  lines.insert(1, "|" + "---|" * len(keep))
  rows = table5["rows"]
  order = [n for n in TABLE5_ORDER if n in rows]
  measured = sorted(order, key=lambda n: -rows[n]["top1"])
  ranked = " > ".join(f"{n} {rows[n]['top1']:.2f}" for n in measured)
  if measured == order:
    text = f"The paper's ImageNet order of Table 5 holds here ({ranked} top-1)."
  else:
    text = (
      f"The paper's ImageNet order of Table 5 ({' > '.join(order)}) does not reproduce on the "
      f"tiny model: {ranked} top-1."
    )
  labeler = table5.get("labeler")
  if labeler:
    top = next(key for key in labeler if key.startswith("top_") and key[4:].isdigit())
    text += (
      f" The concept labeler (App. D.2) ranks every descriptor of an image's class among its K "
      f"best-scored (K the class's count) on {labeler['top_all']:.2f}% of the "
      f"{labeler['images']} images (top-all; paper {labeler['paper_top_all']:.2f}) and among its "
      f"best max(K, {top[4:]}) on "
      f"{labeler[top]:.2f}% ({top.replace('_', '-')}; paper {labeler['paper_' + top]:.2f})."
    )
  title = fill(
    f"Table 5 (App. D) on the same images, as `table1.md` gives it ({table5['images']} images; "
    "the paper's columns: ImageNet val, CLIP ViT-B/16):"
  )
  return title + "\n\n" + "\n".join(lines) + "\n\n" + fill(text)


def _app_a1(corloc: Mapping[str, Any], layers: Mapping[str, Any]) -> list[str]:
  """App. A.1 from protocols.json: CorLoc per facet (rows) and decomposition (columns), with
  the trivial boxes' floors and the paper's GDC-over-PCA reading; the [CLS] layer similarity's
  summary against the paper's reading."""
  from mutual.protocols import localization  # pylint: disable=import-outside-toplevel

  table = corloc["corloc"]
  decompositions = list(next(iter(table.values())))
  titles = [localization.DECOMPOSITION_TITLES.get(d, d) for d in decompositions]
  lines = [
    fill(
      f"App. A.1, CorLoc (%) of the box round the most prominent region (IoU > "
      f"{corloc['iou_threshold']:g} with the object's box, {corloc['images']} images, "
      "`protocols.md`):"
    ),
    "",
    "| Facet | " + " | ".join(titles) + " |",
    "|---|" + "---|" * len(titles),
  ]
  facets = [f for f in localization.FACETS if f in table] + [
    f for f in table if f not in localization.FACETS
  ]  # the paper's order (protocols.json sorts its keys)
  for facet in facets:
    row = table[facet]
    cells = ["-" if row[d] is None else f"{row[d]:.1f}" for d in decompositions]
    lines.append(f"| {localization.FACET_TITLES.get(facet, facet)} | " + " | ".join(cells) + " |")
  scored = {f: table[f] for f in facets if None not in table[f].values()}
  pca_wins = [f for f, r in scored.items() if r.get("pca", 0) > r.get("gdc", 0)]
  trivial = corloc["trivial"]
  if len(pca_wins) == len(scored):
    reading = (
      "PCA localises better than GDC on every facet, the reverse of the paper's ImageNet finding "
      "(GDC well ahead of PCA, hence the pipeline's graph split)"
    )
  elif pca_wins:
    facets = listed([localization.FACET_TITLES.get(f, f) for f in pca_wins])
    reading = (
      f"PCA localises better than GDC on the {facets} facet{'s' if len(pca_wins) > 1 else ''}, "
      "against the paper's ImageNet finding (GDC ahead of PCA everywhere)"
    )
  else:
    reading = "GDC localises better than PCA on every facet, as on ImageNet in the paper"
  floors = (
    f"{reading}; the boxes that look at no feature score {trivial['whole_image']:.1f}% (the whole "
    f"image) and {trivial['centre']:.1f}% (the centred half-side box)."
  )
  t, k = layers["summary"]["tokens"], layers["summary"]["keys"]
  cos = lambda x: f"{x:.3f}".replace("-", MINUS)  # noqa: E731
  shows = t["last_vs_earlier"] < t["among_earlier"] and k["last_vs_earlier"] > t["last_vs_earlier"]
  similarity = (
    f"The [CLS] similarity across the {layers['layers']} layers (`layer_similarity.png`): the last "
    f"layer's token has cosine {cos(t['last_vs_earlier'])} with the earlier layers' (which have "
    f"{cos(t['among_earlier'])} among themselves), its key {cos(k['last_vs_earlier'])} "
    f"({cos(k['among_earlier'])}); the paper's reading on ViT-B/16 (the last token unlike the "
    f"earlier ones, the keys alike across layers) {'shows' if shows else 'does not show'} here."
  )
  return ["\n".join(lines), fill(floors + " " + similarity)]


@dataclasses.dataclass(frozen=True)
class Section:
  """A measurement, the regions it rewrites (in README.md or a page of docs/), and the images it
  draws (paths relative to the README's folder, linked from those regions). `measure` returns {region: markdown} and
  {image path: PNG bytes}. `tolerance`: how far --check lets each decimal figure of the
  regions move (0: not at all), for figures that differ between CPUs whatever the flags; the
  README states it beside them."""

  measure: Callable[[], dict[str, Any]]
  regions: tuple[str, ...]
  what: str
  images: tuple[str, ...] = ()
  tolerance: float = 0.0
  #: Every decimal figure of the regions is one run's timing (seconds, rates, shares, ratios on
  #: a noisy machine): --check compares their words and whole numbers, not those figures.
  timed: bool = False


def grid_figures() -> dict[str, str]:
  """python -m stori_jax.run_grid --config configs/grid_synthetic.py, run in this process (timed):
  the tables as the command prints them."""
  from stori_jax.plumbing.config_files import load_config  # pylint: disable=import-outside-toplevel
  from stori_jax.grid import runner, tables  # pylint: disable=import-outside-toplevel

  config = load_config(os.path.join(CONFIGS, "grid_synthetic.py"))
  with tempfile.TemporaryDirectory() as workdir:
    start = time.perf_counter()
    result = runner.run(config, workdir)
    seconds = time.perf_counter() - start
  intro = f"On the shipped tiny CLIP ({machine()}, {about(seconds)} in all):"
  return {"grid": intro + "\n\n" + tables.markdown(result).strip() + "\n"}


def listed(items: Sequence[Any]) -> str:
  """'1-4' for a run of 3 or more consecutive integers, else 'a, b and c'."""
  items = list(items)
  if len(items) > 2 and all(isinstance(i, int) for i in items):
    if items == list(range(items[0], items[0] + len(items))):
      return f"{items[0]}-{items[-1]}"
  return ", ".join(map(str, items[:-1])) + (" and " if len(items) > 1 else "") + str(items[-1])


#: The paper's Table 1 (16 shots): {dataset: (CuPL, CuPL + nonsensical tokens)}.
PAPER_TABLE1 = {"Caltech101": (97.42, 97.30), "SUN397": (79.54, 79.11)}
FIG10_IMAGE = "docs/images/fig10_synthetic.png"


def _grid_run(argument: str, name: str) -> tuple[dict[str, Any], float, bytes | None]:
  """`python -m stori_jax.run_grid --config configs/<name>.py:<argument>`, run in this process as
  grid_figures runs it, in a temporary workdir: its tables' data, its time in seconds, and its
  figure's PNG (a grid with a sweep) or None."""
  from stori_jax.plumbing.config_files import load_config  # pylint: disable=import-outside-toplevel
  from stori_jax.grid import figure, runner  # pylint: disable=import-outside-toplevel

  config = load_config(os.path.join(CONFIGS, f"{name}.py"), argument)
  with tempfile.TemporaryDirectory() as workdir, contextlib.chdir(ROOT):
    start = time.perf_counter()
    result = runner.run(config, workdir)
    seconds = time.perf_counter() - start
    png = None
    if result["sweep"]:
      with open(os.path.join(workdir, figure.file_name(result)), "rb") as f:
        png = f.read()
  return result, seconds, png


def grid_ablation_figures() -> dict[str, Any]:
  """`python -m stori_jax.run_grid --config configs/table1.py:synthetic`, then
  `--config configs/fig10.py:synthetic`, run in this process (each timed): the tables as the
  command prints them, a sentence on each against the paper, and Fig. 10's
  accuracy_by_start_block.png (FIG10_IMAGE)."""
  from stori_jax.grid import tables  # pylint: disable=import-outside-toplevel

  table1, table1_seconds, _ = _grid_run("synthetic", "table1")
  fig10, fig10_seconds, png = _grid_run("synthetic", "fig10")
  dataset = table1["datasets"][0]
  (shots,) = table1["tables"]
  mean = {r["method"]: r["cells"][dataset]["mean"] for r in table1["tables"][shots]}
  plain, rare = mean["cupl"], mean["cupl_rare_tokens"]
  paper = ", ".join(f"{d} {a:.2f} → {b:.2f}" for d, (a, b) in PAPER_TABLE1.items())
  if rare <= plain:
    table1_text = (
      f"As in the paper's Table 1 ({paper}), the nonsensical tokens do not raise accuracy "
      f"({plain:.2f}% → {rare:.2f}%)."
    )
  else:
    table1_text = (
      f"Unlike the paper's Table 1 ({paper}), the nonsensical tokens raise accuracy here "
      f"({plain:.2f}% → {rare:.2f}%)."
    )
  (fig10_shots,) = fig10["tables"]
  rows = {r["sweep_value"]: r["cells"][dataset] for r in fig10["tables"][fig10_shots]}
  best = max(rows, key=lambda b: rows[b]["mean"])
  floor = rows[best]["mean"] - rows[best]["std"]
  within = [b for b, e in rows.items() if e["mean"] >= floor]
  outside = [b for b in rows if b not in within]
  fig10_text = (
    "The paper sees no significant difference between intermediate first blocks; here blocks "
    f"{listed(within)} lie within one std of the best mean ({rows[best]['mean']:.2f}%, block "
    f"{best})"
  )
  if outside:
    below = ", ".join(f"{rows[b]['mean']:.2f}%" for b in outside)
    plural = "s" if len(outside) > 1 else ""
    fig10_text += f", block{plural} {listed(outside)} below it ({below})"
  fig10_text += "."
  text = "\n\n".join(
    [
      f"On the shipped tiny CLIP ({machine()}), `configs/table1.py:synthetic` "
      f"({about(table1_seconds)}):",
      tables.markdown(table1).strip(),
      fill(table1_text),
      f"`configs/fig10.py:synthetic` ({about(fig10_seconds)}):",
      tables.markdown(fig10).strip(),
      fill(fig10_text),
      f"![Fig. 10, embedded world: accuracy by first reweighted block]({FIG10_IMAGE})",
    ]
  )
  return {"grid.table1_fig10": text + "\n", FIG10_IMAGE: png}


CONTRAST_CONFIG = "configs/pairwise_synthetic.py"
CONTRAST_IMAGE = "docs/images/fig3_pairwise.png"
FIG3_ALT = "Fig. 3 on the embedded world: the prompts shaded by trained weight"


def anchor_weight(pairing: Mapping[str, Any], anchor: str, word: str) -> float:
  """The mean trained (raw) weight of `word` over its occurrences in the anchor's prompts of a
  pairing of pairwise.json."""
  import numpy as np  # pylint: disable=import-outside-toplevel

  weights = [
    w for p in pairing["prompts"] if p["class"] == anchor for x, w in p["words"] if x == word
  ]
  return float(np.mean(weights))


def contrast_figures() -> dict[str, Any]:
  """`python -m stori_jax.contrast --config configs/pairwise_synthetic.py` (the command, run in
  this process; timed): each pairing's accuracies and the anchor's name words' mean trained
  weight from the pairwise.json it writes, and its fig3_pairwise.png (CONTRAST_IMAGE)."""
  import json  # pylint: disable=import-outside-toplevel

  from stori_jax import contrast  # pylint: disable=import-outside-toplevel

  ewf = _ewf()
  with tempfile.TemporaryDirectory() as workdir:
    start = time.perf_counter()
    ewf.run_command(contrast, ["--config", CONTRAST_CONFIG, "--workdir", workdir])
    seconds = time.perf_counter() - start
    with open(os.path.join(workdir, "pairwise.json"), encoding="utf-8") as f:
      results = json.load(f)
    with open(os.path.join(workdir, "fig3_pairwise.png"), "rb") as f:
      png = f.read()
  anchor, pairings = results["anchor"], results["pairings"]
  others = [p["classes"][1] for p in pairings]
  words = anchor.split()
  weight = {w: [anchor_weight(p, anchor, w) for p in pairings] for w in words}
  accuracies = "; ".join(
    f"against the {p['classes'][1]}: test accuracy {100 * p['trained']['accuracy']:.1f}% "
    f"(zero-shot {100 * p['zero_shot']['accuracy']:.1f}%)"
    for p in pairings
  )
  lines = [
    fill(
      f"On the shipped tiny CLIP ({machine()}, {about(seconds)}), the {anchor} {accuracies}. "
      "The anchor's "
      "words, trained weight (1 = untouched) averaged over their places in its prompts "
      "(`pairwise.json`):"
    ),
    "",
    "| word of the " + anchor + " | " + " | ".join(f"vs {o}" for o in others) + " |",
    "|---|" + "---|" * len(others),
  ]
  lines += [f"| {w} | " + " | ".join(f"{x:.2f}" for x in weight[w]) + " |" for w in words]
  # In each pairing, the anchor's words that the other class's name lacks tell the two apart.
  telling = [(i, w) for i, o in enumerate(others) for w in words if w not in o.split()]
  shown = ", ".join(
    f"'{w}' {weight[w][i]:.2f} against the {others[i]} and "
    + " / ".join(f"{x:.2f}" for j, x in enumerate(weight[w]) if j != i)
    + " otherwise"
    for i, w in telling
  )
  holds = all(weight[w][i] > max(x for j, x in enumerate(weight[w]) if j != i) for i, w in telling)
  paper = (
    "the paper's figure ('striped' weighs high against the Warbling Vireo and low against the "
    "White-eyed Vireo, which also has stripes)"
  )
  if holds:
    reading = f"As in {paper}, the anchor's word that tells a pair apart weighs more there: "
  else:
    reading = f"Unlike {paper}, the anchor's word that tells a pair apart does not always weigh "
    reading += "more there: "
  lines += ["", fill(reading + shown + "."), "", f"![{FIG3_ALT}]({CONTRAST_IMAGE})"]
  return {"contrast": "\n".join(lines) + "\n", CONTRAST_IMAGE: png}


# ---------------------------------------------------------------------------------------------
# Workdirs in a bucket: the README's gs:// commands, against the local GCS the tests use.


def _gcs_run(args: Sequence[str], env: Mapping[str, str]) -> tuple[float, str]:
  """Runs a command as the README shows it (a subprocess: the commands run on their own
  processes, the second one on two); (seconds, stdout + stderr); AssertionError unless exit 0."""
  import subprocess  # pylint: disable=import-outside-toplevel

  start = time.perf_counter()
  done = subprocess.run(list(args), cwd=ROOT, env=dict(env), capture_output=True, text=True)
  seconds = time.perf_counter() - start
  if done.returncode != 0:
    raise AssertionError(f"{' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}")
  return seconds, done.stdout + done.stderr


def gcs_figures() -> dict[str, str]:
  """The demo on `gs://demo/one` twice and on `gs://demo/two` with two processes
  (launch/local_multiprocess.sh), against tests/gcs_emulator.py's local GCS: the times, the
  resume line, the objects written, the accuracies and the two runs' weight difference."""
  import json  # pylint: disable=import-outside-toplevel

  import numpy as np  # pylint: disable=import-outside-toplevel

  sys.path.insert(0, os.path.join(ROOT, "tests"))
  import gcs_emulator  # pylint: disable=import-outside-toplevel  # tests/, the tests' own GCS

  # A fresh compilation cache: the first run's time is a first run's, compilation included.
  cache = tempfile.mkdtemp(prefix="stori_jax_gcs_figures_")
  emulator = gcs_emulator.Emulator()
  try:
    emulator.create_bucket("demo")
    env = {
      **os.environ,
      **emulator.env(),
      "PYTHON": sys.executable,
      "JAX_COMPILATION_CACHE_DIR": cache,
    }
    train = [sys.executable, "-m", "stori_jax.train", "--config", "configs/demo.py"]
    first, _ = _gcs_run([*train, "--workdir", "gs://demo/one"], env)
    _, printed = _gcs_run([*train, "--workdir", "gs://demo/one"], env)
    resumed = re.search(r"Resumed from step (\d+) of (\d+)", printed)
    if resumed is None:
      raise AssertionError("the second run did not resume:\n" + printed[-2000:])
    launch = ["bash", "launch/local_multiprocess.sh", "2", "--config", "configs/demo.py"]
    two, _ = _gcs_run([*launch, "--workdir", "gs://demo/two"], env)
    names = emulator.objects("demo", "one/")
    if os.path.exists(os.path.join(ROOT, "gs:")):
      raise AssertionError("a gs:// workdir became a local folder gs:")
    metrics = {w: json.loads(emulator.read("demo", f"{w}/metrics.json")) for w in ("one", "two")}
    weights = {
      w: np.concatenate(
        [r["token_weights"] for r in json.loads(emulator.read("demo", f"{w}/weights.json"))]
      )
      for w in ("one", "two")
    }
  finally:
    emulator.stop()
    shutil.rmtree(cache, ignore_errors=True)
  files = sorted({n.split("/")[1] for n in names if n.count("/") == 1 and n != "one/.lock"})
  steps = sorted(
    {
      int(n.split("/")[2])
      for n in names
      if n.startswith("one/checkpoints/") and n.split("/")[2].isdigit()
    }
  )
  one, multi = metrics["one"], metrics["two"]
  same = all(one[k]["accuracy"] == multi[k]["accuracy"] for k in ("zero_shot", "trained"))
  if not same:
    raise AssertionError(f"two processes' accuracies differ from one's: {multi} vs {one}")
  difference = float(np.max(np.abs(weights["one"] - weights["two"])))
  pct = lambda m, k: f"{100 * m[k]['accuracy']:.2f}%"  # noqa: E731
  block = "\n".join(
    [
      "```bash",
      "python tests/gcs_emulator.py --port 9023 --bucket demo &",
      "export STORAGE_EMULATOR_HOST=http://127.0.0.1:9023",
      "python -m stori_jax.train --config configs/demo.py --workdir gs://demo/one    "
      f"# exit 0, {about(first)}",
      "python -m stori_jax.train --config configs/demo.py --workdir gs://demo/one    "
      f'# exit 0: "Resumed from step {resumed.group(1)} of {resumed.group(2)}"',
      "launch/local_multiprocess.sh 2 --config configs/demo.py --workdir gs://demo/two   "
      f"# exit 0, {about(two)}",
      "```",
    ]
  )
  text = (
    f"The first run wrote {', '.join(f'`{n}`' for n in files)} and the checkpoints of steps "
    f"{' and '.join(str(s) for s in steps)} as objects under `gs://demo/one/`, and no local "
    f"folder (a URL was once made a local folder `gs:`). Both runs report zero-shot "
    f"{pct(one, 'zero_shot')} and SToRI {pct(one, 'trained')}; the two processes' "
    f"`metrics.json` has the same accuracies (on {multi['num_devices']} devices), their weights "
    f"within {bound(difference)} of one process's."
  )
  return {"gcs": "\n" + block + "\n\n" + "\n".join(textwrap.wrap(text, 96)) + "\n"}


# ---------------------------------------------------------------------------------------------
# The machine's limit: each path's seconds, FLOPs and share of the measured matmul rate.


@dataclasses.dataclass(frozen=True)
class LimitRow:
  """One row of the machine_limit table: a path of ours, its reference at equal work, both
  timed in one run beside the machine's matmul rate (GFLOP/s, measured in the same run).

  seconds / reference_seconds: per unit (a step, an image); gflop: our FLOPs per unit;
  fraction / reference_fraction: FLOP/s over the matmul rate (0-1); ratio: reference seconds
  over ours (medians of per-round ratios where the benchmark alternates rounds)."""

  what: str
  unit: str
  seconds: float
  gflop: float
  fraction: float
  reference: str
  reference_seconds: float
  reference_fraction: float
  ratio: float
  rate_gflop_per_s: float
  sizes: str


def _benchmark_json(script: str, args: Sequence[str] = ()) -> dict[str, Any]:
  """benchmarks/<script> with --json, in a subprocess with the user's environment (not this
  script's reproducible-CPU flags, which cap XLA's code at AVX2 but not PyTorch's: a ratio
  against PyTorch must see both at their defaults); its JSON."""
  import json  # pylint: disable=import-outside-toplevel
  import subprocess  # pylint: disable=import-outside-toplevel

  env = dict(os.environ)
  if "reproducible_cpu" in sys.modules:
    env = sys.modules["reproducible_cpu"].original_env(env)
  env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "figures.json")
    command = [sys.executable, os.path.join(ROOT, "benchmarks", script), "--json", out, *args]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode:
      raise AssertionError(f"{script} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    with open(out, encoding="utf-8") as f:
      return json.load(f)


#: The train step's rows: (train_step.py's row, what the table calls it).
TRAIN_STEP_ROWS = (
  ("fresh_views", "SToRI train step, fresh views (the paper's setting)"),
  ("cached_features", "SToRI train step, cached image features"),
)


def train_step_rows(result: Mapping[str, Any] | None = None) -> list[LimitRow]:
  """`python benchmarks/train_step.py` at its default size (or its JSON `result`): the step at
  the paper's setting (fresh views) and on cached features, against PyTorch eager."""
  result = result or _benchmark_json("train_step.py")
  rate = result["matmul"]["gflop_per_s"]
  sizes = f"{result['arch']}, {result['num_prompts']} prompts, {result['batch']} images per step"
  rows = []
  for key, what in TRAIN_STEP_ROWS:
    row = result["rows"][key]
    ours, torch = row["implementations"]["ours"], row["implementations"]["torch"]
    rows.append(
      LimitRow(
        what=what,
        unit="step",
        seconds=ours["seconds_per_step"],
        gflop=ours["gflop_per_step"],
        fraction=ours["fraction_of_matmul_rate"],
        reference="PyTorch eager",
        reference_seconds=torch["seconds_per_step"],
        reference_fraction=torch["fraction_of_matmul_rate"],
        ratio=row["ratios"]["torch_over_ours"],
        rate_gflop_per_s=rate,
        sizes=sizes,
      )
    )
  return rows


#: benchmarks/mutual_throughput.py's arguments for the analysis rows: ViT-B/16 (random weights),
#: one class of 16 images, fp32, reference mode, the CRF off on both sides; the as-written
#: reference, the device-call count and the timed extra class left out (minutes on 2 cores).
ANALYSIS_ARGS = (
  "--arch=ViT-B-16",
  "--images=16",
  "--timed_classes=0",
  "--as_written=false",
  "--device_calls=false",
  "--isolation=",
)


def analysis_rows(result: Mapping[str, Any] | None = None) -> list[LimitRow]:
  """`python benchmarks/mutual_throughput.py` (ANALYSIS_ARGS; or its JSON `result`): the
  mutual-knowledge analysis per image, ours and the per-image reference at equal work, each
  row's share being its vision towers' FLOPs over the whole analysis's time."""
  # pylint: disable-next=import-outside-toplevel
  from benchmarks.mutual_throughput import machine_limit_rows

  result = result or _benchmark_json("mutual_throughput.py", ANALYSIS_ARGS)
  ours, reference = machine_limit_rows(result)
  rate = max(
    r for r in (result["matmul"]["jax_gflop_per_s"], result["matmul"]["torch_gflop_per_s"]) if r
  )
  mode = result.get("mode") or "default"
  sizes = (
    f"{result['arch']}, {result['images']} images of one class, {result['descriptors']} "
    f"descriptors, {mode} mode, CRF {'on' if result.get('crf') else 'off'}"
  )
  return [
    LimitRow(
      what=ours["what"],
      unit="image",
      seconds=ours["seconds"],
      gflop=ours["gflop"],
      fraction=ours["fraction"],
      reference="per-image reference (PyTorch, scikit-learn, OpenCV)",
      reference_seconds=reference["seconds"],
      reference_fraction=reference["fraction"],
      ratio=ours["ratio"],
      rate_gflop_per_s=rate,
      sizes=sizes,
    )
  ]


#: The producers of the machine_limit table's rows, each measuring once (in order).
MACHINE_LIMIT_ROWS: list[Callable[[], list[LimitRow]]] = [train_step_rows, analysis_rows]


def machine_limit_table(rows: Sequence[LimitRow]) -> str:
  """The markdown table of `rows` (LimitRow), then a line per row's sizes and rate."""
  lines = [
    "| path | seconds | GFLOP | share of the matmul rate | reference at equal work | its "
    "seconds | its share | reference / ours |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    lines.append(
      f"| {r.what} | {r.seconds:.2f} per {r.unit} | {r.gflop:.1f} | {100 * r.fraction:.1f}% of "
      f"{r.rate_gflop_per_s:.1f} GFLOP/s | {r.reference} | {r.reference_seconds:.2f} | "
      f"{100 * r.reference_fraction:.1f}% | **{r.ratio:.2f}x** |"
    )
  # Rows of one benchmark share its sizes: each set of sizes once, with the rows it belongs to.
  groups: dict[str, list[str]] = {}
  for r in rows:
    groups.setdefault(r.sizes, []).append(r.what)
  if len(groups) == 1:
    said = next(iter(groups))
  else:
    said = "; ".join(f"{', '.join(whats)}: {sizes}" for sizes, whats in groups.items())
  lines += ["", fill(f"On {machine()}, one run: {said}.")]
  return "\n".join(lines)


def machine_limit_figures(
  producers: Sequence[Callable[[], list[LimitRow]]] | None = None,
) -> dict[str, str]:
  """The machine_limit table: every producer's rows (MACHINE_LIMIT_ROWS by default)."""
  rows = [row for produce in (producers or MACHINE_LIMIT_ROWS) for row in produce()]
  return {"machine_limit": machine_limit_table(rows)}


# ---------------------------------------------------------------------------------------------
# The test suite: its time and counts, as `make test` and `make test-all` run it.

# pytest's last line: "=== 5 passed, 1 skipped in 3.2s ===", or under -q (as run here) bare.
_SUMMARY = re.compile(r"(?:=+ )?(\d+ \w+(?:, \d+ \w+)*) in ([\d.]+)s")


def suite_run(marks: str | None, cache: str) -> tuple[dict[str, int], float]:
  """pytest over tests/ in a subprocess (the suite needs a process of its own: it runs commands
  with their own flags), as `make test` runs it (`marks` "not slow") or `make test-all` (None),
  without CI=true (so tests that need Chromium skip here, as on a developer's machine), with its
  compilation cache in the folder `cache` (empty: a clean clone, as CI's; what an earlier run
  left: `make test` run again). Returns ({"passed": n, "skipped": n, ...}, seconds)."""
  import subprocess  # pylint: disable=import-outside-toplevel

  env = {k: v for k, v in os.environ.items() if k != "CI"}
  if "reproducible_cpu" in sys.modules:  # the suite runs as `make test` does, not with our flags
    env = sys.modules["reproducible_cpu"].original_env(env)
  env["STORI_TEST_COMPILATION_CACHE"] = cache
  # As the Makefile runs it: two worker processes (PYTEST_ARGS).
  args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2"]
  args += ["--dist", "worksteal"]
  args += ["-m", marks] if marks else []
  done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True)
  last = [line for line in done.stdout.splitlines() if _SUMMARY.match(line)]
  if not last:
    raise AssertionError("pytest printed no summary:\n" + done.stdout[-3000:] + done.stderr[-2000:])
  words, seconds = _SUMMARY.match(last[-1]).groups()
  counts = {name: int(n) for n, name in re.findall(r"(\d+) (\w+)", words)}
  if counts.get("failed") or counts.get("error") or counts.get("errors"):
    raise AssertionError(f"the suite did not pass ({words}); fix it before measuring:\n" + last[-1])
  return counts, float(seconds)


def _suite_time(seconds: float) -> str:
  # A suite is read in minutes ("about 6 minutes"), a short one in seconds.
  return about(seconds) if seconds < 100 else f"about {round(seconds / 60)} minutes"


def _suite_sentence(counts: Mapping[str, int], seconds: float) -> str:
  skipped = counts.get("skipped", 0)
  took = _suite_time(seconds)
  return f"{took} on {machine()} ({counts.get('passed', 0)} passed, {skipped} skipped)"


def suite_figures() -> dict[str, str]:
  """`make test`'s suite (not slow): its time and counts with its compilation cache empty (a
  clean clone), then its time run again on the cache that run left (`make test` a second time)."""
  with tempfile.TemporaryDirectory(prefix="suite-compilation-cache-") as cache:
    counts, cold = suite_run("not slow", cache)
    _, warm = suite_run("not slow", cache)
  return {"suite.default": _suite_sentence(counts, cold), "suite.default_warm": _suite_time(warm)}


def suite_all_figures() -> dict[str, str]:
  """`make test-all`'s suite (the slow tests too, as CI runs it, from a clean clone: its
  compilation cache empty): its time and counts."""
  with tempfile.TemporaryDirectory(prefix="suite-compilation-cache-") as cache:
    counts, seconds = suite_run(None, cache)
  return {"suite.all": _suite_sentence(counts, seconds)}


SECTIONS: dict[str, Section] = {
  "demo": Section(
    demo_figures,
    ("demo", "demo.paper", "demo.two_colours"),
    "few-shot demo, seeds 1-3, with the prior and with the paper's objective; the two-colour task",
  ),
  "world": Section(
    world_figures,
    ("world.zero_shot", "world.table3", "world.status"),
    "python -m stori_jax.evaluate_world on both tiny CLIPs (zero-shot, Table 3); weight 0, Fig. 5",
  ),
  "start_block": Section(
    start_block_figures,
    ("start_block",),
    "python -m stori_jax.start_block on both tiny CLIPs (configs/retrieval_synthetic.py)",
  ),
  "ablations": Section(
    ablation_figures,
    ("ablations",),
    "python -m stori_jax.train ablations: Fig. 10 (start block 1-6), Table 1 (rare tokens)",
  ),
  "grid": Section(
    grid_figures,
    ("grid",),
    "python -m stori_jax.run_grid --config configs/grid_synthetic.py (3 seeds, 1 and 16 shots)",
  ),
  "grid_ablations": Section(
    grid_ablation_figures,
    ("grid.table1_fig10",),
    "python -m stori_jax.run_grid on configs/table1.py:synthetic and configs/fig10.py:synthetic",
    images=(FIG10_IMAGE,),
  ),
  "contrast": Section(
    contrast_figures,
    ("contrast",),
    "python -m stori_jax.contrast --config configs/pairwise_synthetic.py (Fig. 3)",
    images=(CONTRAST_IMAGE,),
  ),
  "mutual_analyze": Section(
    mutual_analyze_figures,
    ("mutual_analyze",),
    "mutual.analyze on configs/mutual_synthetic.py",
  ),
  "mutual_explain": Section(
    mutual_explain_figures,
    ("mutual_explain",),
    "python -m mutual.explain on an embedded-world image: its output and figure",
    images=(EXPLAIN_INPUT, EXPLAIN_IMAGE),
  ),
  "mutual_modes": Section(
    mutual_modes_figures,
    ("mutual_modes",),
    "configs/mutual_synthetic.py in both analysis modes; reference mode vs the torch reference",
  ),
  "mutual_precision": Section(
    mutual_precision_figures,
    ("mutual_precision",),
    "configs/mutual_synthetic.py with bfloat16 towers against float32, both modes",
    tolerance=BF16_TOLERANCE,
  ),
  "mutual_evaluate": Section(
    mutual_evaluate_figures,
    ("mutual_evaluate",),
    "mutual.evaluate on configs/mutual_eval_synthetic.py: Tables 1 and 5, protocols",
  ),
  "gcs": Section(
    gcs_figures,
    ("gcs",),
    "the demo on gs://demo/one twice and on two processes, against the tests' local GCS",
  ),
  "machine_limit": Section(
    machine_limit_figures,
    ("machine_limit",),
    "benchmarks/train_step.py at its default size and benchmarks/mutual_throughput.py (ViT-B-16, "
    "16 images): seconds, FLOPs, share of the matmul rate, ratio against the reference",
    timed=True,
  ),
  "suite": Section(
    suite_figures,
    ("suite.default", "suite.default_warm"),
    "make test's suite (pytest -m 'not slow'): time, passed, skipped from a clean clone; its "
    "time again on the compilation cache that run left",
  ),
  "suite_all": Section(
    suite_all_figures,
    ("suite.all",),
    "make test-all's suite (every test, slow ones too: tens of minutes): time, passed, skipped",
  ),
}


# ---------------------------------------------------------------------------------------------
# The command.


def define_flags(values: flags.FlagValues = flags.FLAGS) -> None:
  """The script's flags, on `values`."""
  flags.DEFINE_list(
    "only",
    [],
    "Sections to measure, comma-separated (default: all; see --list).",
    flag_values=values,
  )
  flags.DEFINE_bool(
    "check",
    False,
    "Measure and print the diff against the README and docs/; exit 1 if a figure differs. Writes "
    "nothing.",
    flag_values=values,
  )
  flags.DEFINE_bool(
    "list", False, "List the sections and their regions, and exit.", flag_values=values
  )
  flags.DEFINE_string(
    "readme",
    README,
    "The README to rewrite; the regions it does not hold are looked for in the docs/*.md beside it.",
    flag_values=values,
  )


def _holds(path: str, content: bytes) -> bool:
  """Whether the file at `path` exists and holds exactly `content`."""
  if not os.path.exists(path):
    return False
  with open(path, "rb") as f:
    return f.read() == content


def selected(only: Sequence[str]) -> list[str]:
  """The sections named by --only (all when empty), in SECTIONS' order."""
  unknown = [name for name in only if name not in SECTIONS]
  if unknown:
    raise UserError(f"--only: unknown sections {unknown}; known: {', '.join(SECTIONS)}.")
  return [name for name in SECTIONS if not only or name in only]


def read_texts(files: Sequence[str]) -> dict[str, str]:
  """{path: text} of the files that hold the regions (figure_files)."""
  texts = {}
  for path in files:
    with open(path, encoding="utf-8") as f:
      texts[path] = f.read()
  return texts


def main(argv: list[str], values: flags.FlagValues = flags.FLAGS) -> None:
  """Measures the chosen sections and rewrites (or, with --check, diffs) their regions, each in
  the file (README.md or a page of docs/) that holds it."""
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {argv[1:]}; the script takes flags only.")
  names = selected(values.only)
  files = figure_files(values.readme)
  if values.list:
    texts = read_texts(files)
    for name, section in SECTIONS.items():
      images = f"; images {', '.join(section.images)}" if section.images else ""
      where = [
        f"{r} ({', '.join(os.path.relpath(p) for p, t in texts.items() if OPEN.format(r) in t)})"
        for r in section.regions
      ]
      print(f"{name:16s} regions {', '.join(where)}{images}: {section.what}")
    return
  region_homes(read_texts(files), [r for n in names for r in SECTIONS[n].regions])  # before work
  bodies: dict[str, str] = {}
  images: dict[str, bytes] = {}
  total = time.perf_counter()
  for i, name in enumerate(names, 1):
    section = SECTIONS[name]
    print(f"[{i}/{len(names)}] {name}: {section.what} ...", end="", flush=True)
    start = time.perf_counter()
    with quiet():
      measured = section.measure()
    if set(measured) != {*section.regions, *section.images}:
      raise AssertionError(
        f"section {name} returned {sorted(measured)}, not {section.regions + section.images}"
      )
    bodies.update({r: measured[r] for r in section.regions})
    images.update({i: measured[i] for i in section.images})
    print(f" {time.perf_counter() - start:.0f} s", flush=True)
  # Read again: the pages may have been edited meanwhile, and only the regions are ours.
  texts = read_texts(files)
  homes = region_homes(texts, list(bodies))
  root = os.path.dirname(os.path.abspath(values.readme))
  drawn_by = {r: SECTIONS[n].images for n in names for r in SECTIONS[n].regions}
  bodies = {r: linked_from(b, drawn_by[r], root, homes[r]) for r, b in bodies.items()}
  rewritten: dict[str, str] = {}
  for path, old in texts.items():
    here = {r: body for r, body in bodies.items() if homes[r] == path}
    if here and (new := replace_regions(old, here)) != old:
      rewritten[path] = new
  diff = "".join(unified_diff(texts[p], new, os.path.relpath(p)) for p, new in rewritten.items())
  sys.stdout.write(diff)
  changed = [
    r for r, b in bodies.items() if replace_region(texts[homes[r]], r, b) != texts[homes[r]]
  ]
  # A timed section's decimal figures are its timings (Section.timed): only its words count.
  timed_regions = {r for n in names if SECTIONS[n].timed for r in SECTIONS[n].regions}
  timed = [
    r
    for r in changed
    if same_figures(
      texts[homes[r]][slice(*region_span(texts[homes[r]], r))].strip(),
      bodies[r].strip(),
      math.inf if r in timed_regions else 0.0,
    )
  ]
  summary = (
    f"{len(changed)} of {len(bodies)} regions differ"
    + (f", {len(timed)} of them in timings (or wrapping) only" if timed else "")
    + f" ({time.perf_counter() - total:.0f} s)"
  )
  drawn = {os.path.join(root, i): png for i, png in images.items()}
  redrawn = [f for f, png in drawn.items() if not _holds(f, png)]
  for f in redrawn:
    print(f"{os.path.relpath(f)}: the measured image differs", flush=True)
  if values.check:
    if redrawn:  # drawn from the regions' numbers; bytes also change with matplotlib's version
      print(f"--check: {len(redrawn)} images not written and not compared beyond their bytes.")
    print(f"{summary}; --check: nothing written.")
    tolerance = {r: SECTIONS[n].tolerance for n in names for r in SECTIONS[n].regions}
    now = {r: texts[homes[r]][slice(*region_span(texts[homes[r]], r))].strip() for r in bodies}
    drifted = [
      r
      for r, body in bodies.items()
      if not same_figures(now[r], body.strip(), math.inf if r in timed_regions else 0.0)
    ]
    beyond = [r for r in drifted if not same_figures(now[r], bodies[r].strip(), tolerance[r])]
    for r in drifted:
      if r not in beyond:
        print(
          f"{r}: its figures moved within the tolerance its page states (±{tolerance[r]:g} on "
          "each decimal figure), as they do between CPUs."
        )
    if beyond:
      print(f"Figures drifted in {', '.join(beyond)}.")
      sys.exit(1)
    if diff and not drifted:
      print("Only the measured timings differ (one run on a noisy machine): no figure drifted.")
    return
  for path, new in rewritten.items():
    write_atomic(path, new)
  for f in redrawn:
    os.makedirs(os.path.dirname(f), exist_ok=True)
    write_atomic(f, drawn[f])
  rewrote = f" and {len(redrawn)} images" if redrawn else ""
  pages = ", ".join(os.path.relpath(p) for p in rewritten)
  done = f"rewrote {pages}" if rewritten else f"left {os.path.relpath(values.readme)} and docs/"
  print(f"{summary}; {done}{rewrote}.")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
