"""Early stopping in the database (apps/lifecycle/run_skipping.py): a candidate that can no longer be
accepted loses its queued sweep runs, and nothing else is touched; with ``engine.stop_on_invalid``
(a gate's experiment) the first unusable sweep run skips every queued sweep run."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from apps.analysis.services import experiment_analyse, experiment_report_build
from apps.audit.models import AuditEvent
from apps.experiments.models import Experiment
from apps.gate.verdict import gate_verdict
from apps.lifecycle.run_skipping import experiment_skip_after_invalid, experiment_skip_doomed
from apps.runs.models import RequestRecord as RecordRow
from apps.runs.models import Run
from apps.workloads.services import trace_store
from apps.workloads.tracefile import Trace, TraceRequest
from tests.analysis.builders import request
from tests.analysis.factories import analysis_spec, record_row
from tests.experiments.factories import make_experiment

pytestmark = pytest.mark.django_db

PER_RUN = 40  # 32 short and 8 long requests in the window, as tests/analysis/factories.py spaces them


def stored_trace() -> Any:
    """The trace every run replays: one warm-up request, then the window's 40 requests."""
    requests = [
        TraceRequest(
            index=0, t_offset_s=0.2, klass="short", input_tokens=2, output_tokens=8, warmup=True, prompt="hi"
        )
    ]
    for i in range(PER_RUN):
        requests.append(
            TraceRequest(
                index=i + 1,
                t_offset_s=round(1.0 + i * 0.2, 6),
                klass="long" if i % 5 == 4 else "short",
                input_tokens=2,
                output_tokens=8,
                prompt="hi",
            )
        )
    return trace_store(trace=Trace(meta={"warmup_s": 1.0, "observation_s": 10.0}, requests=requests))


def finish(run: Run, *, unfinished_long: int = 0) -> None:
    """Mark ``run`` done with its records; ``unfinished_long`` of its long requests never finish."""
    key = str(run.run_id)
    rows = []
    long_seen = 0
    for i in range(PER_RUN):
        cls = "long" if i % 5 == 4 else "short"
        kw: dict[str, Any] = {"tokens": 8, "expected": 8}
        if cls == "long":
            long_seen += 1
            if long_seen <= unfinished_long:
                kw.update(ttft_ms=None, unfinished=True)
        rows.append(record_row(run, request(key, i, cls, int(1e9 + i * 0.2e9), **kw)))
    rows.append(
        record_row(run, request(key, PER_RUN, "short", int(0.2e9), warmup=True, tokens=8, expected=8))
    )
    RecordRow.objects.bulk_create(rows)
    Run.objects.filter(pk=run.pk).update(hardware_id="cpu-test", dispatch_lag_p99_ms=1.0)
    end(run, Run.Status.DONE)


def end(run: Run, status: str, reason: str = "") -> None:
    """Finish ``run`` as the pipeline's writer does (workers/pipeline._finish: one update of the row)."""
    Run.objects.filter(pk=run.pk).update(status=status, reason=reason, finished_at=timezone.now())
    run.refresh_from_db()


def running_experiment(**spec: Any) -> Experiment:
    experiment = make_experiment(**analysis_spec(repeats=3), **spec)
    trace = stored_trace()
    experiment.runs.update(trace=trace, trace_sha256=trace.sha256, corpus_sha256=trace.corpus_sha256)
    Experiment.objects.filter(pk=experiment.pk).update(status=Experiment.Status.RUNNING)
    experiment.refresh_from_db()
    return experiment


def sweep(experiment: Experiment, cell: str, repeat: int) -> Run:
    return experiment.runs.select_related("cell").get(cell__cell_id=cell, repeat=repeat, kind=Run.Kind.SWEEP)


def scenario_copy(run: Run, scenario: str) -> Run:
    """A queued non-sweep run of the same cell (a failure scenario or a uniform companion)."""
    fields = {
        f.name: getattr(run, f.name)
        for f in Run._meta.concrete_fields
        if f.name not in {"id", "run_id", "status", "reason", "created_at", "updated_at", "retry_of"}
    }
    kind = Run.Kind.UNIFORM if scenario == "uniform" else Run.Kind.SCENARIO
    fields.update(
        kind=kind,
        scenario="" if kind == Run.Kind.UNIFORM else scenario,
        plan_position=run.plan_position + 100,
    )
    return Run.objects.create(**fields)


