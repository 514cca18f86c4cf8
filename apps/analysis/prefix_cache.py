"""The prefix cache's hit rate beside the latency, and whether a gain came from the cache or the
scheduler. Pure.

vLLM counts, per server, the prompt tokens it looked up in its prefix cache and those it found
(``vllm:prefix_cache_queries`` and ``_hits``, scraped; deltas per run, apps/analysis/server_metrics.py).
The counters are the server's, not a request's: every class of the run and the trace's warm-up
requests together. So:

1. Per cell: is prefix caching on? The runs' effective arguments (what the engine confirmed),
   else the experiment's controls (a frozen control: every cell has the same), else unknown.
2. Per (cell, mixture, rate): the hit rate pooled over the point's done sweep runs (hits / queries,
   both summed), beside each class's TTFT p50/p99. It is attributed to a class only where that
   class was the mixture's only traffic; otherwise it is the run's, shared by the classes named.
3. Per material latency gain of a candidate over B0 (a comparison ``better`` on a TTFT or
   end-to-end metric): the two hit rates at that point. A candidate whose hit rate is higher by
   at least ``CACHE_DIFF`` may owe the gain to the cache (more reuse, less prefill), not to the
   scheduler; within it, the cache hit alike and the gain is the scheduler's. Where the TTFT split
   is per request (apps/analysis/ttft_parts.py), the p50 requests' prefill is shown beside it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from apps.analysis.report_inputs import ExperimentInput
from apps.analysis.report_types import Aggregate, Comparison, RunResult, TtftPartsRow

# Hit rates (shares of prompt tokens) this far apart are a different cache behaviour.
CACHE_DIFF = 0.05
LATENCY_PREFIXES = ("ttft_", "e2e_")


def _truthy(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
        return value.lower() in ("true", "1")
    return None


def cell_enabled(
    cell: str, runs: Sequence[RunResult], experiment: ExperimentInput
) -> tuple[bool | None, str]:
    """Step 1: (on, from where) for one cell."""
    for r in runs:
        if r["cell"] != cell:
            continue
        args = r.get("effective_args")
        if isinstance(args, Mapping):
            on = _truthy(args.get("enable_prefix_caching"))
            if on is not None:
                return on, "the engine's effective arguments"
    on = experiment.get("enable_prefix_caching")
    if isinstance(on, bool):
        return on, "the experiment's controls"
    return None, "unknown"


def _rate(hits: float | None, queries: float | None) -> float | None:
    if hits is None or not queries:
        return None
    return round(hits / queries, 4)


def _point_counts(runs: Sequence[RunResult]) -> tuple[float | None, float | None]:
    hits = [(r["server"].get("counters") or {}).get("prefix_cache_hits") for r in runs]
    queries = [(r["server"].get("counters") or {}).get("prefix_cache_queries") for r in runs]
    if all(h is None for h in hits) or all(q is None for q in queries):
        return None, None
    return sum(float(h or 0) for h in hits), sum(float(q or 0) for q in queries)


def prefix_cache(
    *,
    experiment: ExperimentInput,
    cell_ids: Sequence[str],
    baseline: str,
    run_results: Sequence[RunResult],
    aggregates: Sequence[Aggregate],
    comparisons: Sequence[Comparison],
    parts_rows: Sequence[TtftPartsRow] = (),
) -> dict[str, Any]:
    """Steps 1-3: the cells with prefix caching, each point's hit rate, and each gain's source."""
    sweep = [r for r in run_results if r["status"] == "done" and not r["scenario"]]
    cells = []
    for cid in cell_ids:
        on, source = cell_enabled(cid, sweep, experiment)
        cells.append({"cell": cid, "enabled": on, "from": source})
    on_cells = {c["cell"] for c in cells if c["enabled"]}
    if not on_cells:
        return {
            "enabled": False,
            "cells": cells,
            "rows": [],
            "gains": [],
            "note": "prefix caching is off or unknown in every cell",
        }
    by_point: dict[tuple[str, str, str], list[Aggregate]] = {}
    for a in aggregates:
        by_point.setdefault((a["cell"], a["mixture"], a["rate"]), []).append(a)
    rows = []
    hit_rate: dict[tuple[str, str, str], float | None] = {}
    for (cell, mixture, rate), aggs in sorted(
        by_point.items(), key=lambda kv: (list(cell_ids).index(kv[0][0]), kv[0][1], kv[0][2])
    ):
        runs = [r for r in sweep if (r["cell"], r["mixture"], r["rate"]) == (cell, mixture, rate)]
        hits, queries = _point_counts(runs)
        rate_ = _rate(hits, queries) if cell in on_cells else None
        hit_rate[(cell, mixture, rate)] = rate_
        present = [a["class"] for a in aggs if a["pooled"]["counts"]["offered"] > 0]
        only = present[0] if len(present) == 1 else None
        rows.append(
            {
                "cell": cell,
                "mixture": mixture,
                "rate": rate,
                "enabled": cell in on_cells,
                "runs": len(runs),
                "hits_tokens": hits,
                "queries_tokens": queries,
                "hit_rate": rate_,
                "per": "class" if only else "run",
                "class": only,
                "note": (
                    f"the {only} class was the only traffic: the server's hit rate is the class's"
                    if only
                    else "vLLM counts the server's hits, not a class's: shared by " + ", ".join(present)
                ),
                "classes": [
                    {
                        "class": a["class"],
                        "ttft_p50": a["pooled"]["ttft_ms"]["p50"],
                        "ttft_p99": a["pooled"]["ttft_ms"]["p99"],
                        "e2e_p99": a["pooled"]["e2e_ms"]["p99"],
                    }
                    for a in aggs
                    if a["pooled"]["counts"]["offered"] > 0
                ],
            }
        )
    return {
        "enabled": True,
        "cells": cells,
        "rows": rows,
        "gains": _gains(comparisons, hit_rate, baseline, parts_rows),
        "note": "hit rates are prompt tokens found in the cache over those looked up, per server and run "
        "(every class and the trace's warm-up requests together)",
    }


def _gains(
    comparisons: Sequence[Comparison],
    hit_rate: Mapping[tuple[str, str, str], float | None],
    baseline: str,
    parts_rows: Sequence[TtftPartsRow],
) -> list[dict[str, Any]]:
    """Step 3: each material latency gain with the hit rates on both sides, and its likely source."""
    prefill = {
        (p["cell"], p["mixture"], p["rate"], p["class"]): ((p["p50"].get("parts") or {}).get("prefill_ms"))
        for p in parts_rows
        if p["per_request"]
    }
    out = []
    for c in comparisons:
        for metric, v in sorted(c["metrics"].items()):
            if not metric.startswith(LATENCY_PREFIXES) or v["direction"] != "better":
                continue
            point = (c["mixture"], c["rate"])
            mine, b0 = hit_rate.get((c["cell"], *point)), hit_rate.get((baseline, *point))
            if mine is None or b0 is None:
                source, why = (
                    "unknown",
                    "a hit rate is unknown on one side (caching off or counters not scraped)",
                )
            elif mine - b0 >= CACHE_DIFF:
                source = "cache"
                why = (
                    f"{c['cell']} found {mine:.0%} of prompt tokens in the prefix cache against B0's {b0:.0%}: "
                    "the gain may come from the cache (less prefill), not the scheduler"
                )
            else:
                source = "scheduler"
                why = f"the cache hit alike ({mine:.0%} against B0's {b0:.0%}): the gain is not the cache's"
            out.append(
                {
                    "cell": c["cell"],
                    "mixture": c["mixture"],
                    "rate": c["rate"],
                    "class": c["class"],
                    "metric": metric,
                    "diff": v["diff"],
                    "hit_rate": mine,
                    "b0_hit_rate": b0,
                    "p50_prefill_ms": prefill.get((c["cell"], *point, c["class"])),
                    "b0_p50_prefill_ms": prefill.get((baseline, *point, c["class"])),
                    "source": source,
                    "why": why,
                }
            )
    return out
