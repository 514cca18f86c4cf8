"""The four checks of an experiment: validity, acceptance, failure scenarios, recovery. Pure.

Inputs are the report's own parts (per-run results, pooled aggregates, see
apps/analysis/report.py), so a check can always be re-derived from a stored report; the
decision that reads them is apps/analysis/decide.py. Cells are taken in their plan order, the
rest is sorted, so the same records give the same checks.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from apps.analysis import inference, lengths
from apps.analysis.rehearsal import attempt_outcome, attempts_summary, attempts_tally
from apps.analysis.report_inputs import CellInput, ExperimentInput
from apps.analysis.report_types import (
    AcceptanceCheck,
    CellAcceptance,
    RecoveryCheck,
    RunResult,
    ScenarioCheck,
    ValidityCheck,
)
from apps.experiments.generation import request_sampling


def rounded(x: float | None) -> float | None:
    """A finite number rounded to 6 places; None for None, NaN or infinity."""
    if x is None or not math.isfinite(x):
        return None
    return float(round(x, 6))


def lag_over_tolerance(lag_p99_ms: float | None, max_lag_ms: float | None) -> bool:
    """Whether a run's load generator fell behind: its dispatch lag p99 over the workload's
    tolerance (no tolerance, or no lag measured: not over). The one statement of the rule, for
    the validity check and for a gate that stops at its first unusable run (early_stop.unusable)."""
    return lag_p99_ms is not None and max_lag_ms is not None and lag_p99_ms > max_lag_ms


IDENTITY = ("hardware_id", "model_revision", "tokenizer_revision", "image_digest")
# (cell, mixture, rate, repeat): one point of the sweep in one cell.
CellPoint = tuple[str, str, str, int]


class _Problems:
    """The validity check's problems in the order found, each naming its cell (and its point)."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def add(self, cell: str, problem: str, combo: tuple[str, str, int] | None = None, **detail: Any) -> None:
        entry: dict[str, Any] = {"cell": cell, "problem": problem}
        if combo is not None:
            entry.update(mixture=combo[0], rate=combo[1], repeat=combo[2])
        entry.update(detail)
        self.items.append(entry)


def _chosen_runs(
    cells: Sequence[CellInput],
    run_results: Sequence[RunResult],
    combos: Sequence[tuple[str, str, int]],
    problems: _Problems,
) -> dict[CellPoint, RunResult]:
    """Step 1: the done sweep run of each cell at each point (the first of duplicates); a point
    without one is missing, or says why early stopping skipped it."""
    sweep: dict[CellPoint, list[RunResult]] = defaultdict(list)
    for r in run_results:
        if not r.get("scenario"):
            sweep[(r["cell"], r["mixture"], r["rate"], int(r["repeat"]))].append(r)
    chosen: dict[CellPoint, RunResult] = {}
    for cell in (c["cell_id"] for c in cells):
        for combo in combos:
            runs = sweep.get((cell, *combo), [])
            done = [r for r in runs if r["status"] == "done"]
            if not done:
                states = sorted({r["status"] for r in runs}) or ["not run"]
                skipped = [r for r in runs if r["status"] == "skipped" and r.get("reason")]
                if skipped:
                    # Early stopping (apps/analysis/early_stop.py): say why, not just "missing".
                    problems.add(cell, f"skipped: {skipped[0]['reason']}", combo, statuses=states)
                else:
                    problems.add(cell, "missing", combo, statuses=states)
                continue
            if len(done) > 1:
                problems.add(cell, "duplicate runs", combo, runs=sorted(r["key"] for r in done))
            chosen[(cell, *combo)] = done[0]
    return chosen


@dataclass(frozen=True)
class _Reference:
    """What every run must match (step 3), and the exceptions a candidate's spec allows."""

    values: dict[str, Any]  # identity field -> expected value, and "generation" -> the sampling settings
    own_revision: dict[str, Any]  # cell -> the model revision its spec names (None: B0's)
    own_image: set[str]  # cells whose spec names their own engine image
    unrecorded: list[str]  # identity fields no run recorded: a warning, not an invalid cell


