"""Scenarios and the capacity probe on the real CPU vLLM.

Three tests, few server starts (one vLLM at a time fits the two cores; each
start costs ~40 s):

- the probe goes through the real pipeline: ``experiment_freeze_and_enqueue``
  runs the calibration inline through ``workers.pipeline.inline_executor`` (one
  server kept up across the probe's steps, each after an idle check), freezes the
  rates and the plan, then a scenario run
  (the context boundary) executes through the same pipeline and is judged by
  ``scenario_reports`` from the database;
- every scenario's signal is checked on one FCFS server with a small KV cache,
  and the priority order on a second server with priority scheduling (a test
  of its own), replaying each scenario trace once, back to back,
  with the same replay client and /metrics scraper the pipeline uses. The
  sizes that decide whether a signal can show are derived by the generator
  from the decode pace measured on that server first (as the pipeline derives
  them from B0's probe), so the test holds on a fast or a slow machine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from apps.analysis.scenario_checks import OVERTAKE_MARGIN_MS, decode_step_ms, scenario_verdict
from apps.analysis.server_metrics import server_metrics
from apps.experiments.models import Experiment
from apps.lifecycle.running import experiment_freeze_and_enqueue
from apps.lifecycle.scenario_schedule import pace_trace
from apps.runs.dispatch import HOST_PULL
from apps.runs.hosts import host_queue, host_register_local
from apps.runs.models import RequestRecord, Run
from apps.runs.scenario_reports import scenario_reports
from apps.workloads.prompts import PromptTokenizer
from apps.workloads.scenario_traces import (
    PRIORITY_CHECK,
    ScenarioContext,
    kv_capacity_tokens,
    scenario_trace,
)
from apps.workloads.services import trace_load
from tests.dispatch_support import hold_tasks
from tests.engine_support import ENGINE_DIR, ENGINE_MARKS, MODEL
from tests.experiments.factories import UserFactory, small_spec
from tests.stall_witness import StallWitness
from workers.engine.launcher import cpu_engine_host
from workers.engine.scrape import Scraper
from workers.engine.server import EngineServer
from workers.engine.spans import collect_run_spans, join_spans
from workers.pipeline import inline_executor, run_execute
from workers.replay.config import ReplayConfig
from workers.replay.run import run_replay

pytestmark = ENGINE_MARKS
# Each signal and the priority order are timings under a load sized for the whole machine; no other
# test may run beside them (tests/lanes.py). The probe's test claims no timing (its capacity may be
# either step's rate), so it runs in its lane.
WHOLE_MACHINE = pytest.mark.whole_machine(reason="timings under a load sized for the whole machine")

MAX_MODEL_LEN = 1024
# 4 MiB of KV cache: 4096 tokens of this model (1 KiB per token): six full-context
# sequences overflow it (KV pressure), while the priority check's first wave fits.
KV_BYTES = 4 * 1024 * 1024
MAX_NUM_SEQS = 6
CLASSES = [
    {"name": "short", "input_tokens": 64, "output_tokens": 8, "priority": 0},
    {"name": "long", "input_tokens": 600, "output_tokens": 8, "priority": 1},
]
# The sizes that decide whether a signal shows (the burst, the backlog and its outputs,
# the decode-pressure outputs) are left to the generator, which derives them from the
# decode pace measured on this server just before, as the pipeline does from the probe.
SCENARIOS: list[tuple[str, dict[str, Any]]] = [
    ("kv_pressure", {"requests": 6, "spread_s": 0.05}),
    ("decode_pressure", {"concurrency": 6, "observation_s": 2, "ramp_s": 0.3}),
    ("context_boundary", {"gap_s": 1.0}),
    ("cancellation", {"rps": 4, "observation_s": 3, "output_tokens": 32, "share": 0.5}),
    (
        "long_burst",
        {
            "steady_rps": 2,
            "observation_s": 3,
            "burst_at_s": 1,
            "long_output_tokens": 400,
            "drain_deadline_s": 0.5,
            "overload": 2,
        },
    ),  # fmt: skip
]
PRIORITY_PARAMS = {
    # Six waves of six running sequences (the generator's own is three): a flood the host's stall
    # delays by a few seconds (measured: 2.5-3 s on this VM) still finds most of the backlog waiting.
    "backlog": 6 * MAX_NUM_SEQS,
    "flood": 6,
    "flood_at_s": 0.1,
    "flood_rps": 20,
    "overload": 2,
    "drain_deadline_s": 120,
}


def _server(tmp_path: Path, name: str, policy: str) -> EngineServer:
    return EngineServer(
        model=str(MODEL),
        cell_args={"max_num_batched_tokens": 1024, "max_num_seqs": MAX_NUM_SEQS, "scheduling_policy": policy},
        controls={
            "dtype": "bfloat16",
            "max_model_len": MAX_MODEL_LEN,
            "kv_cache_memory_bytes": KV_BYTES,
            "enable_prefix_caching": False,
            "seed": 0,
            "revision": "tiny-llama-local-v1",
            "tokenizer_revision": "tiny-llama-local-v1",
        },
        host=cpu_engine_host(ENGINE_DIR),
        log_path=tmp_path / f"{name}.log",
        health_deadline_s=240,
        grace_s=15,
    )


def _context(pace_ms: float | None = None) -> ScenarioContext:
    config = json.loads((MODEL / "config.json").read_text())
    return ScenarioContext(
        classes=CLASSES,
        max_model_len=MAX_MODEL_LEN,
        seed=11,
        tokenizer_revision="tiny-llama-local-v1",
        kv_capacity_tokens=kv_capacity_tokens(model_config=config, kv_cache_memory_bytes=KV_BYTES),
        decode_step_ms=pace_ms,
        pace_source=None if pace_ms is None else "engine test: streams one at a time on this server",
        max_num_seqs=MAX_NUM_SEQS,
    )


def _replay(
    server: EngineServer, trace: Any, run_id: str
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """Replay a trace as the pipeline does; the records, the run's server metrics and the replay summary."""
    meta = trace.meta
    scraper = Scraper(server.base_url, interval_s=1.0)
    witness = StallWitness(server.log_path.parent)
    try:
        scraper.scrape("before")
        scraper.start_during()
        with witness:
            result = run_replay(
                [r.to_json() for r in trace.requests],
                ReplayConfig(
                    base_url=server.base_url,
                    model=server.served_model_name,
                    run_id=run_id,
                    warmup_s=meta["warmup_s"],
                    observation_s=meta["observation_s"],
                    drain_deadline_s=meta["drain_deadline_s"],
                    max_dispatch_lag_ms=1000,
                ),
            )
        scraper.stop_during()
        scraper.scrape("after")
        # The server's own timings joined to the records, as the pipeline does after each run
        # (workers/server_timings.py): the priority order is read on the server's clock from them.
        assert server.spans is not None, server.spans_off_reason
        join_spans(result.records, collect_run_spans(server.spans.store, run_id, result.records))
    finally:
        scraper.close()
    # The witness's facts ride with the summary; _judge takes them out before the verdict sees it.
    summary = {**result.summary(), "witness": witness.facts}
    return [r.to_json() for r in result.records], server_metrics(scraper.samples), summary


