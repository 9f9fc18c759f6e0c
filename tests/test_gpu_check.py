"""benchmarks/gpu_check.py --smoke: every part at tiny sizes on the CPU, in this process, and
every figure the GPU check reports (issue 25, item 5) in its JSON."""

import json
import math

import pytest

from benchmarks import gpu_check
from stori_jax.plumbing import cli

#: part -> the figures it must report.
FIELDS = {
  "crf": (
    "lattice_arrays_checked",
    "lattice_arrays_unequal",
    "label_pixels_differing",
    "ms_per_image",
  ),
  "mutual": (
    "first_visit_seconds",
    "steady_seconds_per_class",
    "steady_seconds_per_image",
    "host_seconds_per_image",
    "device_seconds_per_image",
    "compiles",
    "compile_seconds",
    "compiles_first_class",
    "compiles_after_first_class",
    "compile_seconds_after_first_class",
    "projected_imagenet_val_minutes",
  ),
  "reference": ("seconds_per_image", "images"),
  "train_ours": (
    "seconds_per_step",
    "first_call_seconds",
    "prompts",
    "setup_seconds",
    "first_call_compiles",
    "compiles_in_timed_steps",
  ),
  "train_torch": ("seconds_per_step", "first_call_seconds", "prompts"),
  "reweight": ("float32", "bfloat16"),
  "features": ("image_max_rel_error", "text_max_rel_error"),
  "spectral": (
    "per_model_seconds",
    "batched_seconds",
    "ratio_batched_over_per_model",
    "mask_patches_differing",
    "gram_fallbacks",
    "models",
  ),
}
COUNTS = (
  "compiles",
  "first_call_compiles",
  "compiles_in_timed_steps",
  "compiles_first_class",
  "compiles_after_first_class",
  "images",
  "prompts",
  "lattice_arrays_checked",
  "lattice_arrays_unequal",
  "label_pixels_differing",
  "mask_patches_differing",
  "gram_fallbacks",
  "models",
)


def _finite(value):
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@pytest.mark.slow
def test_smoke_writes_every_field(tmp_path):
  path = tmp_path / "gpu_check.json"
  code = cli.run_in_process(gpu_check, ["--smoke", "--json", str(path)])
  assert code == 0
  result = json.loads(path.read_text())
  for key in ("device", "jax_version", "torch_version", "date"):
    assert isinstance(result[key], str) and result[key]
  assert result["smoke"] is True
  assert list(result["parts"]) == list(gpu_check.PARTS)
  for name, fields in FIELDS.items():
    part = result["parts"][name]
    assert part["status"] == "ok", (name, part)
    assert _finite(part["seconds"]) and part["seconds"] <= part["budget_s"] + gpu_check.GRACE_S
    for field in fields:
      value = part[field]
      if name == "reweight":
        assert _finite(value["time_ratio_weighted_over_plain"]), (name, field, value)
        assert value["plain_prompts_per_s"] > 0 and value["weighted_prompts_per_s"] > 0
        continue
      assert _finite(value), (name, field, value)
      assert value >= 0, (name, field, value)
      if field in COUNTS:
        assert isinstance(value, int), (name, field, value)
  mutual = result["parts"]["mutual"]
  assert mutual["compiles_first_class"] > 0  # the first class compiles its programs
  assert mutual["compiles"] == mutual["compiles_first_class"] + mutual["compiles_after_first_class"]
  assert mutual["host_seconds_per_image"] <= mutual["steady_seconds_per_image"] + 1e-6
  # The device's lattices are the host's, array for array and label for label.
  lattice = result["parts"]["crf"]
  assert lattice["lattice_arrays_unequal"] == 0 and lattice["label_pixels_differing"] == 0
  # No class after the first compiles anything.
  assert mutual["compiles_after_first_class"] == 0
  # CPU against the CPU: the same numbers.
  features = result["parts"]["features"]
  assert features["image_max_rel_error"] < 1e-6 and features["text_max_rel_error"] < 1e-6
  # The foreground split batched across models: the same masks as model by model, both timed
  # in the same rounds (each round holds both ways).
  spectral = result["parts"]["spectral"]
  assert spectral["mask_patches_differing"] == 0 and spectral["gram_fallbacks"] == 0
  assert spectral["models"] == gpu_check.SMOKE["spectral_models"] and spectral["rounds"]
  assert all(set(r) == {"per_model", "batched"} for r in spectral["rounds"])
  assert spectral["groups"] == [[f"model-{m:02d}" for m in range(spectral["models"])]]
  for key, value in result["summary"].items():
    assert _finite(value), (key, value)
  assert isinstance(result["summary"]["mutual_compiles"], int)
  # Every part records its compilations (named) and the XLA_FLAGS it ran under.
  for name, part in result["parts"].items():
    compiles = part["part_compiles"]
    assert isinstance(compiles["count"], int) and _finite(compiles["seconds"]), name
    assert sum(p["count"] for p in compiles["programs"].values()) == compiles["count"], name
    assert "xla_flags" in part and "xla_gpu_autotune_level" in part, name
  assert mutual["compile_programs_first_class"]  # which programs the first class compiles
  # The train step: one program, compiled ahead from shapes while the device computes the
  # prefix cache and image features; none on its first call or after; its phases one by one,
  # and no agreement check compiled in the timed part.
  ours = result["parts"]["train_ours"]
  assert ours["first_call_compiles"] == 0 and ours["compiles_in_timed_steps"] == 0
  assert list(ours["phases"]["step_compile"]["compiles"]["programs"]) == ["jit(train_step)"]
  assert set(ours["phases"]) == {"prefix", "image", "state", "step_compile", "wait", "first_call"}
  assert result["gpu_autotune_level"] == 0 and result["gpu_autotune_parts"] == []


