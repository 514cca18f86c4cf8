"""The gate's verdict from an analysis report: pass, regression or inconclusive. Pure: no Django.

The question: does the candidate make any class's tail worse than B0 on this
traffic? Read from the paired analysis (apps/analysis/report.py), for one
candidate against B0 at every agreed (mixture, rate):

1. **inconclusive** (exit 2) when the data cannot answer: the experiment did
   not finish (cancelled, failed runs), B0 or the candidate has invalid or
   missing runs (validity: a failed run, another trace, the load generator's
   dispatch lag over its tolerance, ...), or a class has too few requests for
   any of its tail metrics to be judged.
2. **regression** (exit 1) when, on valid data, a class is materially worse
   than B0 on a judged metric, or the candidate breaks a contract B0 keeps.
   "Materially worse" is family-wise controlled, so an unchanged candidate
   fails the gate at most ``family_alpha`` (5%) of the time however many
   classes and metrics there are: the harm exceeds the metric's material
   threshold and its p-value is rejected by Holm's step-down over every judged
   (class, metric, point) of the candidate. That p-value is the larger of two
   one-sided tests, each valid alone, so their maximum is too: the bootstrap's
   (``p_worse_bootstrap``: requests drawn within runs) and the repeats' own (
   ``p_worse_repeats``: each run one observation, so a run that was slow as a
   whole, the host busy elsewhere, is weighed against the spread between
   repeats; apps/analysis/inference.repeats_p_worse). Measured on this CPU host,
   the bootstrap alone failed an unchanged candidate whose two runs both landed
   on a busier stretch.
3. **pass** (exit 0) otherwise.

Each judged case shows the drift it allowed for (``_drift``): the spread between runs the
repeats' test weighed the harm against, and the smallest worsening that test alone would call
significant; a regression must stand out from that.

Every class × metric is one case (the JUnit test cases): "fail", "pass" or
"skipped" (not judged: too few requests for that tail).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scipy.stats import t as student_t

from apps.analysis import inference
from apps.analysis.compare_options import HIGHER_IS_BETTER
from apps.analysis.report_types import StoredReport
from apps.gate.verdict_types import CaseValues, GateCase, GateVerdict, Outcome, Unanswered, Verdict

EXIT: dict[Verdict, int] = {"pass": 0, "regression": 1, "inconclusive": 2}
# Contract keys of the acceptance check (apps/analysis/checks.acceptance_check) -> the case they belong to.
CONTRACT_CASE = {
    "ttft": "ttft_p99_ms",
    "e2e": "e2e_p99_ms",
    "stall": "max_stall_p99_ms",
    "error_rate": "error_rate",
}
CONTRACT_NAME = {
    "ttft": "TTFT p99",
    "e2e": "end-to-end p99",
    "stall": "max stall p99",
    "error_rate": "error rate",
}
# Shown, never a case of their own: the share of requests within contract is goodput's twin.
NOT_CASES = frozenset({"contract_share"})
UNITS = {"goodput_rps": "req/s", "error_rate": ""}


def _unit(metric: str) -> str:
    return UNITS.get(metric, "ms" if metric.endswith("_ms") else "")


def _contract_failures(acceptance: Mapping[str, Any], cell: str) -> dict[tuple[str, str], list[str]]:
    """(class, case) -> the points where ``cell`` breaks that contract."""
    out: dict[tuple[str, str], list[str]] = defaultdict(list)
    for f in (acceptance.get("cells") or {}).get(cell, {}).get("failures") or []:
        if f.get("class") is None:
            continue
        for key in f.get("broken") or []:
            point = f"{f['mixture']}/{f['rate']}"
            if key == "quality":
                point = _quality_point(f.get("quality") or {})
            out[(f["class"], CONTRACT_CASE.get(key, key))].append(point)
    return out


def _quality_point(quality: Mapping[str, Any]) -> str:
    """What of the quality contract broke, and why each failing validator failed (by reason, as
    apps/analysis/quality_verdict.py counted them: a validator past its time budget says so)."""
    parts = []
    for what in quality.get("broken") or []:
        kind = what.removeprefix("validator ")
        reasons = (quality.get("validator_failures") or {}).get(kind) if what != kind else None
        if reasons:
            what += ": " + "; ".join(f"{n} × {why}" for why, n in reasons.items())
        parts.append(what)
    return "quality probe" + (f" ({', '.join(parts)})" if parts else "")


def gate_verdict(
    report: StoredReport | None,
    *,
    candidate: str | None = None,
    status: str = "analysed",
    status_reason: str = "",
) -> GateVerdict:
    """``verdict``, ``exit_code``, ``reasons`` and ``cases`` for one candidate against B0."""
    if report is None:
        if status == "running":
            return {"verdict": "running", "exit_code": None, "reasons": [], "cases": []}
        why = (
            f"the experiment is {status}"
            + (f": {status_reason}" if status_reason else "")
            + ", with no analysis"
        )
        return {"verdict": "inconclusive", "exit_code": EXIT["inconclusive"], "reasons": [why], "cases": []}
    baseline = str(report.get("baseline"))
    candidate = _the_candidate(report, baseline, candidate)
    checks = report.get("checks") or {}
    reasons = _invalid(checks.get("validity") or {}, status, status_reason, cells=(baseline, candidate))
    # The tuning decision's own "inconclusive" (B0 breaks a contract and the candidates that keep
    # it are worse elsewhere, say) answers another question; only data that is not valid makes
    # the gate's answer unknown, and validity names every such run above.
    acceptance = checks.get("acceptance") or {}
    names = [str(c["name"]) for c in report.get("classes") or []]
    comps = [c for c in report.get("comparisons") or [] if c.get("cell") == candidate]
    by_class: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for c in comps:
        by_class[str(c["class"])].append(c)
    compare = (report.get("options") or {}).get("compare") or {}
    family_alpha = float(compare.get("family_alpha", 0.05))
    judge = _Judge(
        baseline=baseline,
        candidate=candidate,
        b0_broken=_contract_failures(acceptance, baseline),
        cand_broken=_contract_failures(acceptance, candidate),
        confidence=compare.get("confidence", 0.95),
        family_alpha=family_alpha,
        worse=_holm_worse(comps, family_alpha),
        unanswered=_unanswered(report),
        error_rates=_error_rates(report),
    )
    cases: list[GateCase] = []
    unjudged_classes = []
    for name in names:
        entries = by_class.get(name, [])
        judged_latency = any(
            v.get("judged") for c in entries for m, v in (c.get("metrics") or {}).items() if m.endswith("_ms")
        )
        if entries and not judged_latency:
            unjudged_classes.append(name)
        cases += [judge.case(name, metric, entries) for metric in judge.metrics(name, entries)]
    if not comps and not reasons:
        reasons.append(f"no comparison of {candidate} with {baseline}")
    # Invalid data answers nothing; on valid data a regression found stands even if another
    # class could not be judged, and only then does an unjudged class make it inconclusive.
    verdict: Verdict
    if reasons:
        verdict = "inconclusive"
    elif any(c["outcome"] == "fail" for c in cases):
        verdict = "regression"
    elif unjudged_classes:
        verdict = "inconclusive"
        reasons += [
            f"class {n}: too few requests in the window to judge any tail latency" for n in unjudged_classes
        ]
    else:
        verdict = "pass"
    return {
        "verdict": verdict,
        "exit_code": EXIT[verdict],
        "baseline": baseline,
        "candidate": candidate,
        "reasons": reasons,
        "cases": cases,
    }


def _the_candidate(report: StoredReport, baseline: str, candidate: str | None) -> str:
    """The candidate named, or the report's only one; ValueError when that is not one."""
    cells = [c["cell_id"] for c in report.get("cells") or [] if c["cell_id"] != baseline]
    if candidate is None:
        if len(cells) != 1:
            raise ValueError(f"name the candidate: the experiment has {len(cells)} ({', '.join(cells)})")
        candidate = cells[0]
    elif candidate not in cells:
        raise ValueError(f"no candidate {candidate!r} (the experiment has {', '.join(cells) or 'none'})")
    return candidate


