"""What a recovery rehearsal measured, and check 4's rule. Pure: no Django.

Input: the rehearsal run's records (dicts with the record's scalar fields),
B0's /metrics samples (``t_ns`` from the replay's origin), each class's
contract, and the rehearsal's times. Every latency here is measured from the
request's **planned arrival**, so the time a request was held while a cold B0
started is part of it, as a user would feel it.

- **Accounting**: every planned request is exactly one of ok, cut (open on the
  candidate at the drain deadline after the switch), rejected (an HTTP error
  answer), errored (no answer: connect, timeout, protocol), cancelled,
  unfinished (still open at the run's deadline) or not sent; ``unaccounted`` is
  the planned count minus the records there are (0, or the run lost data).
- **After the switch**: per class, the arrivals at or after the switch: who
  served them, and TTFT / E2E / max-stall p99 (nearest rank; a request that got
  no first token, or did not finish, counts as above any limit) against the
  class's contract.
- **Surge**: B0's peak ``num_requests_waiting`` and ``kv_cache_usage_perc``
  after the switch, and its preemptions after it.
- **Time to recover**: rolling windows of ``window_s`` seconds of arrival time,
  ending every second from the switch to the end of the trace (each window
  starts no earlier than the switch). A window holds when every class's p99
  TTFT in it is within the class's contract (an empty window holds). A request
  that got no first token counts as over the limit, unless the run ended
  (``deadline_s``) before it had waited as long as the limit: then it shows
  nothing either way and is left out of the windows. The time
  to recover is from the switch to the start of the first window from which
  every later window holds; None ("did not recover") when the last one does not.
- **Check 4** passes when the time to recover is at most ``max_recovery_s``, no
  class's error share among the arrivals from ``switch + max_recovery_s`` on is
  above its error budget (when the trace ends before then: among the arrivals
  from the measured recovery on, or from the switch if it did not recover;
  ``error_budget_from_s`` says which), and nothing is unaccounted.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypedDict

from apps.analysis.report_inputs import ClassInput, SampleValue

OUTCOMES = ("ok", "cut", "rejected", "errored", "cancelled", "unfinished", "not_sent")
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
PREEMPTIONS = "vllm:num_preemptions_total"
REQUEST_SUCCESS = "vllm:request_success_total"


class _RecordKeys(TypedDict):
    request_class: str
    planned_ns: int


class RehearsalRecord(_RecordKeys, total=False):
    """One request record of the rehearsal run, as the measures read it: the record's scalar
    fields (workers/replay/records.py; apps/analysis/services reads the stored ones)."""

    index: int
    sent: bool
    cut: bool
    http_status: int | None
    error_kind: str | None
    cancelled: bool
    unfinished: bool
    first_token_ns: int | None
    end_ns: int | None
    max_gap_ns: int | None
    backend: str | None


def outcome(r: RehearsalRecord) -> str:
    """The one accounting bucket of a record (see the module docstring)."""
    if not r.get("sent", True):
        return "not_sent"
    if r.get("cut"):
        return "cut"
    if r.get("http_status") is not None and r["http_status"] != 200:
        return "rejected"
    if r.get("error_kind") is not None:
        return "errored"
    if r.get("cancelled"):
        return "cancelled"
    if r.get("unfinished"):
        return "unfinished"
    if r.get("http_status") == 200:
        return "ok"
    return "errored"


def _p99(values: Sequence[float]) -> float:
    """Nearest-rank p99 (inf when it lands on a request without the measure)."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(0.99 * len(ordered))) - 1]


def _ms(x: float) -> float | None:
    return None if math.isinf(x) else round(x, 3)


def _latencies(r: RehearsalRecord) -> tuple[float, float, float]:
    """(TTFT, E2E, max stall) in ms from the planned arrival; inf where the request has none."""
    planned = r["planned_ns"]
    first = r.get("first_token_ns")
    ttft = (first - planned) / 1e6 if first is not None else math.inf
    ok = outcome(r) == "ok"
    end = r.get("end_ns")
    e2e = (end - planned) / 1e6 if ok and end is not None else math.inf
    gap = r.get("max_gap_ns")
    stall = 0.0 if ok and gap is None else (gap / 1e6 if gap is not None and ok else math.inf)
    return ttft, e2e, stall


def _undetermined(r: RehearsalRecord, ttft: float, limit: float | None, deadline_s: float | None) -> bool:
    """A request with no first token whose wait was cut short by the run's own end.

    All we know is TTFT > (end - arrival). When that bound is below the class's limit the
    request shows neither a breach nor a kept contract, so the rolling windows leave it out
    (the same one-sided rule the paired comparison uses for censored values); when the
    bound reaches the limit it is a breach."""
    if not math.isinf(ttft) or limit is None or deadline_s is None:
        return False
    ended = r.get("end_ns")
    waited_ms = ((ended if ended is not None else deadline_s * 1e9) - r["planned_ns"]) / 1e6
    return waited_ms < float(limit) and r.get("error_kind") is None and r.get("http_status") in (None, 200)


