"""The decision table's advisory rows (docs/ANALYSIS.md "Findings"): one function per finding,
in a registry, each returning the evidence that makes it fire (empty: it does not). Pure.

Two rows also reject candidates; those gates live in apps/analysis/rejections.py, which the
decision reads. Comparisons of invalid cells feed no finding: their requests are not paired with
B0's (another trace, a missing run), so neither a "better" nor a "worse" of theirs is evidence.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from apps.analysis.metrics import pvalue
from apps.analysis.report_types import Comparison, Finding, FindingText

FINDINGS: dict[str, FindingText] = {
    "stall_during_prefill": {
        "title": "streams stall while prefill advances",
        "suggests": "a lower token budget; reject it if long-class TTFT or goodput then breaks its contract",
    },
    "short_requests_wait": {
        "title": "new short requests wait while streams are healthy",
        "suggests": "bounded ingress, verified priority, or isolation; a lower budget alone is not fairness",
    },
    "preemptions_rise_with_max_num_seqs": {
        "title": "preemptions rise with the sequence limit",
        "suggests": "fewer simultaneous sequences; reject configs that fit memory only by recomputing",
    },
    "throughput_up_class_loses": {
        "title": "aggregate throughput rises while one class loses",
        "suggests": "reject that candidate; retain B0 or change capacity",
    },
    "long_requests_never_finish": {
        "title": "long requests never finish under stress",
        "suggests": "bound waiting and reserve capacity",
    },
    "no_material_gain": {
        "title": "no material gain",
        "suggests": "keep the simpler baseline",
    },
    "tail_bound": {
        "title": "what bounds each class's tail: queue, prefill or decode",
        "suggests": "the knobs of its bound: the token budget and chunked prefill for prefill and "
        "long-prefill stalls, max_num_seqs and the KV cache for decode, the scheduling policy, bounded "
        "ingress or isolation for a queue",
    },
    "b0_overloaded": {
        "title": "B0 is overloaded: arrivals outrun completions through the window",
        "suggests": "calibrate and rerun at a fraction of B0's capacity; until then read what queueing "
        "does not drive: each class's max stall and inter-token latency once served",
    },
}

LAST = 1 << 30


def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(round(x, 6))


def class_roles(classes: Sequence[Mapping[str, Any]]) -> tuple[str | None, str | None]:
    """The short class has the fewest input tokens, the long class the most (ties: list order)."""
    if not classes:
        return None, None
    short = min(classes, key=lambda c: (c.get("input_tokens", 0), classes.index(c)))
    long = max(classes, key=lambda c: (c.get("input_tokens", 0), -classes.index(c)))
    return short["name"], long["name"]


@dataclass(frozen=True)
class Sweep:
    """What every finding reads: the report's pieces, indexed once."""

    cells: Sequence[Mapping[str, Any]]
    baseline: str
    run_results: Sequence[Mapping[str, Any]]
    comparisons: Sequence[Comparison]
    stall_ratio: float
    short: str | None
    long: str | None
    contracts: Mapping[str, Mapping[str, Any]]
    # (cell, mixture, rate, class) -> pooled metrics; (cell, mixture, rate) in plan order.
    agg: Mapping[tuple[str, str, str, str], Mapping[str, Any]]
    keys: Sequence[tuple[str, str, str]]
    order: Mapping[str, int]
    # Each class's diagnosis at the agreed points (apps/analysis/tail_bound.py), valid cells only.
    tail_bounds: Sequence[Mapping[str, Any]] = ()
    overload: Sequence[Mapping[str, Any]] = ()  # B0's load per point (apps/analysis/overload.py)

    def offered(self, cell: str, mix: str, rate: str, name: str | None) -> int:
        m = self.agg.get((cell, mix, rate, name)) if name is not None else None
        return m["counts"]["offered"] if m else 0

    def next_to_long(self) -> list[tuple[str, str, str, Mapping[str, Any]]]:
        """(cell, mixture, rate, short-class metrics) where short and long traffic both ran."""
        if self.short is None or self.long is None or self.short == self.long:
            return []
        out = []
        for cell, mix, rate in self.keys:
            s = self.agg.get((cell, mix, rate, self.short))
            if s is None or s["counts"]["offered"] == 0 or self.offered(cell, mix, rate, self.long) == 0:
                continue
            out.append((cell, mix, rate, s))
        return out


