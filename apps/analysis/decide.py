"""The retain / retune / isolate decision from the checks and the paired comparisons. Pure.

Inputs are the report's own parts (the checks of apps/analysis/checks.py and
paired comparisons, see apps/analysis/report.py), so a decision can always be
re-derived from a stored report. Nothing here depends on dict or set
iteration order of the inputs: cells are taken in their plan order, the rest
is sorted, so the same records give the same decision.

The checks are importable from here too, as they were before they had their own module.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from apps.analysis.checks import (
    CALIBRATION_SCENARIO,
    NOT_FAILURE_SCENARIOS,
    REHEARSAL_SCENARIO,
    UNIFORM_SCENARIO,
    acceptance_check,
    recovery_check,
    rounded,
    scenario_check,
    validity_check,
)
from apps.analysis.report_types import (
    AcceptanceCheck,
    CellAcceptance,
    Comparison,
    ConsideredCandidate,
    Decision,
    DecisionEvidence,
    ValidityCheck,
)

__all__ = [
    "CALIBRATION_SCENARIO",
    "INCONCLUSIVE",
    "ISOLATE",
    "NOT_FAILURE_SCENARIOS",
    "P99_KEYS",
    "REHEARSAL_SCENARIO",
    "RETAIN",
    "RETUNE",
    "UNIFORM_SCENARIO",
    "acceptance_check",
    "decide",
    "recovery_check",
    "scenario_check",
    "validity_check",
]

RETAIN, RETUNE, ISOLATE, INCONCLUSIVE = "retain", "retune", "isolate", "inconclusive"
P99_KEYS = {"ttft_ms": "ttft", "e2e_ms": "e2e", "max_stall_ms": "stall"}


def _passed(accept: Mapping[str, CellAcceptance], cell: str) -> bool:
    """Acceptance passed the cell (a cell it did not judge did not pass)."""
    entry = accept.get(cell)
    return entry is not None and bool(entry["passed"])


def decide(
    *,
    cells: Sequence[Mapping[str, Any]],
    baseline: str,
    validity: ValidityCheck,
    acceptance: AcceptanceCheck,
    comparisons: Sequence[Comparison],
    agreed: Sequence[tuple[str, str, int]],
    rejected: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
) -> Decision:
    """retain / retune / isolate (or inconclusive when B0 itself is not valid data).

    The comparisons carry the gain family's verdicts (apps/analysis/family.py):
    ``direction`` "better" only on a Holm-significant, material family member.

    1. B0 invalid or incomplete: inconclusive; nothing can be compared.
    2. Eligible candidates: valid; every class keeps its contract at every agreed
       (mixture, rate) (acceptance); no class materially worse than B0 on any
       judged metric there (uncorrected guard); every class's primary metric
       shown non-inferior (the interval's upper end within the margin); and a
       gain: when B0 keeps its contracts, some family member is better; when B0
       breaks them, every metric B0 broke is better (its ``repairs``); and no
       rejecting row of the decision table names it (``rejected``, from
       apps/analysis/rejections.py: short requests wait, preemptions).
    3. Any eligible: retune to the best, ranked by (a) the largest smallest
       goodput gain over agreed (mixture, rate, class), relative to B0, then
       (b) the lowest worst p99 ratio candidate / B0, then (c) plan order.
    4. Else B0 keeps its contracts: retain. Else no configuration does: isolate.
    """
    agreed_pairs = {(m, r) for m, r, _ in agreed}
    accept = acceptance["cells"]
    invalid = set(validity["invalid_cells"])
    if baseline in invalid or baseline not in accept:
        return {
            "outcome": INCONCLUSIVE,
            "chosen_cell": baseline,
            "rule": "B0 has invalid or missing runs: no comparison is possible",
            "evidence": {"problems": [p for p in validity["problems"] if p["cell"] == baseline][:20]},
        }
    b0_passes = accept[baseline]["passed"]
    by_cell: dict[str, list[Comparison]] = defaultdict(list)
    for c in comparisons:
        if (c["mixture"], c["rate"]) in agreed_pairs:
            by_cell[c["cell"]].append(c)

    considered: list[ConsideredCandidate] = []
    ranked = []
    for pos, cell in enumerate(c["cell_id"] for c in cells):
        if cell == baseline:
            continue
        comps = by_cell.get(cell, [])
        worse = [
            (c["mixture"], c["rate"], c["class"], m)
            for c in comps
            for m, v in sorted(c["metrics"].items())
            if v["direction"] == "worse"
        ]
        better = [
            (c["mixture"], c["rate"], c["class"], m)
            for c in comps
            for m, v in sorted(c["metrics"].items())
            if v["direction"] == "better"
        ]
        not_shown = []
        for c in comps:
            primary = c.get("primary")
            if primary is None:
                not_shown.append((c["mixture"], c["rate"], c["class"], "not enough requests to judge"))
            elif not c["metrics"][primary].get("noninferior"):
                not_shown.append((c["mixture"], c["rate"], c["class"], primary))
        unrepaired = [
            (c["mixture"], c["rate"], c["class"], m)
            for c in comps
            for m in c.get("repairs") or []
            if m not in c["metrics"] or c["metrics"][m]["direction"] != "better"
        ]
        reasons = []
        if cell in invalid:
            reasons.append("invalid")
        if not _passed(accept, cell):
            reasons.append("breaks a contract")
        if worse:
            reasons.append("a class is materially worse than B0")
        if not_shown:
            reasons.append("not shown non-inferior to B0 on a class's primary metric")
        if b0_passes and not better:
            reasons.append("no material gain")
        if not b0_passes and unrepaired:
            reasons.append("not materially better on what B0 broke")
        rows = list((rejected or {}).get(cell) or [])
        reasons.extend(row["reason"] for row in rows)
        gains = []
        ratios = []
        for c in comps:
            g = c["metrics"]["goodput_rps"]
            if g["b0"]:
                gains.append((g["candidate"] or 0.0) / g["b0"] - 1.0)
            elif g["candidate"] is not None:
                gains.append(g["candidate"])
            for m in ("ttft_p99_ms", "e2e_p99_ms", "max_stall_p99_ms"):
                v = c["metrics"][m]
                if v["candidate_censored"]:
                    ratios.append(math.inf)
                elif v["b0"] and v["candidate"] is not None:
                    ratios.append(v["candidate"] / v["b0"])
        min_gain = min(gains) if gains else -math.inf
        worst_ratio = max(ratios) if ratios else math.inf
        considered.append(
            {
                "cell": cell,
                "eligible": not reasons,
                "reasons": reasons,
                "min_goodput_gain": rounded(min_gain),
                "worst_p99_ratio": rounded(worst_ratio),
                "material_better": [list(b) for b in better[:10]],
                "material_worse": [list(w) for w in worse[:10]],
                "not_shown_noninferior": [list(x) for x in not_shown[:10]],
                "not_repaired": [list(x) for x in unrepaired[:10]],
                "rejected_by": [dict(row) for row in rows],
            }
        )
        if not reasons:
            ranked.append((-min_gain, worst_ratio, pos, cell))
    ranked.sort()
    evidence: DecisionEvidence = {
        "b0_meets_contracts": b0_passes,
        "candidates": considered,
        "b0_failures": accept[baseline]["failures"][:20],
    }
    if ranked:
        best = ranked[0][3]
        rule = (
            "best candidate that keeps every class contract at every agreed rate and mixture, with a "
            "material gain on a primary metric (family-wise controlled), every class non-inferior and "
            "no class materially worse than B0 "
            "(ranked by smallest goodput gain, then worst p99 ratio, then plan order)"
        )
        if not b0_passes:
            rule = (
                "B0 breaks a class contract; best candidate that keeps every contract at every agreed rate "
                "and mixture, is materially better on what B0 broke and no class materially worse than B0"
            )
        return {"outcome": RETUNE, "chosen_cell": best, "rule": rule, "evidence": evidence}
    if b0_passes:
        return {
            "outcome": RETAIN,
            "chosen_cell": baseline,
            "rule": "B0 keeps every class contract and no candidate passes every gate with a material gain",
            "evidence": evidence,
        }
    passing = [c["cell"] for c in considered if c["cell"] not in invalid and _passed(accept, c["cell"])]
    passing_invalid = [c["cell"] for c in considered if c["cell"] in invalid and _passed(accept, c["cell"])]
    if not passing and passing_invalid:
        # Cells that keep every contract exist but their runs are not comparable data:
        # a fixed rerun would settle it, separate capacity would not.
        return {
            "outcome": INCONCLUSIVE,
            "chosen_cell": baseline,
            "rule": "B0 breaks a contract; the only cells that keep every contract have invalid runs: "
            "rerun them before deciding",
            "evidence": {**evidence, "passing_invalid": passing_invalid},
        }
    if passing:
        # Contracts are kept somewhere, so isolation is not called for, yet the
        # candidates that keep them are materially worse than B0 elsewhere.
        return {
            "outcome": INCONCLUSIVE,
            "chosen_cell": baseline,
            "rule": "B0 breaks a contract; the candidates that keep every contract are materially worse "
            "than B0 on some class: a person must weigh it",
            "evidence": {**evidence, "passing": passing},
        }
    return {
        "outcome": ISOLATE,
        "chosen_cell": baseline,
        "rule": "no configuration keeps every class's contract on shared capacity: separate the classes "
        "with admission control or capacity",
        "evidence": evidence,
    }
