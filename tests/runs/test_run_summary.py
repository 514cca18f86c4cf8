"""A run's summary holds what apps/runs/summary_types.py declares: a sweep run and a run whose
reused server never went idle, executed by the real pipeline on fake servers (tests/engine/
fake_server.py, which starts in milliseconds), walked against their TypedDicts. The rehearsal's
summary is walked in test_rehearsal_router.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from apps.runs.models import Run
from apps.runs.summary_types import PreReplaySummary, RunSummary, run_summary
from tests.runs.fake_engine import fake_sweep_run
from tests.test_typed_contracts import _problems
from workers import pipeline

pytestmark = pytest.mark.django_db(transaction=True)


def _sweep_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *, reuse: bool) -> Run:
    return fake_sweep_run(monkeypatch, tmp_path, reuse=reuse)


def test_a_sweep_runs_summary_is_the_replays_with_the_engines_time_and_the_server(
    monkeypatch, tmp_path
) -> None:
    run = _sweep_run(monkeypatch, tmp_path, reuse=False)
    assert pipeline.run_execute(run_pk=run.pk) == Run.Status.DONE
    run.refresh_from_db()
    assert _problems(run.summary, RunSummary, "summary") == []
    summary = run_summary(run.summary)
    assert summary["sent"] == run.requests_sent and summary["server"] == {
        "reused": False,
        "started_by": str(run.run_id),
    }
    assert {"start_s", "warmup_s", "windows_s", "drain_s", "stop_s"} <= set(summary["engine_time"])
    assert "idle_check" not in summary and "quality_probe" not in summary  # no reuse, no probe


def test_a_reused_servers_run_that_never_went_idle_keeps_the_pre_replay_summary(
    monkeypatch, tmp_path
) -> None:
    # The fake server publishes no running or waiting gauge, so it never reads as idle.
    monkeypatch.setattr(pipeline, "IDLE_TIMEOUT_S", 0.3)
    run = _sweep_run(monkeypatch, tmp_path, reuse=True)
    [(pk, status)] = pipeline.host_pull(limit=1)
    assert (pk, status) == (run.pk, Run.Status.FAILED)
    run.refresh_from_db()
    assert "did not go idle after its warm-up" in run.reason
    assert _problems(run.summary, PreReplaySummary, "summary") == []
    assert run.summary["idle_check"]["idle"] is False and run.summary["server"]["reused"] is False


def test_no_stored_summary_reads_as_an_empty_one() -> None:
    assert run_summary(None) == {} and run_summary([]) == {}
    assert run_summary({"sent": 3}).get("sent") == 3


def test_a_kept_servers_stop_is_added_to_the_last_runs_engine_time() -> None:
    from tests.experiments.factories import make_experiment
    from workers.slot import _add_stop_time

    first, second = make_experiment().runs.order_by("plan_position")[:2]
    Run.objects.filter(pk=first.pk).update(
        summary={"sent": 3, "engine_time": {"start_s": 2.0, "stop_s": 0.5}}
    )
    _add_stop_time(first.pk, 1.25)
    _add_stop_time(second.pk, 1.0)  # no summary yet
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.summary == {"sent": 3, "engine_time": {"start_s": 2.0, "stop_s": 1.75}}
    assert second.summary == {"engine_time": {"stop_s": 1.0}}
