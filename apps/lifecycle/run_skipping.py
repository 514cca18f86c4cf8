"""Skip the remaining sweep runs of cells that can no longer be accepted (early stopping).

The rule and why it is sound live in apps/analysis/early_stop.py; this module turns rows
into its inputs and writes what it decides. The worker calls
:func:`experiment_skip_doomed` after each run finishes, with that run's cell: a cell's
fate changes only when one of its own runs ends.

What it never touches: B0 (the reference every cell is compared with), runs outside the
sweep (failure scenarios, uniform companions, the capacity probe, rehearsals: the approval
of whichever cell the decision proposes needs them), and runs a host has claimed (only
``queued`` rows are skipped, by one conditional update, so a claim and a skip never both
win). A skipped run is finished: status ``skipped``, its reason
``cannot be accepted (run <run id> broke <class> <metric>)``, and an audit entry
``runs.skipped`` per cell.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.analysis.early_stop import doomed, unusable
from apps.analysis.report_options import ReportOptions, agreed_combos, sweep_combos
from apps.analysis.services import runs_over_limit
from apps.audit.services import audit_record
from apps.experiments.models import Experiment
from apps.experiments.spec_types import StoredSpec
from apps.runs.models import Run
from apps.workloads.services import TraceNotFound, trace_content

log = logging.getLogger(__name__)


def early_stop_enabled(spec: StoredSpec | None) -> bool:
    """The spec's ``engine.early_stop`` (default on)."""
    return bool(((spec or {}).get("engine") or {}).get("early_stop", True))


def stop_on_invalid_enabled(spec: StoredSpec | None) -> bool:
    """The spec's ``engine.stop_on_invalid`` (default off; a gate's experiment sets it)."""
    return bool(((spec or {}).get("engine") or {}).get("stop_on_invalid", False))


@lru_cache(maxsize=128)
def trace_cohort_bounds(sha256: str) -> dict[str, int]:
    """class -> non-warm-up requests of the stored trace ``sha256``: the most cohort requests of
    that class a run replaying it can have (a run's cohort is its non-warm-up records planned in
    the window, one record per trace request). Cached: a trace never changes under its hash.

    Reads each canonical line's ``class`` and ``warmup`` with the C JSON parser; the bytes were
    verified against the hash by trace_content.
    """
    counts: dict[str, int] = {}
    lines = trace_content(sha256=sha256).splitlines()
    for line in lines[1:]:  # the first line is the header
        if not line:
            continue
        request = json.loads(line)
        if not request.get("warmup"):
            name = str(request["class"])
            counts[name] = counts.get(name, 0) + 1
    return counts


def _bounds(
    runs: list[Run], cells: set[str], baseline: str, agreed: list[tuple[str, str, int]]
) -> dict[tuple[str, str, int], dict[str, int]]:
    """(mixture, rate, repeat) -> class -> cohort bound, from the trace a run there replays.

    Every cell replays the same trace at a point (validity holds them to it), so the judged
    cell's own runs name it, else B0's. A point with no trace known has no bound (never doomed).
    """
    sha: dict[tuple[str, str, str, int], str] = {}
    for r in runs:
        if r.trace_sha256:
            sha.setdefault((r.cell.cell_id, r.mixture, r.rate_name, r.repeat), r.trace_sha256)
    out: dict[tuple[str, str, int], dict[str, int]] = {}
    wanted = set(agreed)
    for cell in cells:
        for point in wanted:
            name = sha.get((cell, *point)) or sha.get((baseline, *point))
            if not name or point in out:
                continue
            try:
                out[point] = trace_cohort_bounds(name)
            except (TraceNotFound, ValueError) as exc:
                log.warning("early stop: no cohort bound from trace %s: %s", name, exc)
    return out


