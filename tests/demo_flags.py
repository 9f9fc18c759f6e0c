"""The flags of a short few-shot run of configs/demo.py, shared by the tests that train it as a
command (in-process or as a subprocess)."""

import os

DEMO = os.path.join(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "demo.py"
)


def short_demo_flags(workdir, model, *extra, schedule: bool = True) -> list[str]:
  """configs/demo.py on `model` with 2 cached views, 4 shots and 5 test images per class;
  `schedule` adds logging, evaluation and a checkpoint every 1, 2 and 2 steps."""
  flags = [
    f"--config={DEMO}",
    f"--workdir={workdir}",
    f"--config.model.source={model}",
    "--config.views=2",
    "--config.shots=4",
    "--config.data.n_test_per_class=5",
  ]
  if schedule:
    flags += ["--config.log_every=1", "--config.eval_every=2", "--config.checkpoint_every=2"]
  return flags + list(extra)
