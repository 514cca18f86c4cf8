from __future__ import annotations

import json

import pytest

from apps.analysis.columns import RecordTable
from apps.analysis.models import Decision
from apps.analysis.report import build_report
from apps.analysis.services import (
    _experiment_inputs,
    _run_inputs,
    experiment_analyse,
    experiment_report_build,
)
from apps.runs.models import MetricSample, Run
from tests.analysis.factories import done_experiment, isolate_experiment

pytestmark = pytest.mark.django_db


def faster_c1(cell, mix, rep, cls, idx):
    return {"ttft_ms": 100.0 if cell == "C1" else 900.0} if cls == "short" else {}


def test_it_gives_the_same_report_from_the_database_as_from_the_records():
    # 500 requests a run in its 10 s window: 200 long over two repeats, enough to judge a p95.
    experiment, records = done_experiment(faster_c1, per_run=500, spacing_s=0.02)
    stored = experiment_report_build(experiment_id=experiment.pk)
    inputs = _experiment_inputs(experiment)
    runs = [
        {k: v for k, v in r.items() if k != "pk"}
        for r in _run_inputs(list(experiment.runs.select_related("cell").order_by("plan_position", "id")))
    ]
    pure = build_report(
        **inputs,
        runs=runs,
        table=RecordTable.from_records(records),
        rollback={"exists": False, "baseline": None},
        options=None,
    )
    assert stored["decision"] == pure["decision"]
    assert stored["runs"] == pure["runs"]
    assert stored["comparisons"] == pure["comparisons"]
    assert stored["decision"]["outcome"] == "retune"
    assert stored["decision"]["chosen_cell"] == "C1"


def test_it_stores_one_decision_per_experiment_and_replaces_it():
    experiment, _ = done_experiment(faster_c1, per_run=500, spacing_s=0.02)
    first = experiment_analyse(experiment_id=experiment.pk)
    assert first.outcome == Decision.Outcome.RETUNE and first.chosen_cell == "C1"
    assert first.checks["validity"]["status"] == "pass"
    assert first.report["decision"]["rule"] == first.rule
    json.dumps(first.report, allow_nan=False)
    # A run that turns out invalid makes C1 incomplete: the re-analysis replaces the row.
    Run.objects.filter(experiment=experiment, cell__cell_id="C1", repeat=2).update(status=Run.Status.INVALID)
    second = experiment_analyse(experiment_id=experiment.pk)
    assert Decision.objects.filter(experiment=experiment).count() == 1
    assert second.pk == first.pk
    assert second.outcome == Decision.Outcome.RETAIN
    assert second.checks["validity"]["invalid_cells"] == ["C1"]
    missing = [p for p in second.checks["validity"]["problems"] if p["problem"] == "missing"]
    assert missing and missing[0]["statuses"] == ["invalid"]


def test_it_reads_server_samples_with_restarts():
    experiment, _ = done_experiment()
    run = experiment.runs.get(cell__cell_id="B0", repeat=1)
    for t, epoch, value in ((0, 0, 10.0), (5, 0, 14.0), (6, 1, 1.0), (9, 1, 3.0)):
        MetricSample.objects.create(
            run=run,
            t_ns=int(t * 1e9),
            phase="during",
            epoch=epoch,
            name="vllm:num_preemptions_total",
            kind="counter",
            value=value,
        )
    report = experiment_report_build(experiment_id=experiment.pk)
    server = next(r for r in report["runs"] if r["key"] == str(run.run_id))["server"]
    assert server["counters"]["preemptions"] == pytest.approx(6.0)
    assert server["restarts"] == [{"epoch": 1, "t_s": 6.0}]


def test_it_merges_gap_histograms_in_the_database_like_the_pure_code():
    def chunky(cell, mix, rep, cls, idx):
        return {"tokens_per_chunk": 4, "itl_ms": 5.0}

    experiment, _ = done_experiment(chunky)
    report = experiment_report_build(experiment_id=experiment.pk)
    m = report["runs"][0]["classes"]["short"]
    assert m["itl_ms"]["p50"] == pytest.approx(5.0, rel=0.03)
    assert m["chunk_gap_ms"]["p50"] == pytest.approx(20.0, rel=0.03)


def test_it_reports_an_experiment_without_records_as_failing_not_crashing():
    experiment, _ = done_experiment(store=False)
    report = experiment_report_build(experiment_id=experiment.pk)
    assert report["records"]["total"] == 0
    assert all(r["classes"]["short"]["counts"]["offered"] == 0 for r in report["runs"])
    # A done run with nothing measured is not data: every cell is invalid, B0 included.
    assert report["decision"]["outcome"] == "inconclusive"
    assert report["checks"]["validity"]["invalid_cells"] == ["B0", "C1"]
    assert {p["problem"] for p in report["checks"]["validity"]["problems"]} == {
        "no records in the observation window"
    }
    assert report["comparisons"] == []
    # No run recorded its engine time: the report says so with None, never a made-up zero.
    assert report["engine_time"] is None


def test_the_report_carries_the_engine_time_the_runs_recorded():
    experiment, _ = done_experiment(store=False)
    parts = {"start_s": 40.0, "warmup_s": 2.0, "windows_s": 12.0, "drain_s": 0.5, "stop_s": 1.5}
    for run in experiment.runs.all():
        Run.objects.filter(pk=run.pk).update(summary={**(run.summary or {}), "engine_time": parts})
    report = experiment_report_build(experiment_id=experiment.pk)
    n = experiment.runs.count()
    assert report["engine_time"]["spent_s"] == 56.0 * n and report["engine_time"]["server_starts"] == n


def test_an_isolate_report_sizes_its_pools_from_the_workloads_class_capacity_searches():
    search = {"status": "done", "capacity_rps": 0.5, "bracketed": True, "steps": [{"rate_rps": 0.5}]}
    experiment = isolate_experiment({"C1": {"short": search}, "B0": {"short": {"status": "queued"}}})
    report = experiment_report_build(experiment_id=experiment.pk)
    assert report["decision"]["outcome"] == "isolate"
    short, long = report["pools"]["pools"]
    # 80% of 1 req/s is short: 0.8 / (0.5 x 0.8) = 2 servers of C1, the one measured alone.
    assert (short["cell"], short["capacity_rps"], short["replicas"]) == ("C1", 0.5, 2)
    assert short["capacity"]["source"] == "capacity search of C1 on short alone"
    assert short["points"][0]["share"] == 0.8 and short["points"][0]["measured_share"] == 0.8
    # Nothing measured the long class alone: no number, and the command that would measure it.
    assert long["replicas"] is None and long["cell"] == "B0"
    assert f"experiment_calibrate {experiment.pk} --cell B0 --class long" in long["how_to_measure"]
    assert report["pools"]["unsized"] == ["long"] and report["pools"]["total_replicas"] is None
    json.dumps(report, allow_nan=False)