def _skip_queued(
    experiment: Experiment, pending: list[int], *, reason: str, target: str, detail: dict[str, Any]
) -> int:
    """Skip the runs of ``pending`` that are still queued, with ``reason``, and audit them as
    ``runs.skipped`` (``detail`` plus the reason and the runs skipped, in plan order). One
    conditional update: a run a host claimed meanwhile is left to run. Returns how many."""
    now = timezone.now()
    with transaction.atomic():
        n = Run.objects.filter(pk__in=pending, status=Run.Status.QUEUED).update(
            status=Run.Status.SKIPPED, reason=reason, finished_at=now, updated_at=now
        )
        if n:
            runs = (
                Run.objects.filter(pk__in=pending, status=Run.Status.SKIPPED)
                .order_by("plan_position", "id")
                .values_list("run_id", flat=True)
            )
            audit_record(
                action="runs.skipped",
                experiment=experiment,
                target=target,
                detail={**detail, "reason": reason, "runs": [str(k) for k in runs]},
            )
    return n


def experiment_skip_doomed(*, experiment_id: int, cell_id: str | None = None) -> dict[str, str]:
    """Skip the queued sweep runs of every candidate that can no longer be accepted.

    Returns cell id -> the reason, for the cells whose runs were skipped now.

    1. Nothing unless the experiment is running and its spec leaves ``engine.early_stop`` on.
    2. The sweep's runs in the report's order, and the agreed points as the analysis will
       judge them (the spec's ``analysis`` options: agreed rates, ``contract_alpha``).
    3. The cells judged: ``cell_id``'s (the cell whose run just ended), or without it every
       candidate; only those with queued sweep runs left.
    4. Their done sweep runs' over-limit counts, from their records by the report's own path.
    5. Each unsettled repeat's bound from its frozen trace; early_stop.doomed decides.
    6. Per doomed cell, its queued sweep runs become ``skipped`` in one conditional update,
       audited as ``runs.skipped``.
    """
    experiment = Experiment.objects.select_related("workload").filter(pk=experiment_id).first()
    if experiment is None or experiment.status != Experiment.Status.RUNNING:
        return {}
    spec = experiment.spec or {}
    if not early_stop_enabled(spec):
        return {}
    try:
        options = ReportOptions.from_mapping(spec.get("analysis"))
    except ValueError as exc:
        log.warning("early stop: experiment %s has unusable analysis options: %s", experiment_id, exc)
        return {}

    runs = list(
        experiment.runs.filter(kind=Run.Kind.SWEEP).select_related("cell").order_by("plan_position", "id")
    )
    baselines = {r.cell.cell_id for r in runs if r.cell.role == "baseline"}
    baseline = next(iter(baselines), "")
    # An A/A control cell is never recommended, so it is never stopped for failing acceptance:
    # its runs are the measured noise floor, whatever its contracts show.
    queued = {
        r.cell.cell_id
        for r in runs
        if r.status == Run.Status.QUEUED
        and r.cell.role != "baseline"
        and not r.cell.control
        and r.cell.cell_id not in baselines
    }
    judged = queued & ({cell_id} if cell_id is not None else queued)
    if not judged or not baseline:
        return {}
    workload = getattr(experiment, "workload", None)
    combos = sweep_combos(
        [{"mixture": r.mixture, "rate": r.rate_name, "repeat": r.repeat} for r in runs],
        {"mixtures": workload.mixtures if workload else {}, "rates": workload.rates if workload else {}},
    )
    agreed = agreed_combos(combos, options)
    points = {(m, r) for m, r, _ in agreed}

    done = [
        r
        for r in runs
        if r.cell.cell_id in judged and r.status == Run.Status.DONE and (r.mixture, r.rate_name) in points
    ]
    if not done:
        return {}
    over = runs_over_limit(experiment=experiment, runs=done)
    finished = sorted(done, key=lambda r: (r.finished_at or timezone.now(), r.plan_position, r.pk))
    found = doomed(
        cells=sorted(judged),
        baseline=baseline,
        runs=[
            {
                "key": str(r.run_id),
                "cell": r.cell.cell_id,
                "mixture": r.mixture,
                "rate": r.rate_name,
                "repeat": r.repeat,
                "scenario": r.scenario_label,
                "status": r.status,
            }
            for r in runs
            if r.cell.cell_id in judged
        ],
        over=over,
        agreed=agreed,
        classes=[
            {"name": c.name, "error_rate": c.error_rate} for c in experiment.classes.order_by("position")
        ],
        bounds=_bounds(runs, judged, baseline, agreed),
        alpha=options.compare.contract_alpha,
        order=[str(r.run_id) for r in finished],
    )

    return _skip_doomed_cells(experiment, runs, found)


