"""The TaskRes baseline as TaskRes runs it: its optimiser and schedule against PyTorch and
Dassl step for step, and the "TaskRes / Base" row of SToRI Table 2 (Base prompts, no CuPL)."""

import json
import os
import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from stori_jax import train
from stori_jax.plumbing.config_files import load_config
from stori_jax.fewshot import datasets, prompts, schedules, trainer
from stori_jax.fewshot.prompt_bank import build_prompt_bank
from demo_flags import short_demo_flags

DEMO = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs/demo.py")

# The tiny problem: 20 steps, 4 per epoch over 5 epochs, the first epoch the warm-up.
EPOCHS, STEPS_PER_EPOCH, WARMUP_EPOCHS, WARMUP_LR = 5, 4, 1, 1e-5
LR, WEIGHT_DECAY = 0.02, 0.1  # a large decay, so that L2 vs decoupled decay shows


def _flags(workdir, model, *extra):
  return short_demo_flags(workdir, model, *extra, schedule=False)


def _gradient(params: np.ndarray, step: int) -> np.ndarray:
  """A quadratic pull towards a target that moves with the step: [3, 4] -> [3, 4], in the
  params' dtype. Elementwise arithmetic, so torch's side and JAX's side get the same bits from
  the same params."""
  dtype = params.dtype.type
  target = dtype(0.25) * np.sin(np.arange(12, dtype=dtype) + dtype(step))
  return (params - target.reshape(3, 4)) * dtype(1.5)


def _initial_params(dtype) -> np.ndarray:
  return np.random.default_rng(0).uniform(1.0, 2.0, (3, 4)).astype(dtype)


def _torch_dassl_run(dtype):
  """torch.optim.Adam(weight_decay=...) under Dassl's build_lr_scheduler("cosine") with a
  "constant" warm-up, stepped as TaskRes's trainer steps it (the scheduler once per epoch,
  after the epoch's last batch). Returns (params after each step [20, 3, 4], lr of each step
  [20])."""
  torch = pytest.importorskip("torch")

  class ConstantWarmupScheduler(torch.optim.lr_scheduler.LRScheduler):
    """Dassl's (dassl/optim/lr_scheduler.py): cons_lr for warmup_epoch epochs, then the
    successor's rates."""

    def __init__(self, optimizer, successor, warmup_epoch, cons_lr):
      self.successor, self.warmup_epoch, self.cons_lr = successor, warmup_epoch, cons_lr
      super().__init__(optimizer)

    def get_lr(self):
      if self.last_epoch >= self.warmup_epoch:
        return self.successor.get_last_lr()
      return [self.cons_lr for _ in self.base_lrs]

    def step(self, epoch=None):
      if self.last_epoch >= self.warmup_epoch:
        self.successor.step(epoch)
        self._last_lr = self.successor.get_last_lr()
      else:
        super().step(epoch)

  param = torch.nn.Parameter(torch.from_numpy(_initial_params(dtype)))
  optimizer = torch.optim.Adam([param], lr=LR, weight_decay=WEIGHT_DECAY, betas=(0.9, 0.999))
  # Dassl: CosineAnnealingLR(optimizer, float(MAX_EPOCH)), WARMUP_RECOUNT=True (the cosine's
  # epoch count starts after the warm-up), then the warm-up scheduler around it.
  cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, float(EPOCHS))
  scheduler = ConstantWarmupScheduler(optimizer, cosine, WARMUP_EPOCHS, WARMUP_LR)
  params, rates = [], []
  for epoch in range(EPOCHS):
    for batch in range(STEPS_PER_EPOCH):
      step = epoch * STEPS_PER_EPOCH + batch
      optimizer.zero_grad()
      with torch.no_grad():
        param.grad = torch.from_numpy(_gradient(param.detach().numpy().copy(), step))
      rates.append(optimizer.param_groups[0]["lr"])
      optimizer.step()
      params.append(param.detach().numpy().copy())
    scheduler.step()
  return np.stack(params), np.asarray(rates)


def _optax_run(optimizer: optax.GradientTransformation, dtype=np.float32) -> np.ndarray:
  """The params after each of the 20 steps of `optimizer` on the tiny problem [20, 3, 4]."""
  params = jnp.asarray(_initial_params(dtype))
  state = optimizer.init(params)
  out = []
  for step in range(EPOCHS * STEPS_PER_EPOCH):
    grads = jnp.asarray(_gradient(np.asarray(params), step))
    updates, state = optimizer.update(grads, state, params)
    params = optax.apply_updates(params, updates)
    out.append(np.asarray(params))
  return np.stack(out)