def _pace(server: EngineServer, tok: PromptTokenizer) -> float:
    """The server's decode pace, measured on the pipeline's own pace-run trace."""
    trace = pace_trace(context=_context(), tokenizer=tok)
    records, _, _ = _replay(server, trace, "pace")
    pace = decode_step_ms(records)
    assert pace is not None, records
    return pace


def _judge(
    server: EngineServer, name: str, params: dict[str, Any], policy: str, tok: PromptTokenizer, pace: float
) -> dict[str, Any]:
    """Generate the scenario trace at the measured pace, replay it as the pipeline does, and judge it."""
    trace = scenario_trace(name=name, context=_context(pace), params=params, tokenizer=tok)
    records, server_side, summary = _replay(server, trace, f"{name}-{policy}")
    witness = summary.pop("witness")
    status = "failed" if server.failure() else "done"
    verdict = scenario_verdict(
        meta=trace.meta,
        records=records,
        server=server_side,
        status=status,
        scheduling_policy=policy,
        replay=summary,
    )
    verdict["sizing"] = trace.meta["sizing"]
    verdict["witness"] = witness
    verdict["timeline"] = _timeline(trace.meta, records)
    return verdict


def _timeline(meta: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, list[list[Any]]]:
    """Per role, each request's index, when it was planned and sent and when its first token came,
    then the server's arrival and first token (ms from the run's origin, None when never): the raw
    times an order is read from."""
    by_index = {int(r["index"]): r for r in records}

    def ms(ns: Any) -> float | None:
        return None if ns is None else round(float(ns) / 1e6, 1)

    return {
        role: [
            [
                i,
                ms(r.get("planned_ns")),
                ms(r.get("sent_ns")),
                ms(r.get("first_token_ns")),
                ms(r.get("server_arrival_ns")),
                ms(r.get("server_first_token_ns")),
            ]
            for i in indices
            if (r := by_index.get(int(i))) is not None
        ]
        for role, indices in (meta.get("roles") or {}).items()
    }


