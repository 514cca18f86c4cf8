"""Running an experiment: start it, freeze its workload and enqueue its runs, cancel it.

The web request only checks that a host can serve the plan and moves the experiment to running
(:func:`experiment_start`); generating the traces takes minutes, so the freeze runs in a task on
a host's worker (:func:`experiment_freeze_and_enqueue`), after the capacity probe and the pace
probe it may need. Every status change goes through apps/lifecycle/transition.py.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.audit.services import audit_record
from apps.experiments.models import Experiment
from apps.lifecycle.freezing import plan_traces_attach, plan_traces_freeze
from apps.lifecycle.transition import experiment_transition
from apps.runs import dispatch
from apps.runs.hosts import HEARTBEAT_TIMEOUT
from apps.runs.models import Run
from apps.runs.scheduling import (
    experiment_pin_hardware,
    hosts_by_qualification,
    hosts_qualifying,
    runs_dispatch,
)

log = logging.getLogger(__name__)


class StartError(ValueError):
    pass


def experiment_start(*, experiment: Experiment, actor: Any = None) -> int:
    """Check a host can serve the plan, mark the experiment running, and queue the freeze.

    Generating every trace takes minutes for a large plan, so it happens in a
    task on a host's worker (:func:`experiment_freeze_and_enqueue`), never in
    the web request. Returns the number of runs that will be enqueued. The task
    is sent only after this transaction commits.
    """
    if experiment.status not in (Experiment.Status.PLANNED, Experiment.Status.CANCELLED):
        raise StartError(f"experiment is {experiment.status}; only a planned experiment can start")
    hosts = hosts_qualifying(experiment)
    if not hosts:
        refused = hosts_by_qualification(experiment)[1]
        if refused:  # live hosts that may not take it: say why, host by host
            raise StartError(
                "no host can serve this experiment: "
                + "; ".join(f"host {host.name}: {reason}" for host, reason in refused)
            )
        raise StartError(
            "no host can serve this experiment: no worker of its hardware "
            f"({experiment.hardware_id or 'any'}) has sent a heartbeat in the last "
            f"{int(HEARTBEAT_TIMEOUT.total_seconds())} s (start one with `make run` or `make worker`)"
        )
    with transaction.atomic():
        experiment_pin_hardware(experiment, hosts)
        pending = experiment.runs.filter(status__in=[Run.Status.QUEUED, Run.Status.CANCELLED])
        n = pending.update(status=Run.Status.QUEUED, reason="", finished_at=None)
        started = experiment_transition(
            experiment,
            Experiment.Status.RUNNING,
            reason="freezing the workload",
            actor=actor,
            action="experiment.started",
            detail={"runs": n, "hosts": [h.name for h in hosts], "hardware_id": experiment.hardware_id},
            expect={Experiment.Status.PLANNED, Experiment.Status.CANCELLED},
        )
        if not started:  # started (or decided) meanwhile: the runs' updates above roll back
            status = Experiment.objects.values_list("status", flat=True).get(pk=experiment.pk)
            raise StartError(f"experiment is {status}; only a planned experiment can start")
        queue = hosts[0].queue
        dispatch.send_on_commit(
            dispatch.FREEZE_EXPERIMENT, kwargs={"experiment_pk": experiment.pk}, queue=queue
        )
    return n


def experiment_freeze_and_enqueue(*, experiment_id: int, execute: Any = None) -> int:
    """Freeze the workload (every trace generated and stored once by hash), then enqueue the plan.

    When the spec asks for a capacity probe (apps/lifecycle/calibration.py) and no
    probe has frozen the rates yet, the probe runs first, inline, through
    ``execute`` (the run pipeline of this host's worker), so the rates are
    frozen before the first candidate runs.
    """
    from apps.lifecycle.calibration import (
        CalibrationError,
        calibration_pending,
        calibration_runs_retire,
        experiment_calibrate,
    )
    from apps.lifecycle.scenario_schedule import scenario_pace_probe, scenarios_need_pace
    from apps.lifecycle.search_steps import screening_trace_freeze, search_advance

    experiment = Experiment.objects.select_related("workload").get(pk=experiment_id)
    if experiment.status != Experiment.Status.RUNNING:
        return 0
    calibration_runs_retire(experiment=experiment)
    if calibration_pending(experiment=experiment):
        try:
            if execute is None:
                raise CalibrationError("the capacity probe needs a host worker to run it")
            Experiment.objects.filter(pk=experiment_id).update(status_reason="probing B0's capacity")
            experiment_calibrate(experiment_id=experiment_id, execute=execute)
        except Exception as exc:  # the user sees why, and can start again after fixing it
            log.exception("capacity probe of experiment %s failed", experiment_id)
            _back_to_planned(
                experiment,
                action="experiment.calibration_failed",
                reason=f"capacity probe failed: {exc}",
                error=str(exc),
                expect={Experiment.Status.RUNNING},
            )
            return 0
        experiment = Experiment.objects.select_related("workload").get(pk=experiment_id)
        if experiment.status != Experiment.Status.RUNNING:
            return 0
    if execute is not None and scenarios_need_pace(experiment=experiment):
        # Sizes the failure scenarios for this engine (docs/SCENARIOS.md); without it they
        # keep fixed sizes, and their verdicts say so.
        try:
            Experiment.objects.filter(pk=experiment_id).update(status_reason="measuring B0's decode pace")
            scenario_pace_probe(experiment=experiment, execute=execute)
        except Exception:
            log.exception(
                "pace probe of experiment %s failed: scenarios keep their fixed sizes", experiment_id
            )
        if not Experiment.objects.filter(pk=experiment_id, status=Experiment.Status.RUNNING).exists():
            return 0
    search = bool((experiment.spec or {}).get("search"))
    screening = None
    try:
        frozen = plan_traces_freeze(experiment=experiment)
        if search:  # the screening point's draw, which no confirmation round replays
            screening = screening_trace_freeze(experiment=experiment)
    except Exception as exc:  # the user sees why, and can start again after fixing it
        log.exception("freezing experiment %s failed", experiment_id)
        _back_to_planned(
            experiment,
            action="experiment.freeze_failed",
            reason=f"could not freeze the workload: {exc}",
            error=str(exc),
            expect={
                s for s, targets in Experiment.TRANSITIONS.items() if Experiment.Status.PLANNED in targets
            },
        )
        return 0
    hosts = hosts_qualifying(experiment)
    with transaction.atomic():
        runs = plan_traces_attach(experiment=experiment, frozen=frozen)
        Experiment.objects.filter(pk=experiment_id).update(status_reason="", updated_at=timezone.now())
        if not hosts:
            raise StartError("no host of the experiment's hardware is alive to take the runs")
        runs_dispatch(runs, experiment)
    if search:
        # The first trials (or, after a restart, whatever the recorded trials call for next).
        search_advance(experiment_id=experiment_id, screening=screening)
    return len(runs)


def _back_to_planned(
    experiment: Experiment, *, action: str, reason: str, error: str, expect: set[str]
) -> None:
    """A start that failed on the host: back to planned (when the experiment is still in a status
    of ``expect``), audited as ``action`` with the error either way."""
    moved = experiment_transition(
        experiment,
        Experiment.Status.PLANNED,
        reason=reason,
        actor=None,
        action=action,
        detail={"error": error},
        expect=expect,
    )
    if not moved:  # cancelled meanwhile: the failure is still on record
        audit_record(action=action, experiment=experiment, detail={"error": error})


def experiment_cancel(*, experiment: Experiment, actor: Any = None, reason: str = "cancelled by user") -> int:
    """Dequeue the rest and tell the running run's worker to stop (it watches this status).

    An experiment that cannot be cancelled any more (analysed or cancelled meanwhile: the
    caller read a stale status) is left as it is: 0 is returned, the caller reads the status.
    """
    with transaction.atomic():
        before = Experiment.objects.select_for_update().values_list("status", flat=True).get(pk=experiment.pk)
        if Experiment.Status.CANCELLED not in Experiment.TRANSITIONS[before]:
            return 0
        n = experiment.runs.filter(status=Run.Status.QUEUED).update(
            status=Run.Status.CANCELLED, reason=reason, finished_at=timezone.now()
        )
        experiment_transition(
            experiment,
            Experiment.Status.CANCELLED,
            reason=reason,
            actor=actor,
            action="experiment.cancelled",
            detail={"dequeued": n},
        )
    return n