def _schedule():
  return schedules.taskres_schedule(LR, EPOCHS, STEPS_PER_EPOCH, WARMUP_EPOCHS, WARMUP_LR)


def _taskres_optimizer():
  return schedules.taskres_optimizer(
    LR, WEIGHT_DECAY, EPOCHS, STEPS_PER_EPOCH, WARMUP_EPOCHS, WARMUP_LR
  )


def test_taskres_schedule_is_dassls():
  _, torch_rates = _torch_dassl_run(np.float64)
  # 1e-5 through the warm-up epoch, then the cosine, one rate per epoch, never 0.
  assert np.all(torch_rates[:STEPS_PER_EPOCH] == WARMUP_LR) and torch_rates[STEPS_PER_EPOCH] == LR
  assert len(set(torch_rates[-STEPS_PER_EPOCH:])) == 1 and torch_rates[-1] > 0
  schedule = _schedule()
  ours = np.asarray([schedule(jnp.int32(step)) for step in range(EPOCHS * STEPS_PER_EPOCH)])
  np.testing.assert_allclose(ours, torch_rates, rtol=1e-6)


def test_stori_on_taskres_scheme_steps_as_dassl():
  """config.optim.schedule "taskres" (the paper configs') gives SToRI Dassl's rates step for
  step; "cosine" (the demo's) a per-step cosine from the first step, no warm-up."""
  _, torch_rates = _torch_dassl_run(np.float64)
  total = EPOCHS * STEPS_PER_EPOCH
  config = ml_collections.ConfigDict(
    dict(
      epochs=EPOCHS,
      optim=dict(lr=LR, schedule="taskres", warmup_epochs=WARMUP_EPOCHS, warmup_lr=WARMUP_LR),
    )
  )
  schedule = schedules.stori_schedule(config, total)
  ours = np.asarray([schedule(jnp.int32(step)) for step in range(total)])
  np.testing.assert_allclose(ours, torch_rates, rtol=1e-6)
  config.optim.schedule = "cosine"
  schedule = schedules.stori_schedule(config, total)
  rates = np.asarray([schedule(jnp.int32(step)) for step in range(total)])
  expected = LR * (1 + np.cos(np.pi * np.arange(total) / total)) / 2
  np.testing.assert_allclose(rates, expected, rtol=1e-5)


def test_taskres_optimiser_matches_torch_adam_step_for_step():
  """In float64 the two agree to rounding (1e-12 relative) at every step; AdamW does not."""
  torch_params, _ = _torch_dassl_run(np.float64)
  with jax.enable_x64(True):
    ours = _optax_run(_taskres_optimizer(), np.float64)
    adamw = _optax_run(optax.adamw(_schedule(), weight_decay=WEIGHT_DECAY), np.float64)
  assert ours.dtype == np.float64
  for step in range(EPOCHS * STEPS_PER_EPOCH):
    np.testing.assert_allclose(ours[step], torch_params[step], rtol=1e-12, err_msg=f"step {step}")
  # The test tells the two decays apart: AdamW on the same schedule ends elsewhere.
  assert np.max(np.abs(adamw[-1] - torch_params[-1]) / np.abs(torch_params[-1])) > 1e-3


def test_taskres_optimiser_in_float32():
  """The trainer's float32: within 1e-5. optax computes Adam's bias correction 1 - 0.999^t in
  float32 (1.3e-5 off at t = 1; torch in float64), about 6e-6 of each early update."""
  torch_params, _ = _torch_dassl_run(np.float32)
  ours = _optax_run(_taskres_optimizer(), np.float32)
  np.testing.assert_allclose(ours, torch_params, rtol=1e-5)


def test_the_trainer_uses_taskres_optimiser():
  """taskres_method builds `taskres_optimizer` from the config's taskres block."""
  config = ml_collections.ConfigDict(
    {
      "taskres": dict(
        alpha=0.5,
        lr=LR,
        weight_decay=WEIGHT_DECAY,
        warmup_epochs=WARMUP_EPOCHS,
        warmup_lr=WARMUP_LR,
      )
    }
  )
  method = trainer.taskres_method(
    config, jnp.eye(3, 4), EPOCHS * STEPS_PER_EPOCH, steps_per_epoch=STEPS_PER_EPOCH
  )
  np.testing.assert_array_equal(_optax_run(method.optimizer), _optax_run(_taskres_optimizer()))


