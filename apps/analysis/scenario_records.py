"""A scenario run's records, one by one: each one's outcome and the measures the scenario checks
read from them (TTFT percentiles, the oldest wait, streams in flight, the decode pace). Pure;
the checks themselves are apps/analysis/scenario_checks.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from apps.analysis.metrics import REJECT_STATUSES, censored_percentile

NS_PER_MS = 1_000_000.0
OUTCOMES = ("unsent", "rejected", "timeout", "error", "cancelled", "unfinished", "completed")


def outcome(rec: Mapping[str, Any]) -> str:
    """One outcome per record, in the precedence apps/analysis/metrics.py uses."""
    kind = rec.get("error_kind")
    if not rec.get("sent", True):
        return "unsent"
    if rec.get("http_status") in REJECT_STATUSES or kind == "admission":
        return "rejected"
    if kind == "timeout":
        return "timeout"
    if kind is not None:
        return "error"
    if rec.get("cancelled"):
        return "cancelled"
    if rec.get("unfinished"):
        return "unfinished"
    if rec.get("http_status") == 200:
        return "completed"
    return "error"


def decode_step_ms(records: Iterable[Mapping[str, Any]], *, min_output_tokens: int = 8) -> float | None:
    """The decode pace of a run: median over completed streams of (last - first token) / (tokens - 1), in ms.

    What one stream waits per output token once it is decoding (the
    scheduler's step time as a client sees it). Only streams delivered token
    by token count (at least half as many chunks as tokens, when the record
    has ``chunks``): a stream whose tokens arrived in a few lumps (an API
    server or a client that fell behind) says nothing about the step time.
    None when no completed stream qualifies.
    """
    per = []
    for r in records:
        tokens = int(r.get("output_tokens") or 0)
        first, last = r.get("first_token_ns"), r.get("last_token_ns")
        if outcome(r) != "completed" or first is None or last is None or tokens < max(2, min_output_tokens):
            continue
        chunks = r.get("chunks")
        if (chunks is not None and int(chunks) < tokens // 2) or float(last) <= float(first):
            continue
        per.append((float(last) - float(first)) / (tokens - 1) / NS_PER_MS)
    return round(float(np.median(per)), 6) if per else None


def outcome_counts(records: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    out = dict.fromkeys(OUTCOMES, 0)
    for r in records:
        out[outcome(r)] += 1
    return out


def deadline_ns(meta: Mapping[str, Any]) -> float:
    return (
        float(meta.get("warmup_s") or 0)
        + float(meta.get("observation_s") or 0)
        + float(meta.get("drain_deadline_s") or 0)
    ) * 1e9


def _ttft_ms(rec: Mapping[str, Any]) -> float | None:
    first = rec.get("first_token_ns")
    if first is None or outcome(rec) in ("unsent", "rejected"):
        return None
    return (float(first) - float(rec["planned_ns"])) / NS_PER_MS


def ttft_percentile(records: Sequence[Mapping[str, Any]], q: float, deadline_ns: float) -> dict[str, Any]:
    """Censored percentile of TTFT: a request without a first token ranks above every observed one."""
    seen = [t for t in (_ttft_ms(r) for r in records) if t is not None]
    bounds = [
        (deadline_ns - float(r["planned_ns"])) / NS_PER_MS
        for r in records
        if _ttft_ms(r) is None and outcome(r) in ("unfinished", "timeout")
    ]
    return censored_percentile(np.asarray(seen, dtype=float), np.asarray(bounds, dtype=float), q)


def oldest_wait_ms(records: Sequence[Mapping[str, Any]], deadline_ns: float) -> float | None:
    """Oldest wait from planned arrival to first token; still waiting counts up to the deadline."""
    waits = []
    for r in records:
        if outcome(r) in ("unsent", "rejected", "error"):
            continue
        end = r.get("first_token_ns")
        end = float(end) if end is not None else deadline_ns
        waits.append((end - float(r["planned_ns"])) / NS_PER_MS)
    return round(max(waits), 3) if waits else None


def in_flight_peak(records: Sequence[Mapping[str, Any]], deadline_ns: float) -> int:
    """Most streams between first and last token at the same moment."""
    events: list[tuple[float, int]] = []
    for r in records:
        first = r.get("first_token_ns")
        if first is None:
            continue
        last = r.get("last_token_ns") or r.get("end_ns") or deadline_ns
        events += [(float(first), 1), (float(last), -1)]
    peak = cur = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):
        cur += step
        peak = max(peak, cur)
    return peak


def stall_p99(records: Sequence[Mapping[str, Any]]) -> float | None:
    gaps = [float(r["max_gap_ns"]) / NS_PER_MS for r in records if r.get("max_gap_ns") is not None]
    return round(float(np.quantile(gaps, 0.99, method="inverted_cdf")), 3) if gaps else None


def record_brief(r: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "index": r.get("index"),
        "input_tokens": r.get("input_tokens"),
        "outcome": outcome(r),
        "http_status": r.get("http_status"),
        "error_kind": r.get("error_kind"),
        "error": (r.get("error") or "")[:200] or None,
        "output_tokens": r.get("output_tokens"),
    }