def _series(samples: Iterable[SampleValue], name: str) -> list[tuple[float, float]]:
    by_t: dict[int, float] = defaultdict(float)
    for s in samples:
        value = s.get("value")
        if s["name"] == name and value is not None and s["kind"] == "gauge":
            by_t[s["t_ns"]] += float(value)
    return [(t / 1e9, v) for t, v in sorted(by_t.items())]


def _counter_delta(samples: Iterable[SampleValue], name: str, since_s: float) -> float | None:
    by_t: dict[int, float] = defaultdict(float)
    for s in samples:
        value = s.get("value")
        if s["name"] in (name, name.removesuffix("_total")) and s["kind"] == "counter" and value is not None:
            by_t[s["t_ns"]] += float(value)
    points = sorted(by_t.items())
    before = [v for t, v in points if t / 1e9 <= since_s]
    after = [v for t, v in points if t / 1e9 > since_s]
    if not after:
        return None
    start = before[-1] if before else 0.0  # a cold B0 starts counting at zero
    return max(0.0, after[-1] - start)


def recovery_time(
    arrivals: Mapping[str, Sequence[tuple[float, float]]],
    limits: Mapping[str, float],
    *,
    switch_s: float,
    end_s: float,
    window_s: float,
    step_s: float = 1.0,
) -> tuple[float | None, list[dict[str, Any]]]:
    """(seconds from the switch to recovery or None, the windows judged).

    ``arrivals``: class -> [(arrival s, TTFT ms or inf)] of post-switch arrivals.
    """
    ends = []
    k = 1
    while switch_s + k * step_s < end_s + step_s:
        ends.append(min(switch_s + k * step_s, end_s))
        k += 1
    windows: list[dict[str, Any]] = []
    for end in ends:
        start = max(switch_s, end - window_s)
        worst: dict[str, float | None] = {}
        holds = True
        for cls, points in arrivals.items():
            inside = [ttft for t, ttft in points if start <= t < end or (end == end_s and t == end)]
            if not inside:
                continue
            p99 = _p99(inside)
            worst[cls] = _ms(p99)
            if cls in limits and p99 > limits[cls]:
                holds = False
        windows.append(
            {"start_s": round(start, 3), "end_s": round(end, 3), "holds": holds, "ttft_p99_ms": worst}
        )
    if not windows or not windows[-1]["holds"]:
        return None, windows
    first_good = len(windows) - 1
    while first_good > 0 and windows[first_good - 1]["holds"]:
        first_good -= 1
    return round(float(windows[first_good]["start_s"]) - switch_s, 3), windows


def _accounting(
    records: Sequence[RehearsalRecord], contract: Mapping[str, ClassInput], switch_s: float
) -> tuple[dict[str, dict[str, int]], dict[str, int], dict[str, list[RehearsalRecord]]]:
    """(class -> outcome -> requests, outcome -> requests, class -> its arrivals from the switch on)."""
    accounting: dict[str, dict[str, int]] = {name: dict.fromkeys(OUTCOMES, 0) for name in contract}
    total = dict.fromkeys(OUTCOMES, 0)
    after: dict[str, list[RehearsalRecord]] = defaultdict(list)
    for r in records:
        bucket = outcome(r)
        accounting.setdefault(r["request_class"], dict.fromkeys(OUTCOMES, 0))[bucket] += 1
        total[bucket] += 1
        if r["planned_ns"] / 1e9 >= switch_s:
            after[r["request_class"]].append(r)
    return accounting, total, after


def _after_switch(
    rows: Sequence[RehearsalRecord],
    c: ClassInput,
    counts: Mapping[str, int],
    deadline_s: float | None,
) -> tuple[dict[str, Any], list[tuple[float, float]]]:
    """One class's arrivals from the switch on: (who served them and their p99s against the
    contract, the (arrival s, TTFT ms) points the rolling windows judge)."""
    lat = [_latencies(r) for r in rows]
    limit = c.get("ttft_p99_ms")
    arrivals = [
        (r["planned_ns"] / 1e9, ttft)
        for r, (ttft, _e, _s) in zip(rows, lat, strict=True)
        if not _undetermined(r, ttft, limit, deadline_s)
    ]
    entry: dict[str, Any] = {
        "arrivals": len(rows),
        "served_by": dict(sorted(_count(r.get("backend") or "unknown" for r in rows).items())),
        "ok": sum(1 for r in rows if outcome(r) == "ok"),
        "cut": counts["cut"],
        "cut_share": (counts["cut"] / sum(counts.values())) if sum(counts.values()) else 0.0,
    }
    for key, i, limit in (
        ("ttft_p99_ms", 0, c.get("ttft_p99_ms")),
        ("e2e_p99_ms", 1, c.get("e2e_p99_ms")),
        ("max_stall_p99_ms", 2, c.get("max_stall_ms")),
    ):
        values = [x[i] for x in lat]
        p99 = _p99(values) if values else None
        entry[key] = {
            "value": None if p99 is None else _ms(p99),
            "censored": p99 is not None and math.isinf(p99),
            "limit": limit,
            "within": None if p99 is None or limit is None else p99 <= float(limit),
        }
    return entry, arrivals


