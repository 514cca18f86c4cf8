"""A run lost with its worker or host is failed with the reason and queued again, up to
``MAX_RUN_ATTEMPTS`` attempts in all (:func:`run_requeue_once`); the heartbeat's reaper finds the
hosts that stopped heartbeating (:func:`hosts_reap_lost`)."""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from apps.audit.services import audit_record
from apps.experiments.models import Experiment, RunsRefused
from apps.lifecycle.completion import experiment_check_finished
from apps.lifecycle.runs import run_retry_build
from apps.runs.hosts import HEARTBEAT_TIMEOUT
from apps.runs.models import Host, Run
from apps.runs.scheduling import host_release_reserved, runs_dispatch

log = logging.getLogger(__name__)

# A planned run gets this many attempts in all when its worker or host is lost under it (a
# SIGKILL, a reboot): enough that two losses in a row do not drop a measurement, few enough
# that a run which itself brings its worker down does not loop.
MAX_RUN_ATTEMPTS = 3


def attempts_of(run: Run) -> int:
    """How many attempts the planned run behind ``run`` has had, ``run`` included."""
    n, current = 1, run.retry_of_id
    while current is not None:
        n += 1
        current = Run.objects.filter(pk=current).values_list("retry_of_id", flat=True).first()
    return n


def run_requeue_once(*, run: Run, reason: str) -> Run | None:
    """Fail ``run`` with the reason and, unless it was retried already or its planned run has
    had ``MAX_RUN_ATTEMPTS``, queue a fresh copy (linked by ``retry_of``). A search's screening
    run hands its trial to the copy, or without one has it scored failed and the search goes on
    (apps/lifecycle/search_steps.search_run_requeued)."""
    retry = _requeue(run=run, reason=reason)
    if run.kind == Run.Kind.SCREEN:
        from apps.lifecycle.search_steps import search_run_requeued

        search_run_requeued(run_id=run.pk, retry_id=retry.pk if retry is not None else None)
    return retry


def _requeue(*, run: Run, reason: str) -> Run | None:
    failed = (
        Run.objects.filter(pk=run.pk)
        .exclude(status__in=Run.FINISHED)
        .update(status=Run.Status.FAILED, reason=reason, finished_at=timezone.now())
    )
    run.refresh_from_db()
    Host.objects.filter(current_run=run).update(current_run=None)
    if not failed and run.status != Run.Status.FAILED:
        return None
    if Run.objects.filter(retry_of=run).exists() or attempts_of(run) >= MAX_RUN_ATTEMPTS:
        return None
    if run.experiment.status != Experiment.Status.RUNNING:
        return None
    with transaction.atomic():
        try:
            run.experiment.assert_accepts_runs(kind=run.kind)
        except RunsRefused:
            return None  # decided meanwhile: a retry would add to its evidence
        retry = run_retry_build(run=run)
        retry.save()
        # Runnable by any qualifying host; with none alive it waits for one (a host's worker
        # pulls on start, workers/heartbeat.py).
        runs_dispatch([retry], run.experiment)
    audit_record(
        action="run.requeued", experiment=run.experiment, target=str(run.run_id), detail={"reason": reason}
    )
    return retry


def hosts_reap_lost() -> list[Run]:
    """Fail (and re-queue once) the running run of every host that stopped heartbeating."""
    cutoff = timezone.now() - HEARTBEAT_TIMEOUT
    lost = Host.objects.filter(current_run__isnull=False, last_heartbeat__lt=cutoff).select_related(
        "current_run"
    )
    retried = []
    for host in lost:
        run = host.current_run
        if run is None:
            continue
        log.warning(
            "host %s lost (last heartbeat %s): failing run %s", host.name, host.last_heartbeat, run.pk
        )
        retry = run_requeue_once(run=run, reason=f"host lost: {host.name} stopped heartbeating")
        host_release_reserved(host)
        if retry:
            retried.append(retry)
        experiment_check_finished(experiment_id=run.experiment_id)
    return retried