def _served_first(timeline: dict[str, list[list[Any]]]) -> tuple[int, int]:
    """(pairs, flood first): read from the raw server times in the timeline, apart from the verdict.
    A pair is a flood request and a backlog request the server had received before it and had not
    yet given a first token when it arrived; "flood first" counts the pairs whose flood request got
    its first token from the server before the backlog request did (or the backlog one never did)."""
    pairs = first = 0
    for f in timeline.get("flood", []):
        f_arrival, f_first = f[4], f[5]
        if f_arrival is None or f_first is None:
            continue
        for b in timeline.get("backlog", []):
            b_arrival, b_first = b[4], b[5]
            if b_arrival is None or b_arrival >= f_arrival or (b_first is not None and b_first <= f_arrival):
                continue
            pairs += 1
            first += b_first is None or f_first < b_first
    return pairs, first


def _explain(v: dict[str, Any]) -> str:
    keys = ("must_hold", "signal", "counts", "sizing")
    return json.dumps({k: v[k] for k in keys if k in v}, indent=1)


def _order_unread(name: str, v: dict[str, Any]) -> str | None:
    """Why the priority order could not be judged on this replay; None when the verdict read it.

    The verdict reads the order from the first-token times the load generator stamped, and says
    "inconclusive" when the generator stalled for longer than the margin the order is read with
    (first tokens stamped after a stall carry no order). The test then fails, saying whose
    stall it was by evidence the code under test did not produce (tests/stall_witness.py: a
    heartbeat process of its own, the kernel's CPU pressure and steal): the host's, when the
    witness's heartbeat overslept by the margin too; else the client's, which lost the order
    by itself. Either way the claim was not checked, and an unchecked claim is no pass.
    """
    if not v["signal"].get("inconclusive"):
        return None
    claimed = float(v["signal"]["evidence"]["load_generator_stall_max_ms"])
    overslept = float(v["witness"].get("heartbeat_max_oversleep_ms") or 0.0)
    evidence = json.dumps(
        {
            "witness": v["witness"],
            "timeline [index, planned, sent, first token, server arrival, server first token ms]": v[
                "timeline"
            ],
        }
    )
    if overslept >= OVERTAKE_MARGIN_MS:
        return (
            f"{name}: the host stalled, so this replay could not judge the order: the independent "
            f"witness's heartbeat overslept {overslept:.0f} ms and the load generator {claimed:.0f} ms, "
            f"more than the {OVERTAKE_MARGIN_MS:.0f} ms margin first tokens are ordered with. The claim "
            f"was not checked; run it on a host with CPU to spare. {evidence}"
        )
    return (
        f"{name}: the verdict says the load generator stalled {claimed:.0f} ms, but the independent "
        f"witness saw no host stall over {OVERTAKE_MARGIN_MS:.0f} ms: the client, not the host, lost "
        f"the order. {evidence}"
    )