def _error_budget_from(
    after: Mapping[str, Sequence[RehearsalRecord]],
    *,
    switch_s: float,
    max_recovery_s: float,
    recovered_s: float | None,
) -> float:
    """Where the error budget is judged from: switch + max_recovery_s. When the trace ends before
    that, the measured recovery (or the switch, when B0 did not recover): never on no arrivals."""
    judged_from = switch_s + max_recovery_s
    if not any(r["planned_ns"] / 1e9 >= judged_from for rows in after.values() for r in rows):
        judged_from = switch_s + (
            recovered_s if recovered_s is not None and recovered_s <= max_recovery_s else 0.0
        )
    return judged_from


def _error_budget(
    late: Sequence[RehearsalRecord], budget: float | None, judged_from: float
) -> dict[str, Any]:
    """One class's arrivals from ``judged_from`` on that did not end ok, against its error budget."""
    late_bad = sum(1 for r in late if outcome(r) != "ok")
    return {
        "from_s": round(judged_from, 3),
        "arrivals": len(late),
        "not_ok": late_bad,
        "error_share": late_bad / len(late) if late else None,
        "error_budget": budget,
        "within": (late_bad / len(late) <= float(budget)) if late and budget is not None else True,
    }


def _surge(b0_samples: Sequence[SampleValue], switch_s: float) -> dict[str, Any]:
    """B0's peak queue and KV-cache use after the switch, and its preemptions and successes since."""
    after_samples = [s for s in b0_samples if s["t_ns"] / 1e9 >= switch_s]
    return {
        "peak_waiting": max((v for t, v in _series(after_samples, WAITING)), default=None),
        "peak_kv_usage": max((v for t, v in _series(after_samples, KV_USAGE)), default=None),
        "preemptions": _counter_delta(b0_samples, PREEMPTIONS, switch_s),
        "b0_requests_succeeded": _counter_delta(b0_samples, REQUEST_SUCCESS, switch_s),
    }


def _problems(
    recovered_s: float | None,
    max_recovery_s: float,
    per_class: Mapping[str, Mapping[str, Any]],
    unaccounted: int,
) -> list[str]:
    """Why check 4 fails on these measures (none: it passes)."""
    problems = []
    if recovered_s is None:
        problems.append("B0 did not recover: the last window still breaks a class's TTFT contract")
    elif recovered_s > max_recovery_s:
        problems.append(
            f"B0 recovered after {recovered_s:g} s, more than max_recovery_s ({max_recovery_s:g} s)"
        )
    for name, entry in per_class.items():
        w = entry["after_recovery_window"]
        if not w["within"]:
            problems.append(
                f"{name}: {w['not_ok']} of {w['arrivals']} arrivals from {w['from_s']:g} s on failed "
                f"({w['error_share']:.1%} > error budget {float(w['error_budget']):.1%})"
            )
    if unaccounted:
        problems.append(f"{unaccounted} planned requests have no record")
    return problems


