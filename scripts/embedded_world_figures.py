r"""Re-measures the README's figures of the embedded world for one model (default: the shipped
tiny CLIP) and prints them as markdown: zero-shot quality and Table 3 (what
`python -m stori_jax.evaluate_world` prints), weight 0 on the colour word and the Fig. 5 sweep
on the same images, the start-block table (what `python -m stori_jax.start_block` prints), and
the few-shot demo over three seeds.

  python scripts/embedded_world_figures.py [--model tiny-synthetic] [--demo_seeds 1,2,3]

Where the README shows a command beside a figure, the figure comes from that command, run in
this process with the README's flags (`run_command`): its printed output or the file it writes,
not a second implementation. The rest comes from the library functions the commands use, on
the images the README names. The functions below are also what scripts/readme_figures.py
calls to rewrite the README's regions.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile
from typing import Any, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if (
  ROOT not in sys.path
):  # `python scripts/embedded_world_figures.py` puts only scripts/ on the path
  sys.path.insert(0, ROOT)

if __name__ == "__main__":  # before NumPy and JAX start: the same figures on every x86-64 CPU
  import reproducible_cpu  # scripts/, beside this

  if note := reproducible_cpu.apply():
    print(note, file=sys.stderr)

import numpy as np  # noqa: E402
from absl import flags  # noqa: E402
import stori_jax  # noqa: E402
from stori_jax.plumbing import cli  # noqa: E402
from stori_jax.plumbing.config_files import load_config  # noqa: E402
from stori_jax.models import default_start_block  # noqa: E402
from stori_jax.retrieval import datasets, protocol  # noqa: E402
from stori_jax.retrieval.index import encode_data  # noqa: E402

#: The repository's configs, whatever the working directory.
CONFIGS = os.path.join(ROOT, "configs")
#: The probe set of the README's world section: configs/retrieval_synthetic.py's `data` (24
#: prompts, 8 categories x 8 images each), the images of evaluate_world's emphasis table too.
RETRIEVAL_CONFIG = os.path.join(CONFIGS, "retrieval_synthetic.py")
ZERO_SHOT_FAMILIES = ("colour", "shape", "pattern", "size", "position")
TABLE3_WEIGHTS = ("0.5", "1.0", "1.5")
#: The README's ablations (Fig. 10, Table 1): `python -m stori_jax.train` with these flags on
#: the demo's two-colour task, the model before its weight-response stage, the paper's
#: objective, seed 1 (configs/demo.py's).
ABLATION_MODEL = "tiny-synthetic-base"
ABLATION_FLAGS = (
  "--config",
  "configs/demo.py:classes=two_colours",
  f"--config.model.source={ABLATION_MODEL}",
  "--config.optim.log_weight_penalty=0",
)
#: Table 1's flag: what configs/ablation_rare_tokens.py sets (five rare tokens appended).
RARE_TOKENS_FLAG = "--config.prompts.rare_tokens=5"


# ---------------------------------------------------------------------------------------------
# The commands, run as the README shows them.


def run_command(module, args: Sequence[str]) -> str:
  """Runs `python -m <module> *args` in this process from the repository root (as the README's
  commands run; `stori_jax.plumbing.cli.run_in_process`) and returns what it printed on stdout.
  RuntimeError with its output if it exits with another status than 0."""
  out, err = io.StringIO(), io.StringIO()
  with contextlib.chdir(ROOT), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    code = cli.run_in_process(module, [str(a) for a in args])
  if code != 0:
    raise RuntimeError(
      f"python -m {module.__name__} {' '.join(map(str, args))} exited with {code}:\n"
      f"{out.getvalue()[-4000:]}\n{err.getvalue()[-4000:]}"
    )
  return out.getvalue()


def world_eval(model: str, args: Sequence[str] = ()) -> dict[str, Any]:
  """`python -m stori_jax.evaluate_world --source <model> *args` in a temporary output folder;
  its synthetic_world_eval.json (the numbers its tables print)."""
  from stori_jax import evaluate_world  # pylint: disable=import-outside-toplevel

  with tempfile.TemporaryDirectory() as out:
    run_command(evaluate_world, ["--source", model, "--output_dir", out, *args])
    with open(os.path.join(out, "synthetic_world_eval.json"), encoding="utf-8") as f:
      return json.load(f)


def zero_shot_quality(results: dict[str, Any]) -> dict[str, float]:
  """Zero-shot accuracy per attribute family and R@1 both ways ("t2i", "i2t") of
  `world_eval`'s results."""
  out = {f: float(results["zero_shot"]["accuracy"][f]) for f in ZERO_SHOT_FAMILIES}
  out["t2i"] = float(results["retrieval"]["text_to_image"]["R@1"])
  out["i2t"] = float(results["retrieval"]["image_to_text"]["R@1"])
  return out


