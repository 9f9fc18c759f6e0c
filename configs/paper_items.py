r"""Every table and figure with a result in the two papers, and the one command that makes it.

  python configs/paper_items.py              # the index as a table on one screen
  python configs/paper_items.py --markdown   # as a markdown table (README, docs/design.md)
  python configs/paper_items.py --json       # every field, as JSON
  python configs/paper_items.py --item "MK App. Table 3"   # one entry, every field
  python configs/paper_items.py --write_docs docs/design.md  # its generated index, rewritten

One entry per item (`PaperItem`): `paper` ("SToRI": Kim et al., arXiv 2410.08469; "MK": Sammani
& Deligiannis, NeurIPS 2024), `item` as the paper labels it (MK's appendix items "App. Table 1",
"App. Fig. 2"), `command` (what a user with the data and the weights runs: `DIR` is the workdir,
`/data/...` the datasets), `smoke` (the same command on the embedded world, offline, in a minute
or two on a CPU: random-weight or the shipped tiny CLIP, so its numbers check the path, not the
paper), `outputs` (the files of the workdir that hold the item: `<method>` stands for pca and
kmeans, `<label>` for a class label; those of `smoke` are the same names), `deviations` (every
setting of the command that differs from the paper's, and why; docs/design.md's "Every paper
item as a command" and section 5 say more). Diagrams without a result (SToRI Fig. 1, MK Figs. 1-2
and App. Figs. 4-5) have no entry, nor lists of inputs (SToRI Tables 9-10, MK App. Table 8).

docs/design.md's "Every paper item as a command" holds `markdown_table()` between the markers
`<!-- paper_items -->` and `<!-- /paper_items -->`, written by `--write_docs` (never by hand:
a test fails when the two differ).

`tests/test_paper_items.py` checks the index (every config a command names loads, every module
imports, no item twice) and, marked slow, runs every distinct `smoke` command in-process and
finds each entry's outputs.

This file is a config-folder module but not a run config: it has no get_config(); the commands
name the configs.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Sequence

#: The workdir placeholder of every command.
WORKDIR = "DIR"


@dataclasses.dataclass(frozen=True)
class PaperItem:
  """One table or figure of a paper with the command that makes it.

  Attributes:
    paper: "SToRI" or "MK".
    item: the paper's label ("Table 3", "Fig. 5", "App. Table 1", "App. Fig. 2").
    what: what the item shows, in a few words.
    command: the full command on the paper's data (`DIR`: the workdir; several commands are
      joined by " && ").
    smoke: the same command at embedded-world size, runnable offline.
    outputs: the files in the workdir that hold the item (glob-like: `<method>`, `<label>`).
    deviations: every setting that differs from the paper's, with why; empty: none.
  """

  paper: str
  item: str
  what: str
  command: str
  smoke: str
  outputs: tuple[str, ...]
  deviations: tuple[str, ...] = ()

  @property
  def key(self) -> str:
    return f"{self.paper} {self.item}"


# ---------------------------------------------------------------------------------------------
# Commands shared by several items.

_CELEBA = "--config.data.root=/data/celeba"
_CUB = "--config.data.root=/data/CUB_200_2011"
_IMAGENET = (
  "--config.data.root=/data/imagenet/val --config.data.classnames=/data/imagenet/classnames.txt "
  "--config.data.descriptors=data/descriptors/descriptors_imagenet.json"
)
#: A few-shot cell at embedded-world size (tests/test_grid.py's tiny grid).
_TINY_CELLS = (
  "--config.seeds=(1,) --config.base.overrides.epochs=2 --config.base.overrides.views=2 "
  "--config.base.overrides.data.n_test_per_class=5 --config.base.overrides.log_every=1 "
  "--config.base.overrides.eval_every=1 --config.base.overrides.checkpoint_every=1"
)
_TRAIN_SMOKE = (
  "python -m stori_jax.train --config configs/demo.py --config.epochs=2 --config.views=2 "
  f"--config.data.n_test_per_class=5 --config.log_every=1 --config.eval_every=1 "
  f"--config.checkpoint_every=1 --workdir {WORKDIR}"
)
_RETRIEVE_SMOKE = (
  "python -m stori_jax.retrieve --config configs/retrieval_synthetic.py "
  "--config.data.n_triples=3 --config.data.images_per_category=4 "
  "--config.sweep.ws=(0.0,0.5,1.0) --config.sweep.single_ws=(0.0,1.0,2.0) "
  "--config.sweep.start_blocks=(1,4) --config.sweep.single_blocks=(4,) "
  f"--config.cache_dir={WORKDIR}/index_cache --workdir {WORKDIR}"
)
_CELEBA3 = f"python -m stori_jax.retrieve --config configs/retrieval_celeba3.py {_CELEBA}"
_CUB3 = f"python -m stori_jax.retrieve --config configs/retrieval_cub.py {_CUB}"
_ANALYZE = f"python -m mutual.analyze --config configs/mutual_imagenet.py {_IMAGENET}"
_ANALYZE_SMOKE = (
  f"python -m mutual.analyze --config configs/mutual_synthetic.py:smoke --workdir {WORKDIR}"
)
_EVALUATE = (
  f"python -m mutual.evaluate --config configs/mutual_eval_imagenet.py {_IMAGENET} "
  "--config.baselines.data.root=/data/imagenet/train "
  "--config.protocols.corloc.boxes=/data/imagenet/val_boxes"
)
_EVALUATE_SMOKE = (
  f"python -m mutual.evaluate --config configs/mutual_eval_synthetic.py:smoke --workdir {WORKDIR}"
)
_SWEEP = f"python -m mutual.sweep --config configs/mutual_sweep.py {_IMAGENET}"
_SWEEP_SMOKE = f"python -m mutual.sweep --config configs/mutual_sweep.py:smoke --workdir {WORKDIR}"

# Deviations that several items share.
_CUPL_NOT_AUTHORS = (
  "The prompts are CuPL's (Base fixed, CuPL trained, as Table 2's SToRI); the paper's figure "
  "shows the authors' own prompts, which are not published."
)
_MK_REFERENCE_MODE = (
  "config.analysis.mode='reference' runs the authors' code as written; its K-means is seeded "
  "by a stated protocol (np.random.seed / torch.manual_seed 0 per class) so that it replays "
  "on their code: the paper does not say how it seeded (docs/design.md section 5)."
)
_MK_U = (
  "u = 50 language-side descriptors of the predicted class is the reference code's value; the "
  "paper's text gives none (mutual/paper_config.py ANALYSIS_DEFAULTS)."
)
_MK_QUALITATIVE = (
  "The paper hand-picks its examples; the run draws the first images of the first "
  "config.figure_classes classes (config.data.classes picks others, by index or by name)."
)


ITEMS: tuple[PaperItem, ...] = (
  # ------------------------------------------------------------------------------------- SToRI
  PaperItem(
    "SToRI",
    "Fig. 2",
    "trained weights of DTD prompts, shaded",
    f"python -m stori_jax.train --config configs/dtd.py:shots=16 --workdir {WORKDIR}",
    _TRAIN_SMOKE,
    ("interpretability.png", "interpretability.html"),
    (_CUPL_NOT_AUTHORS,),
  ),
  PaperItem(
    "SToRI",
    "Fig. 3",
    "one CUB class against two others: prompts' weights per pairing",
    f"python -m stori_jax.contrast --config configs/pairwise_cub.py {_CUB} --workdir {WORKDIR}",
    "python -m stori_jax.contrast --config configs/pairwise_synthetic.py --config.epochs=2 "
    f"--config.data.n_test_per_class=5 --workdir {WORKDIR}",
    ("fig3_pairwise.png", "pairwise.json"),
    (
      "The prompts come from CUB's attribute labels by a stated rule (the attributes on at "
      "least half of a class's training images, the 10 most frequent, one prompt each): the "
      "paper gives no rule, nor this figure's training settings (all of a class's ~30 training "
      "images, 200 epochs, Adam at 5e-2, fresh views; configs/pairwise_cub.py).",
    ),
  ),
  PaperItem(
    "SToRI",
    "Table 1",
    "rare tokens appended to CuPL prompts (Caltech101, SUN397, 16 shots)",
    f"python -m stori_jax.run_grid --config configs/table1.py --workdir {WORKDIR}",
    f"python -m stori_jax.run_grid --config configs/table1.py:synthetic {_TINY_CELLS} "
    f"--workdir {WORKDIR}",
    ("tables.md", "tables.json"),
    (
      "The 'CuPL' row is Table 2's SToRI setup (Base prompts fixed in the class embedding): "
      "the paper does not say whether Base joins (its numbers are within 0.1 of Table 2's).",
      "Standard deviation over seeds with ddof 0 (numpy, as Dassl's parse_test_res.py): the "
      "paper does not say which.",
    ),
  ),
  PaperItem(
    "SToRI",
    "Table 2",
    "SToRI vs TaskRes, six datasets x 1-16 shots, CLIP ViT-L/14",
    f"python -m stori_jax.run_grid --config configs/table2.py --workdir {WORKDIR}",
    f"python -m stori_jax.run_grid --config configs/grid_synthetic.py --config.shots=(1,) "
    f"{_TINY_CELLS} --workdir {WORKDIR}",
    ("tables.md", "tables.json"),
    (
      "Standard deviation over seeds with ddof 0 (numpy, as Dassl's parse_test_res.py): the "
      "paper does not say which.",
      "TaskRes's Base+CuPL base classifier is the unnormalised mean of the raw features of all "
      "the class's prompts (TaskRes's code averages its templates so); the paper does not say "
      "how it pooled the CuPL prompts.",
    ),
  ),
  PaperItem(
    "SToRI",
    "Fig. 4",
    "retrieval order by category, plain vs weighted prompt (CelebA)",
    f"{_CELEBA3} --workdir {WORKDIR}",
    _RETRIEVE_SMOKE,
    ("fig4_ranking.png",),
  ),
  PaperItem(
    "SToRI",
    "Table 3",
    "AP and P@400 under emphasis / de-emphasis, CelebA and CUB, CLIP ViT-L/14",
    f"{_CELEBA3} --workdir {WORKDIR}/celeba && {_CUB3} --workdir {WORKDIR}/cub",
    _RETRIEVE_SMOKE,
    ("retrieval_tables.md", "retrieval_metrics.json"),
    (
      "CUB: 57 prompts of three attributes with different colours from Table 10's 15; the "
      "paper reports 58 and does not list them (configs/retrieval_cub.py).",
      "The attribute lists are the paper's (App. A.2); attributes.source=auroc recomputes them "
      "by zero-shot AUROC and the run reports where they differ.",
    ),
  ),
  PaperItem(
    "SToRI",
    "Fig. 5",
    "per-category AUC while w and 1 - w move, across four models",
    "python -m stori_jax.retrieve --config configs/retrieval_fig5_models.py "
    f"{_CELEBA} --workdir {WORKDIR}",
    f"python -m stori_jax.retrieve --config configs/retrieval_fig5_models.py:smoke "
    f"--config.cache_dir={WORKDIR}/index_cache --workdir {WORKDIR}",
    ("fig5_models.png", "fig5_models.md"),
    (
      "'OpenCLIP (Cherti et al., 2023)' is taken as open_clip's LAION-2B ViT-L/14 "
      "(laion2b_s32b_b82k): the paper names no architecture or training set.",
    ),
  ),
  PaperItem(
    "SToRI",
    "Table 4",
    "two attributes at different weights (CelebA)",
    f"{_CELEBA3} --workdir {WORKDIR}",
    _RETRIEVE_SMOKE,
    ("retrieval_tables.md",),
  ),
  PaperItem(
    "SToRI",
    "Table 5",
    "Table 3 with MetaCLIP ViT-L/14",
    f"{_CELEBA3.replace('celeba3.py', 'celeba3.py:backbone=metaclip')} --workdir {WORKDIR}/celeba"
    f" && {_CUB3.replace('cub.py', 'cub.py:backbone=metaclip')} --workdir {WORKDIR}/cub",
    _RETRIEVE_SMOKE,
    ("retrieval_tables.md",),
    ("CUB: 57 prompts where the paper reports 58 (as Table 3).",),
  ),
  PaperItem(
    "SToRI",
    "Table 6",
    "five attributes combined, CLIP and MetaCLIP ViT-L/14 (CelebA, P@80)",
    "python -m stori_jax.retrieve --config configs/retrieval_celeba5.py "
    f"{_CELEBA} --workdir {WORKDIR}/clip && python -m stori_jax.retrieve --config "
    f"configs/retrieval_celeba5.py:backbone=metaclip {_CELEBA} --workdir {WORKDIR}/metaclip",
    _RETRIEVE_SMOKE,
    ("retrieval_tables.md",),
    (
      "App. C.4's five-attribute filter is read as at least 1 image per category: the paper "
      "gives no number for it.",
    ),
  ),
  PaperItem(
    "SToRI",
    "Fig. 6",
    "SToRI's weights vs the prompt-weighting baseline (AUC curves)",
    f"{_CELEBA3} --workdir {WORKDIR}",
    _RETRIEVE_SMOKE,
    ("fig6_prompt_weighting.png",),
  ),
  PaperItem(
    "SToRI",
    "Table 7",
    "run time of weighted vs plain text encoding",
    "python benchmarks/reweight_overhead.py --arch ViT-L-14 --batch 256 --repeats 20 "
    f"--json {WORKDIR}/table7.json",
    f"python benchmarks/reweight_overhead.py --batch 2 --repeats 1 --json {WORKDIR}/table7.json",
    ("table7.json",),
    (
      "A ratio measured on the machine at hand (random weights), not the paper's seconds on an "
      "RTX A5000.",
    ),
  ),
  PaperItem(
    "SToRI",
    "Fig. 7",
    "trained weights of ImageNet prompts, shaded",
    f"python -m stori_jax.train --config configs/imagenet.py:shots=16 --workdir {WORKDIR}",
    _TRAIN_SMOKE,
    ("interpretability.png", "interpretability.html"),
    (
      "ImageNet's CuPL prompts are cut to 10 per class, chosen by similarity to the class "
      "(stori_jax/fewshot/paper_config.py), as for Table 2's ImageNet.",
    ),
  ),
  PaperItem(
    "SToRI",
    "Fig. 8",
    "trained weights of DTD prompts, shaded",
    f"python -m stori_jax.train --config configs/dtd.py:shots=16 --workdir {WORKDIR}",
    _TRAIN_SMOKE,
    ("interpretability.png", "interpretability.html"),
  ),
  PaperItem(
    "SToRI",
    "Table 8",
    "Table 2 with MetaCLIP ViT-L/14",
    f"python -m stori_jax.run_grid --config configs/table2.py:backbone=metaclip --workdir {WORKDIR}",
    f"python -m stori_jax.run_grid --config configs/grid_synthetic.py --config.shots=(1,) "
    f"{_TINY_CELLS} --workdir {WORKDIR}",
    ("tables.md", "tables.json"),
    (
      "Standard deviation over seeds with ddof 0 (numpy, as Dassl's parse_test_res.py): the "
      "paper does not say which.",
    ),
  ),
  PaperItem(
    "SToRI",
    "Fig. 9",
    "AUC when reweighting starts at (a) or is confined to (b) other blocks",
    f"{_CELEBA3} --workdir {WORKDIR}",
    _RETRIEVE_SMOKE,
    ("fig9a_start_block.png", "fig9b_single_block.png"),
  ),
  PaperItem(
    "SToRI",
    "Fig. 10",
    "few-shot accuracy vs the first reweighted block",
    f"python -m stori_jax.run_grid --config configs/fig10.py --workdir {WORKDIR}",
    f"python -m stori_jax.run_grid --config configs/fig10.py:synthetic --config.sweep.values=(5,6) "
    f"{_TINY_CELLS} --workdir {WORKDIR}",
    ("tables.md", "accuracy_by_start_block.png"),
    (
      "The paper names none of this figure's settings: Table 2's six datasets at 16 shots, "
      "every block 1-12, seeds 1-3, Table 2's learning rates (configs/fig10.py).",
    ),
  ),
  # ---------------------------------------------------------------------------------------- MK
  PaperItem(
    "MK",
    "Table 1",
    "the multimodal explanations vs baselines on the XAI metrics (ViT-B/16)",
    f"{_EVALUATE} --workdir {WORKDIR}",
    _EVALUATE_SMOKE,
    ("table1.md", "curves.png"),
    ("The baselines train 10 epochs (config.baselines.train.epochs): App. D names no number.",),
  ),
  PaperItem(
    "MK",
    "Table 2",
    "zero-shot Top-1 with the mutual concepts added, 8 models",
    f"python -m mutual.sweep --config configs/mutual_table2_models.py {_IMAGENET} "
    f"--workdir {WORKDIR}",
    f"python -m mutual.sweep --config configs/mutual_table2_models.py:smoke --workdir {WORKDIR}",
    ("table2.md", "table2.json"),
    (_MK_REFERENCE_MODE,),
  ),
  PaperItem(
    "MK",
    "Table 3",
    "MI and AUC per model (13 models), PCA and K-means",
    f"{_SWEEP} --workdir {WORKDIR}",
    _SWEEP_SMOKE,
    ("table.md", "results.json"),
    (_MK_REFERENCE_MODE, _MK_U),
  ),
  PaperItem(
    "MK",
    "Fig. 3",
    "MI curves by model family and pretraining data; AUC vs accuracy",
    f"{_SWEEP} --workdir {WORKDIR}",
    _SWEEP_SMOKE,
    ("fig3_<method>.png", "fig3_auc_vs_accuracy.png"),
    (_MK_REFERENCE_MODE,),
  ),
  PaperItem(
    "MK",
    "Fig. 4",
    "visual concepts and their descriptors",
    f"{_ANALYZE} --workdir {WORKDIR}",
    _ANALYZE_SMOKE,
    ("figures/concepts_<method>_<label>.png",),
    (_MK_QUALITATIVE,),
  ),
  PaperItem(
    "MK",
    "Fig. 5",
    "three classes' MI curves (sock, siamang, crayfish) and their shared concepts",
    f"{_ANALYZE.replace('mutual_imagenet.py', 'mutual_imagenet.py:fig5')} --workdir {WORKDIR}",
    "python -m mutual.analyze --config configs/mutual_synthetic.py:fig5 "
    f"--config.data.images_per_class=2 --workdir {WORKDIR}",
    ("figures/fig5_<method>.png",),
    (
      "Every val image of the three classes (50 each): the paper does not say how many images "
      "its curves average.",
    ),
  ),
  PaperItem(
    "MK",
    "Fig. 6",
    "vision-only, language-only and mutual concepts of a prediction",
    f"{_ANALYZE} --workdir {WORKDIR}",
    _ANALYZE_SMOKE,
    ("figures/mutual_<method>_<label>.png",),
    (_MK_QUALITATIVE,),
  ),
  PaperItem(
    "MK",
    "App. Fig. 1",
    "[CLS] similarity across layers, tokens and keys (ViT-B/16)",
    f"{_EVALUATE} --workdir {WORKDIR}",
    _EVALUATE_SMOKE,
    ("layer_similarity.png", "protocols.md"),
  ),
  PaperItem(
    "MK",
    "App. Table 1",
    "CorLoc per facet and decomposition, ViT-B/16 and ViT-L/14",
    f"python -m mutual.sweep --config configs/mutual_appa1.py {_IMAGENET} "
    f"--config.protocols.corloc.boxes=/data/imagenet/val_boxes --workdir {WORKDIR}",
    f"python -m mutual.sweep --config configs/mutual_appa1.py:smoke --workdir {WORKDIR}",
    ("protocols.md", "protocols.json"),
    (
      "The ensemble rows are filled for ViT-L/14, where the paper prints '-'.",
      "Each model's analysis (the sweep's Table 3 pass) runs too: the sweep is the one "
      "multi-model driver.",
    ),
  ),
  PaperItem(
    "MK",
    "App. Table 2",
    "descriptor entropy without and with optimal transport",
    f"{_EVALUATE} --workdir {WORKDIR}",
    _EVALUATE_SMOKE,
    ("protocols.md",),
    (_MK_REFERENCE_MODE,),
  ),
  PaperItem(
    "MK",
    "App. Fig. 2",
    "optimal transport diversifies the descriptors across the visual concepts",
    f"{_ANALYZE} --workdir {WORKDIR}",
    _ANALYZE_SMOKE,
    ("figures/ot_<method>_<label>.png",),
    (_MK_QUALITATIVE,),
  ),
  PaperItem(
    "MK",
    "App. Table 3",
    "zero-shot Top-1 after blurring the non-prominent regions, 5 models",
    f"python -m mutual.sweep --config configs/mutual_appa3.py {_IMAGENET} --workdir {WORKDIR}",
    f"python -m mutual.sweep --config configs/mutual_appa3.py:smoke --workdir {WORKDIR}",
    ("protocols.md", "protocols.json"),
    (
      "Blurring is done in float on [0, 1] pixels; the reference's OpenCV blur of uint8 "
      "rounds (mutual/protocols/blur.py).",
      "Each model's analysis (the sweep's Table 3 pass) runs too: the sweep is the one "
      "multi-model driver.",
    ),
  ),
  PaperItem(
    "MK",
    "App. Table 4",
    "descriptor sets of different LLMs and prompts (ViT-B/16)",
    f"python -m mutual.evaluate --config configs/mutual_appa4.py {_IMAGENET} --workdir {WORKDIR}",
    f"python -m mutual.evaluate --config configs/mutual_appa4.py:smoke --workdir {WORKDIR}",
    ("protocols.md", "protocols/bank_quality.json"),
    (
      "Only P1 / GPT-3.5 (Menon & Vondrick's file) is published: the other seven sets must be "
      "generated with the paper's prompts and LLMs (configs/mutual_appa4.py names their files).",
      "The sentence encoder is the packaged all-MiniLM-L6-v2 (no download); the paper says "
      "'Sentence Transformer' without a model.",
    ),
  ),
  PaperItem(
    "MK",
    "App. Fig. 3",
    "noisy, scattered visual concepts (a limitation)",
    f"{_ANALYZE} --workdir {WORKDIR}",
    _ANALYZE_SMOKE,
    ("figures/concepts_<method>_<label>.png",),
    (_MK_QUALITATIVE,),
  ),
  PaperItem(
    "MK",
    "App. Table 5",
    "Standard, LF-CBM, MM-CBM, MM-ProtoSim baselines (ImageNet, ViT-B/16)",
    f"{_EVALUATE} --workdir {WORKDIR}",
    _EVALUATE_SMOKE,
    ("table1.md", "table1.json"),
    (
      "The baselines train 10 epochs: App. D names no number. LF-CBM keeps its authors' "
      "ImageNet recipe (mutual.paper_config.LF_CBM_DEFAULTS); the MK paper gives none.",
    ),
  ),
  PaperItem(
    "MK",
    "App. Fig. 6",
    "feature activation maps of the highest-norm neurons, labelled",
    f"{_EVALUATE} --workdir {WORKDIR}",
    _EVALUATE_SMOKE,
    ("fig6_feature_maps.png",),
    (
      "The paper's images are hand-picked; here the first image of each class in turn, 6 at "
      "most (config.baselines.feature_maps.figure_images).",
    ),
  ),
  PaperItem(
    "MK",
    "App. Fig. 7",
    "deletion and insertion steps of one image",
    f"{_EVALUATE} --workdir {WORKDIR}",
    _EVALUATE_SMOKE,
    ("fig7_<method>.png",),
    ("The first image of the first class, where the paper hand-picks one.",),
  ),
  PaperItem(
    "MK",
    "App. Table 6",
    "MI and AUC on Places365, grouped by model size and pretraining data",
    "python -m mutual.sweep --config configs/mutual_appg.py:places365 "
    "--config.data.root=/data/places365/val --config.data.descriptors=PATH "
    f"--workdir {WORKDIR}",
    f"python -m mutual.sweep --config configs/mutual_appg.py:smoke --workdir {WORKDIR}",
    ("table_groups.md",),
    (
      "MI and AUC are given per concept method; the paper prints one of each without saying "
      "which method.",
    ),
  ),
  PaperItem(
    "MK",
    "App. Table 7",
    "MI and AUC on Food-101",
    "python -m mutual.sweep --config configs/mutual_appg.py:food101 "
    "--config.data.root=/data/food-101/images --config.data.descriptors=PATH "
    f"--workdir {WORKDIR}",
    f"python -m mutual.sweep --config configs/mutual_appg.py:smoke --workdir {WORKDIR}",
    ("table_groups.md",),
    (
      "MI and AUC are given per concept method; the paper prints one of each without saying "
      "which method.",
    ),
  ),
  PaperItem(
    "MK",
    "App. Fig. 8",
    "more visual concepts with their importance map",
    f"{_ANALYZE} --workdir {WORKDIR}",
    _ANALYZE_SMOKE,
    ("figures/concepts_<method>_<label>.png",),
    (_MK_QUALITATIVE,),
  ),
  PaperItem(
    "MK",
    "App. Fig. 9",
    "more visual concepts with their importance map",
    f"{_ANALYZE} --workdir {WORKDIR}",
    _ANALYZE_SMOKE,
    ("figures/concepts_<method>_<label>.png",),
    (_MK_QUALITATIVE,),
  ),
  PaperItem(
    "MK",
    "App. Fig. 10",
    "more vision-language-mutual concepts",
    f"{_ANALYZE} --workdir {WORKDIR}",
    _ANALYZE_SMOKE,
    ("figures/mutual_<method>_<label>.png",),
    (_MK_QUALITATIVE,),
  ),
)


# ---------------------------------------------------------------------------------------------
# Reading the commands.


def split_commands(command: str) -> list[list[str]]:
  """A command line (several joined by " && ") -> each one's words (shell quoting)."""
  import shlex  # pylint: disable=import-outside-toplevel

  return [shlex.split(part) for part in command.split(" && ")]


