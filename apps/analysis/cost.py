"""Operating cost per cell: output tokens per second at the agreed points, and what a million of
them cost at a price per GPU-hour (docs/ANALYSIS.md, "Operating cost"). Pure.

The method's decision table says to check operating cost first where there is no material
gain; the results page shows it beside every cell, B0 included.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

# The largest price per GPU-hour taken (the spec's or the host's): above it, a typo.
MAX_USD_PER_GPU_HOUR = 1e6


def valid_price(value: Any) -> bool:
    """A price per GPU-hour is a positive number of dollars below the bound (never a bool)."""
    return (
        not isinstance(value, bool) and isinstance(value, (int, float)) and 0 < value < MAX_USD_PER_GPU_HOUR
    )


def cell_costs(
    *,
    cells: Sequence[Mapping[str, Any]],
    run_results: Sequence[Mapping[str, Any]],
    agreed: Sequence[tuple[str, str, int]],
    usd_per_gpu_hour: float | None,
    price_source: str,
    gpus_per_server: int,
) -> dict[str, Any]:
    """Per cell: its done sweep runs at the agreed points, pooled.

    1. output tokens/s = the runs' output tokens over their observation seconds (the open-loop
       window: what the cell served of the offered load);
    2. $ per 1M output tokens = price x GPUs per server / 3600 / (tokens/s) x 1e6, absent when
       no price is known or the cell served no token (never 0, never infinite).
    """
    points = {(m, r) for m, r, _ in agreed}
    tokens: dict[str, float] = defaultdict(float)
    seconds: dict[str, float] = defaultdict(float)
    runs: dict[str, int] = defaultdict(int)
    for r in run_results:
        if r.get("scenario") or r["status"] != "done" or (r["mixture"], r["rate"]) not in points:
            continue
        if r.get("tokens_per_s") is None:
            continue  # a run with no records in its window measured nothing
        observation = float(r["window"]["observation_s"])
        tokens[r["cell"]] += float(r["tokens_per_s"]) * observation
        seconds[r["cell"]] += observation
        runs[r["cell"]] += 1
    per_hour = usd_per_gpu_hour * gpus_per_server if usd_per_gpu_hour is not None else None
    out: dict[str, Any] = {}
    for c in cells:
        cell = c["cell_id"]
        rate = tokens[cell] / seconds[cell] if seconds[cell] > 0 else None
        cost = None
        if per_hour is not None and rate:
            cost = round(per_hour / 3600.0 / rate * 1e6, 4)
        out[cell] = {
            "runs": runs[cell],
            "output_tokens_per_s": round(rate, 3) if rate is not None else None,
            "usd_per_1m_output_tokens": cost,
        }
    return {
        "usd_per_gpu_hour": usd_per_gpu_hour,
        "price_source": price_source,
        "gpus_per_server": gpus_per_server,
        "cells": out,
    }