def _invalid(
    validity: Mapping[str, Any], status: str, status_reason: str, *, cells: tuple[str, str]
) -> list[str]:
    """Why the data cannot answer: the experiment did not finish, or a run of B0 or the
    candidate (``cells``) is not valid."""
    reasons: list[str] = []
    if status not in ("analysed", "approved", "rejected", "revoked"):
        reasons.append(f"the experiment is {status}" + (f": {status_reason}" if status_reason else ""))
    for p in validity.get("problems") or []:
        if p.get("cell") in cells:
            where = "/".join(str(p[k]) for k in ("mixture", "rate", "repeat") if k in p)
            detail = {k: v for k, v in p.items() if k not in ("cell", "problem", "mixture", "rate", "repeat")}
            extra = f" {detail}" if detail else ""
            reasons.append(f"{p['cell']} {where}: {p['problem']}{extra}".replace("  ", " "))
    return reasons


@dataclass(frozen=True)
class _Judge:
    """What judging one class x metric case of the candidate needs from the whole report."""

    baseline: str
    candidate: str
    # (class, case) -> the points where the cell breaks that contract (_contract_failures).
    b0_broken: Mapping[tuple[str, str], list[str]]
    cand_broken: Mapping[tuple[str, str], list[str]]
    confidence: float
    family_alpha: float
    # (mixture, rate, class, metric) found materially worse, family-wise (_holm_worse).
    worse: set[tuple[str, str, str, str]]
    # Per (cell, class); a defaultdict (_unanswered): a class with no done run has zeros.
    unanswered: dict[tuple[str, str], Unanswered]
    error_rates: dict[tuple[str, str], float]

    def metrics(self, name: str, entries: Sequence[Mapping[str, Any]]) -> list[str]:
        """The class's cases: every metric its comparisons measured, the error rate, and the
        quality contract when the candidate breaks it."""
        metrics: list[str] = []
        for c in entries:
            for m in c.get("metrics") or {}:
                if m not in NOT_CASES and m not in metrics:
                    metrics.append(m)
        if "error_rate" not in metrics:
            metrics.append("error_rate")
        if (name, "quality") in self.cand_broken:
            metrics.append("quality")  # check 2's quality contract (apps/analysis/quality_verdict.py)
        return metrics

    def case(self, name: str, metric: str, entries: Sequence[Mapping[str, Any]]) -> GateCase:
        """Class ``name``'s case on ``metric``, over its comparisons ``entries`` (one a point)."""
        baseline, candidate, family_alpha = self.baseline, self.candidate, self.family_alpha
        shown: CaseValues | None = None
        drift: str | None = None
        messages = []
        outcome: Outcome = "pass"
        judged_any = False
        for c in entries:
            v = (c.get("metrics") or {}).get(metric)
            if v is None:
                continue
            point = f"{c['mixture']}/{c['rate']}"
            is_worse = (c["mixture"], c["rate"], name, metric) in self.worse
            if shown is None or is_worse:  # the first point, or the one that failed
                shown = _case_values(v, self.unanswered[(baseline, name)], self.unanswered[(candidate, name)])
                shown.update(_drift(v, metric, family_alpha))
                drift = _drift_message(shown, metric) if v.get("judged") else None
            if v.get("judged"):
                judged_any = True
            else:
                messages.append(str(v.get("note") or "not judged"))
            if is_worse:
                outcome = "fail"
                messages.append(
                    f"materially worse than B0 at {point} (p={_p_worse(v):.6g}: bootstrap "
                    f"{v.get('p_worse_bootstrap', v.get('p_worse'))}, across repeats {v.get('p_worse_repeats')}; Holm over the "
                    f"family at {family_alpha:g}; material above {v.get('threshold')})"
                )
        if drift:
            messages.append(drift)
        kept_by_b0 = (name, metric) not in self.b0_broken
        broken = self.cand_broken.get((name, metric))
        contract_key = next((k for k, case_name in CONTRACT_CASE.items() if case_name == metric), None)
        if broken and kept_by_b0:
            outcome = "fail"
            messages.append(
                f"breaks the {CONTRACT_NAME.get(contract_key or '', metric)} contract that B0 keeps "
                f"(at {', '.join(broken)})"
            )
        elif broken:
            messages.append("breaks its contract, as B0 does (not a regression)")
        if shown is None and metric == "error_rate":
            # A contract with no paired difference: show each side's pooled error rate.
            shown = {
                "b0": self.error_rates.get((baseline, name)),
                "candidate": self.error_rates.get((candidate, name)),
                "diff": None,
                "ci": None,
            }
        if outcome == "pass" and not judged_any and not broken:
            outcome = "skipped" if metric != "error_rate" else "pass"
            if metric == "error_rate":
                messages.append("the contract is judged, not the difference")
        return {
            "class": name,
            "metric": metric,
            "unit": _unit(metric),
            "confidence": self.confidence,
            **(shown or {}),
            "outcome": outcome,
            "message": "; ".join(dict.fromkeys(messages)) or None,
        }


