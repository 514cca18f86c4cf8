"""The rehearsal's measures and check 4's rule, on records built by hand (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from apps.analysis.checks import recovery_check
from apps.analysis.rehearsal_measures import (
    attempt_outcome,
    attempts_summary,
    outcome,
    recovery_time,
    rehearsal_measures,
)

CLASSES = [
    {"name": "short", "ttft_p99_ms": 500.0, "e2e_p99_ms": 2000.0, "max_stall_ms": 500.0, "error_rate": 0.1},
    {"name": "long", "ttft_p99_ms": 2000.0, "e2e_p99_ms": 8000.0, "max_stall_ms": 1000.0, "error_rate": 0.1},
]


def rec(
    i: int, t_s: float, cls: str = "short", *, ttft_ms: float | None = 100.0, **kw: Any
) -> dict[str, Any]:
    planned = round(t_s * 1e9)
    first = None if ttft_ms is None else planned + round(ttft_ms * 1e6)
    r = {
        "index": i,
        "request_class": cls,
        "planned_ns": planned,
        "sent": True,
        "http_status": 200,
        "error_kind": None,
        "cancelled": False,
        "unfinished": False,
        "cut": False,
        "first_token_ns": first,
        "end_ns": (first or planned) + 50_000_000,
        "max_gap_ns": 10_000_000,
        "backend": "b0" if t_s >= 10 else "candidate",
    }
    r.update(kw)
    return r


def test_every_record_has_exactly_one_outcome():
    assert outcome(rec(0, 1)) == "ok"
    assert outcome(rec(0, 1, cut=True, unfinished=True)) == "cut"
    assert outcome(rec(0, 1, http_status=503)) == "rejected"
    assert outcome(rec(0, 1, http_status=None, error_kind="connect")) == "errored"
    assert outcome(rec(0, 1, unfinished=True)) == "unfinished"
    assert outcome(rec(0, 1, sent=False, http_status=None)) == "not_sent"


def test_time_to_recover_is_the_start_of_the_first_window_after_which_all_hold():
    # Arrivals every 0.5 s after a switch at 10 s; TTFT 5 s (held by a cold start) until 20 s, then fast.
    points = [(10 + k * 0.5, 5000.0 if 10 + k * 0.5 < 20 else 100.0) for k in range(60)]
    recovered, windows = recovery_time(
        {"short": points}, {"short": 500.0}, switch_s=10.0, end_s=40.0, window_s=5.0
    )
    assert recovered == 10.0  # the first window that holds starts at 20 s: 10 s after the switch
    assert windows[-1]["holds"] and not windows[0]["holds"]


def test_a_last_window_that_breaks_the_contract_did_not_recover():
    points = [(10 + k, 5000.0) for k in range(20)]
    recovered, _ = recovery_time({"short": points}, {"short": 500.0}, switch_s=10.0, end_s=30.0, window_s=5.0)
    assert recovered is None


def test_a_request_without_a_first_token_counts_as_over_the_limit():
    points = [(10 + k * 0.1, 100.0) for k in range(99)] + [(19.95, float("inf"))]
    recovered, _ = recovery_time({"short": points}, {"short": 500.0}, switch_s=10.0, end_s=20.0, window_s=5.0)
    assert recovered is None


def _measures(records: list[dict[str, Any]], planned: int | None = None, **kw: Any) -> dict[str, Any]:
    args = {
        "records": records,
        "planned": len(records) if planned is None else planned,
        "b0_samples": [],
        "classes": CLASSES,
        "switch_s": 10.0,
        "cut_s": 12.0,
        "end_s": 30.0,
        "window_s": 5.0,
        "max_recovery_s": 10.0,
    }
    args.update(kw)
    return rehearsal_measures(**args)


def test_a_clean_rollback_passes_check_4_and_accounts_for_everything():
    records = [rec(i, i * 0.5) for i in range(60)]
    records[5].update(cut=True, unfinished=True)  # open on the candidate at the deadline
    m = _measures(records)
    assert m["passed"], m["problems"]
    assert m["time_to_recover_s"] == 0.0
    assert m["accounting"]["total"]["cut"] == 1 and m["accounting"]["unaccounted"] == 0
    assert m["classes"]["short"]["served_by"] == {"b0": 40}
    check = recovery_check(
        None, chosen_cell="C1", baseline="B0", rehearsal={"run": "r", "status": "done", "measures": m}
    )
    assert check["status"] == "pass"


def test_a_missing_record_fails_check_4():
    m = _measures([rec(i, i * 0.5) for i in range(60)], planned=61)
    assert not m["passed"] and "1 planned requests have no record" in m["problems"]


def test_errors_after_the_recovery_window_beyond_the_budget_fail_check_4():
    records = [rec(i, i * 0.5) for i in range(60)]
    for r in records[45:]:  # arrivals from 22.5 s: after switch + max_recovery_s
        r.update(http_status=503, first_token_ns=None)
    m = _measures(records)
    assert not m["passed"]
    assert any("error budget" in p for p in m["problems"]), m["problems"]


def test_a_slow_recovery_fails_with_its_number():
    records = [rec(i, i * 0.5, ttft_ms=3000.0 if 10 <= i * 0.5 < 25 else 100.0) for i in range(60)]
    m = _measures(records)
    assert m["time_to_recover_s"] == 15.0
    assert "more than max_recovery_s" in m["problems"][0]


def test_b0_surge_from_its_metrics_after_the_switch():
    samples = [
        {"t_ns": 5_000_000_000, "name": "vllm:num_requests_waiting", "kind": "gauge", "value": 9.0},
        {"t_ns": 11_000_000_000, "name": "vllm:num_requests_waiting", "kind": "gauge", "value": 4.0},
        {"t_ns": 11_000_000_000, "name": "vllm:kv_cache_usage_perc", "kind": "gauge", "value": 0.5},
        {"t_ns": 9_000_000_000, "name": "vllm:num_preemptions_total", "kind": "counter", "value": 2.0},
        {"t_ns": 20_000_000_000, "name": "vllm:num_preemptions_total", "kind": "counter", "value": 5.0},
    ]
    m = _measures([rec(i, i * 0.5) for i in range(60)], b0_samples=samples)
    assert m["surge"] == {
        "peak_waiting": 4.0,
        "peak_kv_usage": 0.5,
        "preemptions": 3.0,
        "b0_requests_succeeded": None,
    }


def test_check_4_statuses_before_and_without_a_rehearsal():
    assert recovery_check(None, chosen_cell="B0", baseline="B0")["status"] == "not needed"
    assert recovery_check(None, chosen_cell="C1", baseline="B0")["status"] == "pending"
    assert recovery_check(None, chosen_cell="C1", baseline="B0", rehearse=False)["status"] == "not rehearsed"
    running = {"run": "r", "status": "measuring", "measures": None}
    assert recovery_check(None, chosen_cell="C1", baseline="B0", rehearsal=running)["status"] == "pending"
    failed = {
        "run": "r",
        "status": "failed",
        "reason": "the switch command exited with status 1: no",
        "measures": None,
    }
    check = recovery_check(None, chosen_cell="C1", baseline="B0", rehearsal=failed)
    assert check["status"] == "fail" and "switch command" in check["reason"]


def test_a_request_the_run_ended_on_before_its_limit_shows_nothing_either_way():
    # The run ends at 31 s. A short request arriving at 30.8 s got no first token: it waited
    # 200 ms < its 500 ms limit, so it is left out of the windows; one that waited 600 ms breaks.
    records = [rec(i, i * 0.5) for i in range(60)]
    records.append(rec(60, 30.8, ttft_ms=None, unfinished=True, end_ns=None))
    m = _measures(records, end_s=31.0, deadline_s=31.0)
    assert m["time_to_recover_s"] == 0.0, m["windows"][-3:]
    records[-1] = rec(60, 30.4, ttft_ms=None, unfinished=True, end_ns=None)
    m = _measures(records, end_s=31.0, deadline_s=31.0)
    assert m["time_to_recover_s"] is None


def test_a_trace_shorter_than_the_recovery_limit_judges_the_budget_from_the_recovery_on():
    # The trace ends 20 s after the switch but max_recovery_s is 60: the error budget is judged
    # on the arrivals after the measured recovery, not waved through on no arrivals.
    records = [rec(i, i * 0.5, ttft_ms=3000.0 if 10 <= i * 0.5 < 14 else 100.0) for i in range(60)]
    for r in records[40:]:
        r.update(http_status=503, first_token_ns=None)
    m = _measures(records, max_recovery_s=60.0)
    assert (
        m["error_budget_from_s"] == 10.0 + m["time_to_recover_s"]
        if m["time_to_recover_s"] is not None
        else 10.0
    )
    assert any("error budget" in p for p in m["problems"]), m["problems"]


def _attempt(n: int, outcome: str, why: str = "", **kw: Any) -> dict[str, Any]:
    status = {"passed": "done", "failed": "done", "invalid": "invalid", "pending": "measuring"}[outcome]
    return {"attempt": n, "run": f"r{n}", "status": status, "outcome": outcome, "why": why, **kw}


def _entry(*attempts: dict[str, Any]) -> dict[str, Any]:
    """A cell's rehearsals as the report holds them: the latest attempt on top, every one listed."""
    latest = attempts[-1]
    measures = _measures([rec(i, i * 0.5) for i in range(60)]) if latest["outcome"] == "passed" else None
    return {
        "run": latest["run"],
        "status": latest["status"],
        "measures": measures,
        "attempts": list(attempts),
    }