def stall_during_prefill(sw: Sweep) -> list[dict[str, Any]]:
    """Next to long traffic, the short class's max-stall p99 breaks its limit where the same cell
    and rate without long traffic does not (or there is none), or grows ``stall_ratio`` over it."""
    evidence = []
    for cell, mix, rate, s in sw.next_to_long():
        limit = sw.contracts[str(sw.short)]["max_stall_ms"]
        ref_mix = next(
            (
                k[1]
                for k in sw.keys
                if k[0] == cell
                and k[2] == rate
                and sw.offered(cell, k[1], rate, sw.short) > 0
                and sw.offered(cell, k[1], rate, sw.long) == 0
            ),
            None,
        )
        ref = sw.agg.get((cell, ref_mix, rate, str(sw.short))) if ref_mix else None
        stall = pvalue(s["max_stall_ms"]["p99"])
        ref_stall = pvalue(ref["max_stall_ms"]["p99"]) if ref else None
        breaks = stall > limit
        ref_breaks = ref_stall is not None and ref_stall > limit
        grew = ref_stall is not None and ref_stall > 0 and stall >= sw.stall_ratio * ref_stall
        if (breaks and not ref_breaks) or grew:
            lg = sw.agg[(cell, mix, rate, str(sw.long))]
            evidence.append(
                {
                    "cell": cell,
                    "mixture": mix,
                    "rate": rate,
                    "short_max_stall_p99": s["max_stall_ms"]["p99"],
                    "limit_ms": limit,
                    "short_itl_p99_ms": s["itl_ms"]["p99"],
                    "short_only_mixture": ref_mix,
                    "short_only_max_stall_p99": ref["max_stall_ms"]["p99"] if ref else None,
                    "long_ttft_p99": lg["ttft_ms"]["p99"],
                    "long_goodput_rps": lg["goodput_rps"],
                }
            )
    return evidence


def short_requests_wait(sw: Sweep) -> list[dict[str, Any]]:
    """Next to long traffic, short TTFT p99 breaks its limit while the short max stall keeps its."""
    evidence = []
    for cell, mix, rate, s in sw.next_to_long():
        sc = sw.contracts[str(sw.short)]
        if (
            pvalue(s["ttft_ms"]["p99"]) > sc["ttft_p99_ms"]
            and pvalue(s["max_stall_ms"]["p99"]) <= sc["max_stall_ms"]
        ):
            evidence.append(
                {
                    "cell": cell,
                    "mixture": mix,
                    "rate": rate,
                    "short_ttft_p99": s["ttft_ms"]["p99"],
                    "limit_ms": sc["ttft_p99_ms"],
                    "short_oldest_queue_age_ms": s["oldest_queue_age_ms"],
                    "short_max_stall_p99": s["max_stall_ms"]["p99"],
                    "short_itl_p99_ms": s["itl_ms"]["p99"],
                }
            )
    return evidence


def preemptions_rise_with_max_num_seqs(sw: Sweep) -> list[dict[str, Any]]:
    """Among cells that differ only in ``max_num_seqs``, pairs where more sequences gave more
    preemptions per run outnumber the opposite."""
    preempt: dict[str, list[float]] = defaultdict(list)
    for r in sw.run_results:
        p = (r.get("server") or {}).get("counters", {}).get("preemptions")
        if not r.get("scenario") and r["status"] == "done" and p is not None:
            preempt[r["cell"]].append(float(p))
    points = []
    for c in sw.cells:
        seqs = (c.get("args") or {}).get("max_num_seqs")
        if seqs is not None and preempt.get(c["cell_id"]):
            rest = {k: v for k, v in sorted((c.get("args") or {}).items()) if k != "max_num_seqs"}
            vals = preempt[c["cell_id"]]
            points.append((repr(rest), int(seqs), sum(vals) / len(vals), c["cell_id"]))
    rising = falling = 0
    for a in points:
        for b in points:
            if a[0] == b[0] and a[1] < b[1]:
                rising += b[2] > a[2]
                falling += b[2] < a[2]
    if not (rising > falling and rising > 0):
        return []
    return [
        {"cell": cid, "max_num_seqs": seqs, "mean_preemptions_per_run": _num(mean)}
        for _, seqs, mean, cid in sorted(points, key=lambda p: (p[0], p[1], sw.order[p[3]]))
    ] + [{"pairs_rising": rising, "pairs_falling": falling}]


