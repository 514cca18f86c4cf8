"""End to end on the CPU vLLM: real workers, real engine processes, real broker and database."""

from __future__ import annotations

import os
import signal
import time

import pytest

from apps.experiments.models import Experiment
from apps.lifecycle.running import experiment_cancel, experiment_start
from apps.runs.models import Host, MetricSample, RequestRecord, Run
from tests.engine_support import ENGINE_MARKS
from tests.experiments.factories import make_experiment
from tests.orchestration.conftest import Workers, pid_alive
from tests.waiting import wait_for
from workers.tasks import execute_run

pytestmark = [*ENGINE_MARKS, pytest.mark.django_db(transaction=True)]

FINISHED = {"analysed", "cancelled"}


def _wait_experiment(experiment: Experiment, timeout_s: float, workers: Workers) -> Experiment:
    try:
        wait_for(lambda: Experiment.objects.get(pk=experiment.pk).status in FINISHED, timeout_s, interval_s=1)
    except AssertionError:
        runs = list(experiment.runs.values_list("status", "reason"))
        raise AssertionError(f"experiment not finished: runs {runs}\n{workers.logs()}") from None
    experiment.refresh_from_db()
    return experiment


def _wait_measuring(experiment: Experiment, workers: Workers) -> Run:
    try:
        return wait_for(lambda: experiment.runs.filter(status="measuring").first(), 600)  # type: ignore[return-value]
    except AssertionError:
        runs = list(experiment.runs.values_list("status", "reason"))
        raise AssertionError(f"no run reached measuring: {runs}\n{workers.logs()}") from None


def _server_pids(host_name: str) -> list[int]:
    host = Host.objects.get(name=host_name)
    return [pid for pid, _ in host.server_pids]


def test_it_runs_a_small_experiment_end_to_end_and_ignores_a_redelivered_task(workers: Workers) -> None:
    """Also issue #35's acceptance: B0 with chunked prefill off (budget 8192) against a candidate
    chunking at 512 tokens on a short/long mix; the report says where each cell's short-class TTFT
    p99 went, from vLLM's own per-request spans joined to at least 95% of the records."""
    workers.start()
    experiment = make_experiment(
        baseline={
            "id": "B0",
            "captured_from": "prod",
            "args": {"enable_chunked_prefill": False, "max_num_batched_tokens": 8192, "max_num_seqs": 8},
        },
        candidates=[
            {
                "id": "C1",
                "args": {"enable_chunked_prefill": True, "max_num_batched_tokens": 512, "max_num_seqs": 8},
            }
        ],
    )
    assert experiment_start(experiment=experiment) == 2
    experiment = _wait_experiment(experiment, 600, workers)
    runs = list(experiment.runs.select_related("cell"))
    assert [r.status for r in runs] == ["done", "done"], [(r.status, r.reason) for r in runs]
    for run in runs:
        records = RequestRecord.objects.filter(run=run)
        # Every planned request has a record: sent, or marked unsent with a reason.
        assert records.count() == run.requests_planned
        ok = records.filter(http_status=200, error__isnull=True)
        assert ok.count() == run.requests_planned
        for rec in ok:
            assert rec.output_tokens == rec.expected_output_tokens
            assert rec.first_token_ns is not None and rec.first_token_ns > rec.planned_ns
        assert MetricSample.objects.filter(run=run, name="vllm:num_requests_running").exists()
        assert run.effective_args["max_num_batched_tokens"] == run.cell.args["max_num_batched_tokens"]
        assert run.trace_sha256 and run.hardware_id and run.image_digest
    assert runs[0].trace_sha256 == runs[1].trace_sha256  # paired: the same frozen traffic
    assert hasattr(experiment, "decision")
    _assert_ttft_split_from_spans(experiment, runs)

    # The same task delivered again is harmless: one set of results.
    before = RequestRecord.objects.filter(run=runs[0]).count()
    result = execute_run.apply_async(kwargs={"run_pk": runs[0].pk}, queue=f"host.{workers.host_name}")
    assert result.get(timeout=60).startswith("skipped")
    assert RequestRecord.objects.filter(run=runs[0]).count() == before


