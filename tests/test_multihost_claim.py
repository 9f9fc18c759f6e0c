"""stori_jax.multihost.claim_on_process_zero: every process checks the workdir before any
writes it, then process 0 claims. (The former order, process 0 claiming while the others
checked, let a process see run.json's temporary file without run.json and refuse a good
workdir; the multi-process runs themselves are in the slow tests.)"""

import jax
import pytest

from stori_jax import multihost, run_identity


@pytest.mark.parametrize("rank", [0, 1])
def test_every_process_checks_before_process_zero_claims(monkeypatch, rank):
  events = []
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(jax, "process_index", lambda: rank)
  monkeypatch.setattr(multihost, "wait_for_all_processes", lambda name: events.append(name))

  def claim(check_only):
    events.append("check" if check_only else "claim")
    return "moved"

  result = multihost.claim_on_process_zero(claim, "run")
  middle = ["claim"] if rank == 0 else []
  assert events == ["check", "run: workdir checked", *middle, "run: workdir claimed"]
  assert result == ("moved" if rank == 0 else None)


def test_a_refused_workdir_stops_every_process_before_any_barrier(tmp_path, monkeypatch):
  """Each process raises the same error at its check, so none waits for the others."""
  (tmp_path / "other.txt").write_text("not a run")
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  waited = []
  monkeypatch.setattr(multihost, "wait_for_all_processes", waited.append)
  for rank in (0, 1):
    monkeypatch.setattr(jax, "process_index", lambda rank=rank: rank)
    with pytest.raises(run_identity.WorkdirMismatchError, match="holds files but no run.json"):
      multihost.claim_on_process_zero(
        lambda check_only: run_identity.claim_workdir(
          str(tmp_path), {"config": 1}, check_only=check_only
        ),
        "run",
      )
  assert waited == [] and sorted(p.name for p in tmp_path.iterdir()) == ["other.txt"]


def test_one_process_claims_at_once(tmp_path):
  calls = []
  multihost.claim_on_process_zero(lambda check_only: calls.append(check_only), "run")
  assert calls == [False]