def module_of(words: Sequence[str]) -> str | None:
  """`python -m MODULE ...` -> MODULE; a script (`python path.py`) -> None."""
  return words[2] if len(words) > 2 and words[:2] == ["python", "-m"] else None


def config_of(words: Sequence[str]) -> tuple[str, str | None] | None:
  """The config file a command names (`--config PATH[:ARG]` or `--config=PATH[:ARG]`) as
  (path, argument or None); None without one."""
  for k, word in enumerate(words):
    value = None
    if word == "--config" and k + 1 < len(words):
      value = words[k + 1]
    elif word.startswith("--config="):
      value = word.split("=", 1)[1]
    if value is not None:
      path, _, argument = value.partition(":")
      return path, argument or None
  return None


def with_deviations() -> list[PaperItem]:
  return [i for i in ITEMS if i.deviations]


# ---------------------------------------------------------------------------------------------
# Printing.


def _short(command: str) -> str:
  """The command without its data flags: what tells the items apart on one screen."""
  data_flags = ("--config.data.", "--config.baselines.data.", "--config.protocols.corloc.boxes")
  parts = []
  for words in split_commands(command):
    kept, skip = [], False
    for w in words:
      if skip or w.startswith(data_flags) or w.startswith("--workdir="):
        skip = False
        continue
      if w in ("--workdir", "--config"):
        skip = w == "--workdir"
        continue
      kept.append(w.removeprefix("configs/"))
    parts.append(" ".join(kept[2:] if module_of(words) else kept[1:]))
  return " && ".join(parts)