def _case_values(v: Mapping[str, Any], b0_unanswered: Unanswered, cand_unanswered: Unanswered) -> CaseValues:
    """A point's numbers for its case. A tail the unanswered requests censor has no value, only
    a bound: say how far it is known and how many requests went unanswered."""
    out: CaseValues = {
        "b0": v.get("b0"),
        "candidate": v.get("candidate"),
        "diff": v.get("diff"),
        "ci": v.get("ci"),
    }
    if v.get("b0_censored"):
        out["b0_above"] = v.get("b0_above")
        out["b0_unanswered"] = b0_unanswered
    if v.get("candidate_censored"):
        out["candidate_above"] = v.get("candidate_above")
        out["candidate_unanswered"] = cand_unanswered
    return out


def _drift(v: Mapping[str, Any], metric: str, alpha: float) -> CaseValues:
    """The drift between runs a point's repeats' test allowed for: their pooled spread (compare.judge's
    ``repeats_sd_rel``; a report from before it: from the repeats' values), how many repeats each
    side had, and the smallest worsening of the candidate's runs over B0's (geometric means) that
    test alone calls significant at ``alpha``, before Holm. Nothing where it took no spread."""
    b0_reps = [float(x) for x in v.get("b0_repeats") or [] if x is not None]
    cand_reps = [float(x) for x in v.get("candidate_repeats") or [] if x is not None]
    if "repeats_sd_rel" in v:
        rel = v["repeats_sd_rel"]
    else:
        sd = inference.repeats_pooled_sd(cand_reps, b0_reps)
        rel = None if sd is None else math.expm1(sd)
    if rel is None or len(b0_reps) < 2 or len(cand_reps) < 2:
        return {}
    se = math.log1p(float(rel)) * math.sqrt(1 / len(b0_reps) + 1 / len(cand_reps))
    bar = float(student_t.ppf(1 - alpha, len(b0_reps) + len(cand_reps) - 2)) * se
    # Lower is better: the candidate's runs exp(bar) times B0's; higher (goodput): that much less.
    stand_out = -math.expm1(-bar) if HIGHER_IS_BETTER.get(metric, False) else math.expm1(bar)
    return {
        "repeats_sd_rel": round(float(rel), 4),
        "repeats": [len(b0_reps), len(cand_reps)],
        "stand_out_rel": round(stand_out, 4),
        "stand_out_alpha": alpha,
    }


