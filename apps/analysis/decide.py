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

from apps.analysis import rule_text
from apps.analysis.checks import rounded
from apps.analysis.compare_options import metric_kind
from apps.analysis.report_inputs import CellInput, ClassInput
from apps.analysis.report_types import (
    AcceptanceCheck,
    CellAcceptance,
    Comparison,
    ConsideredCandidate,
    Decision,
    DecisionEvidence,
    ValidityCheck,
)
from apps.analysis.settle import Design
from apps.search.objective import class_margin

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


B0_KEY = "\x00b0"
# A primary metric's kind -> the contract key that limits it.
_LIMIT_OF = {"ttft": "ttft_p99_ms", "e2e": "e2e_p99_ms", "max_stall": "max_stall_ms"}


def confirmed_margins(
    comparisons: Sequence[Comparison], classes: Sequence[ClassInput], agreed_pairs: set[tuple[str, str]]
) -> dict[str, float]:
    """Each cell's worst class margin ``(limit - value) / limit`` on its primary metric over the
    agreed points, and B0's, from the same comparisons' B0 side, under ``B0_KEY`` (no cell id can
    hold a NUL). A value missing is the floor, -1."""
    limits = {str(c["name"]): c for c in classes}
    out: dict[str, float] = {}
    b0 = math.inf
    for c in comparisons:
        primary = c.get("primary")
        cls = limits.get(c["class"])
        kind = metric_kind(primary) if primary else None
        if (c["mixture"], c["rate"]) not in agreed_pairs or cls is None or kind is None or primary is None:
            continue
        limit = float(cls[_LIMIT_OF[kind]])  # type: ignore[literal-required]
        v = c["metrics"][primary]
        out[c["cell"]] = min(out.get(c["cell"], math.inf), class_margin(v.get("candidate"), limit))
        b0 = min(b0, class_margin(v.get("b0"), limit))
    if b0 != math.inf:
        out[B0_KEY] = b0
    return out


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
    classes: Sequence[ClassInput] = (),
    designs: Mapping[tuple[str, str, str, str], Design] | None = None,
    margin_rel: float | None = None,
    overload: Sequence[Mapping[str, Any]] = (),
    by_margin: bool = False,
) -> Decision:
    """retain / retune / isolate (or inconclusive when B0 itself is not valid data).

    The ``rule`` says why in words built from the evidence that decided (apps/analysis/rule_text.py):
    the contracts B0 broke with their values and limits, each candidate's blocking reasons with
    their numbers, and, for a comparison left unsettled, the change this design detects
    (``designs``: (mixture, rate, class, metric) -> settle.Design, from B0's runs) and the repeats
    or window that would detect the difference seen; those are also listed in
    ``evidence["unsettled"]``. ``classes`` give the limits, ``margin_rel`` the non-inferiority margin.

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
       A search experiment (``by_margin``, its candidates the confirmed cells of apps/search) ranks
       by the search's own objective first: the worst class's margin to its contract on the
       confirmation data (``confirmed_margins``), largest first, then (a)-(c); and a cell whose
       margin is not above B0's in the same rounds is not eligible (the search looked for a wider
       margin; a gain on one class while the worst has less to spare is not what it found).
       objective.pick_confirmed is the same rule for the bench.
    4. Else B0 keeps its contracts: retain. Else no configuration does: isolate.
    5. B0 overloaded at an agreed point (``overload``: apps/analysis/overload.py, arrivals outran
       completions through the window): inconclusive, naming the overload and how to calibrate;
       the advice steps 2-4 would give is kept in ``evidence["advice_not_applicable"]``.
    """
    agreed_pairs = {(m, r) for m, r, _ in agreed}
    accept = acceptance["cells"]
    invalid = set(validity["invalid_cells"])
    if baseline in invalid or baseline not in accept:
        problems = [p for p in validity["problems"] if p["cell"] == baseline][:20]
        return {
            "outcome": INCONCLUSIVE,
            "chosen_cell": baseline,
            "rule": rule_text.b0_invalid(problems, judged=baseline in accept),
            "evidence": {"problems": problems},
        }
    b0_passes = accept[baseline]["passed"]
    # A/A control cells (B0's config run again) measure the noise floor: never recommended.
    controls = {c["cell_id"] for c in cells if c.get("control") and c["cell_id"] != baseline}
    by_cell: dict[str, list[Comparison]] = defaultdict(list)
    for c in comparisons:
        if (c["mixture"], c["rate"]) in agreed_pairs:
            by_cell[c["cell"]].append(c)

    margins = confirmed_margins(comparisons, classes, agreed_pairs) if by_margin else None
    considered, ranked = _consider(
        cells,
        baseline,
        by_cell,
        rejected or {},
        controls,
        margins,
        accept=accept,
        invalid=invalid,
        b0_passes=b0_passes,
    )
    evidence: DecisionEvidence = {
        "b0_meets_contracts": b0_passes,
        "candidates": considered,
        "b0_failures": accept[baseline]["failures"][:20],
    }
    cell_problems: dict[str, list[Any]] = defaultdict(list)
    for p in validity["problems"]:
        cell_problems[p["cell"]].append(p)
    words = rule_text.Words(
        limits={str(c["name"]): c for c in classes},
        comps={(c["cell"], c["mixture"], c["rate"], c["class"]): c for cs in by_cell.values() for c in cs},
        problems=cell_problems,
        failures={cell: list(v["failures"]) for cell, v in accept.items()},
        designs=designs or {},
        margin_rel=margin_rel,
    )
    if ranked:
        eligible = [cell for *_, cell in ranked]
        best = next(c for c in considered if c["cell"] == eligible[0])
        decision: Decision = {
            "outcome": RETUNE,
            "chosen_cell": best["cell"],
            "rule": rule_text.retune(words, best, b0_failures=evidence["b0_failures"], eligible=eligible),
            "evidence": evidence,
        }
    else:
        decision = _no_candidate(
            baseline,
            [c for c in considered if c["cell"] not in controls],
            accept=accept,
            invalid=invalid,
            b0_passes=b0_passes,
            evidence=evidence,
            words=words,
        )
    if words.unsettled:
        decision["evidence"]["unsettled"] = words.unsettled[:20]
    return _unless_overloaded(decision, baseline, overload)


