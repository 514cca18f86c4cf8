"""Reading one metric of a report's pooled class metrics (report ``aggregates[].pooled``). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# A tail metric's kind -> its key in the pooled metrics.
POOLED_KEY = {"ttft": "ttft_ms", "e2e": "e2e_ms", "max_stall": "max_stall_ms"}
# The metrics a comparison shows, in order: latency tails, then throughput and errors.
COMPARED = (
    "ttft_p50_ms",
    "ttft_p95_ms",
    "ttft_p99_ms",
    "e2e_p50_ms",
    "e2e_p95_ms",
    "e2e_p99_ms",
    "max_stall_p99_ms",
    "goodput_rps",
    "error_rate",
)


def value(pooled: Mapping[str, Any], metric: str) -> float | None:
    """``ttft_p99_ms`` -> pooled["ttft_ms"]["p99"]["ms"]; ``goodput_rps`` and ``error_rate`` as
    they are. None when the report has no value (too few requests for the level, censored)."""
    if metric in ("goodput_rps", "error_rate"):
        raw = pooled.get(metric)
        return float(raw) if isinstance(raw, int | float) and not isinstance(raw, bool) else None
    for kind, key in POOLED_KEY.items():
        prefix = kind + "_"
        if metric.startswith(prefix) and metric.endswith("_ms"):
            level = metric[len(prefix) : -len("_ms")]
            cell = (pooled.get(key) or {}).get(level)
            ms = cell.get("ms") if isinstance(cell, Mapping) else None
            return float(ms) if isinstance(ms, int | float) else None
    return None