def text_table(items: Sequence[PaperItem] = ITEMS) -> str:
  """One line per item: paper, item, what, the command (data flags left out), deviations."""
  head = ("paper", "item", "command (configs/, data and --workdir flags left out)", "dev.")
  rows = [(i.paper, i.item, _short(i.command), str(len(i.deviations))) for i in items]
  widths = [max(len(r[c]) for r in [head, *rows]) for c in range(3)]
  lines = [
    "  ".join(h.ljust(w) for h, w in zip(head[:3], widths)) + "  " + head[3],
  ]
  lines += ["  ".join(c.ljust(w) for c, w in zip(r[:3], widths)) + "  " + r[3] for r in rows]
  lines.append(
    f"{len(items)} items, {sum(bool(i.deviations) for i in items)} with deviations from the "
    "paper (--item 'MK App. Table 3' shows one in full; --json every field)"
  )
  return "\n".join(lines)


def markdown_table(items: Sequence[PaperItem] = ITEMS) -> str:
  """The index as a markdown table: paper, item, what, command, smoke, differs from the paper."""
  lines = [
    "| paper | item | what | command | offline (embedded world) | differs from the paper |",
    "|---|---|---|---|---|---|",
  ]
  for i in items:
    cells = [
      i.paper,
      i.item,
      i.what,
      f"`{i.command}`",
      f"`{i.smoke}`",
      "<br>".join(i.deviations) or "none",
    ]
    lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
  return "\n".join(lines) + "\n"