def _drift_message(case: CaseValues, metric: str) -> str | None:
    """``runs spread by 18% between repeats (2 of B0, 2 of the candidate): ...`` (``_drift``)."""
    spread, bar = case.get("repeats_sd_rel"), case.get("stand_out_rel")
    if spread is None or bar is None:
        return None
    b0_n, cand_n = case.get("repeats") or [0, 0]
    runs = f"between repeats ({b0_n} of B0, {cand_n} of the candidate)"
    if round(spread, 2) == 0:
        return f"runs did not differ {runs}"
    change = f"-{bar:.0%}" if HIGHER_IS_BETTER.get(metric, False) else f"+{bar:.0%}"
    return (
        f"runs spread by {spread:.0%} {runs}: a regression must stand out from that, and one of "
        f"about {change} or less cannot (the repeats' one-sided test at "
        f"{case.get('stand_out_alpha', 0.05):g}, before Holm)"
    )


def _unanswered(report: StoredReport) -> dict[tuple[str, str], Unanswered]:
    """Per (cell, class), over its done runs: requests offered, unfinished at the drain deadline,
    and failed otherwise (rejected, errors, timeouts, not sent): those with no latency to rank."""
    out: dict[tuple[str, str], Unanswered] = defaultdict(lambda: {"offered": 0, "unfinished": 0, "failed": 0})
    for run in report.get("runs") or []:
        if run.get("status") != "done":
            continue
        for name, metrics in (run.get("classes") or {}).items():
            counts = (metrics or {}).get("counts") or {}
            tally = out[(str(run.get("cell")), str(name))]
            tally["offered"] += int(counts.get("offered", 0))
            tally["unfinished"] += int(counts.get("unfinished", 0))
            tally["failed"] += sum(
                int(counts.get(k, 0)) for k in ("unsent", "rejected", "errors", "timeouts")
            )
    return out


