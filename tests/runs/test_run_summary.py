"""A run's summary holds what apps/runs/summary_types.py declares: a sweep run and a run whose
reused server never went idle, executed by the real pipeline on fake servers (tests/engine/
fake_server.py, which starts in milliseconds), walked against their TypedDicts. The rehearsal's
summary is walked in test_rehearsal_router.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from apps.experiments.models import Experiment
from apps.lifecycle.creation import experiment_create
from apps.lifecycle.running import experiment_freeze_and_enqueue
from apps.runs.dispatch import ANALYSE_EXPERIMENT, HOST_PULL
from apps.runs.hosts import host_register_local
from apps.runs.models import Run
from apps.runs.summary_types import PreReplaySummary, RunSummary, run_summary
from tests.dispatch_support import hold_tasks
from tests.experiments.factories import UserFactory, small_spec
from tests.test_typed_contracts import _problems
from workers import pipeline

FAKE = Path(__file__).resolve().parents[1] / "engine" / "fake_server.py"
pytestmark = pytest.mark.django_db(transaction=True)


def _sweep_run(monkeypatch: pytest.MonkeyPatch, *, reuse: bool) -> Run:
    hold_tasks(monkeypatch, HOST_PULL, ANALYSE_EXPERIMENT)
    monkeypatch.setenv("TAILTUNE_VLLM_COMMAND", json.dumps([sys.executable, str(FAKE)]))
    spec = small_spec()
    spec["engine"] = {"reuse": reuse, "early_stop": False}
    spec["workload"] = {**spec["workload"], "rates": {"low": 4.0}, "warmup_s": 0.5, "observation_s": 1.5}
    spec["workload"]["drain_deadline_s"] = 5
    host_register_local()
    experiment = experiment_create(spec=spec, owner=UserFactory(roles=["experimenter"]))
    Experiment.objects.filter(pk=experiment.pk).update(status=Experiment.Status.RUNNING)
    experiment_freeze_and_enqueue(experiment_id=experiment.pk)
    return experiment.runs.filter(kind=Run.Kind.SWEEP).order_by("plan_position").first()


def test_a_sweep_runs_summary_is_the_replays_with_the_engines_time_and_the_server(monkeypatch) -> None:
    run = _sweep_run(monkeypatch, reuse=False)
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


def test_a_reused_servers_run_that_never_went_idle_keeps_the_pre_replay_summary(monkeypatch) -> None:
    # The fake server publishes no running or waiting gauge, so it never reads as idle.
    monkeypatch.setattr(pipeline, "IDLE_TIMEOUT_S", 0.3)
    run = _sweep_run(monkeypatch, reuse=True)
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