def compact_table(items: Sequence[PaperItem] = ITEMS) -> str:
  """The index on one screen, for the README: paper, item, what, the command without its data
  flags, and how many settings differ from the paper (docs/design.md's table says which)."""
  lines = [
    "| paper | item | what | command (data and --workdir flags left out) | settings that differ |",
    "|---|---|---|---|---|",
  ]
  for i in items:
    cells = [i.paper, i.item, i.what, f"`{_short(i.command)}`", str(len(i.deviations))]
    lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
  return "\n".join(lines) + "\n"


#: The markers of the generated index in a markdown document (docs/design.md: every field)...
MARKERS = ("<!-- paper_items -->", "<!-- /paper_items -->")
#: ... and of its one-screen form (README.md).
COMPACT_MARKERS = ("<!-- paper_items.compact -->", "<!-- /paper_items.compact -->")
#: Each kind of region and the table it holds.
REGIONS = ((MARKERS, markdown_table), (COMPACT_MARKERS, compact_table))


def docs_region(text: str, markers: tuple[str, str] = MARKERS) -> str:
  """The text between `markers` (ValueError when they are not there once each, in order)."""
  start, end = (text.find(m) for m in markers)
  if min(start, end) < 0 or text.count(markers[0]) != 1 or end < start:
    raise ValueError(f"the document needs {markers[0]} and then {markers[1]}, once each")
  return text[start + len(markers[0]) : end].strip("\n")


