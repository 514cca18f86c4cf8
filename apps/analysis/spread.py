"""Uniform against bursty arrivals: the p50-to-p99 TTFT spread per class for each arrival process.

The method asks what burstiness does to the tail beyond what the same load does on even
spacing: the gap between the median and the p99 is that answer, where the p99 alone mixes it
with the load. Pure; read by the results page's table and chart (apps/analysis/charts.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from apps.analysis.report_types import RunResult

# One (cell, mixture, rate, class, process) of ``arrival_spread``; "class" is a keyword.
SpreadRow = TypedDict(
    "SpreadRow",
    {
        "cell": str,
        "mixture": str,
        "rate": str,
        "class": str,
        "process": str,  # "bursty" | "uniform"
        "runs": int,
        "p50_ms": float | None,
        "p99_ms": float | None,
        "spread_ms": float | None,
    },
)


def _ms(p: Mapping[str, Any] | None) -> float | None:
    """A percentile entry's value; a censored one has none (its bound is not the value)."""
    if not p or p.get("censored"):
        return None
    return p.get("ms")


def arrival_spread(
    *, runs: Sequence[RunResult], classes: Sequence[str], cells: Sequence[str]
) -> list[SpreadRow]:
    """One row per (cell, mixture, rate, class, process) where both processes ran.

    ``bursty``: the done sweep runs (the spec's arrival process); ``uniform``: the done uniform
    companion runs of the same cell, mixture and rate. p50 and p99 are the means over those
    runs of each run's TTFT percentiles (runs whose percentile is censored leave it out), and
    ``spread_ms`` = p99 - p50, absent when either is.
    """
    keys = sorted(
        {(r["cell"], r["mixture"], r["rate"]) for r in runs if "uniform" in (r.get("scenario") or "")},
        key=lambda k: (cells.index(k[0]) if k[0] in cells else 1 << 30, k[1], k[2]),
    )
    rows: list[SpreadRow] = []
    for cell, mix, rate in keys:
        for process in ("bursty", "uniform"):
            chosen = [
                r
                for r in runs
                if (r["cell"], r["mixture"], r["rate"]) == (cell, mix, rate)
                and r["status"] == "done"
                and ("uniform" in (r.get("scenario") or "")) == (process == "uniform")
                and (process == "uniform" or not r.get("scenario"))
            ]
            for name in classes:
                ttft = [r["classes"].get(name, {}).get("ttft_ms", {}) for r in chosen]
                p50s = [v for v in (_ms(t.get("p50")) for t in ttft) if v is not None]
                p99s = [v for v in (_ms(t.get("p99")) for t in ttft) if v is not None]
                p50 = sum(p50s) / len(p50s) if p50s else None
                p99 = sum(p99s) / len(p99s) if p99s else None
                rows.append(
                    {
                        "cell": cell,
                        "mixture": mix,
                        "rate": rate,
                        "class": name,
                        "process": process,
                        "runs": len(chosen),
                        "p50_ms": round(p50, 3) if p50 is not None else None,
                        "p99_ms": round(p99, 3) if p99 is not None else None,
                        "spread_ms": round(p99 - p50, 3) if p50 is not None and p99 is not None else None,
                    }
                )
    return rows
