"""Natural-length replay (``workload.output_mode: natural``): output-length strata and stop reasons.

When the model stops where it stops, a candidate could look faster by emitting fewer tokens.
So, per class, requests are compared within equivalent **output-length strata** (buckets of the
tokens each request actually got), and a cell whose output tokens drift from B0's beyond
``max_output_shift`` is invalid (apps/analysis/decide.py). Pure.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

# Strata of output tokens: [1, 32), [32, 128), [128, 512), [512, 2048), [2048, ...).
EDGES = (1, 32, 128, 512, 2048)
# The largest relative difference of a cell's output tokens from B0's, per (mixture, rate,
# repeat) and class, before the comparison would reward emitting fewer tokens.
MAX_OUTPUT_SHIFT = 0.05


def mean_completed_tokens(metrics: Mapping[str, Any]) -> float | None:
    """Mean output tokens per completed request of a class's metrics; None without one."""
    completed = (metrics.get("counts") or {}).get("completed") or 0
    if not completed or metrics.get("completed_output_tokens") is None:
        return None
    return float(metrics["completed_output_tokens"]) / completed


def stratum_names() -> list[str]:
    names = [f"{lo}-{hi - 1}" for lo, hi in zip(EDGES, EDGES[1:], strict=False)]
    return [*names, f"{EDGES[-1]}+"]


def strata(output_tokens: np.ndarray, e2e_ms: np.ndarray) -> list[dict[str, Any]]:
    """Completed requests by stratum: count, share, mean tokens and E2E p50/p99 (nearest rank)."""
    names = stratum_names()
    total = int(output_tokens.size)
    which = np.searchsorted(np.asarray(EDGES[1:]), output_tokens, side="right")
    out = []
    for i, name in enumerate(names):
        mask = which == i
        n = int(np.count_nonzero(mask))
        e2e = np.sort(e2e_ms[mask])
        out.append(
            {
                "tokens": name,
                "requests": n,
                "share": round(n / total, 6) if total else None,
                "mean_tokens": round(float(output_tokens[mask].mean()), 3) if n else None,
                "e2e_p50_ms": round(float(e2e[max(1, int(np.ceil(0.5 * n))) - 1]), 3) if n else None,
                "e2e_p99_ms": round(float(e2e[max(1, int(np.ceil(0.99 * n))) - 1]), 3) if n else None,
            }
        )
    return out


def stop_reasons_by_cell(
    run_results: Sequence[Mapping[str, Any]], reasons: Mapping[str, Mapping[str, Mapping[str, int]]]
) -> dict[str, dict[str, dict[str, int]]]:
    """cell -> class -> finish_reason -> requests, over the cell's sweep runs
    (``reasons``: run key -> class -> finish_reason, "none" where the stream gave none)."""
    out: dict[str, dict[str, dict[str, int]]] = defaultdict(lambda: defaultdict(dict))
    for r in run_results:
        if r.get("scenario"):
            continue
        for cls, counts in (reasons.get(str(r["key"])) or {}).items():
            into = out[r["cell"]][cls]
            for reason, n in counts.items():
                into[reason] = into.get(reason, 0) + int(n)
    return {cell: {cls: dict(sorted(v.items())) for cls, v in by.items()} for cell, by in out.items()}
