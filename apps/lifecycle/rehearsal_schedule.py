"""Rollback rehearsals as runs: when one is due, and starting one.

A rehearsal is a Run with ``kind = "rehearsal"`` (apart from the sweep: the
paired analysis never reads it). It replays one frozen sweep trace (by default
the first mixture at its highest agreed rate, repeat 1) against the candidate
and rolls back to B0 mid-way (workers/rehearsal_run.py runs it; apps/analysis/
rehearsal.py measures it, from the rows apps/analysis/services.rehearsal_inputs
reads; check 4 judges it).

- After the analysis, :func:`rehearsal_due` queues the rehearsal of the cell the
  decision proposes, once, unless the spec says ``recovery.rehearse: false``; the
  experiment stays running until it ends, then is analysed again.
- :func:`rehearsal_start` rehearses any candidate on demand (the results page), while the
  experiment awaits approval (``analysed``); never once a person decided (the evidence behind
  a verdict never changes) nor while another rehearsal runs.

Every attempt is kept: a cell rehearsed again gets a new run, its earlier ones stay as they
ended. A repeat needs a reason, which goes into the audit log with who asked (action
``rehearsal.queued``); the report, the results and approval pages and the manifest list every
attempt with it, and check 4 reads them all (docs/SCENARIOS.md, "Repeated attempts"). The only
other path that queues a rehearsal again is the service's own, when a worker or host is lost
under one (apps/lifecycle/retries.run_requeue_once, audited as ``run.requeued`` with its reason).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from apps.analysis.rehearsal_measures import REHEARSAL_QUEUED
from apps.audit.services import audit_record
from apps.experiments.models import Experiment, RunsRefused, ServerConfig
from apps.experiments.recovery import recovery_options
from apps.experiments.spec import RUN_OVERHEAD_S
from apps.lifecycle.runs import run_build
from apps.lifecycle.transition import experiment_transition
from apps.runs.models import Run
from apps.runs.scheduling import hosts_qualifying, runs_dispatch

# The longest reason a repeat may carry (the audit log and the manifest keep it whole).
MAX_REASON_CHARS = 2000


class RehearsalError(ValueError):
    """A rehearsal cannot start now: ``field`` names the request's field at fault ("cell",
    "reason"); None when it is the experiment's state (not awaiting approval, a rehearsal
    already running, no host)."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def rehearsal_point(experiment: Experiment) -> tuple[str, str]:
    """(mixture, rate name) of the trace a rehearsal replays: the spec's, else the first
    mixture at its highest agreed rate (the near-capacity point)."""
    options = recovery_options(experiment.spec or {})
    w = experiment.workload
    mixture = options["mixture"] or next(iter(w.mixtures))
    agreed = ((experiment.spec or {}).get("analysis") or {}).get("agreed_rates") or list(w.rates)
    rate = options["rate"] or max(agreed, key=lambda name: (w.rate_for(mixture, name), name))
    return mixture, rate


def rehearsal_cost_s(experiment: Experiment) -> float:
    """Engine seconds one rehearsal costs: its windows, plus two server starts."""
    w = experiment.workload
    return float(w.warmup_s + w.observation_s + w.drain_deadline_s) + 2 * RUN_OVERHEAD_S


def _source_run(experiment: Experiment, mixture: str, rate: str) -> Run:
    source = (
        experiment.runs.filter(kind=Run.Kind.SWEEP, mixture=mixture, rate_name=rate)
        .exclude(trace_sha256="")
        .order_by("repeat", "plan_position")
        .first()
    )
    if source is None:
        raise RehearsalError(
            f"no frozen trace for mixture {mixture!r} at rate {rate!r}: start the sweep first"
        )
    return source


def _create(experiment: Experiment, cell: ServerConfig) -> Run:
    # The rule every writer of runs follows: a rehearsal may still be added while the
    # experiment is analysed (check 4 is part of deciding), never once a person decided.
    try:
        experiment.assert_accepts_runs(kind=Run.Kind.REHEARSAL)
    except RunsRefused as exc:
        raise RehearsalError(str(exc)) from None
    mixture, rate = rehearsal_point(experiment)
    source = _source_run(experiment, mixture, rate)
    last = experiment.runs.order_by("-plan_position").values_list("plan_position", flat=True).first() or 0
    run = run_build(
        experiment=experiment,
        kind=Run.Kind.REHEARSAL,
        cell=cell,
        mixture=mixture,
        rate_name=rate,
        rate_rps=source.rate_rps,
        repeat=source.repeat,
        round_position=0,
        plan_position=last + 1,
        replays=source,
    )
    run.save()
    return run