def test_a_candidate_that_broke_a_contract_loses_only_its_queued_sweep_runs():
    experiment = running_experiment()
    finish(sweep(experiment, "B0", 1))
    broke = sweep(experiment, "C1", 1)
    finish(broke, unfinished_long=3)
    claimed = sweep(experiment, "C1", 2)
    Run.objects.filter(pk=claimed.pk).update(status=Run.Status.STARTING)
    burst = scenario_copy(sweep(experiment, "C1", 3), "long-burst")
    uniform = scenario_copy(sweep(experiment, "C1", 3), "uniform")

    reason = f"cannot be accepted (run {broke.run_id} broke long ttft)"
    assert experiment_skip_doomed(experiment_id=experiment.pk, cell_id="C1") == {"C1": reason}

    queued_c1 = sweep(experiment, "C1", 3)
    assert queued_c1.status == Run.Status.SKIPPED and queued_c1.reason == reason
    assert queued_c1.finished_at is not None
    # A claimed run runs on; B0 and the runs outside the sweep are never skipped.
    assert Run.objects.get(pk=claimed.pk).status == Run.Status.STARTING
    assert {sweep(experiment, "B0", r).status for r in (2, 3)} == {Run.Status.QUEUED}
    assert {Run.objects.get(pk=r.pk).status for r in (burst, uniform)} == {Run.Status.QUEUED}
    event = AuditEvent.objects.get(action="runs.skipped", experiment=experiment)
    assert event.detail["cell"] == "C1" and event.detail["reason"] == reason
    assert event.detail["runs"] == [str(queued_c1.run_id)]
    assert (event.detail["class"], event.detail["metric"]) == ("long", "ttft")
    # Nothing is left to skip: a second call changes nothing and audits nothing.
    assert experiment_skip_doomed(experiment_id=experiment.pk) == {}
    assert AuditEvent.objects.filter(action="runs.skipped").count() == 1

    # The report lists the skipped run with its reason and says why the cell is incomplete.
    report = experiment_report_build(experiment_id=experiment.pk)
    row = next(r for r in report["runs"] if r["run_id"] == str(queued_c1.run_id))
    assert (row["status"], row["reason"]) == ("skipped", reason)
    # C1 is stopped, with what settled it as early stopping recorded it (its only settled run's
    # count is the pooled count the audit entry holds); stopped is not invalid.
    assert report["skipped"] == [
        {
            "cell": "C1",
            "reason": reason,
            "runs": [str(queued_c1.run_id)],
            "settled_by": {
                "run": str(broke.run_id),
                "mixture": broke.mixture,
                "rate": broke.rate_name,
                "repeat": broke.repeat,
                "class": "long",
                "metric": "ttft",
                "run_over": event.detail["over"],
            },
        }
    ]
    c1_problems = [p for p in report["checks"]["validity"]["problems"] if p["cell"] == "C1"]
    assert ("missing", 2) in [(p["problem"], p["repeat"]) for p in c1_problems]  # still running
    assert not [p for p in c1_problems if p["repeat"] == 3]  # the stopped point is no validity problem
    failures = report["checks"]["acceptance"]["cells"]["C1"]["failures"]
    assert [f["broken"] for f in failures if f["class"] is None] == [[f"skipped: {reason}"]]


def test_a_candidate_that_may_still_pass_keeps_its_runs():
    experiment = running_experiment()
    finish(sweep(experiment, "C1", 1), unfinished_long=0)
    assert experiment_skip_doomed(experiment_id=experiment.pk, cell_id="C1") == {}
    assert set(experiment.runs.values_list("status", flat=True)) <= {Run.Status.QUEUED, Run.Status.DONE}


def test_the_baseline_is_never_skipped():
    experiment = running_experiment()
    finish(sweep(experiment, "B0", 1), unfinished_long=3)
    assert experiment_skip_doomed(experiment_id=experiment.pk) == {}
    assert not experiment.runs.filter(status=Run.Status.SKIPPED).exists()


def test_nothing_is_skipped_with_the_switch_off_or_outside_a_running_experiment():
    off = running_experiment(engine={"early_stop": False})
    assert off.spec["engine"]["early_stop"] is False
    finish(sweep(off, "C1", 1), unfinished_long=3)
    assert experiment_skip_doomed(experiment_id=off.pk, cell_id="C1") == {}
    assert not off.runs.filter(status=Run.Status.SKIPPED).exists()

    paused = running_experiment()
    finish(sweep(paused, "C1", 1), unfinished_long=3)
    Experiment.objects.filter(pk=paused.pk).update(status=Experiment.Status.PLANNED)
    assert experiment_skip_doomed(experiment_id=paused.pk, cell_id="C1") == {}
    assert not paused.runs.filter(status=Run.Status.SKIPPED).exists()


def test_a_repeat_without_a_known_trace_settles_nothing():
    experiment = running_experiment()
    finish(sweep(experiment, "C1", 1), unfinished_long=3)
    experiment.runs.filter(repeat__gt=1).update(trace=None, trace_sha256="")
    assert experiment_skip_doomed(experiment_id=experiment.pk, cell_id="C1") == {}