# This 2-core VM has stalled for 1-20 s at a time once the engine keeps both cores busy (the
# host throttles it: a heartbeat thread, `top` and a monitor at real-time priority all stopped
# together), while the engine's worker keeps decoding. The sizes above and the replay's rule
# that a stream ending after the drain deadline is unfinished make every signal hold through
# that, on one replay each. The priority order is read on the server's clock (vLLM's span of
# each request, joined as the pipeline does): the client's stamps, read in one pass after a
# stall, carry no order, and a verdict without the spans says "inconclusive" (_order_unread).
@WHOLE_MACHINE
def test_it_shows_every_scenario_signal_on_the_cpu_engine(tmp_path: Path) -> None:
    tok = PromptTokenizer(MODEL)
    verdicts: dict[str, dict[str, Any]] = {}
    with _server(tmp_path, "fcfs", "fcfs") as server:
        server.start()
        server.warm_up(n=4)
        pace = _pace(server, tok)
        for name, params in [*SCENARIOS, (PRIORITY_CHECK, PRIORITY_PARAMS)]:
            verdicts[name] = _judge(server, name, params, "fcfs", tok, pace)

    for name, v in verdicts.items():
        print(
            name,
            json.dumps({"sizing": v["sizing"]["derived"], "counts": v["counts"], "witness": v["witness"]}),
        )
    # Every verdict is looked at before failing, so one slow run shows every problem; one whose
    # order could not be read says why (the host's stall or the client's), with the evidence.
    problems = [
        _order_unread(name, v) or f"{name} did not show its signal (decode pace {pace} ms):\n{_explain(v)}"
        for name, v in verdicts.items()
        if v["signal"].get("inconclusive") or v["status"] != "done" or not v["shown"]
    ]
    assert not problems, "\n".join(problems)
    for v in verdicts.values():
        assert v["sizing"]["measured"], _explain(v)
    kv = verdicts["kv_pressure"]
    assert kv["held"], _explain(kv)
    assert kv["signal"]["evidence"]["preemption_delta"] > 0
    burst = verdicts["long_burst"]["signal"]["evidence"]["burst"]
    assert burst["unfinished"] + burst["rejected"] > 0
    boundary = verdicts["context_boundary"]
    assert boundary["held"], _explain(boundary)
    past = boundary["signal"]["evidence"]["past_limit"][0]
    assert past["error_kind"] is not None and past["http_status"] == 400
    cancel = verdicts["cancellation"]
    assert cancel["held"] and cancel["signal"]["evidence"]["cancelled"] == 6, _explain(cancel)
    # Without priority scheduling the flood does not overtake the waiting backlog.
    fcfs = verdicts[PRIORITY_CHECK]["signal"]["evidence"]
    assert fcfs["overtaking"]["clock"] == "server", _explain(verdicts[PRIORITY_CHECK])
    assert fcfs["overtaking"]["share"] <= 0.1, _explain(verdicts[PRIORITY_CHECK])
    # The same from the server's raw times, apart from the verdict: arrival order kept.
    pairs, flood_first = _served_first(verdicts[PRIORITY_CHECK]["timeline"])
    assert pairs and flood_first <= 0.1 * pairs, (pairs, flood_first, verdicts[PRIORITY_CHECK]["timeline"])


@WHOLE_MACHINE
def test_priority_scheduling_serves_the_high_priority_flood_before_the_backlog(tmp_path: Path) -> None:
    tok = PromptTokenizer(MODEL)
    with _server(tmp_path, "priority", "priority") as server:
        server.start()
        server.warm_up(n=4)
        v = _judge(server, PRIORITY_CHECK, PRIORITY_PARAMS, "priority", tok, _pace(server, tok))
    print(json.dumps({"sizing": v["sizing"]["derived"], "counts": v["counts"], "witness": v["witness"]}))
    assert v["sizing"]["measured"], _explain(v)
    # Read on vLLM's own clock (its span of every served request): a stalled load generator's
    # stamps no longer decide it (the stall rule below is for a run without the spans).
    assert v["signal"]["evidence"]["overtaking"]["clock"] == "server", _explain(v)
    unread = _order_unread("priority_check under priority", v)
    if unread:
        pytest.fail(unread)
    assert v["status"] == "done" and v["shown"], _explain(v)
    ev = v["signal"]["evidence"]
    assert ev["overtaking"]["share"] >= 0.5
    assert (
        ev["high_priority_ttft_p50"]["ms"] < ev["low_priority_ttft_p50"]["ms"]
        or ev["low_priority_ttft_p50"]["censored"]
    )
    assert ev["oldest_lower_priority_wait_ms"] > 0
    # The claim from the server's raw times, apart from the verdict: of the backlog requests still
    # waiting when a flood request reached the server, most got their first token after it.
    pairs, flood_first = _served_first(v["timeline"])
    assert pairs and flood_first >= 0.75 * pairs, (pairs, flood_first, v["timeline"])


