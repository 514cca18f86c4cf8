"""What each failure scenario must show, and whether it did. Pure: plain inputs, no Django.

A scenario run is judged from its records (one per planned request), the
server-side metrics of the run (apps/analysis/server_metrics.py ``server_metrics``)
and the meta of its trace, which names each request's role (the burst, the
backlog, the input past the context window...). Every verdict has two parts:

- ``must_hold``: claims that keep the measurement honest whatever the
  candidate (every request is accounted for: answered, refused, cancelled or
  counted unfinished, never dropped; the run itself did not crash), each with
  ``held`` and its evidence;
- ``signal``: the stress the scenario is built to produce (preemptions under
  KV pressure, unfinished or refused long requests under the burst...), with
  ``shown`` and the evidence. A scenario that did not produce its signal did
  not test what it claims to, and says so.

docs/SCENARIOS.md states the same rules in prose. Each record's outcome and the
measures read from the records (``outcome``, ``decode_step_ms``...) are
apps/analysis/scenario_records.py, importable from here too.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from apps.analysis.scenario_records import (
    NS_PER_MS,
    OUTCOMES,
    deadline_ns,
    decode_step_ms,
    in_flight_peak,
    oldest_wait_ms,
    outcome,
    outcome_counts,
    record_brief,
    stall_p99,
    ttft_percentile,
)
from apps.workloads.scenario_layouts import SCENARIOS

__all__ = [
    "FCFS_OVERTAKE_SHARE",
    "NS_PER_MS",
    "OUTCOMES",
    "OVERTAKE_MARGIN_MS",
    "PRIORITY_OVERTAKE_SHARE",
    "decode_step_ms",
    "outcome",
    "priority_order",
    "scenario_verdict",
    "scenarios_summary",
]

# A flood request "overtakes" an older backlog request when its first token
# comes at least this much earlier: first tokens of one scheduler step differ
# only by delivery jitter, and that must not count as reordering.
OVERTAKE_MARGIN_MS = 50.0
# Shares of flood requests that overtook the backlog: above the first,
# priority works; at or below the second, the order was arrival order.
PRIORITY_OVERTAKE_SHARE = 0.5
FCFS_OVERTAKE_SHARE = 0.1


def _unsized(meta: Mapping[str, Any], key: str) -> str | None:
    """The diagnosis when a size that decides the signal fell back to a fixed count."""
    derived = ((meta.get("sizing") or {}).get("derived") or {}).get(key)
    if derived and str(derived.get("rule", "")).startswith("fixed fallback"):
        return (
            f"{key} was a fixed fallback ({derived['value']}), not sized from B0's measured decode pace "
            "(no probe or pace run measured it): set it in the spec so the stress outlasts the window "
            "on this engine"
        )
    return None


def _claim(claim: str, held: bool, **evidence: Any) -> dict[str, Any]:
    return {"claim": claim, "held": bool(held), "evidence": evidence}


def _roles(
    meta: Mapping[str, Any], by_index: Mapping[int, Mapping[str, Any]]
) -> dict[str, list[Mapping[str, Any]]]:
    roles = meta.get("roles") or {}
    return {role: [by_index[i] for i in idx if i in by_index] for role, idx in roles.items()}


def _accounted(meta: Mapping[str, Any], by_index: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    planned = int(meta.get("requests") or sum(len(v) for v in (meta.get("roles") or {}).values()))
    return _claim(
        "every planned request is accounted for (answered, refused, cancelled or counted unfinished)",
        len(by_index) == planned and planned > 0,
        planned=planned,
        recorded=len(by_index),
    )


def _run_done(status: str) -> dict[str, Any]:
    return _claim("the run finished without crashing (status done)", status == "done", status=status)


def _long_burst(
    meta: Mapping[str, Any],
    roles: Mapping[str, list[Mapping[str, Any]]],
    deadline: float,
    _: Mapping[str, Any],
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    burst = outcome_counts(roles.get("burst", []))
    steady = roles.get("steady", [])
    not_done = burst["unfinished"] + burst["rejected"] + burst["timeout"] + burst["error"]
    claims = [
        _claim(
            "bounded admission: burst requests the server could not take are refused or left visibly "
            "unfinished at the drain deadline, never silently dropped",
            sum(burst.values()) == len(roles.get("burst", [])),
            burst=burst,
        ),
    ]
    signal = {
        "expected": "some long requests of the burst are refused or still unfinished at the drain deadline",
        "shown": not_done > 0,
        "evidence": {
            "burst": burst,
            "steady": outcome_counts(steady),
            "steady_ttft_p99": ttft_percentile(steady, 0.99, deadline),
            "steady_oldest_wait_ms": oldest_wait_ms(steady, deadline),
        },
    }
    if not signal["shown"]:
        signal["diagnosis"] = _unsized(meta, "burst_size") or (
            "the server cleared the burst before the drain deadline: raise burst_size or overload"
        )
    return claims, signal


def _decode_pressure(
    meta: Mapping[str, Any],
    roles: Mapping[str, list[Mapping[str, Any]]],
    deadline: float,
    server: Mapping[str, Any],
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    streams = roles.get("long_output", [])
    counts = outcome_counts(streams)
    wrong = sum(
        1
        for r in streams
        if outcome(r) == "completed" and r.get("output_tokens") != r.get("expected_output_tokens")
    )
    peak = in_flight_peak(streams, deadline)
    want = max(2, math.ceil(len(streams) / 2))
    running = ((server.get("gauges") or {}).get("running") or {}).get("max")
    claims = [
        _claim(
            "every long stream either delivered all its tokens or is counted unfinished",
            wrong == 0 and counts["completed"] + counts["unfinished"] + counts["timeout"] == len(streams),
            counts=counts,
            wrong_token_counts=wrong,
        )
    ]
    signal = {
        "expected": f"at least {want} long outputs in flight at the same time",
        "shown": peak >= want,
        "evidence": {
            "peak_streams_in_flight": peak,
            "server_running_max": running,
            "stream_stall_p99": stall_p99(streams),
        },
    }
    return claims, signal


def _context_boundary(
    meta: Mapping[str, Any],
    roles: Mapping[str, list[Mapping[str, Any]]],
    deadline: float,
    _: Mapping[str, Any],
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    at = roles.get("at_limit", [])
    past = roles.get("past_limit", [])
    at_ok = bool(at) and all(
        outcome(r) == "completed" and r.get("output_tokens") == r.get("expected_output_tokens") for r in at
    )
    past_err = bool(past) and all(r.get("error_kind") is not None for r in past)
    claims = [
        _claim(
            "the input exactly at the context window is served in full",
            at_ok,
            at_limit=[record_brief(r) for r in at],
        ),
        _claim(
            "the input past the context window is refused, and the refusal is recorded with its kind",
            past_err,
            past_limit=[record_brief(r) for r in past],
        ),
    ]
    signal = {
        "expected": "the server's error for the input past the window is captured in its record",
        "shown": past_err,
        "evidence": {"past_limit": [record_brief(r) for r in past]},
    }
    return claims, signal


def _cancellation(
    meta: Mapping[str, Any],
    roles: Mapping[str, list[Mapping[str, Any]]],
    deadline: float,
    _: Mapping[str, Any],
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    cancel = roles.get("cancel", [])
    keep = roles.get("complete", [])
    c_cancel = outcome_counts(cancel)
    c_keep = outcome_counts(keep)
    claims = [
        _claim(
            "streams the client cancelled are recorded as cancellations, not as server errors",
            c_cancel["error"] == 0
            and c_cancel["cancelled"] + c_cancel["completed"] + c_cancel["unfinished"] == len(cancel),
            cancel=c_cancel,
        ),
        _claim(
            "the other streams are still served in full after the disconnects",
            c_keep["completed"] + c_keep["unfinished"] == len(keep) and c_keep["error"] == 0,
            complete=c_keep,
        ),
    ]
    signal = {
        "expected": "every stream marked to cancel is recorded as a client cancellation",
        "shown": bool(cancel) and c_cancel["cancelled"] == len(cancel),
        "evidence": {"planned_cancellations": len(cancel), "cancelled": c_cancel["cancelled"]},
    }
    return claims, signal


def _kv_pressure(
    meta: Mapping[str, Any],
    roles: Mapping[str, list[Mapping[str, Any]]],
    deadline: float,
    server: Mapping[str, Any],
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    reqs = roles.get("pressure", [])
    counts = outcome_counts(reqs)
    preemptions = (server.get("counters") or {}).get("preemptions")
    claims = [
        _claim(
            "preempted requests still finish, or are counted unfinished (recomputation is visible, not lost)",
            counts["completed"] + counts["unfinished"] + counts["timeout"] == len(reqs),
            counts=counts,
        )
    ]
    signal = {
        "expected": "the server's preemption counter rises during the run (delta > 0)",
        "shown": preemptions is not None and preemptions > 0,
        "evidence": {
            "preemption_delta": preemptions,
            "kv_usage_max": ((server.get("gauges") or {}).get("kv_usage") or {}).get("max"),
            "kv_capacity_tokens": meta.get("kv_capacity_tokens"),
        },
    }
    return claims, signal


def priority_order(
    backlog: Sequence[Mapping[str, Any]],
    flood: Sequence[Mapping[str, Any]],
    *,
    margin_ms: float = OVERTAKE_MARGIN_MS,
) -> dict[str, Any]:
    """How many flood requests got their first token before an older backlog request still waiting.

    A flood request is *contested* when some older backlog request was still
    waiting (no first token yet) when it was sent: only those can show an
    order. It *overtook* when its first token came at least ``margin_ms``
    before such a request's (a backlog request that never got a first token,
    and was not refused or failed, was still waiting at the deadline).
    ``share`` is overtook / contested.
    """
    margin = margin_ms * NS_PER_MS
    waiting = [r for r in backlog if outcome(r) not in ("unsent", "rejected", "error")]
    overtook = contested = 0
    for f in flood:
        first = f.get("first_token_ns")
        if first is None:
            continue
        # The server can only reorder what it has received: a late send (a
        # starved load generator) is judged from when it went out.
        arrived = float(f["sent_ns"] if f.get("sent_ns") is not None else f["planned_ns"])
        older = [
            b
            for b in waiting
            if float(b["planned_ns"]) < arrived
            and (b.get("first_token_ns") is None or float(b["first_token_ns"]) > arrived)
        ]
        if not older:
            continue
        contested += 1
        if any(
            b.get("first_token_ns") is None or float(first) < float(b["first_token_ns"]) - margin
            for b in older
        ):
            overtook += 1
    served = sum(1 for f in flood if f.get("first_token_ns") is not None)
    return {
        "flood_served": served,
        "contested": contested,
        "overtook": overtook,
        "share": round(overtook / contested, 6) if contested else None,
    }


def on_server_clock(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]] | None:
    """The records as the server saw them: each one's plan and send replaced by the server's arrival,
    and its first token by the server's (``server_arrival_ns``, ``server_first_token_ns``: vLLM's
    span of it, its clock moved onto the replay's). A wait then counts from when the server had
    the request: it can only order what it received, and a load generator that sent late is not
    the server's doing. None unless every record with a first token has both: an order is read
    from one clock or the other, never from a mix."""
    moved = []
    for r in records:
        first, arrival = r.get("server_first_token_ns"), r.get("server_arrival_ns")
        if r.get("first_token_ns") is not None and (first is None or arrival is None):
            return None
        if arrival is None:  # never reached the server (unsent, refused before it): as planned
            moved.append({**r, "first_token_ns": None})
        else:
            moved.append({**r, "planned_ns": arrival, "sent_ns": arrival, "first_token_ns": first})
    return moved


def _priority_flood(
    meta: Mapping[str, Any],
    roles: Mapping[str, list[Mapping[str, Any]]],
    deadline: float,
    _: Mapping[str, Any],
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    backlog: Sequence[Mapping[str, Any]] = roles.get("backlog", [])
    flood: Sequence[Mapping[str, Any]] = roles.get("flood", [])
    # The order is read on the server's clock where its spans were joined to every served request:
    # a load generator that stalls reads a backlog of first tokens in one pass, and its stamps then
    # carry no order, while the server's still do. Else on the client's, with the stall rule below.
    server_backlog, server_flood = on_server_clock(backlog), on_server_clock(flood)
    clock = "client"
    if server_backlog is not None and server_flood is not None and (server_backlog or server_flood):
        backlog, flood, clock = server_backlog, server_flood, "server"
    order = priority_order(backlog, flood)
    order["clock"] = clock
    high = ttft_percentile(flood, 0.5, deadline)
    low = ttft_percentile(backlog, 0.5, deadline)
    oldest = oldest_wait_ms(backlog, deadline)
    high_v = high["ms"] if high["ms"] is not None else math.inf
    low_v = low["ms"] if low["ms"] is not None else (math.inf if low.get("censored") else math.nan)
    claims = [
        _claim(
            "no starvation hidden by percentiles of the finished: the oldest lower-priority wait is "
            "reported, counting requests still waiting at the drain deadline",
            oldest is not None,
            oldest_lower_priority_wait_ms=oldest,
            backlog=outcome_counts(backlog),
        ),
        _claim(
            "every request of the flood and the backlog is accounted for",
            sum(outcome_counts(backlog).values()) + sum(outcome_counts(flood).values())
            == len(backlog) + len(flood),
            flood=outcome_counts(flood),
        ),
    ]
    evidence = {
        "high_priority_ttft_p50": high,
        "low_priority_ttft_p50": low,
        "overtaking": order,
        "oldest_lower_priority_wait_ms": oldest,
        "scheduling_policy": meta.get("scheduling_policy") or "fcfs",
    }
    if meta.get("scheduling_policy") == "priority" and meta.get("send_priority", True):
        shown = (order["share"] or 0) >= PRIORITY_OVERTAKE_SHARE and high_v < low_v
        signal = {
            "expected": "under priority scheduling, high-priority arrivals overtake the waiting backlog "
            "and their TTFT p50 is lower than the backlog's",
            "shown": shown,
            "evidence": evidence,
        }
        if not shown and not order["contested"]:
            signal["diagnosis"] = (
                "inconclusive: the backlog was no longer waiting when the flood arrived, so there was "
                "no order to change (raise backlog or backlog_output_tokens)"
            )
            unsized = _unsized(meta, "backlog_output_tokens")
            if unsized:
                signal["diagnosis"] = f"{signal['diagnosis']}; {unsized}"
        elif not shown:
            signal["diagnosis"] = (
                "priority has no effect on the order: the priority field is being dropped somewhere "
                "(trace, replay client, server flag --scheduling-policy priority, or the scheduler)"
            )
    else:
        signal = {
            "expected": "without priority scheduling, arrival order is kept: high-priority arrivals do not overtake the backlog",
            "shown": order["share"] is not None and order["share"] <= FCFS_OVERTAKE_SHARE,
            "evidence": evidence,
        }
        if order["share"] is None:
            signal["diagnosis"] = "inconclusive: no flood request arrived while the backlog was still waiting"
    stall = meta.get("loop_stall_max_ms")
    evidence["load_generator_stall_max_ms"] = stall
    if not signal["shown"] and clock == "client" and stall is not None and stall > OVERTAKE_MARGIN_MS:
        signal["inconclusive"] = True
        signal["diagnosis"] = (
            f"inconclusive: the load generator stalled for {stall:.0f} ms during the run, more than the "
            f"{OVERTAKE_MARGIN_MS:.0f} ms margin, so the first-token times it stamped cannot order the flood "
            "and the backlog; rerun on a host with CPU to spare"
        )
    return claims, signal


def _checks_by_name() -> dict[str, Any]:
    """Each failure scenario's check, found by its name: ``_<scenario>`` above. The names are
    read from the one list of the scenarios (apps/workloads/scenario_layouts.SCENARIOS, where each
    has its generator), so a scenario added there without a check here fails on import."""
    missing = [name for name in SCENARIOS if not callable(globals().get(f"_{name}"))]
    if missing:
        raise ImportError(
            f"no check in apps/analysis/scenario_checks.py for failure scenario(s) {', '.join(missing)}"
        )
    return {name: globals()[f"_{name}"] for name in SCENARIOS}


_CHECKS = _checks_by_name()


def scenario_verdict(
    *,
    meta: Mapping[str, Any],
    records: Iterable[Mapping[str, Any]],
    server: Mapping[str, Any] | None = None,
    status: str = "done",
    scheduling_policy: str | None = None,
    replay: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Judge one scenario run: what must hold, whether it did, and whether the scenario's signal showed.

    ``meta`` is the scenario trace's meta (its ``scenario_kind`` picks the
    check, its ``roles`` map roles to request indices); ``records`` are the
    run's request records as mappings; ``server`` is ``server_metrics`` of
    the run's samples; ``scheduling_policy`` is the cell's (vLLM's default,
    FCFS, when None): it decides what the priority flood must show;
    ``replay`` is the replay's summary (its ``loop_stall_max_ms`` tells whether
    client-side times can order first tokens).
    """
    kind = str(meta.get("scenario_kind") or meta.get("scenario") or "")
    if kind not in _CHECKS:
        raise ValueError(f"no check for scenario {kind!r}")
    by_index = {int(r["index"]): r for r in records}
    roles = _roles(meta, by_index)
    deadline = deadline_ns(meta)
    meta = {
        **meta,
        "scheduling_policy": scheduling_policy or "fcfs",
        "loop_stall_max_ms": (replay or {}).get("loop_stall_max_ms"),
    }
    claims, signal = _CHECKS[kind](meta, roles, deadline, server or {})
    claims = [_run_done(status), _accounted(meta, by_index), *claims]
    return {
        "scenario": meta.get("scenario") or kind,
        "kind": kind,
        "status": status,
        "counts": outcome_counts(by_index.values()),
        "must_hold": claims,
        "held": all(c["held"] for c in claims),
        "signal": signal,
        "shown": bool(signal["shown"]),
    }


def scenarios_summary(verdicts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One line per scenario run and whether all held and showed their signal."""
    return {
        "runs": len(verdicts),
        "held": sum(1 for v in verdicts if v["held"]),
        "shown": sum(1 for v in verdicts if v["shown"]),
        "status": "none"
        if not verdicts
        else ("pass" if all(v["held"] and v["shown"] for v in verdicts) else "listed"),
    }
