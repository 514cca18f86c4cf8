"""Scenario checks on hand-built records: each signal shown, and not shown (no engine)."""

from __future__ import annotations

from typing import Any

from apps.analysis.scenario_checks import decode_step_ms, priority_order, scenario_verdict, scenarios_summary

MS = 1_000_000


def rec(
    index: int, t_ms: float, *, first_ms: float | None = None, end_ms: float | None = None, **kw: Any
) -> dict[str, Any]:
    base = {
        "index": index,
        "planned_ns": int(t_ms * MS),
        "sent": True,
        "first_token_ns": None if first_ms is None else int(first_ms * MS),
        "last_token_ns": None if end_ms is None else int(end_ms * MS),
        "end_ns": None if end_ms is None else int(end_ms * MS),
        "http_status": 200,
        "error_kind": None,
        "cancelled": False,
        "unfinished": False,
        "output_tokens": 8,
        "expected_output_tokens": 8,
        "max_gap_ns": 10 * MS,
    }
    base.update(kw)
    return base


def meta(kind: str, roles: dict[str, list[int]], **extra: Any) -> dict[str, Any]:
    n = sum(len(v) for v in roles.values())
    return {"scenario": kind, "scenario_kind": kind, "roles": roles, "requests": n, "warmup_s": 0.0,
            "observation_s": 10.0, "drain_deadline_s": 5.0, **extra}  # fmt: skip


def claim(verdict: dict[str, Any], text: str) -> bool:
    return next(c["held"] for c in verdict["must_hold"] if text in c["claim"])


def test_it_shows_kv_pressure_only_when_the_preemption_counter_rose() -> None:
    m = meta("kv_pressure", {"pressure": [0, 1]})
    records = [rec(0, 0, first_ms=10, end_ms=900), rec(1, 1, first_ms=12, end_ms=950)]
    shown = scenario_verdict(meta=m, records=records, server={"counters": {"preemptions": 3.0}})
    assert shown["shown"] and shown["held"]
    assert shown["signal"]["evidence"]["preemption_delta"] == 3.0
    flat = scenario_verdict(meta=m, records=records, server={"counters": {"preemptions": 0.0}})
    assert not flat["shown"] and flat["held"]
    unknown = scenario_verdict(meta=m, records=records, server={})
    assert not unknown["shown"]


def test_it_shows_a_long_burst_by_its_refused_or_unfinished_long_requests() -> None:
    m = meta("long_burst", {"steady": [0, 1], "burst": [2, 3, 4]})
    steady = [rec(0, 0, first_ms=5, end_ms=50), rec(1, 500, first_ms=600, end_ms=700)]
    finished = [rec(i, 300, first_ms=400, end_ms=800) for i in (2, 3, 4)]
    assert not scenario_verdict(meta=m, records=steady + finished)["shown"]
    hurt = [
        rec(2, 300, first_ms=400, end_ms=800),
        rec(3, 300, unfinished=True, http_status=200),
        rec(4, 300, http_status=503, error_kind="http"),
    ]
    v = scenario_verdict(meta=m, records=steady + hurt)
    assert v["shown"] and v["held"]
    assert v["signal"]["evidence"]["burst"] == {
        **dict.fromkeys(v["counts"], 0),
        "completed": 1,
        "unfinished": 1,
        "rejected": 1,
    }


def test_it_fails_accounting_when_a_request_has_no_record() -> None:
    m = meta("long_burst", {"steady": [0, 1], "burst": [2]})
    v = scenario_verdict(meta=m, records=[rec(0, 0, first_ms=5, end_ms=9), rec(2, 1, unfinished=True)])
    assert not v["held"] and not claim(v, "accounted for")


