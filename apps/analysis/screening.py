"""What a search's screening run measured (#36 item 2): each class's p99s and the run's
throughput, by the report's own path (metrics.derive, cohort_groups, class_metrics), so a trial's
margin is read the way the verdict reads a cell's. Pure.

apps/analysis/services.screening_measures loads the run's records; apps/search scores them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from apps.analysis import metrics

# The primary metrics a search scores (objective.CONTRACT_OF), from class_metrics' fields.
P99_FIELDS = {"ttft_p99_ms": "ttft_ms", "e2e_p99_ms": "e2e_ms", "max_stall_p99_ms": "max_stall_ms"}


def run_screening_measures(
    *,
    runs: Sequence[Mapping[str, Any]],
    classes: Sequence[Mapping[str, Any]],
    table: Any,
    natural: bool = False,
) -> dict[str, dict[str, Any]]:
    """run key -> ``{"p99s": class -> {primary metric: ms or None}, "throughput_rps": ...}``.

    A censored or missing p99 (too few requests finished to bound it) is None: the search scores
    it as the floor. ``throughput_rps``: requests completed in the window per second."""
    contracts = {str(c["name"]): metrics.Contract.from_mapping(c) for c in classes}
    windows = {str(r["key"]): metrics.run_window(r) for r in runs}
    d = metrics.derive(table, windows, contracts, natural=natural)
    groups = metrics.cohort_groups(d)
    empty = np.zeros(0, dtype=np.int64)
    out: dict[str, dict[str, Any]] = {}
    for key, w in windows.items():
        p99s: dict[str, dict[str, float | None]] = {}
        completed = 0
        for name, contract in contracts.items():
            m = metrics.class_metrics(
                d, groups.get((key, name), empty), contract=contract, observation_s=w.observation_s
            )
            values: dict[str, float | None] = {}
            for metric, field in P99_FIELDS.items():
                value = metrics.pvalue(m[field]["p99"])
                values[metric] = value if np.isfinite(value) else None
            p99s[name] = values
            completed += int(m["counts"]["completed"])
        out[key] = {
            "p99s": p99s,
            "throughput_rps": round(completed / w.observation_s, 6) if w.observation_s > 0 else None,
        }
    return out