@pytest.mark.django_db(transaction=True)
def test_it_probes_b0_freezes_the_rates_and_runs_a_scenario_through_the_pipeline(monkeypatch) -> None:
    from apps.lifecycle.creation import experiment_create

    enqueued = hold_tasks(monkeypatch, HOST_PULL)
    spec = small_spec()
    spec["workload"] = {
        **spec["workload"],
        "mixtures": {"short-only": {"short": 1.0}},
        # In its lane the load generator shares one core with the server and the other lane's
        # work; a step late by more than this would be invalid, which is not what this test is
        # about (the probe's steps, its one server, the frozen rates and plan).
        "max_dispatch_lag_ms": 2000,
    }
    del spec["workload"]["rates"]
    spec["calibration"] = {
        "start_rps": 2.0,
        "max_steps": 2,
        "warmup_s": 1,
        "observation_s": 4,
        "drain_deadline_s": 10,
    }
    spec["scenarios"] = {"context_boundary": {"cells": [], "gap_s": 1.0, "drain_deadline_s": 10}}
    experiment = experiment_create(spec=spec, owner=UserFactory(roles=["experimenter"]))
    host = host_register_local()
    Experiment.objects.filter(pk=experiment.pk).update(status=Experiment.Status.RUNNING)

    with inline_executor() as execute:
        n = experiment_freeze_and_enqueue(experiment_id=experiment.pk, execute=execute)

    experiment.refresh_from_db()
    assert n == 5, experiment.status_reason  # 2 cells x 2 frozen rates + the scenario run
    workload = experiment.workload.__class__.objects.get(pk=experiment.workload.pk)
    probes = list(
        Run.objects.filter(experiment=experiment, kind__in=sorted(Run.PROBES)).order_by("plan_position")
    )
    assert [p.status for p in probes] == ["done", "done"], [(p.status, p.reason) for p in probes]
    assert all(RequestRecord.objects.filter(run=p).count() == p.requests_planned for p in probes)
    # One server for both steps: the first started it (and warmed it up), the second replayed on it
    # after an idle check, and the stop is on the second's account.
    first, second = (p.summary for p in probes)
    assert first["server"] == {"reused": False, "started_by": str(probes[0].run_id)}, first["server"]
    assert second["server"] == {"reused": True, "started_by": str(probes[0].run_id)}, second["server"]
    assert "start_s" in first["engine_time"] and "start_s" not in second["engine_time"]
    assert first["idle_check"]["idle"] and second["idle_check"]["idle"]
    assert probes[0].server_pid == probes[1].server_pid
    assert second["engine_time"].get("stop_s", 0) > 0 and not first["engine_time"].get("stop_s")
    d = workload.rates_derivation
    capacity = d["capacities"]["short-only"]
    assert capacity in (2.0, 4.0), d
    assert workload.rates_source == "probe"
    assert workload.rates == {"low": round(0.3 * capacity, 4), "near_capacity": round(0.9 * capacity, 4)}
    assert [s["run"] for s in d["probes"][0]["steps"]] == [str(p.run_id) for p in probes]
    # The following sweep: every cell replays the same frozen trace at exactly the frozen rates.
    sweep = list(experiment.runs.filter(kind=Run.Kind.SWEEP).select_related("cell"))
    assert len(sweep) == 4
    for rate_name, rps in workload.rates.items():
        runs = [r for r in sweep if r.rate_name == rate_name]
        assert {r.cell.cell_id for r in runs} == {"B0", "C1"}
        assert {r.rate_rps for r in runs} == {rps}
        assert len({r.trace_sha256 for r in runs}) == 1
        assert trace_load(sha256=runs[0].trace_sha256).meta["rate_rps"] == rps
    # All five are runnable by this host, which is woken once to pull them. (Any other host with a
    # fresh heartbeat, such as a worker an earlier test stopped moments ago, is woken too: it may
    # take runs of the pinned hardware as well.)
    assert (
        experiment.runs.exclude(kind__in=sorted(Run.PROBES)).filter(dispatched_at__isnull=False).count() == 5
    )
    assert [q for _, _, q in enqueued].count(host_queue(host.name)) == 1, enqueued

    boundary = Run.objects.get(experiment=experiment, scenario="context_boundary")
    assert boundary.cell.cell_id == "B0"
    assert run_execute(run_pk=boundary.pk) == "done", Run.objects.get(pk=boundary.pk).reason
    # While it ran, the worker published the real server's gauges for the live page.
    live = Run.objects.get(pk=boundary.pk).live
    assert (
        live.get("at") and live["gauges"]["running"] is not None and live["gauges"]["kv_usage"] is not None
    ), live
    errored = RequestRecord.objects.get(run=boundary, index=1)
    assert errored.error_kind is not None and errored.http_status == 400
    report = scenario_reports(experiment_id=experiment.pk)
    verdict = next(r["verdict"] for r in report["runs"] if r["scenario"] == "context_boundary")
    assert verdict["shown"] and verdict["held"], _explain(verdict)
    assert report["rates"]["source"] == "probe" and report["rates"]["derivation"]["rates"] == workload.rates
