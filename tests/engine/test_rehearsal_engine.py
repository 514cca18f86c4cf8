"""The rollback rehearsal on the real CPU vLLM: candidate and B0 side by side on this machine.

Two rehearsals through the real pipeline (``workers.pipeline.run_execute``), each
with two servers on one core apiece:

- warm standby, tailtune's own client: the requests after the switch are
  served by B0 (its own /metrics count them), the streams still open on the
  candidate at the drain deadline are recorded as cut, every planned request
  is accounted for, and the time to recover is a number (or, when the starved load generator
  made the last window late, the records show that its own lag explains every breach);
- cold standby: B0 starts only at the switch, so its first token after the
  switch comes after its startup (seen in the timeline), and check 4 fails
  when ``max_recovery_s`` is shorter than that.
"""

from __future__ import annotations

from typing import Any

import pytest

from apps.analysis.checks import recovery_check
from apps.analysis.services import rehearsal_inputs
from apps.experiments.models import Experiment
from apps.lifecycle.creation import experiment_create
from apps.lifecycle.rehearsal_schedule import rehearsal_start
from apps.lifecycle.running import experiment_freeze_and_enqueue
from apps.runs.dispatch import ANALYSE_EXPERIMENT, HOST_PULL
from apps.runs.hosts import host_register_local
from apps.runs.models import MetricSample, RequestRecord, Run
from apps.workloads.services import trace_load
from tests.dispatch_support import hold_tasks
from tests.engine_support import ENGINE_MARKS
from tests.experiments.factories import UserFactory, small_spec
from workers.engine.procs import alive_pids
from workers.pipeline import run_execute

pytestmark = [
    *ENGINE_MARKS,
    pytest.mark.django_db(transaction=True),
    # Its claim is the split: the candidate and B0 each on a core of their own.
    pytest.mark.whole_machine(reason="two servers side by side, one core each"),
]


def _rehearsal(
    monkeypatch: pytest.MonkeyPatch,
    *,
    recovery: dict[str, Any],
    workload: dict[str, Any],
    switch_after_long: bool = False,
) -> Run:
    """An experiment whose sweep traces are frozen, analysed on paper, then rehearsed for C1."""
    # No task reaches the shared broker: this test runs the pipeline itself and analyses nothing.
    hold_tasks(monkeypatch, HOST_PULL, ANALYSE_EXPERIMENT)
    spec = small_spec()
    # Long streams (1,700 tokens: 2.4-6 s at this engine's 1.4-3.6 ms per token) are still open
    # at the drain deadline after the switch (0.75 s in the warm test).
    spec["classes"][1]["input_tokens"] = 256
    spec["classes"][1]["output_tokens"] = 1700
    # Contracts this shared CPU keeps with one core per server, so recovery is a number here;
    # the cold test shows the failing side.
    spec["classes"][0]["contract"] = {**spec["classes"][0]["contract"], "ttft_p99_ms": 5000}
    # Two servers pinned to one core each leave the load generator no core of its own: its
    # dispatch lag is measured and kept with the run (measured here: p99 1-5 s, and 6.8 s in
    # one clean-clone run), and the claims below (routing, cuts, accounting, the cold start)
    # do not depend on it; the tolerance only keeps such a run from being judged invalid.
    spec["workload"] = {**spec["workload"], "rates": {"near": 1.5}, "max_dispatch_lag_ms": 30000, **workload}
    spec["recovery"] = recovery
    owner = UserFactory(roles=["experimenter"])
    experiment = experiment_create(spec=spec, owner=owner)
    host_register_local()
    Experiment.objects.filter(pk=experiment.pk).update(status=Experiment.Status.RUNNING)
    experiment_freeze_and_enqueue(experiment_id=experiment.pk)
    if switch_after_long:
        # The trace is frozen from the seed, so which request comes when is known: switch 0.05 s
        # after a long request's arrival, so its stream is open at the deadline (switch + drain).
        trace = trace_load(sha256=experiment.runs.filter(kind=Run.Kind.SWEEP).first().trace_sha256)
        arrival = next(r.t_offset_s for r in trace.requests if r.klass == "long" and 3 <= r.t_offset_s <= 12)
        spec = {
            **experiment.spec,
            "recovery": {**experiment.spec["recovery"], "switch_at_s": round(arrival + 0.05, 3)},
        }
        Experiment.objects.filter(pk=experiment.pk).update(spec=spec)
        experiment.refresh_from_db()
    # The sweep itself is not what is tested here: the rehearsal replays its frozen trace.
    experiment.runs.filter(kind=Run.Kind.SWEEP).update(status=Run.Status.DONE)
    Experiment.objects.filter(pk=experiment.pk).update(status=Experiment.Status.ANALYSED)
    run = rehearsal_start(experiment=experiment, cell_id="C1", actor=owner)
    assert run_execute(run_pk=run.pk) in ("done", "failed", "invalid")
    run.refresh_from_db()
    return run