def with_index(text: str) -> str:
  """`text` with each region it holds (MARKERS, COMPACT_MARKERS) replaced by its table;
  ValueError naming the markers when it holds neither."""
  found = [(m, table) for m, table in REGIONS if m[0] in text or m[1] in text]
  if not found:
    raise ValueError(f"the document needs {MARKERS[0]} and then {MARKERS[1]}, once each")
  for markers, table in found:
    docs_region(text, markers)  # the markers, checked
    start = text.index(markers[0]) + len(markers[0])
    text = text[:start] + "\n" + table() + text[text.index(markers[1]) :]
  return text


def as_json(items: Sequence[PaperItem] = ITEMS) -> str:
  return json.dumps([dataclasses.asdict(i) for i in items], indent=1)


def _describe(item: PaperItem) -> str:
  lines = [f"{item.key}: {item.what}", f"  command: {item.command}", f"  smoke:   {item.smoke}"]
  lines.append(f"  outputs: {', '.join(item.outputs)}")
  lines += [f"  differs: {d}" for d in item.deviations] or ["  differs: nothing"]
  return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
  args = list(argv)
  if args[:1] == ["--json"]:
    print(as_json())
  elif args[:1] == ["--markdown"]:
    print(markdown_table(), end="")
  elif args[:1] == ["--item"] and len(args) == 2:
    found = [i for i in ITEMS if i.key.casefold() == args[1].casefold()]
    if not found:
      print(
        f"No item {args[1]!r}; items are named as '<paper> <item>', e.g. 'MK App. Table 3' "
        "(python configs/paper_items.py lists them).",
        file=sys.stderr,
      )
      return 2
    print(_describe(found[0]))
  elif args[:1] == ["--write_docs"] and len(args) == 2:
    from stori_jax.plumbing import paths  # pylint: disable=import-outside-toplevel

    try:
      updated = with_index(paths.read_text(args[1]))
    except (OSError, ValueError) as error:
      print(f"Cannot write the index into {args[1]}: {error}.", file=sys.stderr)
      return 2
    paths.write_text_atomic(args[1], updated)
    print(f"{args[1]}: the index of {len(ITEMS)} items written")
  elif not args:
    print(text_table())
  else:
    print(
      f"Unknown arguments {args}: use no argument (the table), --markdown, --json, "
      "--item '<paper> <item>' or --write_docs PATH.",
      file=sys.stderr,
    )
    return 2
  return 0


if __name__ == "__main__":
  # As a script its folder heads sys.path; --write_docs imports the project's path layer.
  import os  # pylint: disable=import-outside-toplevel

  sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  sys.exit(main(sys.argv[1:]))