def throughput_up_class_loses(sw: Sweep) -> list[dict[str, Any]]:
    """A candidate's output tokens/s is above B0's at a (mixture, rate) while a class is
    materially worse there."""
    evidence = []
    by_pair: dict[tuple[str, str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for cmp in sw.comparisons:
        by_pair[(cmp["cell"], cmp["mixture"], cmp["rate"])].append(cmp)

    def tput(c: str, mix: str, rate: str) -> float:
        ms = [sw.agg[k] for k in sw.agg if k[0] == c and k[1] == mix and k[2] == rate]
        return sum(m["output_tokens"] for m in ms) / max(1e-9, ms[0]["observation_s"]) if ms else 0.0

    for cell, mix, rate in sorted(by_pair, key=lambda k: (sw.order.get(k[0], LAST), k[1], k[2])):
        cand_t, base_t = tput(cell, mix, rate), tput(sw.baseline, mix, rate)
        if base_t <= 0 or cand_t <= base_t:
            continue
        losses = [
            {
                "class": cmp["class"],
                "metric": m,
                "b0": v["b0"],
                "candidate": v["candidate"],
                "diff": v["diff"],
                "ci": v["ci"],
            }
            for cmp in sorted(by_pair[(cell, mix, rate)], key=lambda x: x["class"])
            for m, v in sorted(cmp["metrics"].items())
            if v["direction"] == "worse"
        ]
        if losses:
            evidence.append(
                {
                    "cell": cell,
                    "mixture": mix,
                    "rate": rate,
                    "tokens_per_s": _num(cand_t),
                    "b0_tokens_per_s": _num(base_t),
                    "losses": losses,
                }
            )
    return evidence


def long_requests_never_finish(sw: Sweep) -> list[dict[str, Any]]:
    """A done run has unfinished long-class requests at the drain deadline."""
    if sw.long is None:
        return []
    evidence = []
    runs = sorted(
        sw.run_results,
        key=lambda r: (
            sw.order.get(r["cell"], LAST),
            r["mixture"],
            r["rate"],
            int(r["repeat"]),
            r.get("scenario") or "",
            r["key"],
        ),
    )
    for r in runs:
        m = r["classes"].get(sw.long)
        if r["status"] == "done" and m and m["counts"]["unfinished"] > 0:
            evidence.append(
                {
                    "cell": r["cell"],
                    "mixture": r["mixture"],
                    "rate": r["rate"],
                    "repeat": r["repeat"],
                    "scenario": r.get("scenario") or "",
                    "class": sw.long,
                    "unfinished": m["counts"]["unfinished"],
                    "offered": m["counts"]["offered"],
                    "still_waiting": m["counts"]["still_waiting"],
                    "e2e_p99": m["e2e_ms"]["p99"],
                }
            )
    return evidence


def no_material_gain(sw: Sweep) -> list[dict[str, Any]]:
    """No comparison shows a material improvement: the largest differences against their
    thresholds, with the repeats' spread."""
    comparisons = sw.comparisons
    if not comparisons or any(v["direction"] == "better" for c in comparisons for v in c["metrics"].values()):
        return []
    largest = [
        (abs(v["diff"]) / v["threshold"], c["cell"], c["mixture"], c["rate"], c["class"], m, v)
        for c in comparisons
        for m, v in sorted(c["metrics"].items())
        if v["diff"] is not None and v["threshold"]
    ]
    largest.sort(key=lambda x: (-x[0], sw.order.get(x[1], LAST), x[2], x[3], x[4], x[5]))
    evidence: list[dict[str, Any]] = [{"comparisons": len(comparisons), "material_better": 0}]
    for ratio, cell, mix, rate, cls, m, v in largest[:5]:
        evidence.append(
            {
                "cell": cell,
                "mixture": mix,
                "rate": rate,
                "class": cls,
                "metric": m,
                "diff": v["diff"],
                "ci": v["ci"],
                "threshold": v["threshold"],
                "repeat_std": v["repeat_std"],
                "diff_over_threshold": _num(ratio),
            }
        )
    return evidence


def tail_bound(sw: Sweep) -> list[dict[str, Any]]:
    """Each class's tail at each agreed point of each valid cell, where a bound could be named:
    queue, prefill, decode or outside the engine, with its shares and the knobs for it."""
    return [
        {
            "cell": t["cell"],
            "mixture": t["mixture"],
            "rate": t["rate"],
            "class": t["class"],
            "tail": t["tail"],
            "bound": t["bound"],
            "cause": t["cause"],
            "per_request": t["per_request"],
            "queue_share": t["shares"].get("queue"),
            "prefill_share": t["shares"].get("prefill"),
            "decode_share": t["shares"].get("decode"),
            "knobs": ", ".join(t["knobs"]),
        }
        for t in sw.tail_bounds
        if t["bound"] != "unknown" and t["cell"] in sw.order
    ]


# Under overload TTFT and end-to-end latency measure the queue; these do not (a stream's gaps and
# its tokens' pace once it is served): the signal underneath (docs/ANALYSIS.md "Overload").
UNDER_THE_QUEUE = (("max_stall_ms", "p99"), ("itl_ms", "p99"))


def b0_overloaded(sw: Sweep) -> list[dict[str, Any]]:
    """B0 fell behind its arrivals at a point (more than half its runs there): the point's load,
    then per class and cell what queueing does not drive, against B0's (max stall and ITL p99)."""
    evidence: list[dict[str, Any]] = []
    for p in sw.overload:
        if not p.get("overloaded"):
            continue
        mix, rate = p["mixture"], p["rate"]
        evidence.append(
            {
                k: p.get(k)
                for k in (
                    "mixture",
                    "rate",
                    "offered_rps",
                    "arrivals_rps",
                    "completions_rps",
                    "queue_growth_rps",
                    "waiting_growth_rps",
                    "capacity_rps",
                    "offered_over_capacity",
                )
            }
        )
        names = sorted({k[3] for k in sw.agg if k[1] == mix and k[2] == rate})
        for cell, _, _ in [k for k in sw.keys if k[1] == mix and k[2] == rate]:
            for name in names:
                m, b0 = sw.agg.get((cell, mix, rate, name)), sw.agg.get((sw.baseline, mix, rate, name))
                if not m or not b0 or not m["counts"]["offered"]:
                    continue
                row: dict[str, Any] = {"cell": cell, "mixture": mix, "rate": rate, "class": name}
                for metric, q in UNDER_THE_QUEUE:
                    row[f"{metric[:-3]}_{q}"] = m[metric][q]
                    if cell != sw.baseline:
                        row[f"b0_{metric[:-3]}_{q}"] = b0[metric][q]
                if cell != sw.baseline:
                    row["compared"] = _compared(sw, cell, mix, rate, name)
                evidence.append(row)
    return evidence


def _compared(sw: Sweep, cell: str, mix: str, rate: str, name: str) -> dict[str, dict[str, Any]]:
    """The paired comparison's difference from B0 on the judged stall and inter-token metrics,
    with its interval (a candidate that breaks a contract is never "better", so the interval
    is what shows the difference)."""
    for c in sw.comparisons:
        if (c["cell"], c["mixture"], c["rate"], c["class"]) == (cell, mix, rate, name):
            return {
                m: {"diff": v["diff"], "ci": v["ci"], "direction": v["direction"]}
                for m, v in sorted(c["metrics"].items())
                if m.startswith(("max_stall_", "itl_")) and v["judged"]
            }
    return {}


# Every finding, in the order the report lists them.
REGISTRY: dict[str, Callable[[Sweep], list[dict[str, Any]]]] = {
    "stall_during_prefill": stall_during_prefill,
    "short_requests_wait": short_requests_wait,
    "preemptions_rise_with_max_num_seqs": preemptions_rise_with_max_num_seqs,
    "throughput_up_class_loses": throughput_up_class_loses,
    "long_requests_never_finish": long_requests_never_finish,
    "no_material_gain": no_material_gain,
    "tail_bound": tail_bound,
    "b0_overloaded": b0_overloaded,
}


def findings(
    *,
    cells: Sequence[Mapping[str, Any]],
    classes: Sequence[Mapping[str, Any]],
    baseline: str,
    run_results: Sequence[Mapping[str, Any]],
    aggregates: Sequence[Mapping[str, Any]],
    comparisons: Sequence[Comparison],
    stall_ratio: float = 2.0,
    invalid_cells: Sequence[str] = (),
    tail_bounds: Sequence[Mapping[str, Any]] = (),
    overload: Sequence[Mapping[str, Any]] = (),
) -> list[Finding]:
    """Every finding that fires, each with its title, what it suggests, its evidence and cells."""
    order = {c["cell_id"]: i for i, c in enumerate(cells)}
    short, long = class_roles(classes)
    sweep = Sweep(
        cells=cells,
        baseline=baseline,
        run_results=run_results,
        comparisons=[c for c in comparisons if c["cell"] not in set(invalid_cells)],
        stall_ratio=stall_ratio,
        short=short,
        long=long,
        contracts={c["name"]: c for c in classes},
        agg={(a["cell"], a["mixture"], a["rate"], a["class"]): a["pooled"] for a in aggregates},
        keys=sorted(
            {(a["cell"], a["mixture"], a["rate"]) for a in aggregates},
            key=lambda k: (order.get(k[0], LAST), k[1], k[2]),
        ),
        order=order,
        tail_bounds=[t for t in tail_bounds if t["cell"] not in set(invalid_cells)],
        overload=overload,
    )
    out: list[Finding] = []
    for fid, check in REGISTRY.items():
        evidence = check(sweep)
        if evidence:
            cells_named = {e["cell"] for e in evidence if "cell" in e}
            out.append(
                {
                    "id": fid,
                    **FINDINGS[fid],
                    "evidence": evidence,
                    "cells": sorted(cells_named, key=lambda c: order.get(c, LAST)),
                }
            )
    return out