def test_the_results_page_shows_the_skipped_runs_and_why(client, viewer):  # type: ignore[no-untyped-def]
    experiment = running_experiment()
    finish(sweep(experiment, "B0", 1))
    broke = sweep(experiment, "C1", 1)
    finish(broke, unfinished_long=3)
    reason = experiment_skip_doomed(experiment_id=experiment.pk, cell_id="C1")["C1"]
    client.force_login(viewer)
    before = client.get(f"/experiments/{experiment.pk}/results/").content.decode()
    assert '2 of them <span class="badge status-skipped">skipped</span>' in before
    # The run table on the experiment page gives each skipped run its status and reason.
    page = client.get(f"/experiments/{experiment.pk}/").content.decode()
    assert "status-skipped" in page and reason in page
    skipped = sweep(experiment, "C1", 3)
    run_page = client.get(f"/runs/{skipped.run_id}/")
    assert run_page.status_code == 200 and reason in run_page.content.decode()

    experiment_analyse(experiment_id=experiment.pk)
    after = client.get(f"/experiments/{experiment.pk}/results/").content.decode()
    assert 'id="skipped-cells"' in after and reason in after and "2 skipped" in after


def test_with_stop_on_invalid_an_invalid_run_skips_every_queued_sweep_run_and_the_gate_is_inconclusive():
    experiment = running_experiment(engine={"early_stop": False, "stop_on_invalid": True})
    finish(sweep(experiment, "C1", 1))
    bad = sweep(experiment, "B0", 1)
    end(
        bad,
        Run.Status.INVALID,
        "server not idle at the run's start after 30 s: 1 running, 0 waiting, KV 3.0%",
    )
    claimed = sweep(experiment, "C1", 2)
    Run.objects.filter(pk=claimed.pk).update(status=Run.Status.STARTING)
    burst = scenario_copy(sweep(experiment, "C1", 3), "long-burst")

    reason = experiment_skip_after_invalid(experiment_id=experiment.pk, run_pk=bad.pk)
    assert reason == (
        f"the answer is inconclusive (run {bad.run_id} invalid: server not idle at the run's start "
        "after 30 s: 1 running, 0 waiting, KV 3.0%)"
    )
    skipped = list(experiment.runs.filter(status=Run.Status.SKIPPED).order_by("plan_position"))
    queued_sweep = {(r.cell.cell_id, r.repeat) for r in skipped}
    assert queued_sweep == {("B0", 2), ("B0", 3), ("C1", 3)}
    assert all(r.reason == reason and r.finished_at is not None for r in skipped)
    # A claimed run runs on; runs outside the sweep are left to run.
    assert Run.objects.get(pk=claimed.pk).status == Run.Status.STARTING
    assert Run.objects.get(pk=burst.pk).status == Run.Status.QUEUED
    event = AuditEvent.objects.get(action="runs.skipped", experiment=experiment)
    assert event.detail["run"] == str(bad.run_id) and event.detail["runs"] == [str(r.run_id) for r in skipped]
    # Nothing is left to skip: a second call changes nothing and audits nothing.
    assert experiment_skip_after_invalid(experiment_id=experiment.pk, run_pk=bad.pk) is None
    assert AuditEvent.objects.filter(action="runs.skipped").count() == 1

    # What the gate would have said after every run is what it says now: inconclusive, naming why.
    report = experiment_report_build(experiment_id=experiment.pk)
    verdict = gate_verdict(report, candidate="C1")
    assert verdict["verdict"] == "inconclusive" and verdict["exit_code"] == 2
    assert any("skipped: " + reason in r for r in verdict["reasons"]), verdict["reasons"]
    assert any(r.startswith("B0 ") and "invalid" in r for r in verdict["reasons"]), verdict["reasons"]


def test_with_stop_on_invalid_a_done_run_over_the_lag_tolerance_skips_the_rest():
    experiment = running_experiment(engine={"early_stop": False, "stop_on_invalid": True})
    late = sweep(experiment, "C1", 1)
    finish(late)
    tolerance = experiment.workload.max_dispatch_lag_ms
    Run.objects.filter(pk=late.pk).update(dispatch_lag_p99_ms=tolerance + 1)
    reason = experiment_skip_after_invalid(experiment_id=experiment.pk, run_pk=late.pk)
    assert reason == (
        f"the answer is inconclusive (run {late.run_id} dispatch lag over tolerance "
        f"(p99 {tolerance + 1:g} ms > {tolerance:g} ms))"
    )
    assert not experiment.runs.filter(kind=Run.Kind.SWEEP, status=Run.Status.QUEUED).exists()


def test_a_usable_run_or_the_switch_off_skips_nothing():
    on = running_experiment(engine={"stop_on_invalid": True})
    fine = sweep(on, "C1", 1)
    finish(fine)
    assert experiment_skip_after_invalid(experiment_id=on.pk, run_pk=fine.pk) is None

    off = running_experiment()
    assert off.spec["engine"]["stop_on_invalid"] is False
    bad = sweep(off, "B0", 1)
    end(bad, Run.Status.FAILED, "vLLM exited with status 1 during startup")
    assert experiment_skip_after_invalid(experiment_id=off.pk, run_pk=bad.pk) is None
    for experiment in (on, off):
        assert not experiment.runs.filter(status=Run.Status.SKIPPED).exists()
