"""The training plumbing every trainer shares: the loop around a jitted step (`loop`), orbax
checkpoints of the training state and the non-finite watch (`checkpointer`), and the per-step
JSON-lines log (`metrics_log`)."""