def rehearsal_measures(
    *,
    records: Sequence[RehearsalRecord],
    planned: int,
    b0_samples: Sequence[SampleValue],
    classes: Sequence[ClassInput],
    switch_s: float,
    cut_s: float,
    end_s: float,
    window_s: float,
    max_recovery_s: float,
    deadline_s: float | None = None,
) -> dict[str, Any]:
    """Everything the results page, the manifest and check 4 say about one rehearsal."""
    contract = {c["name"]: c for c in classes}
    accounting, total, after = _accounting(records, contract, switch_s)
    unaccounted = planned - len(records)
    per_class = {}
    arrivals: dict[str, list[tuple[float, float]]] = {}
    for name in contract:
        per_class[name], arrivals[name] = _after_switch(
            after.get(name, []), contract[name], accounting[name], deadline_s
        )
    limits = {n: float(c["ttft_p99_ms"]) for n, c in contract.items() if c.get("ttft_p99_ms") is not None}
    recovered_s, windows = recovery_time(arrivals, limits, switch_s=switch_s, end_s=end_s, window_s=window_s)
    judged_from = _error_budget_from(
        after, switch_s=switch_s, max_recovery_s=max_recovery_s, recovered_s=recovered_s
    )
    for name, entry in per_class.items():
        late = [r for r in after.get(name, []) if r["planned_ns"] / 1e9 >= judged_from]
        entry["after_recovery_window"] = _error_budget(late, contract[name].get("error_rate"), judged_from)
    everyone: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in records:
        everyone[r["request_class"]].append((r["planned_ns"] / 1e9, _latencies(r)[0]))
    problems = _problems(recovered_s, max_recovery_s, per_class, unaccounted)
    return {
        "switch_at_s": switch_s,
        "cut_at_s": cut_s,
        "end_s": end_s,
        "window_s": window_s,
        "max_recovery_s": max_recovery_s,
        "error_budget_from_s": round(judged_from, 3),
        "time_to_recover_s": recovered_s,
        "recovered": recovered_s is not None,
        "planned": planned,
        "accounting": {"total": total, "classes": accounting, "unaccounted": unaccounted},
        "cut": total["cut"],
        "classes": per_class,
        "surge": _surge(b0_samples, switch_s),
        "windows": windows,
        "timeline": {
            **_timeline(everyone),
            "b0_waiting": _series(b0_samples, WAITING),
            "b0_kv_usage": _series(b0_samples, KV_USAGE),
        },
        "passed": not problems,
        "problems": problems,
    }


def _count(values: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for v in values:
        out[v] += 1
    return out


def _timeline(arrivals: Mapping[str, Sequence[tuple[float, float]]]) -> dict[str, Any]:
    """Per-second TTFT p99 per class by arrival second: [mid-second, p99 ms or None if censored, n]."""
    out: dict[str, list[list[Any]]] = {}
    for cls, points in sorted(arrivals.items()):
        by_second: dict[int, list[float]] = defaultdict(list)
        for t, ttft in points:
            by_second[math.floor(t)].append(ttft)
        out[cls] = [[s + 0.5, _ms(_p99(v)), len(v)] for s, v in sorted(by_second.items())]
    return {"ttft_p99_ms_per_second": out}


# --- Attempts -------------------------------------------------------------------------------
# A cell may be rehearsed more than once (a repeat needs a reason: apps/lifecycle/rehearsal_schedule.py). Every
# attempt is kept and shown with its outcome; check 4 reads them all (apps/analysis/checks.py).

# The audit action that queues an attempt: who queued it and, for a repeat, why (its detail's
# "reason"); apps/lifecycle/rehearsal_schedule.py writes it, apps/analysis/services.rehearsal_inputs reads it.
REHEARSAL_QUEUED = "rehearsal.queued"
PENDING_STATUSES = frozenset({"queued", "starting", "warming", "measuring", "draining"})


def attempt_outcome(
    *, status: str, measures: Mapping[str, Any] | None, reason: str = "", requeued: bool = False
) -> tuple[str, str]:
    """(outcome, why) of one rehearsal attempt from its run's status and measures.

    ``passed``: the run ended done and its measures pass. ``failed``: the measures do not pass
    (why: their problems), or the run ended failed or cancelled (why: its reason). ``invalid``:
    the run measured nothing a verdict can rest on: the load generator fell behind (status
    ``invalid``), or the service itself failed it and queued it again (``requeued``: its worker
    or host was lost). ``pending``: not finished yet."""
    if status in PENDING_STATUSES:
        return "pending", f"the rehearsal is {status}"
    if status == "done" and measures:
        if measures.get("passed"):
            return "passed", ""
        return "failed", "; ".join(measures.get("problems") or []) or "the measures did not pass"
    if status == "invalid":
        return "invalid", f"the rehearsal ended invalid: {reason or 'no reason recorded'}"
    if requeued:
        return "invalid", (
            f"the rehearsal ended {status}: {reason or 'no reason recorded'}; the service queued it "
            "again (a lost worker or host, not the candidate's doing)"
        )
    if status == "done":
        return "failed", "the rehearsal ended without the switch's facts: nothing was measured"
    return "failed", f"the rehearsal ended {status}: {reason or 'no reason recorded'}"


def attempts_tally(attempts: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """How many attempts came to each outcome."""
    tally = dict.fromkeys(("passed", "failed", "invalid", "pending"), 0)
    for a in attempts:
        tally[a["outcome"]] += 1
    return tally


def attempts_summary(attempts: Sequence[Mapping[str, Any]]) -> str:
    """What an approver reads first, e.g. "3 attempts, 2 failed" or "1 attempt, none failed"."""
    tally = attempts_tally(attempts)
    n = len(attempts)
    parts = [f"{tally[k]} {k}" for k in ("failed", "invalid", "pending") if tally[k]]
    return f"{n} attempt{'s' if n != 1 else ''}, " + (", ".join(parts) if parts else "none failed")
