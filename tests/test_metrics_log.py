"""The JSON-lines metrics log that pretraining and few-shot training share."""

from stori_jax.trainloop import metrics_log


def test_resume_drops_redone_steps_and_a_line_cut_by_a_kill(tmp_path):
  path = str(tmp_path / "metrics.jsonl")
  assert metrics_log.read_records(path) == []
  for step in (10, 20, 30):
    metrics_log.append_record(path, {"step": step, "loss": 1.0 / step})
  with open(path, "a", encoding="utf-8") as f:
    f.write('{"step": 40, "lo')  # SIGKILL mid-write
  assert [r["step"] for r in metrics_log.read_records(path)] == [10, 20, 30]
  # resuming from the checkpoint at step 20: steps after it are logged again by the run
  assert [r["step"] for r in metrics_log.read_records(path, up_to_step=20)] == [10, 20]
  metrics_log.append_record(path, {"step": 30, "loss": 0.5})
  records = metrics_log.read_records(path)
  assert [r["step"] for r in records] == [10, 20, 30] and records[-1]["loss"] == 0.5
