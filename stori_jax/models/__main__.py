"""Deprecated entry, kept for one release: `python -m stori_jax.list_models` lists the registered
checkpoints (a command may read the checkpoint layer; the models package may not)."""

if __name__ == "__main__":
  import runpy
  import sys

  print(
    "note: `python -m stori_jax.models` is now `python -m stori_jax.list_models`.", file=sys.stderr
  )
  runpy.run_module("stori_jax.list_models", run_name="__main__", alter_sys=True)
