"""The decision table's two rejecting rows, as gates the decision reads (docs/ANALYSIS.md).

Pure: computed from the pooled aggregates and the run results before the decision, which
makes every cell named here ineligible with the row's reason.

- ``short_requests_wait``: a candidate that lowers B0's token budget
  (``max_num_batched_tokens``) while, next to long traffic at an agreed point, the short
  class's TTFT p99 still breaks its contract and its streams are healthy (max stall within its
  limit). New short requests wait in the queue; a lower budget alone is not fairness.
- ``preemptions``: a candidate whose done sweep runs at the agreed points preempt more than
  ``max_preemption_share`` of their requests (each whole run's preemptions, warm-up and drain
  included, over the requests of its measured window, pooled: a share on the high side): it
  fits memory only by preempting and recomputing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from apps.analysis.findings import class_roles
from apps.analysis.metrics import pvalue

# A candidate preempting more than 1 request in 100 (pooled over its runs at the agreed
# points) fits memory only by recomputing. Preemption means a sequence's KV cache was freed
# and is recomputed: once in a hundred requests is already a full extra prefill per hundred.
MAX_PREEMPTION_SHARE = 0.01


def _budget(cell: Mapping[str, Any]) -> float | None:
    value = (cell.get("args") or {}).get("max_num_batched_tokens")
    return float(value) if value is not None else None


def rejections(
    *,
    cells: Sequence[Mapping[str, Any]],
    classes: Sequence[Mapping[str, Any]],
    baseline: str,
    aggregates: Sequence[Mapping[str, Any]],
    run_results: Sequence[Mapping[str, Any]],
    agreed: Sequence[tuple[str, str, int]],
    max_preemption_share: float = MAX_PREEMPTION_SHARE,
) -> dict[str, list[dict[str, Any]]]:
    """cell -> the rows that reject it, each ``{"id", "reason", ...numbers}``; B0 is never rejected."""
    points = {(m, r) for m, r, _ in agreed}
    out: dict[str, list[dict[str, Any]]] = {}
    by_id = {c["cell_id"]: c for c in cells}
    b0_budget = _budget(by_id[baseline]) if baseline in by_id else None
    short, long = class_roles(classes)
    contracts = {c["name"]: c for c in classes}
    agg = {(a["cell"], a["mixture"], a["rate"], a["class"]): a["pooled"] for a in aggregates}

    for cell in (c["cell_id"] for c in cells):
        if cell == baseline:
            continue
        budget = _budget(by_id[cell])
        if short and long and short != long and budget is not None and b0_budget is not None:
            if budget < b0_budget:
                for mix, rate in sorted(points):
                    s = agg.get((cell, mix, rate, short))
                    lg = agg.get((cell, mix, rate, long))
                    if not s or not lg or not s["counts"]["offered"] or not lg["counts"]["offered"]:
                        continue
                    limit, stall_limit = contracts[short]["ttft_p99_ms"], contracts[short]["max_stall_ms"]
                    ttft, stall = pvalue(s["ttft_ms"]["p99"]), pvalue(s["max_stall_ms"]["p99"])
                    if ttft > limit and stall <= stall_limit:
                        shown = s["ttft_ms"]["p99"].get("ms") or s["ttft_ms"]["p99"].get("above_ms")
                        out.setdefault(cell, []).append(
                            {
                                "id": "short_requests_wait",
                                "reason": (
                                    f"new short requests wait: {short} TTFT p99 {shown} ms > {limit:g} ms "
                                    f"at {mix} @ {rate} while its streams are healthy, with a lower token "
                                    f"budget than B0 ({budget:g} < {b0_budget:g}): a lower budget alone "
                                    "is not fairness"
                                ),
                                "mixture": mix,
                                "rate": rate,
                                "short_ttft_p99": s["ttft_ms"]["p99"],
                                "limit_ms": limit,
                                "max_num_batched_tokens": budget,
                                "b0_max_num_batched_tokens": b0_budget,
                            }
                        )
                        break

        preempted = requests = 0.0
        runs = 0
        for r in run_results:
            if r["cell"] != cell or r.get("scenario") or r["status"] != "done":
                continue
            if (r["mixture"], r["rate"]) not in points:
                continue
            p = ((r.get("server") or {}).get("counters") or {}).get("preemptions")
            if p is None:
                continue
            runs += 1
            preempted += float(p)
            requests += sum(m["counts"]["offered"] for m in r["classes"].values())
        if runs and requests and preempted / requests > max_preemption_share:
            share = preempted / requests
            out.setdefault(cell, []).append(
                {
                    "id": "preemptions",
                    "reason": (
                        f"fits memory only by preempting: {preempted / runs:.1f} preemptions per run, "
                        f"{share:.1%} of its requests > {max_preemption_share:.1%}"
                    ),
                    "preemptions_per_run": round(preempted / runs, 3),
                    "preemption_share": round(share, 6),
                    "max_preemption_share": max_preemption_share,
                    "runs": runs,
                }
            )
    return out