def _reference(
    experiment: ExperimentInput,
    cells: Sequence[CellInput],
    baseline: str,
    combos: Sequence[tuple[str, str, int]],
    chosen: Mapping[CellPoint, RunResult],
) -> _Reference:
    """The experiment's identity where it names it, else B0's first chosen run's."""
    values: dict[str, Any] = {}
    for field in IDENTITY:
        expected = experiment.get(field) or None
        if expected is None:
            base_runs = [chosen[(baseline, *c)] for c in combos if (baseline, *c) in chosen]
            expected = base_runs[0].get(field) if base_runs else None
        values[field] = expected
    # What every request should carry (the spec's sampling settings; its flags belong to the replay).
    values["generation"] = request_sampling(experiment.get("generation"))
    own_revision = {c["cell_id"]: (c.get("engine") or {}).get("model_revision") for c in cells}
    # A candidate that is another engine build on purpose (its spec names its own image) runs
    # another image; every other cell runs B0's.
    own_image = {c["cell_id"] for c in cells if (c.get("engine") or {}).get("image")}
    # A field no run recorded cannot tell cells apart: a warning, not an invalid cell (for the
    # image digest, among the cells held to B0's image).
    unrecorded = [
        f
        for f in IDENTITY
        if chosen
        and not any(
            r.get(f) for (cell, *_), r in chosen.items() if f != "image_digest" or cell not in own_image
        )
    ]
    return _Reference(values=values, own_revision=own_revision, own_image=own_image, unrecorded=unrecorded)


def _pairing_problems(
    cell: str,
    combo: tuple[str, str, int],
    run: RunResult,
    base: RunResult | None,
    *,
    experiment: ExperimentInput,
    baseline: str,
    problems: _Problems,
) -> None:
    """Steps 2 and 5: the run replayed B0's trace and corpus, every class of the mixture, the same
    cohort as B0, and (natural lengths) about as many output tokens per request."""
    for field in ("trace_sha256", "corpus_sha256"):
        if not run.get(field):
            problems.add(cell, f"no {field}", combo)
        elif base is not None and run.get(field) != base.get(field):
            problems.add(
                cell, f"{field} differs from {baseline}", combo, value=run.get(field), b0=base.get(field)
            )
    weights = (experiment.get("mixtures") or {}).get(combo[0]) or {}
    expected = sorted(c for c, w in weights.items() if w and w > 0)
    empty = sorted(c for c in expected if run["classes"].get(c, {}).get("counts", {}).get("offered", 0) == 0)
    if not any(m["counts"]["offered"] for m in run["classes"].values()):
        problems.add(cell, "no records in the observation window", combo, run=run["key"])
    elif empty:
        problems.add(cell, "a class of the mixture has no requests", combo, classes=empty)
    if base is None or run is base:
        return
    mine = {c: m["counts"]["offered"] for c, m in run["classes"].items()}
    theirs = {c: m["counts"]["offered"] for c, m in base["classes"].items()}
    if mine != theirs:
        problems.add(cell, f"cohort differs from {baseline}", combo, offered=mine, b0=theirs)
    if experiment.get("output_mode") == "natural":
        shifted = _length_shift(run, base)
        if shifted:
            problems.add(
                cell,
                f"output lengths differ from {baseline}",
                combo,
                relative_shift=shifted,
                max_shift=lengths.MAX_OUTPUT_SHIFT,
            )


def _length_shift(run: RunResult, base: RunResult) -> dict[str, float]:
    """class -> the relative shift of its mean tokens per completed request from B0's, where it is
    over lengths.MAX_OUTPUT_SHIFT. Per completed request: a cell that drops requests is a
    regression the comparison shows, not a length shift."""
    shifted = {}
    for c, m in run["classes"].items():
        mine_mean = lengths.mean_completed_tokens(m)
        b0_mean = lengths.mean_completed_tokens(base["classes"].get(c) or {})
        if mine_mean is not None and b0_mean and abs(mine_mean / b0_mean - 1.0) > lengths.MAX_OUTPUT_SHIFT:
            shifted[c] = round(mine_mean / b0_mean - 1.0, 4)
    return shifted


def _identity_problems(
    cell: str, combo: tuple[str, str, int], run: RunResult, ref: _Reference, problems: _Problems
) -> None:
    """Step 3: hardware, revisions, image and sampling settings as the reference has them."""
    for field in IDENTITY:
        want = ref.values[field]
        if field == "model_revision" and ref.own_revision.get(cell):
            want = ref.own_revision[cell]  # a candidate that is another model revision, on purpose
        if field == "image_digest" and cell in ref.own_image:
            continue
        if want and run.get(field) and run.get(field) != want:
            problems.add(cell, f"{field} differs", combo, value=run.get(field), expected=want)
        elif not run.get(field) and field not in ref.unrecorded:
            problems.add(cell, f"no {field}", combo)
    if run.get("generation") is not None and run.get("generation") != ref.values["generation"]:
        problems.add(
            cell,
            "generation settings differ",
            combo,
            value=run.get("generation"),
            expected=ref.values["generation"],
        )