def test_it_survives_a_worker_killed_mid_run(workers: Workers) -> None:
    first = workers.start()
    # Long enough that the kill, at its first record, lands mid-run; each later run replays it whole.
    experiment = make_experiment(workload={**make_experiment_workload(), "observation_s": 15})
    experiment_start(experiment=experiment)
    measuring = _wait_measuring(experiment, workers)
    wait_for(lambda: RequestRecord.objects.filter(run=measuring).exists(), 60)
    server_pids = _server_pids(workers.host_name)
    assert server_pids
    os.killpg(first.pid, signal.SIGKILL)  # the worker and its pool process, as an OOM kill would
    first.wait()
    workers.start()  # the new worker reaps what the killed one left and fails the run
    wait_for(lambda: not any(pid_alive(p) for p in server_pids), 60)
    killed = wait_for(lambda: Run.objects.filter(pk=measuring.pk, status="failed").first(), 60)
    assert "worker lost" in killed.reason
    experiment = _wait_experiment(experiment, 900, workers)
    assert experiment.status == "analysed"
    retry = Run.objects.get(retry_of=killed)
    # The re-run measured to the end; on a loaded machine its own generator may
    # fall behind, which the validity check then calls out rather than hides.
    assert retry.status == "done" or (retry.status == "invalid" and "load generator" in retry.reason), (
        retry.reason
    )
    assert RequestRecord.objects.filter(run=retry).count() == retry.requests_planned
    # Records of the killed run are kept, none twice.
    for run in experiment.runs.all():
        indexes = list(RequestRecord.objects.filter(run=run).values_list("index", flat=True))
        assert len(indexes) == len(set(indexes))
    assert RequestRecord.objects.filter(run=killed).exists()


def test_it_cancels_mid_run_within_ten_seconds_keeping_partial_records(workers: Workers) -> None:
    workers.start()
    experiment = make_experiment(workload={**make_experiment_workload(), "observation_s": 60})
    experiment_start(experiment=experiment)
    measuring = _wait_measuring(experiment, workers)
    wait_for(lambda: RequestRecord.objects.filter(run=measuring).count() >= 2, 60)
    server_pids = _server_pids(workers.host_name)
    experiment_cancel(experiment=experiment)
    started = time.monotonic()
    wait_for(lambda: Run.objects.get(pk=measuring.pk).status == "cancelled", 10, interval_s=0.2)
    wait_for(lambda: not any(pid_alive(p) for p in server_pids), 10 - (time.monotonic() - started) + 5)
    assert RequestRecord.objects.filter(run=measuring).count() >= 2
    assert set(experiment.runs.exclude(pk=measuring.pk).values_list("status", flat=True)) == {"cancelled"}


def make_experiment_workload() -> dict:
    from tests.experiments.factories import SMALL_SPEC

    return dict(SMALL_SPEC["workload"])


def _assert_ttft_split_from_spans(experiment: Experiment, runs: list[Run]) -> None:
    """vLLM's spans joined to the records (workers/engine/spans.py), and the report's split of the
    short class's TTFT p99 per cell from them, with the bound named (apps/analysis/ttft_parts.py,
    tail_bound.py)."""
    for run in runs:
        spans = run.summary["server_spans"]
        assert spans["source"] == "otlp" and spans["used"], spans
        assert spans["joined"] >= 0.95 * spans["answered"] and spans["answered"] == run.requests_planned, (
            spans
        )
        joined = RequestRecord.objects.filter(run=run, server_ttft_ns__isnull=False)
        assert joined.count() == spans["joined"]
        for rec in joined:
            # The server's own clock inside the client's: queue and prefill within vLLM's TTFT,
            # vLLM's TTFT within the client's (from the send; 5 ms of clock slack between processes).
            assert rec.server_queue_ns >= 0 and rec.server_prefill_ns > 0
            assert rec.server_queue_ns + rec.server_prefill_ns <= rec.server_ttft_ns + 5_000_000
            assert rec.server_ttft_ns <= rec.first_token_ns - rec.sent_ns + 5_000_000
    report = experiment.decision.report
    rows = {r["cell"]: r for r in report["ttft_parts"]["rows"] if r["class"] == "short"}
    assert set(rows) == {"B0", "C1"}, report["ttft_parts"]
    for cell, row in rows.items():
        assert row["source"] == "spans" and row["per_request"], (cell, row)
        assert row["joined_share"] >= 0.95, (cell, row)
        p99 = row["p99"]
        assert not p99["censored"] and p99["parts"], (cell, p99)
        assert p99["parts"]["queue_ms"] is not None and p99["parts"]["prefill_ms"] is not None, (cell, p99)
        # The p99 request's own parts add up to its TTFT (each rounded to a microsecond).
        total = sum(v for v in p99["parts"].values() if v is not None)
        assert abs(total - p99["request_ttft_ms"]) < 0.01 * len(p99["parts"]), (cell, p99)
    bounds = {t["cell"]: t for t in report["tail_bounds"] if t["class"] == "short"}
    assert set(bounds) == {"B0", "C1"}, report["tail_bounds"]
    assert all(t["bound"] in ("queue", "prefill", "decode", "outside the engine") for t in bounds.values()), (
        bounds
    )
    assert all(t["knobs"] or t["bound"] == "outside the engine" for t in bounds.values()), bounds