def test_warm_standby_rolls_back_to_b0_cuts_at_the_deadline_and_accounts_for_every_request(monkeypatch):
    run = _rehearsal(
        monkeypatch,
        recovery={"standby": "warm", "max_recovery_s": 30, "window_s": 4},
        workload={"warmup_s": 2, "observation_s": 14, "drain_deadline_s": 0.75},
        switch_after_long=True,
    )
    switch = run.experiment.spec["recovery"]["switch_at_s"]
    lags = {
        k: (run.summary or {}).get(k)
        for k in ("dispatch_lag_p50_ms", "dispatch_lag_p99_ms", "loop_stall_max_ms")
    }
    assert run.status == "done", (run.reason, lags, run.log_tail[-3000:])
    facts = run.summary["rehearsal"]
    assert (
        facts["standby"] == "warm"
        and facts["switch_at_s"] == switch
        and facts["cut_at_s"] == pytest.approx(switch + 0.75)
    )
    assert facts["split"].startswith("cores ")

    records = list(RequestRecord.objects.filter(run=run).order_by("index"))
    assert len(records) == run.requests_planned
    after = [r for r in records if r.planned_ns >= switch * 1e9]
    before = [r for r in records if r.planned_ns < switch * 1e9]
    assert after and before
    assert {r.backend for r in after} == {"b0"} and {r.backend for r in before if r.sent} == {"candidate"}
    # B0's own counter saw them: every post-switch request that finished was counted by B0 after the switch.
    b0 = MetricSample.objects.filter(run=run, server="b0", name="vllm:request_success_total")
    assert b0.exists()
    measures = rehearsal_inputs(experiment=run.experiment)["C1"]["measures"]
    ok_after = sum(1 for r in after if r.http_status == 200 and r.error is None and not r.unfinished)
    assert ok_after > 0 and measures["surge"]["b0_requests_succeeded"] >= ok_after
    # The candidate's long streams still open at switch + drain deadline were cut there, not dropped.
    cut = [r for r in records if r.cut]
    assert cut, (
        switch,
        [
            (r.index, r.planned_ns, r.sent_ns, r.end_ns, r.output_tokens, r.error, r.unfinished)
            for r in before
            if r.request_class == "long"
        ],
    )
    for r in cut:
        assert r.backend == "candidate" and r.unfinished and r.planned_ns < switch * 1e9
        # Never before the deadline; after it by at most the client's own longest stall (two
        # servers on two cores starve it: measured up to seconds) plus a second.
        stall_ns = (run.summary.get("loop_stall_max_ms") or 0) * 1e6
        assert (switch + 0.75) * 1e9 <= r.end_ns < (switch + 1.75) * 1e9 + stall_ns, (r.end_ns, stall_ns)
    # Every planned request is exactly one of the outcomes; nothing unaccounted.
    accounting = measures["accounting"]
    assert accounting["unaccounted"] == 0
    assert sum(accounting["total"].values()) == run.requests_planned
    assert accounting["total"]["cut"] == len(cut)
    recovered = measures["time_to_recover_s"]
    if recovered is None:
        # B0 broke a TTFT contract in the last window. Both cores are pinned to the two servers,
        # so the load generator starves (one clean-clone run: dispatch lag p99 6.8 s against a
        # 5 s contract). That is allowed only when the records prove it: every breach in the last
        # window is within its contract once the client's own lateness is taken off (its send
        # lag, and the longest stall of its event loop, which can delay reading a first token).
        last = measures["windows"][-1]
        limits = {c["name"]: float(c["contract"]["ttft_p99_ms"]) for c in run.experiment.spec["classes"]}
        loop_stall_ms = float(run.summary.get("loop_stall_max_ms") or 0)
        breaches = [
            r
            for r in after
            if r.planned_ns >= last["start_s"] * 1e9
            and (
                r.first_token_ns is None or (r.first_token_ns - r.planned_ns) / 1e6 > limits[r.request_class]
            )
        ]
        explained = [
            r
            for r in breaches
            if r.first_token_ns is not None
            and r.sent_ns is not None
            and (r.first_token_ns - r.sent_ns) / 1e6 - loop_stall_ms <= limits[r.request_class]
        ]
        assert breaches and explained == breaches, (
            "B0 did not recover and the client's lag does not explain it",
            last,
            loop_stall_ms,
            [(r.index, r.request_class, r.planned_ns, r.sent_ns, r.first_token_ns) for r in breaches],
        )
    else:
        assert isinstance(recovered, float) and 0 <= recovered <= measures["end_s"] - switch, measures[
            "windows"
        ]
    check = recovery_check(
        {"exists": False},
        chosen_cell="C1",
        baseline="B0",
        rehearsal={"run": "x", "status": "done", "measures": measures},
    )
    assert check["status"] in ("pass", "fail") and "measures" in check
    # Both servers are gone.
    assert not alive_pids(run.summary["servers"]["candidate"] + run.summary["servers"]["b0"])