def _queue(experiment: Experiment, cell: ServerConfig, *, actor: Any, reason: str, earlier: list[str]) -> Run:
    """Add the rehearsal run, move the experiment to running with the audit event that names the
    run, and dispatch it, in the caller's transaction on the locked experiment (an analysed one
    takes this one kind of run: Experiment.assert_accepts_runs)."""
    hosts = hosts_qualifying(experiment)
    if not hosts:
        raise RehearsalError("no host is alive to run the rehearsal (start a worker)")
    run = _create(experiment, cell)
    experiment_transition(
        experiment,
        Experiment.Status.RUNNING,
        reason=f"rehearsing the rollback of {cell.cell_id} to B0",
        actor=actor,
        action=REHEARSAL_QUEUED,
        target=str(run.run_id),
        detail={
            "cell": cell.cell_id,
            "reason": reason,
            "attempt": len(earlier) + 1,
            "earlier_attempts": earlier,
            "hosts": [h.name for h in hosts],
        },
    )
    runs_dispatch([run], experiment)
    return run


def _attempts(experiment: Experiment, cell: ServerConfig) -> list[str]:
    """The run ids of the cell's rehearsal attempts so far, oldest first."""
    return [
        str(run_id)
        for run_id in experiment.runs.filter(kind=Run.Kind.REHEARSAL, cell=cell)
        .order_by("id")
        .values_list("run_id", flat=True)
    ]


@transaction.atomic
def rehearsal_due(*, experiment_id: int, chosen_cell: str) -> Run | None:
    """Queue the proposed cell's rehearsal if the spec wants one and none exists; else None."""
    experiment = Experiment.objects.select_for_update().get(pk=experiment_id)
    if (
        experiment.status != Experiment.Status.RUNNING
        or not recovery_options(experiment.spec or {})["rehearse"]
    ):
        return None
    cell = experiment.cells.filter(cell_id=chosen_cell, role=ServerConfig.Role.CANDIDATE).first()
    if cell is None or experiment.runs.filter(kind=Run.Kind.REHEARSAL, cell=cell).exists():
        return None
    try:
        with transaction.atomic():  # a savepoint: no half-made rehearsal run stays behind
            run = _queue(experiment, cell, actor=None, reason="the decision proposes this cell", earlier=[])
    except RehearsalError as exc:
        audit_record(action="rehearsal.not_started", experiment=experiment, detail={"error": str(exc)})
        return None
    return run


@transaction.atomic
def rehearsal_start(*, experiment: Experiment, cell_id: str, actor: Any, reason: str = "") -> Run:
    """Rehearse the rollback of a candidate now (the results page); RehearsalError if not possible.

    A cell rehearsed before is rehearsed again only with a reason (a blank one is refused,
    naming the field): every attempt stays, and the reason goes to the audit log beside it.
    """
    experiment = Experiment.objects.select_for_update().get(pk=experiment.pk)
    if experiment.status != Experiment.Status.ANALYSED:
        raise RehearsalError(
            f"the experiment is {experiment.status}; a rehearsal starts while it awaits approval "
            "(analysed), never once a person decided: the evidence behind a verdict never changes"
        )
    cell = experiment.cells.filter(cell_id=cell_id).first()
    if cell is None:
        raise RehearsalError(f"cell: no cell {cell_id!r} in this experiment", field="cell")
    if cell.role == ServerConfig.Role.BASELINE:
        raise RehearsalError("cell: B0 is what a rollback returns to; choose a candidate", field="cell")
    reason = (reason or "").strip()
    if len(reason) > MAX_REASON_CHARS:
        raise RehearsalError(f"reason: at most {MAX_REASON_CHARS} characters", field="reason")
    earlier = _attempts(experiment, cell)
    if earlier and not reason:
        n = len(earlier)
        raise RehearsalError(
            f"reason: {cell.cell_id} was already rehearsed ({n} attempt{'s' if n != 1 else ''}); say why "
            "you rehearse it again: the reason goes to the audit log, and every attempt stays in the "
            "report and the manifest",
            field="reason",
        )
    if experiment.runs.filter(kind=Run.Kind.REHEARSAL).exclude(status__in=Run.FINISHED).exists():
        raise RehearsalError("a rehearsal of this experiment is already queued or running")
    return _queue(
        experiment, cell, actor=actor, reason=reason or "started from the results page", earlier=earlier
    )
