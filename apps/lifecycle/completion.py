"""An experiment's runs have all finished: the analysis is sent once (:func:`analysis_enqueue`),
run by a worker (:func:`experiment_analysis`, the body of the ``tailtune.analyse_experiment``
task), and the experiment is analysed, or first rehearses the rollback of the cell its decision
proposes (apps/lifecycle/rehearsal_schedule.py)."""

from __future__ import annotations

import logging

from django.conf import settings
from django.utils import timezone

from apps.analysis.services import experiment_analyse
from apps.audit.services import audit_record
from apps.experiments.models import Experiment
from apps.lifecycle.rehearsal_schedule import rehearsal_due
from apps.lifecycle.transition import experiment_transition
from apps.runs import dispatch
from apps.runs.models import Run
from apps.search.selectors import search_report

log = logging.getLogger(__name__)


def experiment_check_finished(*, experiment_id: int) -> bool:
    """After the last run finishes, enqueue the analysis (once). A search is analysed only after
    its confirmation: between its screening runs, none may be unfinished while its next step is
    taken, and screening data never feeds a verdict (apps/lifecycle/search_steps.py)."""
    experiment = Experiment.objects.get(pk=experiment_id)
    if experiment.status != Experiment.Status.RUNNING:
        return False
    if experiment.runs.exclude(status__in=Run.FINISHED).exists():
        return False
    if search_unconfirmed(experiment):
        return False
    analysis_enqueue(experiment_id=experiment_id)
    return True


def search_unconfirmed(experiment: Experiment) -> bool:
    """A search whose confirmation is not planned yet (no sweep run): nothing to analyse."""
    return (
        bool((experiment.spec or {}).get("search"))
        and not experiment.runs.filter(kind=Run.Kind.SWEEP).exists()
    )


def analysis_enqueue(*, experiment_id: int) -> None:
    """Send the experiment's analysis to the default queue once this transaction commits."""
    dispatch.send_on_commit(
        dispatch.ANALYSE_EXPERIMENT,
        kwargs={"experiment_pk": experiment_id},
        queue=settings.CELERY_TASK_DEFAULT_QUEUE,
    )


def experiment_mark_analysed(*, experiment_id: int) -> None:
    """Running -> analysed, once; cancelled or analysed meanwhile, nothing changes or is recorded."""
    experiment_transition(
        Experiment.objects.get(pk=experiment_id),
        Experiment.Status.ANALYSED,
        reason="",
        actor=None,
        action="experiment.analysed",
        expect={Experiment.Status.RUNNING},
    )


def experiment_analysis(*, experiment_id: int) -> str:
    """Analyse the experiment once its runs have all finished; returns what happened, in words.

    A duplicate or stale message (a redelivery, a task left on the broker) never analyses an
    experiment early: only a running experiment whose runs have all finished is analysed. A failed
    analysis is recorded (``experiment.analysis_failed``), never lost: the reconciler
    (apps/lifecycle/reconcile.py) sends it again, and cancels the experiment with the error after
    repeated failures.
    """
    experiment = Experiment.objects.filter(pk=experiment_id).first()
    if experiment is None or experiment.status != Experiment.Status.RUNNING:
        return f"skipped ({experiment.status if experiment else 'no such experiment'})"
    if experiment.runs.exclude(status__in=Run.FINISHED).exists():
        return "skipped (runs still to finish)"
    if search_unconfirmed(experiment):
        return "skipped (the search has not confirmed its cells yet)"
    Experiment.objects.filter(pk=experiment_id).update(updated_at=timezone.now())  # the reconciler waits
    try:
        decision = experiment_analyse(
            experiment_id=experiment_id,
            search=search_report(experiment_id=experiment_id, spec=experiment.spec or {}),
        )
    except Exception as exc:
        log.exception("analysis of experiment %s failed", experiment_id)
        audit_record(
            action="experiment.analysis_failed",
            experiment=experiment,
            detail={"error": f"{type(exc).__name__}: {exc}"[:2000]},
        )
        return f"analysis failed: {type(exc).__name__}: {exc}"[:500]
    # The proposed cell's rollback is rehearsed before anyone approves it (check 4); the
    # experiment stays running until the rehearsal ends, and is then analysed again.
    if decision.chosen_cell and rehearsal_due(experiment_id=experiment_id, chosen_cell=decision.chosen_cell):
        return f"{decision.outcome} {decision.chosen_cell}: rehearsing its rollback".strip()
    experiment_mark_analysed(experiment_id=experiment_id)
    return f"{decision.outcome} {decision.chosen_cell}".strip()
