"""Rollback rehearsals as runs: when one is due, and starting one.

A rehearsal is a Run with ``scenario = "rehearsal"`` (apart from the sweep: the
paired analysis never reads it). It replays one frozen sweep trace (by default
the first mixture at its highest agreed rate, repeat 1) against the candidate
and rolls back to B0 mid-way (workers/rehearsal.py runs it; apps/analysis/
rehearsal.py measures it, from the rows apps/analysis/services.rehearsal_inputs
reads; check 4 judges it).

- After the analysis, :func:`rehearsal_due` queues the rehearsal of the cell the
  decision proposes, once, unless the spec says ``recovery.rehearse: false``; the
  experiment stays running until it ends, then is analysed again.
- :func:`rehearsal_start` rehearses any candidate on demand (the experiment page).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.analysis.decide import REHEARSAL_SCENARIO
from apps.approvals.audit import audit_record
from apps.experiments.models import Experiment, RunsRefused, ServerConfig
from apps.experiments.recovery import recovery_options
from apps.experiments.spec import RUN_OVERHEAD_S
from apps.runs.models import Run
from apps.runs.scheduling import hosts_qualifying, runs_dispatch

REHEARSAL = REHEARSAL_SCENARIO


class RehearsalError(ValueError):
    """A rehearsal cannot start now (the experiment's state, the cell, no host)."""


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
        experiment.runs.filter(scenario="", mixture=mixture, rate_name=rate)
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
    return Run.objects.create(
        experiment=experiment,
        cell=cell,
        mixture=mixture,
        rate_name=rate,
        rate_rps=source.rate_rps,
        repeat=source.repeat,
        round_position=0,
        plan_position=last + 1,
        kind=Run.Kind.REHEARSAL,
        scenario=REHEARSAL,
        trace=source.trace,
        trace_sha256=source.trace_sha256,
        corpus_sha256=source.corpus_sha256,
        requests_planned=source.requests_planned,
        model_revision=experiment.model_revision,
        tokenizer_revision=experiment.tokenizer_revision,
        warmup_seconds=source.warmup_seconds,
        observation_seconds=source.observation_seconds,
        drain_deadline_seconds=source.drain_deadline_seconds,
    )


def _enqueue(run: Run, experiment: Experiment, *, actor: Any, reason: str) -> None:
    hosts = hosts_qualifying(experiment)
    if not hosts:
        raise RehearsalError("no host is alive to run the rehearsal (start a worker)")
    experiment.status = Experiment.objects.values_list("status", flat=True).get(pk=experiment.pk)
    Experiment.objects.filter(pk=experiment.pk).update(
        status=Experiment.Status.RUNNING,
        status_reason=f"rehearsing the rollback of {run.cell.cell_id} to B0",
        updated_at=timezone.now(),
    )
    audit_record(
        action="rehearsal.queued",
        actor=actor,
        experiment=experiment,
        target=str(run.run_id),
        detail={
            "cell": run.cell.cell_id,
            "reason": reason,
            "hosts": [h.name for h in hosts],
            "from": experiment.status,
            "to": Experiment.Status.RUNNING,
        },
    )
    runs_dispatch([run], experiment)


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
    if cell is None or experiment.runs.filter(scenario=REHEARSAL, cell=cell).exists():
        return None
    try:
        with transaction.atomic():  # a savepoint: no half-made rehearsal run stays behind
            run = _create(experiment, cell)
            _enqueue(run, experiment, actor=None, reason="the decision proposes this cell")
    except RehearsalError as exc:
        audit_record(action="rehearsal.not_started", experiment=experiment, detail={"error": str(exc)})
        return None
    return run


@transaction.atomic
def rehearsal_start(*, experiment: Experiment, cell_id: str, actor: Any) -> Run:
    """Rehearse the rollback of any candidate now (from the experiment page); RehearsalError if not possible."""
    experiment = Experiment.objects.select_for_update().get(pk=experiment.pk)
    if experiment.status != Experiment.Status.ANALYSED:
        raise RehearsalError(
            f"the experiment is {experiment.status}; a rehearsal starts on an analysed experiment, "
            "before approval"
        )
    cell = experiment.cells.filter(cell_id=cell_id).first()
    if cell is None:
        raise RehearsalError(f"cell: no cell {cell_id!r} in this experiment")
    if cell.role == ServerConfig.Role.BASELINE:
        raise RehearsalError("cell: B0 is what a rollback returns to; choose a candidate")
    if experiment.runs.filter(scenario=REHEARSAL).exclude(status__in=Run.FINISHED).exists():
        raise RehearsalError("a rehearsal of this experiment is already queued or running")
    run = _create(experiment, cell)
    _enqueue(run, experiment, actor=actor, reason="started from the experiment page")
    return run