def test_a_part_over_its_budget_is_recorded_and_the_rest_skipped(monkeypatch):
  """Budgets: a part that overruns reports what it had; no part starts without time left."""
  import time  # pylint: disable=import-outside-toplevel

  def slow(ctx):
    ctx.put(first=1.0)
    time.sleep(3.0)
    ctx.put(second=2.0)

  monkeypatch.setitem(gpu_check.PART_FUNCTIONS, "features", slow)
  monkeypatch.setitem(gpu_check.SMOKE_BUDGETS, "features", 0.5)
  monkeypatch.setattr(gpu_check, "GRACE_S", 0.5)
  monkeypatch.setattr(gpu_check, "MIN_START_S", 1.0)
  parts = gpu_check.run_parts(["features", "reweight"], smoke=True, budget_s=1.5, isolate=False)
  assert parts["features"]["status"] == "overran"
  assert parts["features"]["first"] == 1.0 and "second" not in parts["features"]
  assert parts["reweight"]["status"] == "skipped"
  table = gpu_check.table(
    dict(
      device="cpu:cpu",
      jax_version="x",
      torch_version="y",
      date="d",
      smoke=True,
      parts=parts,
      summary=gpu_check.summary(parts),
    )
  )
  assert "overran" in table and "skipped" in table


def test_the_autotune_level_goes_to_the_chosen_parts_only(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x")
  flags_of = gpu_check._child_xla_flags  # pylint: disable=protected-access
  level_of = gpu_check._autotune_level  # pylint: disable=protected-access
  assert flags_of("train_ours", 0, gpu_check.AUTOTUNE_PARTS) == (
    "--xla_dump_to=/tmp/x --xla_gpu_autotune_level=0"
  )
  assert level_of(flags_of("train_ours", 2, ("train_ours",))) == 2
  # The mutual part keeps XLA's default; -1 leaves every part alone.
  assert flags_of("mutual", 0, gpu_check.AUTOTUNE_PARTS) == "--xla_dump_to=/tmp/x"
  assert flags_of("train_ours", -1, gpu_check.AUTOTUNE_PARTS) == "--xla_dump_to=/tmp/x"
  assert level_of("--xla_dump_to=/tmp/x") is None
  # A level XLA_FLAGS sets already wins.
  monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_autotune_level=3")
  assert level_of(flags_of("train_ours", 0, gpu_check.AUTOTUNE_PARTS)) == 3
