"""The retain / retune / isolate decision from the checks and the paired comparisons. Pure.

Inputs are the report's own parts (the checks of apps/analysis/checks.py and
paired comparisons, see apps/analysis/report.py), so a decision can always be
re-derived from a stored report. Nothing here depends on dict or set
iteration order of the inputs: cells are taken in their plan order, the rest
is sorted, so the same records give the same decision.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from apps.analysis.checks import rounded
from apps.analysis.report_inputs import CellInput
from apps.analysis.report_types import (
    AcceptanceCheck,
    CellAcceptance,
    Comparison,
    ConsideredCandidate,
    Decision,
    DecisionEvidence,
    ValidityCheck,
)

RETAIN, RETUNE, ISOLATE, INCONCLUSIVE = "retain", "retune", "isolate", "inconclusive"
P99_KEYS = {"ttft_ms": "ttft", "e2e_ms": "e2e", "max_stall_ms": "stall"}
# Why an A/A control cell (the spec's ``control: true``) is never the retune.
CONTROL_REASON = (
    "A/A control cell (B0's configuration run again): it measures the noise floor, never recommended"
)

# A (mixture, rate, class, metric or why) a candidate is judged on.
Point = tuple[str, str, str, str]


def _passed(accept: Mapping[str, CellAcceptance], cell: str) -> bool:
    """Acceptance passed the cell (a cell it did not judge did not pass)."""
    entry = accept.get(cell)
    return entry is not None and bool(entry["passed"])


class _Claims(NamedTuple):
    """What a candidate's comparisons at the agreed points show against B0."""

    worse: list[Point]  # a metric materially worse (the uncorrected guard)
    better: list[Point]  # a gain family member materially better
    not_shown: list[Point]  # a class's primary metric not shown non-inferior (or not judgeable)
    unrepaired: list[Point]  # a metric B0 broke that the candidate is not materially better on


def _claims(comps: Sequence[Comparison]) -> _Claims:
    def where(direction: str) -> list[Point]:
        return [
            (c["mixture"], c["rate"], c["class"], m)
            for c in comps
            for m, v in sorted(c["metrics"].items())
            if v["direction"] == direction
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
    return _Claims(worse=where("worse"), better=where("better"), not_shown=not_shown, unrepaired=unrepaired)


def _reasons(
    cell: str,
    claims: _Claims,
    rows: Sequence[Mapping[str, Any]],
    *,
    accept: Mapping[str, CellAcceptance],
    invalid: set[str],
    b0_passes: bool,
) -> list[str]:
    """Step 2: every gate the candidate fails, in the docstring's order (none: eligible)."""
    reasons = []
    if cell in invalid:
        reasons.append("invalid")
    if not _passed(accept, cell):
        reasons.append("breaks a contract")
    if claims.worse:
        reasons.append("a class is materially worse than B0")
    if claims.not_shown:
        reasons.append("not shown non-inferior to B0 on a class's primary metric")
    if b0_passes and not claims.better:
        reasons.append("no material gain")
    if not b0_passes and claims.unrepaired:
        reasons.append("not materially better on what B0 broke")
    reasons.extend(row["reason"] for row in rows)
    return reasons


def _ranking(comps: Sequence[Comparison]) -> tuple[float, float]:
    """Step 3's measures: (the smallest goodput gain relative to B0, the worst p99 ratio
    candidate / B0); -inf and inf where the comparisons give none."""
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
    return (min(gains) if gains else -math.inf, max(ratios) if ratios else math.inf)


def _considered(
    cell: str,
    claims: _Claims,
    reasons: list[str],
    ranking: tuple[float, float],
    rows: Sequence[Mapping[str, Any]],
) -> ConsideredCandidate:
    """The candidate as the decision's evidence shows it (ten of each kind of point at most)."""
    min_gain, worst_ratio = ranking
    return {
        "cell": cell,
        "eligible": not reasons,
        "reasons": reasons,
        "min_goodput_gain": rounded(min_gain),
        "worst_p99_ratio": rounded(worst_ratio),
        "material_better": [list(b) for b in claims.better[:10]],
        "material_worse": [list(w) for w in claims.worse[:10]],
        "not_shown_noninferior": [list(x) for x in claims.not_shown[:10]],
        "not_repaired": [list(x) for x in claims.unrepaired[:10]],
        "rejected_by": [dict(row) for row in rows],
    }


def decide(
    *,
    cells: Sequence[CellInput],
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
    2. Eligible candidates: not an A/A control cell (B0's config run again, the measured noise
       floor: never recommended); valid; every class keeps its contract at every agreed
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
    # A/A control cells (B0's config run again) measure the noise floor: never recommended.
    controls = {c["cell_id"] for c in cells if c.get("control") and c["cell_id"] != baseline}
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
        claims = _claims(comps)
        rows = list((rejected or {}).get(cell) or [])
        reasons = _reasons(cell, claims, rows, accept=accept, invalid=invalid, b0_passes=b0_passes)
        if cell in controls:
            reasons.insert(0, CONTROL_REASON)
        min_gain, worst_ratio = _ranking(comps)
        considered.append(_considered(cell, claims, reasons, (min_gain, worst_ratio), rows))
        if not reasons:
            ranked.append((-min_gain, worst_ratio, pos, cell))
    ranked.sort()
    evidence: DecisionEvidence = {
        "b0_meets_contracts": b0_passes,
        "candidates": considered,
        "b0_failures": accept[baseline]["failures"][:20],
    }
    if ranked:
        return _retune(ranked[0][3], b0_passes=b0_passes, evidence=evidence)
    return _no_candidate(
        baseline,
        [c for c in considered if c["cell"] not in controls],
        accept=accept,
        invalid=invalid,
        b0_passes=b0_passes,
        evidence=evidence,
    )


def _retune(best: str, *, b0_passes: bool, evidence: DecisionEvidence) -> Decision:
    """Step 3: the best eligible candidate, and the rule it was chosen by."""
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


def _no_candidate(
    baseline: str,
    considered: Sequence[ConsideredCandidate],
    *,
    accept: Mapping[str, CellAcceptance],
    invalid: set[str],
    b0_passes: bool,
    evidence: DecisionEvidence,
) -> Decision:
    """Step 4, no candidate eligible: retain when B0 keeps its contracts; else isolate, unless
    cells that keep every contract exist (then a person or a rerun must settle it)."""
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
