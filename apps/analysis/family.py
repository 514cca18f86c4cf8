"""The gain family: which "better" a retune may rest on, with Holm's control over all of them. Pure.

A candidate is adopted on a gain, so the gains are the claims whose false-positive
rate the verdict has to bound. Only a candidate that is valid and passes acceptance
(every class keeps its contract at every agreed point) can be adopted, so only its
gains are claims the verdict rests on: a cell that breaks a contract is left out, and
with it the cells early stopping cut short (apps/analysis/early_stop.py), which is what
makes a stopped sweep reach the full sweep's decision. The family (docs/ANALYSIS.md)
holds, for every such candidate, agreed (mixture, rate) and class with requests there:

1. the class's primary metric at the level it can be judged at (p99, else p95);
2. where B0 breaks a contract there, the metric it broke (ttft, e2e or stall at
   the judged level; an error-rate break maps to the contract share), because a
   candidate that B0's failure would otherwise make a winner must be materially
   better on exactly that.

Holm's step-down over the family's one-sided bootstrap p-values keeps the chance
of any false gain at most ``family_alpha``; a gain also has to exceed the
material thresholds. Every other metric only guards against harm ("worse",
uncorrected, in compare.judge).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from apps.analysis import inference
from apps.analysis.compare_options import PRIMARY_CHOICES, latency_metric, metric_kind
from apps.analysis.report_types import Comparison, FamilySummary

# A contract key B0 broke -> the compared metric kind a candidate must improve.
BROKEN_TO_KIND = {"ttft": "ttft", "e2e": "e2e", "stall": "max_stall", "error_rate": "contract_share"}


def primary_metrics(classes: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Each class's declared primary metric, else by role.

    The short class (fewest input tokens) is judged on TTFT p99, the long class
    (most input tokens) on end-to-end p99, any other on TTFT p99.
    """
    if not classes:
        return {}
    short = min(classes, key=lambda c: (c.get("input_tokens", 0), list(classes).index(c)))["name"]
    long = max(classes, key=lambda c: (c.get("input_tokens", 0), -list(classes).index(c)))["name"]
    out = {}
    for c in classes:
        declared = c.get("primary_metric") or None
        if declared is not None and declared not in PRIMARY_CHOICES:
            raise ValueError(f"class {c['name']}: primary_metric must be one of {', '.join(PRIMARY_CHOICES)}")
        if declared is None:
            declared = "e2e_p99_ms" if (c["name"] == long and long != short) else "ttft_p99_ms"
        out[str(c["name"])] = declared
    return out


def at_level(metric: str, level: str | None) -> str | None:
    """'e2e_p99_ms' judged at p95 -> 'e2e_p95_ms'; None when nothing is judgeable."""
    if level is None:
        return None
    kind = metric_kind(metric)
    return latency_metric(kind, level) if kind else metric


def required_repairs(
    b0_failures: Sequence[Mapping[str, Any]], level: str | None, mixture: str, rate: str, cls: str
) -> list[str]:
    """The compared metrics a candidate must improve because B0 broke them at this point and class."""
    out: list[str] = []
    for f in b0_failures:
        if (f.get("mixture"), f.get("rate"), f.get("class")) != (mixture, rate, cls):
            continue
        for key in f.get("broken") or []:
            kind = BROKEN_TO_KIND.get(key)
            if kind is None:
                continue
            metric = kind if kind == "contract_share" else at_level(latency_metric(kind, "p99"), level)
            if metric and metric not in out:
                out.append(metric)
    return out


def family_size(
    *,
    points: Sequence[tuple[str, str, str, int]],
    candidates: int,
    b0_failures: Sequence[Mapping[str, Any]],
) -> int:
    """Upper bound of the family before the comparisons exist: (mixture, rate, class, n) points."""
    m = 0
    for mix, rate, cls, n in points:
        level = inference.judged_level(n)
        extra = len(required_repairs(b0_failures, level, mix, rate, cls))
        m += candidates * ((1 if level else 0) + extra)
    return m


def apply(
    comparisons: list[Comparison],
    *,
    primary: Mapping[str, str],
    eligible_cells: set[str],
    agreed_pairs: set[tuple[str, str]],
    b0_failures: Sequence[Mapping[str, Any]],
    alpha: float,
) -> FamilySummary:
    """Mark each comparison's primary metric and repairs, run Holm, and set ``direction`` "better".

    Mutates ``comparisons``: each gets ``primary`` (the judged primary metric or
    None), ``repairs`` and, on family members, ``in_family``, ``p_better_adj``.
    Returns the family's summary for the report.
    """
    members: list[tuple[Comparison, str]] = []
    seen: set[tuple[int, str]] = set()
    not_judged: list[str] = []
    for c in comparisons:
        level = c.get("level")
        c["primary"] = at_level(primary.get(c["class"], "ttft_p99_ms"), level)
        c["repairs"] = required_repairs(b0_failures, level, c["mixture"], c["rate"], c["class"])
        if c["cell"] not in eligible_cells or (c["mixture"], c["rate"]) not in agreed_pairs:
            continue
        if c["primary"] is None:
            note = (
                f"not enough requests to judge {c['class']} at {c['mixture']} @ {c['rate']} "
                f"(n={sum(c['requests'])} < {inference.judgeable_n(0.95)}): left out of the gain family"
            )
            if note not in not_judged:
                not_judged.append(note)
        for metric in [c["primary"], *c["repairs"]]:
            if metric is None or metric not in c["metrics"]:
                continue
            if (id(c), metric) in seen or not c["metrics"][metric]["judged"]:
                continue
            seen.add((id(c), metric))
            members.append((c, metric))
    pvalues = [c["metrics"][m]["p_better"] for c, m in members]
    adjusted, rejected = inference.holm(pvalues, alpha)
    gains = 0
    for (c, m), adj, rej in zip(members, adjusted, rejected, strict=True):
        v = c["metrics"][m]
        v["in_family"] = True
        v["p_better_adj"] = float(round(adj, 6))
        if rej and v["improvement"] is not None and v["improvement"] > (v["threshold"] or 0.0):
            v["direction"] = "better"
            v["material"] = True
            gains += 1
    return {
        "alpha": alpha,
        "size": len(members),
        "gains": gains,
        "method": "Holm step-down over one-sided block-bootstrap p-values",
        "not_judged": not_judged,
    }