def _consider(
    cells: Sequence[CellInput],
    baseline: str,
    by_cell: Mapping[str, list[Comparison]],
    rejected: Mapping[str, Sequence[Mapping[str, Any]]],
    controls: set[str],
    margins: Mapping[str, float] | None,
    *,
    accept: Mapping[str, Any],
    invalid: set[str],
    b0_passes: bool,
) -> tuple[list[ConsideredCandidate], list[tuple[float, float, float, int, str]]]:
    """Steps 2-3 for each candidate in plan order: what it claims and what blocks it, and the
    eligible ones ranked (best first). ``margins`` (a search: the confirmed margins) ranks first."""
    considered: list[ConsideredCandidate] = []
    ranked = []
    for pos, cell in enumerate(c["cell_id"] for c in cells):
        if cell == baseline:
            continue
        comps = by_cell.get(cell, [])
        claims = _claims(comps)
        rows = list(rejected.get(cell) or [])
        reasons = _reasons(cell, claims, rows, accept=accept, invalid=invalid, b0_passes=b0_passes)
        if cell in controls:
            reasons.insert(0, CONTROL_REASON)
        margin = -math.inf if margins is None else margins.get(cell, -math.inf)
        if margins is not None and margin <= margins.get(B0_KEY, -math.inf):
            reasons.append(
                f"confirmed margin {margin:.3f} not above B0's {margins.get(B0_KEY, -math.inf):.3f} "
                "(the search's objective: the worst class's margin to its contract)"
            )
        min_gain, worst_ratio = _ranking(comps)
        entry = _considered(cell, claims, reasons, (min_gain, worst_ratio), rows)
        if margins is not None:
            entry["confirmed_margin"] = rounded(margin)
        considered.append(entry)
        if not reasons:
            ranked.append((-margin if margins is not None else 0.0, -min_gain, worst_ratio, pos, cell))
    ranked.sort()
    return considered, ranked


def _unless_overloaded(decision: Decision, baseline: str, overload: Sequence[Mapping[str, Any]]) -> Decision:
    """Step 5: B0 overloaded at an agreed point makes the decision inconclusive (what was measured
    is B0's queue growing, not the configurations); the advice it would have been is kept."""
    over = [dict(p) for p in overload if p.get("overloaded") and p.get("agreed")]
    if not over:
        return decision
    advice = {
        "outcome": decision["outcome"],
        "chosen_cell": decision["chosen_cell"],
        "rule": decision["rule"],
    }
    return {
        "outcome": INCONCLUSIVE,
        "chosen_cell": baseline,
        "rule": rule_text.overloaded(over, advice),
        "evidence": {**decision["evidence"], "overload": over, "advice_not_applicable": advice},
    }


def _no_candidate(
    baseline: str,
    considered: Sequence[ConsideredCandidate],
    *,
    accept: Mapping[str, CellAcceptance],
    invalid: set[str],
    b0_passes: bool,
    evidence: DecisionEvidence,
    words: rule_text.Words,
) -> Decision:
    """Step 4, no candidate eligible: retain when B0 keeps its contracts; else isolate, unless
    cells that keep every contract exist (then a rerun, more data or a person must settle it)."""
    if b0_passes:
        return {
            "outcome": RETAIN,
            "chosen_cell": baseline,
            "rule": rule_text.retain(words, considered),
            "evidence": evidence,
        }
    b0_failures = evidence["b0_failures"]
    passing = [c for c in considered if c["cell"] not in invalid and _passed(accept, c["cell"])]
    passing_invalid = [c["cell"] for c in considered if c["cell"] in invalid and _passed(accept, c["cell"])]
    if not passing and passing_invalid:
        # Cells that keep every contract exist but their runs are not comparable data:
        # a fixed rerun would settle it, separate capacity would not.
        return {
            "outcome": INCONCLUSIVE,
            "chosen_cell": baseline,
            "rule": rule_text.rerun_invalid(words, b0_failures, passing_invalid),
            "evidence": {**evidence, "passing_invalid": passing_invalid},
        }
    if passing:
        # Contracts are kept somewhere, so isolation is not called for, yet no candidate that
        # keeps them is eligible: the words say which gate each failed, with its numbers.
        return {
            "outcome": INCONCLUSIVE,
            "chosen_cell": baseline,
            "rule": rule_text.weigh(words, b0_failures, passing),
            "evidence": {**evidence, "passing": [c["cell"] for c in passing]},
        }
    return {
        "outcome": ISOLATE,
        "chosen_cell": baseline,
        "rule": rule_text.isolate(words, b0_failures, considered),
        "evidence": evidence,
    }