def test_check_4_is_not_the_latest_attempt_alone():
    # Rehearsed until it passed: the earlier failure still fails check 4, and the reason says so.
    entry = _entry(_attempt(1, "failed", "B0 did not recover"), _attempt(2, "passed"))
    check = recovery_check(None, chosen_cell="C1", baseline="B0", rehearsal=entry)
    assert check["status"] == "fail", check
    assert check["reason"].startswith("2 attempts, 1 failed")
    assert "attempt 1 failed: B0 did not recover" in check["reason"]
    assert check["attempts"] == {
        "summary": "2 attempts, 1 failed",
        "passed": 1,
        "failed": 1,
        "invalid": 0,
        "pending": 0,
    }
    assert check["run"] == "r2" and check["measures"]["time_to_recover_s"] == 0.0


@pytest.mark.parametrize(
    ("attempts", "status"),
    [
        ([_attempt(1, "passed"), _attempt(2, "passed")], "pass"),
        # A run the service failed under a lost host and queued again measured nothing either way.
        ([_attempt(1, "invalid", "host lost", requeued_by_service=True), _attempt(2, "passed")], "pass"),
        # An invalid run nobody re-queued by itself counts against check 4, like a failure.
        ([_attempt(1, "invalid", "the load generator fell behind"), _attempt(2, "passed")], "fail"),
        ([_attempt(1, "passed"), _attempt(2, "failed", "class short broke its error budget")], "fail"),
        ([_attempt(1, "passed"), _attempt(2, "invalid", "the load generator fell behind")], "fail"),
        ([_attempt(1, "failed", "no"), _attempt(2, "pending")], "pending"),
    ],
    ids=["all-passed", "requeued-then-passed", "invalid-then-passed", "passed-then-failed",
         "passed-then-invalid", "failed-then-running"],
)  # fmt: skip
def test_check_4_when_attempts_disagree(attempts, status):
    check = recovery_check(None, chosen_cell="C1", baseline="B0", rehearsal=_entry(*attempts))
    assert check["status"] == status, check["reason"]
    assert check["reason"].count("attempt") >= 1 and f"{len(attempts)} attempts" in check["reason"]


def test_an_attempt_s_outcome_and_the_summary_an_approver_reads_first():
    assert attempt_outcome(status="done", measures={"passed": True, "problems": []}) == ("passed", "")
    assert attempt_outcome(status="done", measures={"passed": False, "problems": ["a", "b"]}) == (
        "failed",
        "a; b",
    )
    assert attempt_outcome(status="failed", measures=None, reason="exit 1")[0] == "failed"
    assert attempt_outcome(status="failed", measures=None, reason="host lost", requeued=True)[0] == "invalid"
    assert attempt_outcome(status="invalid", measures=None, reason="lag") == (
        "invalid",
        "the rehearsal ended invalid: lag",
    )
    assert attempt_outcome(status="cancelled", measures=None, reason="stop")[0] == "failed"
    assert attempt_outcome(status="queued", measures=None)[0] == "pending"
    three = [_attempt(1, "failed"), _attempt(2, "failed"), _attempt(3, "passed")]
    assert attempts_summary(three) == "3 attempts, 2 failed"
    assert attempts_summary(three[2:]) == "1 attempt, none failed"
    assert (
        attempts_summary([_attempt(1, "invalid"), _attempt(2, "pending")])
        == "2 attempts, 1 invalid, 1 pending"
    )