def test_base_prompts_need_no_cupl_file(tmp_path):
  """A real dataset's Base row reads no CuPL file; Base + CuPL still asks for one."""
  config = load_config(DEMO)
  config.prompts.cupl_path = str(tmp_path / "missing" / prompts.CUPL_FILES["dtd"])
  split = types.SimpleNamespace(dataset="dtd", class_names=("banded", "blotchy"))
  features, labels = np.zeros((2, 1, 4), np.float32), np.array([0, 1])
  with pytest.raises(datasets.DatasetMissingError, match="texture_prompts_base.json"):
    trainer.prompt_texts(config, split, None, features, labels)
  config.prompts.use_cupl = False
  trainable, fixed = trainer.prompt_texts(config, split, None, features, labels)
  assert trainable == {"banded": [], "blotchy": []}
  assert fixed == {"banded": ["banded texture."], "blotchy": ["blotchy texture."]}


def test_a_bank_of_base_prompts_only(tiny_synthetic):
  bank = build_prompt_bank(
    tiny_synthetic.tokenizer, ("a", "b"), {"a": [], "b": []}, {"a": ["x"], "b": ["y", "z"]}
  )
  assert bank.buckets == () and bank.texts == () and list(bank.fixed_class) == [0, 1, 1]
  with pytest.raises(ValueError, match="'b' has no prompts"):
    build_prompt_bank(tiny_synthetic.tokenizer, ("a", "b"), {}, {"a": ["x"]})
  with pytest.raises(ValueError, match="'b' has no trainable prompts"):
    build_prompt_bank(tiny_synthetic.tokenizer, ("a", "b"), {"a": ["x"]}, {"b": ["y"]})


def test_the_taskres_base_row_runs_on_the_embedded_world(tmp_path, tiny_random_model, run_command):
  base = run_command(
    train,
    *_flags(
      tmp_path / "base",
      tiny_random_model,
      "--config.epochs=2",
      "--config.method=taskres",
      "--config.prompts.use_cupl=False",
    ),
  )
  assert base.returncode == 0, base.stderr[-3000:]
  assert "0 CuPL + 12 Base prompts" in base.stdout
  metrics = json.loads((tmp_path / "base" / "metrics.json").read_text())
  assert metrics["method"] == "taskres" and metrics["num_prompts"] == 0
  assert metrics["num_fixed_prompts"] == 12  # one Base template per class
  assert metrics["config"]["prompts"]["use_cupl"] is False
  assert 0 <= metrics["trained"]["accuracy"] <= 1

  # SToRI has nothing to train without CuPL prompts: refused before any work.
  stori = run_command(
    train, *_flags(tmp_path / "stori", tiny_random_model, "--config.prompts.use_cupl=False")
  )
  assert stori.returncode == 2 and "Traceback" not in stori.stderr
  assert "SToRI trains the token weights of the CuPL prompts" in stori.stderr
  assert not (tmp_path / "stori").exists()


def test_taskres_config_values_are_checked():
  config = load_config(DEMO)
  config.method = "taskres"
  config.taskres.warmup_epochs = -1
  config.taskres.warmup_lr = 0.0
  config.prompts.use_cupl = False
  config.prompts.use_base = False
  with pytest.raises(trainer.ConfigError) as error:
    trainer.validate_config(config)
  message = str(error.value)
  assert "config.taskres.warmup_epochs must be an integer >= 0" in message
  assert "config.taskres.warmup_lr must be a finite number > 0" in message
  assert "use_base and config.prompts.use_cupl are both False" in message


def test_taskres_base_is_the_unnormalised_mean_of_raw_features(tiny_synthetic):
  """TaskRes adds its residual to the *raw* mean of the class's prompt features (its
  `_get_base_text_features`), not to a unit vector: the base must be that mean, prompt by
  prompt, whatever bucket or padding the bank put a prompt in."""
  bundle = tiny_synthetic
  cupl = {"a": ["a red circle on grass", "a round red thing"], "b": ["a blue square"]}
  fixed = {"a": ["a photo of a a."], "b": ["a photo of a b.", "b texture."]}
  bank = build_prompt_bank(bundle.tokenizer, ("a", "b"), cupl, fixed)
  base = np.asarray(trainer.taskres_base(bundle, bank, batch_size=8))

  expected = []
  for name in ("a", "b"):
    rows = [
      np.asarray(bundle.encode_text(bundle.tokenize([t])))[0] for t in cupl[name] + fixed[name]
    ]
    expected.append(np.mean(rows, axis=0))
  np.testing.assert_allclose(base, np.stack(expected), rtol=2e-5, atol=2e-6)
  # Raw features are far from unit length, so the residual's scale differs from a unit base's.
  norms = np.linalg.norm(base, axis=1)
  assert np.all(np.abs(norms - 1.0) > 0.2), norms
