"""The checks of an experiment after validity (apps/analysis/validity.py): acceptance, failure
scenarios, recovery. Pure.

Inputs are the report's own parts (per-run results, pooled aggregates, see
apps/analysis/report.py), so a check can always be re-derived from a stored report; the
decision that reads them is apps/analysis/decide.py. Cells are taken in their plan order, the
rest is sorted, so the same records give the same checks.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, cast

from apps.analysis import inference
from apps.analysis.rehearsal_measures import attempt_outcome, attempts_summary, attempts_tally
from apps.analysis.report_types import (
    AcceptanceCheck,
    CellAcceptance,
    RecoveryCheck,
    ScenarioCheck,
)


def rounded(x: float | None) -> float | None:
    """A finite number rounded to 6 places; None for None, NaN or infinity."""
    if x is None or not math.isfinite(x):
        return None
    return float(round(x, 6))


def acceptance_check(
    *,
    cells: Sequence[Mapping[str, Any]],
    classes: Sequence[Mapping[str, Any]],
    aggregates: Sequence[Mapping[str, Any]],
    agreed: Sequence[tuple[str, str, int]],
    alpha: float = 0.05,
    skipped: Mapping[tuple[str, str, str, int], str] | None = None,
) -> AcceptanceCheck:
    """Per cell: does every class keep its contract at every agreed (mixture, rate)?

    Judged pooled over the repeats, with the uncertainty the counts have: a p99
    limit is broken when the share of requests over it (an unobserved value is
    over) is above 1% by an exact one-sided binomial test at ``alpha``; the
    error rate likewise against its own limit (inference.share_breaks). A point
    that lacks a done run of some repeat fails ("no done run"), or, when early
    stopping skipped it (``skipped``: (cell, mixture, rate, repeat) -> the skipped
    run's reason), "skipped: <reason>".
    """
    points: dict[tuple[str, str], list[int]] = defaultdict(list)
    for mix, rate, rep in agreed:
        points[(mix, rate)].append(int(rep))
    agg = {(a["cell"], a["mixture"], a["rate"], a["class"]): a for a in aggregates}
    # Every class of a (cell, mixture, rate) pools the same done repeats.
    done_repeats = {(a["cell"], a["mixture"], a["rate"]): sorted(set(a["repeats"])) for a in aggregates}
    limits = {str(c["name"]): float(c.get("error_rate", 0.0)) for c in classes}
    out: dict[str, CellAcceptance] = {}
    for cell in (c["cell_id"] for c in cells):
        failures: list[dict[str, Any]] = []
        for (mix, rate), reps in sorted(points.items()):
            done_reps = done_repeats.get((cell, mix, rate), [])
            missing = sorted(set(reps) - set(done_reps))
            if missing:
                why = [(skipped or {}).get((cell, mix, rate, rep)) for rep in missing]
                stopped = next((w for w in why if w), None)
                failures.append(
                    {
                        "mixture": mix,
                        "rate": rate,
                        "repeats": missing,
                        "class": None,
                        "broken": [f"skipped: {stopped}" if stopped else "no done run"],
                    }
                )
                continue
            for name in sorted(limits):
                a = agg.get((cell, mix, rate, name))
                if a is None or a["pooled"]["counts"]["offered"] == 0:
                    continue
                m = a["pooled"]
                over = m.get("over_limit") or {}
                shares: dict[str, float | None] = {}
                pvals: dict[str, float] = {}
                broken = []
                for key, allowed in (
                    ("ttft", 0.01),
                    ("e2e", 0.01),
                    ("stall", 0.01),
                    ("error_rate", limits[name]),
                ):
                    k, n = over.get(key, [0, 0])
                    bad, p = inference.share_breaks(k, n, allowed, alpha)
                    shares[key] = rounded(k / n) if n else None
                    pvals[key] = float(round(p, 6))
                    if bad:
                        broken.append(key)
                if broken:
                    failures.append(
                        {
                            "mixture": mix,
                            "rate": rate,
                            "repeats": done_reps,
                            "class": name,
                            "broken": broken,
                            "share_over": shares,
                            "p_values": {k: pvals[k] for k in broken},
                            "ttft_p99": m["ttft_ms"]["p99"],
                            "e2e_p99": m["e2e_ms"]["p99"],
                            "max_stall_p99": m["max_stall_ms"]["p99"],
                            "error_rate": m["error_rate"],
                        }
                    )
        out[cell] = {"passed": not failures and bool(points), "failures": failures, "checked": len(points)}
    return {
        "status": "pass" if any(v["passed"] for v in out.values()) else "fail",
        "rule": f"pooled over repeats; a limit is broken when the share over it is above the allowed share "
        f"(1% for a p99) by an exact binomial test at {alpha:g}",
        "cells": out,
        "agreed": [list(c) for c in agreed],
    }


# Runs apart from the sweep that are not failure scenarios: the capacity probe's steps
# (apps/lifecycle/calibration.py), the uniform-spacing companions of the sweep's traces, and a
# search's screening runs (which the report's rows leave out anyway: apps/analysis/services.py).
CALIBRATION_SCENARIO = "calibration"
UNIFORM_SCENARIO = "uniform"
SCREEN_SCENARIO = "screen"
NOT_FAILURE_SCENARIOS = frozenset({CALIBRATION_SCENARIO, UNIFORM_SCENARIO, "rehearsal", SCREEN_SCENARIO})


def scenario_check(
    run_results: Sequence[Mapping[str, Any]], verdicts: Mapping[str, Mapping[str, Any]] | None = None
) -> ScenarioCheck:
    """Failure-scenario runs, listed apart from the sweep with what held and what did not.

    ``verdicts`` (run key -> apps.analysis.scenario_checks.scenario_verdict) says what each
    scenario must show and hold; without one a run is judged by its classes' contracts.
    """
    verdicts = verdicts or {}
    listed = []
    for r in sorted(
        (r for r in run_results if r.get("scenario") and r["scenario"] not in NOT_FAILURE_SCENARIOS),
        key=lambda r: (r["scenario"], r["cell"], r["mixture"], r["rate"], int(r["repeat"]), r["key"]),
    ):
        classes = {}
        for name, m in sorted(r["classes"].items()):
            c = m["counts"]
            classes[name] = {
                "offered": c["offered"],
                "completed": c["completed"],
                "rejected": c["rejected"],
                "errors": c["errors"],
                "timeouts": c["timeouts"],
                "cancelled": c["cancelled"],
                "unfinished": c["unfinished"],
                "contract_met": m["contract"]["met"],
                "ttft_p99": m["ttft_ms"]["p99"],
                "e2e_p99": m["e2e_ms"]["p99"],
                "oldest_queue_age_ms": m["oldest_queue_age_ms"],
            }
        verdict = verdicts.get(str(r["key"]))
        held = r["status"] == "done" and all(v["contract_met"] for v in classes.values())
        if verdict is not None:
            held = bool(verdict["held"] and verdict["shown"])
        listed.append(
            {
                "verdict": verdict,
                "scenario": r["scenario"],
                "cell": r["cell"],
                "mixture": r["mixture"],
                "rate": r["rate"],
                "repeat": r["repeat"],
                "run": r["key"],
                "status": r["status"],
                "held": held,
                "preemptions": (r.get("server") or {}).get("counters", {}).get("preemptions"),
                "classes": classes,
            }
        )
    status = "none" if not listed else ("pass" if all(x["held"] for x in listed) else "listed")
    return {"status": status, "runs": listed}


REHEARSAL_SCENARIO = "rehearsal"


def recovery_check(
    rollback: Mapping[str, Any] | None,
    *,
    chosen_cell: str | None = None,
    baseline: str | None = None,
    rehearse: bool = True,
    rehearsal: Mapping[str, Any] | None = None,
) -> RecoveryCheck:
    """Check 4: the rollback to B0, rehearsed for real (apps/analysis/rehearsal_measures.py).

    ``rehearsal`` is the chosen cell's entry of the report's ``rehearsals``: its latest
    attempt's {"run", "status", "reason", "measures"} and ``attempts``, every attempt in order
    (apps/analysis/rehearsal.attempt_outcome); an entry without ``attempts`` is one attempt.
    Statuses: ``not needed`` (B0 stays: nothing to roll back), ``pending`` (not run yet, or
    the latest attempt still running), ``not rehearsed`` (the spec turned it off), ``fail``,
    ``pass``. The manifest's existence is reported beside it.

    Attempts never let an author pick (docs/SCENARIOS.md, "Repeated attempts"): check 4
    passes only when the latest attempt passed **and** every earlier one passed or was queued
    again by the service itself (a lost worker or host). One failed or invalid attempt fails
    it, whatever came after; only an approver's typed override reason gets past that.
    """
    rb = dict(rollback or {})
    out: dict[str, Any] = {"manifest": bool(rb.get("exists")), "baseline": rb.get("baseline") or baseline}

    def verdict(status: str, reason: str) -> RecoveryCheck:
        return cast(RecoveryCheck, {**out, "status": status, "reason": reason})

    if chosen_cell is None or chosen_cell == baseline:
        return verdict("not needed", "the decision keeps B0: there is no change to roll back")
    out["cell"] = chosen_cell
    if rehearsal is None:
        if not rehearse:
            return verdict(
                "not rehearsed", "the spec turned the rollback rehearsal off (recovery.rehearse: false)"
            )
        return verdict("pending", f"the rollback of {chosen_cell} has not been rehearsed yet")
    out["run"] = rehearsal.get("run")
    attempts = list(rehearsal.get("attempts") or [_only_attempt(rehearsal)])
    summary = attempts_summary(attempts)
    out["attempts"] = {"summary": summary, **attempts_tally(attempts)}
    latest = attempts[-1]
    earlier = f" ({summary})" if len(attempts) > 1 else ""
    if latest["outcome"] == "pending":
        return verdict("pending", f"the rehearsal of {chosen_cell} is {latest['status']}{earlier}")
    measures = rehearsal.get("measures")
    if latest["status"] == "done" and measures:
        out["measures"] = {
            k: measures.get(k)
            for k in ("time_to_recover_s", "max_recovery_s", "cut", "surge", "standby", "switch_at_s")
        }
    against = [
        a
        for a in attempts
        if a["outcome"] == "failed" or (a["outcome"] == "invalid" and not a.get("requeued_by_service"))
    ]
    if latest["outcome"] == "passed" and measures and not against:
        return verdict("pass", f"B0 recovered {measures['time_to_recover_s']:g} s after the switch{earlier}")
    if len(attempts) == 1:
        return verdict("fail", latest["why"])
    if latest not in against and latest["outcome"] != "passed":
        against.append(latest)
    listed = "; ".join(f"attempt {a['attempt']} {a['outcome']}: {a['why']}" for a in against)
    return verdict(
        "fail",
        f"{summary}: check 4 passes only when the latest attempt passed and no earlier one failed "
        f"or was invalid; {listed}",
    )


def _only_attempt(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A rehearsal entry that lists no attempts (a report stored before attempts were kept, or
    one built by hand) is one attempt: its own."""
    status = str(entry.get("status"))
    outcome, why = attempt_outcome(
        status=status, measures=entry.get("measures"), reason=entry.get("reason") or ""
    )
    return {"attempt": 1, "run": entry.get("run"), "status": status, "outcome": outcome, "why": why}