def _dispatch_lag(run: RunResult) -> float | None:
    """The run's dispatch lag p99 as the load generator measured it, else its lateness p99."""
    lag = run.get("dispatch_lag_p99_ms")
    if lag is None:
        lag = run.get("lateness_ms", {}).get("p99")
    return lag


def validity_check(
    *,
    experiment: ExperimentInput,
    cells: Sequence[CellInput],
    baseline: str,
    run_results: Sequence[RunResult],
    combos: Sequence[tuple[str, str, int]],
) -> ValidityCheck:
    """Are all cells comparable? Every problem names its cell; a cell with one is invalid.

    1. Every cell has exactly one done sweep run per (mixture, rate, repeat); a point whose
       runs early stopping skipped says so, with the reason (``skipped: cannot be accepted ...``).
    2. Its trace and corpus hashes equal B0's in that (mixture, rate, repeat),
       and its cohort has as many requests per class as B0's.
    3. Hardware, model and tokenizer revisions, engine image digest and the
       sampling settings the requests carried are the same in every run (and
       match the experiment's where it names them); a candidate whose spec
       names its own ``engine.model_revision`` must run that, and one that
       names its own ``engine.image`` may run another image.
    4. The load generator's dispatch lag p99 is within the experiment's tolerance.
    5. In a natural-length replay, each class's output tokens are within
       ``lengths.MAX_OUTPUT_SHIFT`` of B0's in the same (mixture, rate, repeat):
       otherwise a cell could win by emitting fewer tokens.
    """
    problems = _Problems()
    max_lag = float(experiment.get("max_dispatch_lag_ms") or math.inf)
    chosen = _chosen_runs(cells, run_results, combos, problems)
    ref = _reference(experiment, cells, baseline, combos, chosen)
    worst_lag: float | None = None
    for (cell, mix, rate, repeat), run in sorted(chosen.items(), key=lambda kv: (kv[0][1:], kv[0][0])):
        combo = (mix, rate, repeat)
        base = chosen.get((baseline, *combo))
        _pairing_problems(cell, combo, run, base, experiment=experiment, baseline=baseline, problems=problems)
        _identity_problems(cell, combo, run, ref, problems)
        lag = _dispatch_lag(run)
        if lag is not None and (worst_lag is None or lag > worst_lag):
            worst_lag = float(lag)
        if lag_over_tolerance(lag, max_lag):
            problems.add(cell, "dispatch lag over tolerance", combo, p99_ms=lag, tolerance_ms=max_lag)

    invalid = sorted({p["cell"] for p in problems.items if p["problem"] != "duplicate runs"})
    order = [c["cell_id"] for c in cells]
    invalid.sort(key=order.index)
    return {
        "status": "pass" if not invalid else "fail",
        "invalid_cells": invalid,
        "baseline_valid": baseline not in invalid,
        "problems": problems.items,
        "warnings": [f"no run recorded {f}: cells cannot be checked for it" for f in ref.unrecorded],
        "reference": ref.values,
        # The tolerance, and the worst p99 dispatch lag measured in any compared run.
        "max_dispatch_lag_ms": rounded(max_lag),
        "worst_dispatch_lag_p99_ms": rounded(worst_lag) if worst_lag is not None else None,
    }


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
# (apps/lifecycle/calibration.py) and the uniform-spacing companions of the sweep's traces.
CALIBRATION_SCENARIO = "calibration"
UNIFORM_SCENARIO = "uniform"
NOT_FAILURE_SCENARIOS = frozenset({CALIBRATION_SCENARIO, UNIFORM_SCENARIO, "rehearsal"})


def scenario_check(
    run_results: Sequence[Mapping[str, Any]], verdicts: Mapping[str, Mapping[str, Any]] | None = None
) -> ScenarioCheck:
    """Failure-scenario runs, listed apart from the sweep with what held and what did not.

    ``verdicts`` (run key -> apps.analysis.scenarios.scenario_verdict) says what each
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
    """Check 4: the rollback to B0, rehearsed for real (apps/analysis/rehearsal.py).

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