def test_cold_standby_shows_the_cold_start_and_fails_check_4_when_it_is_longer_than_allowed(monkeypatch):
    run = _rehearsal(
        monkeypatch,
        recovery={"standby": "cold", "switch_at_s": 5, "max_recovery_s": 5, "window_s": 4},
        workload={"warmup_s": 1, "observation_s": 8, "drain_deadline_s": 240},
    )
    lags = {
        k: (run.summary or {}).get(k)
        for k in ("dispatch_lag_p50_ms", "dispatch_lag_p99_ms", "loop_stall_max_ms")
    }
    assert run.status == "done", (run.reason, lags, run.log_tail[-3000:])
    facts = run.summary["rehearsal"]
    # The worker started B0 at the switch; both the client (``ready``) and the worker's own start()
    # (``healthy``) first saw its /health answer only after a cold start of seconds. How far apart
    # the two polls land is not asserted: once the held requests reach B0, a /health call can wait
    # its 2 s timeout on this 2-core machine (CI saw 3.6 s), which says nothing about the code.
    started, healthy, ready = facts["b0_started_at_s"], facts["b0_healthy_at_s"], facts["b0_ready_at_s"]
    # (Not started before the switch; how late after it the switch thread woke on a loaded 2-core
    # machine is scheduling, not the code, and is not asserted.)
    assert started >= 5 and ready - started > 5 and healthy - started > 5, facts
    after = list(RequestRecord.objects.filter(run=run, planned_ns__gte=5e9).order_by("planned_ns"))
    assert after and all(r.backend == "b0" for r in after)
    # No first token after the switch before B0 was up: the cold start is in every latency.
    assert min(r.first_token_ns for r in after if r.first_token_ns is not None) >= ready * 1e9
    # Held, not sent: no post-switch request left the client before B0 answered /health.
    assert min(r.sent_ns for r in after if r.sent_ns is not None) >= ready * 1e9 - 1e6
    # B0's own /metrics answered only from then on (it did not exist before the switch).
    first_b0 = MetricSample.objects.filter(run=run, server="b0").order_by("t_ns").first()
    assert first_b0 is not None and first_b0.t_ns >= started * 1e9
    measures = rehearsal_inputs(experiment=run.experiment)["C1"]["measures"]
    timeline = measures["timeline"]["ttft_p99_ms_per_second"]
    post = [p for points in timeline.values() for p in points if p[0] >= 5 and p[1] is not None]
    # A point is [s + 0.5, p99, n] for the arrivals of second [s, s + 1): each waited for B0 at least
    # until ready, so even the p99 is >= ready - (s + 1).
    assert post and all(p[1] >= (ready - (p[0] + 0.5)) * 1000 for p in post), (ready, post)
    check = recovery_check(
        {"exists": False},
        chosen_cell="C1",
        baseline="B0",
        rehearsal={"run": "x", "status": "done", "measures": measures},
    )
    assert check["status"] == "fail", check
    assert "max_recovery_s" in check["reason"] or "did not recover" in check["reason"]
