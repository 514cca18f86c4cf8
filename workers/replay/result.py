"""The result of a replay: counts, dispatch lag, achieved rate, and whether the run is valid.

:func:`summarise` reads a finished replay, one event loop (:class:`workers.replay.client._Replay`)
or several processes (:class:`workers.replay.shard.Sharded`): anything with ``records``,
``run_id``, ``warmup_ns``, ``observation_ns``, ``stopped``, ``notes``, ``extra_body`` and
``output_mode``. A p99 dispatch lag above the tolerance, or requests not sent by the drain
deadline, make the run invalid: the load generator fell behind, the server is not to blame.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, TypedDict, cast

from workers.replay.records import RequestRecord


class RehearsalClientFacts(TypedDict):
    """What a recovery rehearsal's client saw (:meth:`workers.replay.rehearsal_client.RehearsalReplay.facts`),
    times from the origin in seconds."""

    switch_at_s: float
    cut_at_s: float
    mode: str  # "own client" or "router"
    cold_wait: bool
    b0_ready_at_s: float | None
    cut: int  # streams cut at the deadline


class ReplaySummary(TypedDict):
    """:meth:`ReplayResult.summary`: every field of the result but the records, JSON-ready. A run's
    ``summary`` starts from it (apps/runs/summary_types.py); tests/replay/test_result.py keeps the
    keys equal to the dataclass's fields."""

    run_id: str
    planned_requests: int
    sent: int
    ok: int
    errors: int
    cancelled: int
    unfinished: int
    not_sent: int
    dispatch_lag_p50_ms: float | None
    dispatch_lag_p99_ms: float | None
    dispatch_lag_max_ms: float | None
    planned_rate_rps: float | None
    achieved_rate_rps: float | None
    valid: bool
    invalid_reason: str
    stopped: bool
    duration_s: float
    tolerance_ms: float
    notes: list[str]
    loop_stall_max_ms: float | None
    send_priority: str | None
    rehearsal: RehearsalClientFacts | None
    extra_body: dict[str, Any]
    output_mode: str


@dataclass
class ReplayResult:
    run_id: str
    records: list[RequestRecord]
    planned_requests: int
    sent: int
    ok: int
    errors: int
    cancelled: int
    unfinished: int
    not_sent: int
    dispatch_lag_p50_ms: float | None
    dispatch_lag_p99_ms: float | None
    dispatch_lag_max_ms: float | None
    planned_rate_rps: float | None
    achieved_rate_rps: float | None
    valid: bool
    invalid_reason: str
    # True when the caller's stop event ended the run early.
    stopped: bool
    duration_s: float
    tolerance_ms: float
    notes: list[str] = field(default_factory=list)
    # The longest time the event loop could not run during the replay (None: not measured,
    # e.g. sharded). A stall holds back sends and stamps every frame read after it late.
    loop_stall_max_ms: float | None = None
    # The send loop's scheduling class ("realtime", or "normal (why)"); None for a loop in the
    # caller's own process (runtime.realtime_send_loop).
    send_priority: str | None = None
    # A recovery rehearsal's own facts (workers/replay/rehearsal_client.py): the switch, B0 ready, cuts.
    rehearsal: RehearsalClientFacts | None = None
    # The fields every request body carried besides its own (the sampling settings): what the
    # server was asked for, recorded with the run so cells can be checked for the same settings.
    extra_body: dict[str, Any] = field(default_factory=dict)
    # exact: every request forced to its length; natural: the length is only a cap.
    output_mode: str = "exact"

    def run_fields(self) -> dict[str, Any]:
        """The Run row's load-generator fields (dispatch lag, achieved rate, requests sent)."""
        return {
            "dispatch_lag_p50_ms": self.dispatch_lag_p50_ms,
            "dispatch_lag_p99_ms": self.dispatch_lag_p99_ms,
            "dispatch_lag_max_ms": self.dispatch_lag_max_ms,
            "achieved_rate_rps": self.achieved_rate_rps,
            "requests_sent": self.sent,
        }

    def summary(self) -> ReplaySummary:
        """Everything but the records, JSON-ready (for Run.summary and logs)."""
        return cast(ReplaySummary, {k: v for k, v in self.__dict__.items() if k != "records"})


def _percentile(sorted_values: list[int], q: float) -> float:
    # Nearest-rank: the reported p99 is a lag that some request really had.
    rank = max(1, math.ceil(q * len(sorted_values)))
    return float(sorted_values[rank - 1])


def summarise(replay: Any, *, tolerance_ms: float, duration_s: float) -> ReplayResult:
    """Summarise a finished replay (single loop or sharded: records, windows, stopped, notes)."""
    records = replay.records
    sent = [r for r in records if r.sent and r.sent_ns is not None]
    observed = [r for r in sent if not r.warmup] or sent
    lags = sorted(r.sent_ns - (r.admission_delay_ns or 0) - r.planned_ns for r in observed)
    p50 = _percentile(lags, 0.50) / 1e6 if lags else None
    p99 = _percentile(lags, 0.99) / 1e6 if lags else None
    lag_max = lags[-1] / 1e6 if lags else None

    planned_obs = [r for r in records if not r.warmup]
    window_s = replay.observation_ns / 1e9
    planned_rate = len(planned_obs) / window_s if window_s > 0 and planned_obs else None
    achieved_rate = None
    sent_obs = [r for r in sent if not r.warmup]
    if planned_rate is not None and sent_obs:
        last_dispatch = max(r.sent_ns - (r.admission_delay_ns or 0) for r in sent_obs)
        span_s = max(window_s, (last_dispatch - replay.warmup_ns) / 1e9)
        achieved_rate = len(sent_obs) / span_s

    not_sent = len(records) - len(sent)
    reasons = []
    if p99 is not None and p99 > tolerance_ms:
        reasons.append(
            f"load generator fell behind: p99 dispatch lag {p99:.1f} ms > tolerance {tolerance_ms:g} ms"
        )
    behind = [r for r in records if not r.sent and r.error == "not sent by the drain deadline"]
    if behind and not replay.stopped:
        reasons.append(f"load generator fell behind: {len(behind)} requests not sent by the drain deadline")
    return ReplayResult(
        run_id=replay.run_id,
        records=records,
        planned_requests=len(records),
        sent=len(sent),
        ok=sum(1 for r in records if r.ok),
        errors=sum(1 for r in records if r.error_kind is not None),
        cancelled=sum(1 for r in records if r.cancelled),
        unfinished=sum(1 for r in records if r.unfinished),
        not_sent=not_sent,
        dispatch_lag_p50_ms=p50,
        dispatch_lag_p99_ms=p99,
        dispatch_lag_max_ms=lag_max,
        planned_rate_rps=planned_rate,
        achieved_rate_rps=achieved_rate,
        valid=not reasons,
        invalid_reason="; ".join(reasons),
        stopped=replay.stopped,
        duration_s=duration_s,
        tolerance_ms=tolerance_ms,
        notes=replay.notes,
        extra_body=dict(replay.extra_body),
        output_mode=replay.output_mode,
        loop_stall_max_ms=(
            round(replay.loop_stall_max_ns / 1e6, 3) if hasattr(replay, "loop_stall_max_ns") else None
        ),
        send_priority=getattr(replay, "send_priority", None),
    )