def test_it_captures_the_context_boundary_error_as_a_record() -> None:
    m = meta("context_boundary", {"at_limit": [0], "past_limit": [1]})
    good = [
        rec(0, 0, first_ms=100, end_ms=200),
        rec(1, 2000, http_status=400, error_kind="context", error="maximum context length is 2048"),
    ]
    v = scenario_verdict(meta=m, records=good)
    assert v["shown"] and v["held"]
    assert v["signal"]["evidence"]["past_limit"][0]["error_kind"] == "context"
    served = [rec(0, 0, first_ms=100, end_ms=200), rec(1, 2000, first_ms=2100, end_ms=2200)]
    v = scenario_verdict(meta=m, records=served)
    assert not v["shown"] and not claim(v, "past the context window")
    crashed = scenario_verdict(meta=m, records=good, status="failed")
    assert not crashed["held"] and not claim(crashed, "without crashing")


def test_it_counts_client_cancellations_apart_from_errors() -> None:
    m = meta("cancellation", {"cancel": [0, 2], "complete": [1, 3]})
    records = [
        rec(0, 0, first_ms=5, cancelled=True, output_tokens=4),
        rec(1, 500, first_ms=505, end_ms=600),
        rec(2, 1000, first_ms=1005, cancelled=True, output_tokens=4),
        rec(3, 1500, first_ms=1505, end_ms=1600),
    ]
    v = scenario_verdict(meta=m, records=records)
    assert v["shown"] and v["held"] and v["signal"]["evidence"]["cancelled"] == 2
    records[2] = rec(2, 1000, error_kind="protocol", http_status=200)
    v = scenario_verdict(meta=m, records=records)
    assert not v["shown"] and not claim(v, "recorded as cancellations")


def test_it_shows_decode_pressure_by_streams_in_flight_together() -> None:
    m = meta("decode_pressure", {"long_output": [0, 1, 2, 3]})
    together = [rec(i, i, first_ms=10 + i, end_ms=5000, output_tokens=8) for i in range(4)]
    v = scenario_verdict(meta=m, records=together)
    assert v["shown"] and v["signal"]["evidence"]["peak_streams_in_flight"] == 4
    one_by_one = [rec(i, i * 1000, first_ms=i * 1000 + 1, end_ms=i * 1000 + 500) for i in range(4)]
    assert not scenario_verdict(meta=m, records=one_by_one)["shown"]
    short = [*together[:3], rec(3, 3, first_ms=13, end_ms=5000, output_tokens=5)]
    assert not scenario_verdict(meta=m, records=short)["held"]


def _flood(overtake: bool) -> list[dict[str, Any]]:
    # Backlog 0-3 arrives at 0; flood 4-6 arrives at 1 s. With priority the
    # flood is served within 100 ms while the last backlog waits until 5 s.
    backlog = [rec(i, 0, first_ms=100 + i * 1500, end_ms=2000 + i * 1500) for i in range(4)]
    if overtake:
        flood = [rec(4 + j, 1000 + j * 250, first_ms=1080 + j * 250, end_ms=1300 + j * 250) for j in range(3)]
    else:
        flood = [rec(4 + j, 1000 + j * 250, first_ms=5200 + j * 100, end_ms=5600 + j * 100) for j in range(3)]
    return backlog + flood


def test_it_reports_lower_high_priority_ttft_and_overtaking_under_priority() -> None:
    m = meta("priority_flood", {"backlog": [0, 1, 2, 3], "flood": [4, 5, 6]})
    v = scenario_verdict(meta=m, records=_flood(True), scheduling_policy="priority")
    ev = v["signal"]["evidence"]
    assert v["shown"] and ev["overtaking"]["share"] == 1.0
    assert ev["high_priority_ttft_p50"]["ms"] < ev["low_priority_ttft_p50"]["ms"]
    assert ev["oldest_lower_priority_wait_ms"] == 4600.0
    dropped = scenario_verdict(meta=m, records=_flood(False), scheduling_policy="priority")
    assert not dropped["shown"] and "dropped" in dropped["signal"]["diagnosis"]