def _skip_doomed_cells(
    experiment: Experiment, runs: list[Run], found: Mapping[str, Mapping[str, Any]]
) -> dict[str, str]:
    """Step 6: each doomed cell's queued sweep runs skipped (one conditional update, audited);
    cell id -> the reason, for the cells whose runs were skipped now."""
    experiment_id = experiment.pk
    skipped: dict[str, str] = {}
    cell_pk = {r.cell.cell_id: r.cell_id for r in runs}
    for cell, why in sorted(found.items()):
        pending = (
            Run.objects.filter(
                experiment_id=experiment_id,
                cell_id=cell_pk[cell],
                kind=Run.Kind.SWEEP,
                status=Run.Status.QUEUED,
            )
            .exclude(cell__role="baseline")
            .values_list("pk", flat=True)
        )
        n = _skip_queued(
            experiment,
            list(pending),
            reason=why["reason"],
            target=cell,
            detail={
                "cell": cell,
                "run": why["run"],
                "mixture": why["mixture"],
                "rate": why["rate"],
                "class": why["class"],
                "metric": why["metric"],
                "over": why["over"],
                "most_to_come": why["most_to_come"],
                "p_value": why["p_value"],
            },
        )
        if not n:
            continue
        log.info("early stop: %s skipped %d runs of %s: %s", experiment_id, n, cell, why["reason"])
        skipped[cell] = why["reason"]
    return skipped


def experiment_skip_after_invalid(*, experiment_id: int, run_pk: int) -> str | None:
    """With ``engine.stop_on_invalid``: once a sweep run has ended unusable, skip every queued
    sweep run of the experiment. Returns the reason, when runs were skipped now.

    1. Nothing unless the experiment is running with ``engine.stop_on_invalid`` on.
    2. The run that just ended, if it is a sweep run: early_stop.unusable says whether the
       analysis can ever use it (invalid, failed, or its dispatch lag over the workload's
       tolerance). A gate's verdict is then inconclusive whatever else runs.
    3. Every queued sweep run becomes ``skipped`` with ``the answer is inconclusive (run <run
       id> <why>)``, in one conditional update (a run a host claimed meanwhile runs), audited as
       ``runs.skipped``. Runs outside the sweep are left to run.
    """
    experiment = Experiment.objects.select_related("workload").filter(pk=experiment_id).first()
    if experiment is None or experiment.status != Experiment.Status.RUNNING:
        return None
    if not stop_on_invalid_enabled(experiment.spec):
        return None
    run = Run.objects.filter(pk=run_pk, experiment_id=experiment_id, kind=Run.Kind.SWEEP).first()
    if run is None:
        return None
    workload = getattr(experiment, "workload", None)
    why = unusable(
        status=run.status,
        reason=run.reason,
        lag_p99_ms=run.dispatch_lag_p99_ms,
        max_lag_ms=workload.max_dispatch_lag_ms if workload else None,
    )
    if why is None:
        return None
    reason = f"the answer is inconclusive (run {run.run_id} {why})"
    queued = Run.objects.filter(experiment_id=experiment_id, kind=Run.Kind.SWEEP, status=Run.Status.QUEUED)
    n = _skip_queued(
        experiment,
        list(queued.values_list("pk", flat=True)),
        reason=reason,
        target=str(run.run_id),
        detail={"run": str(run.run_id)},
    )
    if not n:
        return None
    log.info("stop on invalid: %s skipped %d runs: %s", experiment_id, n, reason)
    return reason
