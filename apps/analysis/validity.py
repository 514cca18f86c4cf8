"""Check 1, validity: are all cells comparable? Pure.

Every cell has one done sweep run per (mixture, rate, repeat), on B0's trace and corpus, with
B0's cohort, on the same hardware, revisions, image and sampling settings, its load generator
within the dispatch-lag tolerance, and (natural lengths) about as many output tokens per request
as B0. Every problem names its cell; a cell with one is invalid (``validity_check``). Inputs are
the report's own parts (per-run results, see apps/analysis/report.py); the other three checks are
apps/analysis/checks.py.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from apps.analysis import lengths
from apps.analysis.checks import rounded
from apps.analysis.report_inputs import CellInput, ExperimentInput
from apps.analysis.report_types import RunResult, ValidityCheck
from apps.experiments.generation import request_sampling
from apps.runs.summary_types import MeasurementGaps


def lag_over_tolerance(lag_p99_ms: float | None, max_lag_ms: float | None) -> bool:
    """Whether a run's load generator fell behind: its dispatch lag p99 over the workload's
    tolerance (no tolerance, or no lag measured: not over). The one statement of the rule, for
    the validity check and for a gate that stops at its first unusable run (early_stop.unusable)."""
    return lag_p99_ms is not None and max_lag_ms is not None and lag_p99_ms > max_lag_ms


# Measurement gaps a run may have and stay valid (docs/SPEC.md, "Measurement gaps"). The load
# generator's event loop stamps every send and every token frame: while it cannot run, sends go
# out late and frames are stamped late by up to the stall, so a stall longer than this could move
# a request's TTFT or stall by more than a short class's contract allows for noise. The replay
# measures its longest stall itself (workers/replay/client.py, ``loop_stall_max_ms``).
MAX_LOOP_STALL_MS = 250.0
# /metrics is scraped every 2 s (workers/pipeline.py): a run that went longer than this without a
# scrape (five intervals: the scraper stalled, or its scrapes failed) has holes in the gauges the
# diagnosis reads (running, waiting, KV use) and in its counters' timeline.
MAX_SCRAPE_GAP_S = 10.0


def loop_stall_tolerance_ms(max_dispatch_lag_ms: float | None) -> float:
    """The longest loop stall a run may have: :data:`MAX_LOOP_STALL_MS`, or the spec's dispatch-lag
    tolerance where that is larger. A stall delays sends and token stamps alike; a spec that
    accepts sends this late (a client sharing CPUs with the engine) has said how late its client
    may be, and a stall within that is no more than the lateness it already accepts."""
    return max(MAX_LOOP_STALL_MS, float(max_dispatch_lag_ms or 0.0))


def measurement_gaps(
    *,
    loop_stall_max_ms: float | None,
    scrape_gap_max_s: float | None,
    max_dispatch_lag_ms: float | None = None,
) -> list[str]:
    """Why a run's measurements have a hole over tolerance, one sentence per gap that is; empty
    when there is none (a gap not measured is none). Such a run is ``invalid``: its numbers are
    not the server's, so it is never judged against a contract (early stopping passes over it)."""
    problems = []
    stall_tolerance = loop_stall_tolerance_ms(max_dispatch_lag_ms)
    if loop_stall_max_ms is not None and loop_stall_max_ms > stall_tolerance:
        problems.append(
            f"the load generator's event loop stalled for {loop_stall_max_ms:.0f} ms, over the "
            f"{stall_tolerance:.0f} ms tolerance: sends and token times after it are late by up to that"
        )
    if scrape_gap_max_s is not None and scrape_gap_max_s > MAX_SCRAPE_GAP_S:
        problems.append(
            f"the /metrics scrape had a gap of {scrape_gap_max_s:.1f} s, over the "
            f"{MAX_SCRAPE_GAP_S:.0f} s tolerance: the server went unobserved that long"
        )
    return problems


def gaps_summary(
    *,
    loop_stall_max_ms: float | None,
    scrape_gap_max_s: float | None,
    max_dispatch_lag_ms: float | None = None,
) -> MeasurementGaps:
    """A run's ``summary["measurement_gaps"]``: its longest client loop stall and scrape gap,
    the tolerances, and :func:`measurement_gaps`' sentences (the worker ends the run ``invalid``
    with them, workers/pipeline.py ``_judge``)."""
    return {
        "loop_stall_max_ms": loop_stall_max_ms,
        "loop_stall_tolerance_ms": loop_stall_tolerance_ms(max_dispatch_lag_ms),
        "scrape_gap_max_s": scrape_gap_max_s,
        "scrape_gap_tolerance_s": MAX_SCRAPE_GAP_S,
        "problems": measurement_gaps(
            loop_stall_max_ms=loop_stall_max_ms,
            scrape_gap_max_s=scrape_gap_max_s,
            max_dispatch_lag_ms=max_dispatch_lag_ms,
        ),
    }


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
    stopped: Collection[CellPoint] = (),
) -> dict[CellPoint, RunResult]:
    """Step 1: the done sweep run of each cell at each point (the first of duplicates); a point
    without one is missing, or says why its runs were skipped. A point early stopping settled
    (``stopped``) is no problem of comparability: its cell is stopped, not invalid."""
    sweep: dict[CellPoint, list[RunResult]] = defaultdict(list)
    for r in run_results:
        if not r.get("scenario"):
            sweep[(r["cell"], r["mixture"], r["rate"], int(r["repeat"]))].append(r)
    chosen: dict[CellPoint, RunResult] = {}
    for cell in (c["cell_id"] for c in cells):
        for combo in combos:
            runs = sweep.get((cell, *combo), [])
            done = [r for r in runs if r["status"] == "done"]
            if not done and (cell, *combo) in stopped:
                continue
            if not done:
                states = sorted({r["status"] for r in runs}) or ["not run"]
                skipped = [r for r in runs if r["status"] == "skipped" and r.get("reason")]
                if skipped:
                    # Skipped for another reason (a gate's stop at an unusable run): say why.
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
    stopped: Collection[CellPoint] = (),
) -> ValidityCheck:
    """Are all cells comparable? Every problem names its cell; a cell with one is invalid.

    1. Every cell has exactly one done sweep run per (mixture, rate, repeat); a point whose
       runs were skipped says so, with the reason (``skipped: ...``), except a point early
       stopping settled (``stopped``: (cell, mixture, rate, repeat)): that cell can no longer be
       accepted, which acceptance says, and is stopped, not incomparable.
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
    chosen = _chosen_runs(cells, run_results, combos, problems, stopped)
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