def test_it_expects_arrival_order_under_fcfs() -> None:
    m = meta("priority_flood", {"backlog": [0, 1, 2, 3], "flood": [4, 5, 6]})
    assert scenario_verdict(meta=m, records=_flood(False), scheduling_policy="fcfs")["shown"]
    assert not scenario_verdict(meta=m, records=_flood(True), scheduling_policy="fcfs")["shown"]


def test_it_counts_a_backlog_request_still_waiting_as_overtaken_and_in_the_oldest_wait() -> None:
    backlog = [rec(0, 0, unfinished=True)]
    flood = [rec(1, 1000, first_ms=1100, end_ms=1200)]
    assert priority_order(backlog, flood)["overtook"] == 1
    m = meta("priority_flood", {"backlog": [0], "flood": [1]})
    v = scenario_verdict(meta=m, records=backlog + flood, scheduling_policy="priority")
    # Still waiting at the drain deadline (10 s observation + 5 s drain).
    assert v["signal"]["evidence"]["oldest_lower_priority_wait_ms"] == 15000.0
    assert v["signal"]["evidence"]["low_priority_ttft_p50"]["censored"] is True


def test_it_summarises_verdicts() -> None:
    assert scenarios_summary([])["status"] == "none"
    good = {"held": True, "shown": True}
    assert scenarios_summary([good, good])["status"] == "pass"
    assert scenarios_summary([good, {"held": True, "shown": False}])["status"] == "listed"


def test_it_calls_the_priority_probe_inconclusive_when_the_backlog_drained_before_the_flood() -> None:
    # Every backlog request had its first token before the first flood arrival: no order to change.
    backlog = [rec(i, 0, first_ms=50 + i, end_ms=200) for i in range(3)]
    flood = [rec(3 + j, 1000 + j * 100, first_ms=1050 + j * 100, end_ms=1100 + j * 100) for j in range(2)]
    m = meta("priority_flood", {"backlog": [0, 1, 2], "flood": [3, 4]})
    v = scenario_verdict(meta=m, records=backlog + flood, scheduling_policy="priority")
    assert v["signal"]["evidence"]["overtaking"] == {
        "flood_served": 2,
        "contested": 0,
        "overtook": 0,
        "share": None,
        "clock": "client",
    }
    assert not v["shown"] and v["signal"]["diagnosis"].startswith("inconclusive")


def test_it_judges_a_late_flood_request_from_when_it_was_sent() -> None:
    # Planned while the backlog waited, but the load generator sent it after the backlog started.
    backlog = [rec(0, 0, first_ms=900, end_ms=1500)]
    late = [rec(1, 100, first_ms=1000, end_ms=1100, sent_ns=950 * MS)]
    assert priority_order(backlog, late)["contested"] == 0
    on_time = [rec(1, 100, first_ms=200, end_ms=300, sent_ns=100 * MS)]
    assert priority_order(backlog, on_time) == {
        "flood_served": 1,
        "contested": 1,
        "overtook": 1,
        "share": 1.0,
    }


def test_it_measures_the_decode_pace_from_completed_streams_only() -> None:
    streams = [
        rec(0, 0, first_ms=100, end_ms=100 + 9 * 4, output_tokens=10),  # 4 ms a token
        rec(1, 0, first_ms=100, end_ms=100 + 9 * 6, output_tokens=10),  # 6 ms
        rec(2, 0, first_ms=100, end_ms=100 + 9 * 5, output_tokens=10),  # 5 ms
        rec(3, 0, first_ms=100, end_ms=100 + 9 * 99, output_tokens=10, unfinished=True),
        rec(4, 0, first_ms=100, end_ms=101, output_tokens=2),  # too short to tell
        rec(5, 0, first_ms=100, end_ms=100.5, output_tokens=10, chunks=2),  # delivered in two lumps
        rec(6, 0, first_ms=100, end_ms=100, output_tokens=10),  # all at once
    ]
    assert decode_step_ms(streams) == 5.0
    assert decode_step_ms(streams[3:]) is None