def table3(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
  """Table 3 per emphasised family of `world_eval`'s results (SToRI): mean AP at w = 0.5 / 1 /
  1.5 ("ap") and the mean change from w = 1 at 0.5 and 1.5 ("delta"), as the command prints."""
  summary = results["emphasis"]["methods"]["stori"]["ap"]
  return {
    family: dict(
      ap=tuple(summary["mean"][family][k] for k in TABLE3_WEIGHTS),
      delta=(summary["delta_mean"][family]["0.5"], summary["delta_mean"][family]["1.5"]),
    )
    for family in results["emphasis"]["families"]
  }


def start_block_run(model: str, data_config: str | None = None) -> tuple[str, dict[str, Any]]:
  """`python -m stori_jax.start_block --model <model> [--data_config ...]` in a temporary
  workdir: the table it prints (its lines from the header to the last block) and its
  start_block.json."""
  from stori_jax import start_block  # pylint: disable=import-outside-toplevel

  with tempfile.TemporaryDirectory() as workdir:
    args = ["--model", model, "--workdir", workdir]
    if data_config:
      args += ["--data_config", data_config]
    printed = run_command(start_block, args).splitlines()
    with open(os.path.join(workdir, "start_block.json"), encoding="utf-8") as f:
      sweep = json.load(f)
  first = next(i for i, line in enumerate(printed) if line.startswith("start  dAP"))
  rows = 2 + len(sweep["blocks"])
  return "\n".join(printed[first : first + rows]), sweep


def train_run(args: Sequence[str]) -> dict[str, Any]:
  """`python -m stori_jax.train *args` in a temporary workdir; its metrics.json."""
  from stori_jax import train  # pylint: disable=import-outside-toplevel

  with tempfile.TemporaryDirectory() as workdir:
    run_command(train, [*args, "--workdir", workdir])
    with open(os.path.join(workdir, "metrics.json"), encoding="utf-8") as f:
      return json.load(f)


def mutual_evaluate_run(config: str, args: Sequence[str] = ()) -> dict[str, Any]:
  """`python -m mutual.evaluate --config <config> *args` in a temporary workdir: "printed" (what
  it printed: table1.md and protocols.md), "table1" and "protocols" (its JSON files)."""
  from mutual import evaluate  # pylint: disable=import-outside-toplevel

  with tempfile.TemporaryDirectory() as workdir:
    printed = run_command(evaluate, ["--config", config, "--workdir", workdir, *args])
    out = {"printed": printed}
    for name in ("table1", "protocols"):
      path = os.path.join(workdir, f"{name}.json")
      if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
          out[name] = json.load(f)
  return out


def ablation_runs(blocks: Sequence[int]) -> dict[str, Any]:
  """The README's ablations: Fig. 10 (ABLATION_FLAGS with --config.start_block=b, per b of
  `blocks`: "blocks", {b: metrics}) and Table 1 (ABLATION_FLAGS with RARE_TOKENS_FLAG:
  "rare_tokens", at the model's default start block, "default_block")."""
  return {
    "default_block": default_start_block(stori_jax.load(ABLATION_MODEL).config.text),
    "blocks": {int(b): train_run([*ABLATION_FLAGS, f"--config.start_block={b}"]) for b in blocks},
    "rare_tokens": train_run([*ABLATION_FLAGS, RARE_TOKENS_FLAG]),
  }


# ---------------------------------------------------------------------------------------------
# Library measurements on the same images.


def probe_set(bundle, config_path: str = RETRIEVAL_CONFIG) -> tuple[np.ndarray, list]:
  """The encoded probe images and their tasks: a retrieval config's `data` block (default
  configs/retrieval_synthetic.py's: the images of evaluate_world's emphasis table)."""
  config = load_config(config_path)
  data = datasets.build_data(config.data, int(bundle.config.vision.image_size))
  return encode_data(bundle, data), list(data.tasks)


def colour_shares(bundle, embeddings, tasks) -> tuple[float, float]:
  """Share of the prompt's colour among the top 16 images at colour weight 1 and 0."""
  w1, w0 = (protocol.top_share(bundle, embeddings, tasks, 0, w) for w in (1.0, 0.0))
  return w1, w0


def fig5_focus(bundle, embeddings, tasks) -> list[float]:
  """Fig. 5 (pattern w, colour 1 - w): the favoured category's mean AUC at each w of
  configs/retrieval_synthetic.py's sweep."""
  config = load_config(RETRIEVAL_CONFIG)
  sweep = protocol.auc_sweep(
    bundle, embeddings, tasks, config.sweep.ws, tuple(config.sweep.attributes), True
  )
  return [row[sweep["focus"]] for row in sweep["mean_auc"]]


def demo_runs(
  seeds: Sequence[int],
  model: str = "tiny-synthetic",
  classes: str = "one_colour",
  penalty: float | None = None,
) -> list[dict[str, Any]]:
  """configs/demo.py trained once per seed in a temporary workdir; one summary per seed:
  seed, zero_shot and stori (accuracy), auc_nuisance, auc_other, top3 (classes with a
  discriminating word among their 3 top-weighted words), classes, test_images, shots."""
  from stori_jax.fewshot import trainer  # pylint: disable=import-outside-toplevel

  out = []
  for seed in seeds:
    demo = load_config(os.path.join(CONFIGS, "demo.py"), f"classes={classes}")
    demo.seed, demo.model.source = int(seed), model
    if penalty is not None:
      demo.optim.log_weight_penalty = penalty
    with tempfile.TemporaryDirectory() as workdir:
      m = trainer.run(demo, workdir)
    n_classes = len(m["top_words"])
    out.append(
      dict(
        seed=int(seed),
        zero_shot=float(m["zero_shot"]["accuracy"]),
        stori=float(m["trained"]["accuracy"]),
        auc_nuisance=float(m["word_rank_auc"]["nuisance"]),
        auc_other=float(m["word_rank_auc"]["other"]),
        top3=len(m["classes_with_discriminating_top3"]),
        classes=n_classes,
        test_images=n_classes * int(demo.data.n_test_per_class),
        shots=int(demo.shots),
      )
    )
  return out


def define_flags(values: flags.FlagValues = flags.FLAGS) -> None:
  """The script's flags, on `values`."""
  flags.DEFINE_string("model", "tiny-synthetic", "Model to measure.", flag_values=values)
  flags.DEFINE_string(
    "demo_seeds", "1,2,3", "Few-shot seeds of the demo ('' skips it).", flag_values=values
  )
  flags.DEFINE_float(
    "penalty", None, "Demo's log-weight penalty (default: config's).", flag_values=values
  )
  flags.DEFINE_string(
    "demo_classes",
    "one_colour",
    "The demo's task (configs/demo.py:classes=...): one_colour, two_colours.",
    flag_values=values,
  )


def main(argv: list[str], values: flags.FlagValues = flags.FLAGS) -> None:
  """Prints every figure for --model."""
  del argv
  model = values.model
  bundle = stori_jax.load(model)
  print(f"## {model} (default start block {default_start_block(bundle.config.text)})\n")
  results = world_eval(model)
  q = zero_shot_quality(results)
  print(f"python -m stori_jax.evaluate_world --source {model}:\n")
  print("| colour | shape | pattern | size | position | R@1 t->i | R@1 i->t |")
  print("|---|---|---|---|---|---|---|")
  print("| " + " | ".join(f"{q[f]:.3f}" for f in (*ZERO_SHOT_FAMILIES, "t2i", "i2t")) + " |\n")
  print("| emphasised word | AP w=0.5 | AP w=1.0 | AP w=1.5 | dAP 0.5 | dAP 1.5 |")
  print("|---|---|---|---|---|---|")
  for family, row in table3(results).items():
    ap, delta = row["ap"], row["delta"]
    print(
      f"| {family} | {ap[0]:.3f} | {ap[1]:.3f} | {ap[2]:.3f} | {delta[0]:+.3f} | {delta[1]:+.3f} |"
    )
  embeddings, tasks = probe_set(bundle)
  shares = colour_shares(bundle, embeddings, tasks)
  print("\nOn configs/retrieval_synthetic.py's probe set (the same images):")
  print(f"colour of the top 16: {shares[0]:.1%} at w = 1, {shares[1]:.1%} at w = 0")
  focus = fig5_focus(bundle, embeddings, tasks)
  print(
    f"Fig. 5 (pattern w, colour 1 - w): favoured category AUC {focus[0]:.3f} at w = 0 -> "
    f"{focus[-1]:.3f} at w = 1 (moves {max(focus) - min(focus):.3f})\n"
  )
  table, _ = start_block_run(model)
  print(f"python -m stori_jax.start_block --model {model}:\n")
  print("```\n" + table + "\n```\n")
  if values.demo_seeds:
    seeds = [int(s) for s in values.demo_seeds.split(",")]
    print(f"configs/demo.py:classes={values.demo_classes}\n")
    print("| seed | zero-shot | SToRI | AUC vs nuisance | AUC vs other | top-3 explained |")
    print("|---|---|---|---|---|---|")
    for r in demo_runs(seeds, model, values.demo_classes, values.penalty):
      print(
        f"| {r['seed']} | {r['zero_shot']:.2%} | {r['stori']:.2%} | "
        f"{r['auc_nuisance']:.3f} | {r['auc_other']:.3f} | {r['top3']} of {r['classes']} |"
      )


if __name__ == "__main__":
  define_flags()
  cli.run(main)
