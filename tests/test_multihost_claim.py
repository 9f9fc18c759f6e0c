"""stori_jax.plumbing.multihost.claim_on_process_zero: every process checks the workdir before any
writes it, the processes compare what they checked, then process 0 claims. (The former order,
process 0 claiming while the others checked, let a process see run.json's temporary file
without run.json and refuse a good workdir; the multi-process runs themselves are in the slow
tests.)"""

import jax
import pytest

from stori_jax.plumbing import multihost, run_identity


def _fake_processes(monkeypatch, rank, events, others=None):
  """Two processes, this one `rank`; the exchange returns this process's outcome for both
  processes, or `others(mine)` (the list of every process's outcome)."""
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(jax, "process_index", lambda: rank)
  monkeypatch.setattr(
    multihost, "wait_for_all_processes", lambda name, timeout_s=None: events.append(name)
  )

  def exchange(name, value, timeout_s=None):
    events.append(name)
    return others(value) if others else [value, value]

  monkeypatch.setattr(multihost, "exchange", exchange)


@pytest.mark.parametrize("rank", [0, 1])
def test_every_process_checks_before_process_zero_claims(monkeypatch, rank):
  events = []
  _fake_processes(monkeypatch, rank, events)

  def claim(check_only):
    events.append("check" if check_only else "claim")
    return "moved"

  result = multihost.claim_on_process_zero(claim, "run")
  middle = ["claim"] if rank == 0 else []
  assert events == ["check", "run: workdir checked", *middle, "run: workdir claimed"]
  assert result == ("moved" if rank == 0 else None)


def test_a_refused_workdir_stops_every_process_before_anything_is_written(tmp_path, monkeypatch):
  """Each process raises its own check's error once the outcomes are shared."""
  (tmp_path / "other.txt").write_text("not a run")
  for rank in (0, 1):
    events = []
    _fake_processes(monkeypatch, rank, events)
    with pytest.raises(run_identity.WorkdirMismatchError, match="holds files but no run.json"):
      multihost.claim_on_process_zero(
        lambda check_only: run_identity.claim_workdir(
          str(tmp_path), {"config": 1}, check_only=check_only
        ),
        "run",
      )
    assert events == ["run: workdir checked"]  # no claim, no barrier after it
  assert sorted(p.name for p in tmp_path.iterdir()) == ["other.txt"]


def test_a_workdir_refused_on_another_process_only_stops_this_one_too(tmp_path, monkeypatch):
  """Process 1 refused (another filesystem, say): process 0 does not claim or wait for it."""
  events = []
  _fake_processes(
    monkeypatch, 0, events, others=lambda mine: [mine, {**mine, "error": "W is a file"}]
  )
  claimed = []
  with pytest.raises(multihost.ProcessesDisagreeError, match="process 1 of this run stopped"):
    multihost.claim_on_process_zero(claimed.append, "run")
  assert claimed == [True] and events == ["run: workdir checked"]


def test_processes_with_other_identities_stop_before_the_claim(tmp_path, monkeypatch):
  events = []

  def others(mine):
    other = {**mine, "identity": {**mine["identity"], "config": {"seed": 2}}}
    return [mine, other]

  _fake_processes(monkeypatch, 0, events, others=others)
  workdir = tmp_path / "run"
  with pytest.raises(multihost.ProcessesDisagreeError) as error:
    multihost.claim_on_process_zero(
      lambda check_only: run_identity.claim_workdir(
        str(workdir), {"config": {"seed": 1}}, check_only=check_only
      ),
      "run",
    )
  assert "config.seed: 1 on process 0, 2 on process 1" in str(error.value)
  assert not workdir.exists()


def test_one_process_claims_at_once(tmp_path):
  calls = []
  multihost.claim_on_process_zero(lambda check_only: calls.append(check_only), "run")
  assert calls == [False]