def test_it_says_when_an_unshown_burst_was_not_sized_for_the_engine() -> None:
    sizing = {
        "derived": {"burst_size": {"value": 8, "rule": "fixed fallback: B0's decode pace was not measured"}}
    }
    m = meta("long_burst", {"steady": [0], "burst": [1]}, sizing=sizing)
    records = [rec(0, 0, first_ms=5, end_ms=50), rec(1, 300, first_ms=400, end_ms=800)]
    v = scenario_verdict(meta=m, records=records)
    assert not v["shown"] and "not sized from B0's measured decode pace" in v["signal"]["diagnosis"]
    sized = scenario_verdict(meta=meta("long_burst", {"steady": [0], "burst": [1]}), records=records)
    assert "cleared the burst" in sized["signal"]["diagnosis"]


def test_it_calls_the_priority_order_inconclusive_when_the_load_generator_stalled() -> None:
    m = meta("priority_flood", {"backlog": [0, 1], "flood": [2]})
    # Everything stamped at once after a 3 s stall: no order can be read.
    records = [rec(0, 0, first_ms=3000, end_ms=3100), rec(1, 1, first_ms=3000, end_ms=3100, priority=10),
               rec(2, 100, first_ms=3000, end_ms=3050)]  # fmt: skip
    records[1]["first_token_ns"] = 3000 * MS  # backlog 1 waited until the stall ended
    stalled = scenario_verdict(
        meta=m, records=records, scheduling_policy="priority", replay={"loop_stall_max_ms": 2900.0}
    )
    assert not stalled["shown"] and stalled["signal"]["inconclusive"]
    assert "load generator stalled for 2900 ms" in stalled["signal"]["diagnosis"]
    assert stalled["signal"]["evidence"]["load_generator_stall_max_ms"] == 2900.0
    calm = scenario_verdict(
        meta=m, records=records, scheduling_policy="priority", replay={"loop_stall_max_ms": 5.0}
    )
    assert not calm["shown"] and not calm["signal"].get("inconclusive")


def test_it_reads_the_order_on_the_servers_clock_when_every_served_request_has_its_span() -> None:
    m = meta("priority_flood", {"backlog": [0, 1, 2], "flood": [3]})
    # The client read every first token in one pass after a 3 s stall; the server's own times show
    # backlog 1 and 2 still waiting when the flood request arrived, and served only after it.
    records = [
        rec(0, 0, first_ms=3000, end_ms=3100, server_arrival_ns=1 * MS, server_first_token_ns=20 * MS),
        rec(1, 1, first_ms=3000, end_ms=3100, server_arrival_ns=2 * MS, server_first_token_ns=2400 * MS),
        rec(2, 2, first_ms=3000, end_ms=3100, server_arrival_ns=3 * MS, server_first_token_ns=2500 * MS),
        rec(3, 100, first_ms=3000, end_ms=3050, server_arrival_ns=101 * MS, server_first_token_ns=180 * MS),
    ]
    v = scenario_verdict(
        meta=m, records=records, scheduling_policy="priority", replay={"loop_stall_max_ms": 2900.0}
    )
    order = v["signal"]["evidence"]["overtaking"]
    assert order == {"flood_served": 1, "contested": 1, "overtook": 1, "share": 1.0, "clock": "server"}
    assert v["shown"] and not v["signal"].get("inconclusive")
    # Under FCFS the same server times would be an overtaking: not the arrival order.
    assert not scenario_verdict(meta=m, records=records, scheduling_policy="fcfs")["shown"]
    # One served request without its span: the client's clock, and the stall rule, again.
    records[0] = {**records[0], "server_first_token_ns": None}
    again = scenario_verdict(
        meta=m, records=records, scheduling_policy="priority", replay={"loop_stall_max_ms": 2900.0}
    )
    assert again["signal"]["evidence"]["overtaking"]["clock"] == "client"
    assert again["signal"]["inconclusive"]
