r"""App. A.4's Table 4 of the mutual-knowledge paper in one run: the descriptor sets of different
LLMs and prompts, one row each (Prompt | LLM | Top-1 | Top-5 | InterDiv | IntraDiv), scored with
OpenAI ViT-B/16 on the same ImageNet val images.

  python -m mutual.evaluate --config configs/mutual_appa4.py --workdir DIR \
    --config.data.root=/data/imagenet/val \
    --config.data.classnames=/data/imagenet/classnames.txt \
    --config.data.descriptors=data/descriptors/descriptors_imagenet.json
  python -m mutual.evaluate --config configs/mutual_appa4.py:smoke --workdir DIR   # offline

The rows are config.protocols.bank_quality.descriptor_sets, (prompt, LLM, descriptor file)
triples; each file (Menon & Vondrick's layout, {class name: [descriptor, ...]}) is read and its
classes matched to the data's by name before the model loads. Each set is scored as the
single-bank run scores its bank (`mutual.protocols.bank_quality`: App. K's descriptor classifier
Top-1 / Top-5 on the run's images, inter- and intra-class similarity under the sentence
encoder); protocols.md holds the table, protocols/bank_quality.json every number. The first row
(P1, GPT-3.5) is Menon & Vondrick's file, the one every other MK result uses; the authors did
not publish the other seven sets: generate them with the paper's prompts (P1-P4, App. A.4) and
LLMs into data/descriptors/appa4/ under the names below, or point the triples elsewhere
(--config.protocols.bank_quality.descriptor_sets="(('P1','GPT-3.5','a.json'), ...)").
mutual.evaluate's Table 1 pass runs too (it gives the images' embeddings; the baselines are off
here), so its table1.md is written beside.

The argument (`:variant=NAME`, or just `:NAME`) picks one of:
  imagenet  (default) the paper's 8 rows on ImageNet val
  smoke     the embedded world's two descriptor sets (stori_jax.data.synthetic_tasks.
            DESCRIPTOR_SETS: "attributes", the analysis's own bank, and "sentences", a second
            set written by another rule) on configs/mutual_eval_synthetic.py:smoke's 2 classes
            x 4 images with the shipped tiny CLIP (the tests' run)
"""

from stori_jax.plumbing.config_files import config_arguments, sibling_config

#: App. Table 4's rows, in its order: (prompt, LLM, descriptor file).
APPA4_SETS = (
  ("P1", "GPT-3.5", "data/descriptors/descriptors_imagenet.json"),
  ("P1", "GPT-4o-mini", "data/descriptors/appa4/p1_gpt-4o-mini.json"),
  ("P1", "GPT-4o", "data/descriptors/appa4/p1_gpt-4o.json"),
  ("P1", "Llama3.1-8B-Instruct", "data/descriptors/appa4/p1_llama3.1-8b-instruct.json"),
  ("P2", "GPT-4o-mini", "data/descriptors/appa4/p2_gpt-4o-mini.json"),
  ("P3", "GPT-4o-mini", "data/descriptors/appa4/p3_gpt-4o-mini.json"),
  ("P4", "GPT-4o-mini", "data/descriptors/appa4/p4_gpt-4o-mini.json"),
  ("P4", "GPT-3.5 + GPT-4o-mini", "data/descriptors/appa4/p4_gpt-3.5+gpt-4o-mini.json"),
)
#: The embedded world's rows: its two descriptor sets, named as two prompts of one "LLM" (the
#: world's rules).
SMOKE_SETS = (
  ("attributes", "embedded world", "attributes"),
  ("sentences", "embedded world", "sentences"),
)


def get_config(argument=None):
  variant = config_arguments(argument, __file__, variant=("imagenet", "smoke"))["variant"]
  if variant == "imagenet":
    config = sibling_config(__file__, "mutual_eval_imagenet")
  else:
    config = sibling_config(__file__, "mutual_eval_synthetic", "smoke")
  # Item 1 of issue 41 (config.analysis.bank_template, App. L's descriptor prompt) is set by
  # the analysis config this one starts from.
  config.name = "mutual_appa4" + ("" if variant == "imagenet" else f"_{variant}")
  config.evaluation.protocols = ("bank_quality",)
  config.baselines.enabled = False
  config.protocols.bank_quality.descriptor_sets = SMOKE_SETS if variant == "smoke" else APPA4_SETS
  return config