def _error_rates(report: StoredReport) -> dict[tuple[str, str], float]:
    """Per (cell, class), the error rate pooled over its done runs: the sum of each run's
    ``over_limit`` error-rate pair [failed, judged] (apps/analysis/metrics.over_limit), the
    counts the acceptance check pools."""
    failed: dict[tuple[str, str], int] = defaultdict(int)
    judged: dict[tuple[str, str], int] = defaultdict(int)
    for run in report.get("runs") or []:
        if run.get("status") != "done":
            continue
        for name, metrics in (run.get("classes") or {}).items():
            pair = ((metrics or {}).get("over_limit") or {}).get("error_rate")
            if pair:
                key = (str(run.get("cell")), str(name))
                failed[key] += int(pair[0])
                judged[key] += int(pair[1])
    return {key: round(failed[key] / n, 6) for key, n in judged.items() if n}


def _material_harm(v: Mapping[str, Any]) -> bool:
    harm, threshold = v.get("harm"), v.get("threshold") or 0.0
    if harm is None:  # an infinite harm: the candidate left requests unanswered where B0 did not
        return bool(v.get("candidate_censored")) and not v.get("b0_censored")
    return float(harm) > float(threshold)


def _p_worse(v: Mapping[str, Any]) -> float:
    """The larger of the bootstrap's and the repeats' one-sided p-values (module docstring).

    None for the repeats' test means it could not be taken (a side with a class missing from a
    repeat): nothing then shows the harm is more than a slow run, so no regression is claimed.
    A report analysed before the repeats' test existed has no such key and keeps its verdict.
    """
    # The bootstrap's own p-value: the report's p_worse already holds the verdict's run-level test
    # (cells x rounds, R - 1 degrees of freedom with two cells), which the gate replaces with the
    # two-sample test of the repeats (2R - 2: with the gate's two repeats, 2 rather than 1).
    boot = float(v.get("p_worse_bootstrap", v["p_worse"]))
    if "p_worse_repeats" not in v:
        return boot
    repeats = v["p_worse_repeats"]
    return max(boot, 1.0 if repeats is None else float(repeats))


def _holm_worse(comps: Sequence[Mapping[str, Any]], alpha: float) -> set[tuple[str, str, str, str]]:
    """(mixture, rate, class, metric) of the candidate found materially worse, family-wise at ``alpha``."""
    family = []
    for c in comps:
        for metric, v in (c.get("metrics") or {}).items():
            if metric in NOT_CASES or not v.get("judged") or v.get("p_worse") is None:
                continue
            family.append((_p_worse(v), (c["mixture"], c["rate"], str(c["class"]), metric), v))
    family.sort(key=lambda x: x[0])
    m = len(family)
    out = set()
    for i, (p, key, v) in enumerate(family):
        if p > alpha / (m - i):
            break  # Holm stops at the first non-rejection
        if _material_harm(v):
            out.add(key)
    return out
