"""Celery tasks: thin wrappers that take primary keys, re-read rows, and call services.

A redelivered task is harmless: ``execute_run`` claims its run with a
conditional update from ``queued`` and returns at once if the run is past
that; ``host_pull`` claims with the same kind of update (apps/runs/scheduling.py);
``analyse_experiment`` (apps/lifecycle/completion.py) skips an experiment that is not running or
has runs still to finish, and otherwise recomputes the same decision from the same rows.
"""

from __future__ import annotations

import logging
import os
import socket

from celery import shared_task
from django.conf import settings

log = logging.getLogger(__name__)


@shared_task(name="tailtune.health")
def health() -> dict[str, object]:
    """Answer who is listening: used by the README's check and the tests."""
    return {"ok": True, "hostname": socket.gethostname(), "pid": os.getpid(), "host": settings.TAILTUNE_HOST}


@shared_task(name="tailtune.freeze_experiment", acks_late=True)
def freeze_experiment(*, experiment_pk: int) -> int:
    from apps.lifecycle.running import experiment_freeze_and_enqueue
    from workers.pipeline import inline_executor

    # The capacity probe and the pace probe (if the spec asks for them) run inline on this host,
    # on one server kept up across their runs.
    with inline_executor() as execute:
        return experiment_freeze_and_enqueue(experiment_id=experiment_pk, execute=execute)


@shared_task(name="tailtune.cell_goodput_capacity", acks_late=True)
def cell_goodput_capacity(
    *, experiment_pk: int, cell_id: str, mixture: str, request_class: str = ""
) -> float | None:
    """Goodput capacity of one cell (send it to that host's queue): one probe run per step, inline;
    with ``request_class``, the cell's capacity for that class alone (an isolate decision's pools)."""
    from apps.experiments.models import RunsRefused
    from apps.lifecycle.calibration import cell_goodput_capacity as measure
    from workers.pipeline import inline_executor

    try:
        with inline_executor() as execute:
            result = measure(
                experiment_id=experiment_pk,
                cell_id=cell_id,
                mixture=mixture,
                execute=execute,
                request_class=request_class,
            )
    except RunsRefused as exc:  # analysed or decided since it was queued: stored as failed, with why
        log.info("goodput capacity of experiment %s not measured: %s", experiment_pk, exc)
        return None
    return result["capacity_rps"]


@shared_task(name="tailtune.execute_run", acks_late=True, reject_on_worker_lost=True)
def execute_run(*, run_pk: int) -> str:
    from workers.pipeline import run_execute

    return run_execute(run_pk=run_pk)


@shared_task(name="tailtune.host_pull", acks_late=True, reject_on_worker_lost=True)
def host_pull() -> str:
    """Woken on this host's queue: claim and run runnable runs until none is left
    (apps/runs/scheduling.py). A duplicate wake-up finds nothing and returns."""
    from workers.pipeline import host_pull as pull

    done = pull()
    return f"{len(done)} runs: " + ", ".join(f"{pk} {status}" for pk, status in done[:20])


@shared_task(name="tailtune.analyse_experiment", acks_late=True)
def analyse_experiment(*, experiment_pk: int) -> str:
    from apps.lifecycle.completion import experiment_analysis

    return experiment_analysis(experiment_id=experiment_pk)


@shared_task(name="tailtune.notify", bind=True, acks_late=True, max_retries=None)
def notify(self, *, notification_pk: int) -> str:
    """Send one notification (apps/notifications/services.py); a failed attempt is retried after
    30 s, 60 s, 120 s ... (at most 10 minutes apart) until the service's MAX_ATTEMPTS, which
    stops asking. Each attempt is recorded on the row whatever happens to this message."""
    from apps.notifications.services import DeliveryFailed, notification_deliver

    try:
        return notification_deliver(notification_id=notification_pk)
    except DeliveryFailed as exc:
        raise self.retry(exc=exc, countdown=min(600, 30 * 2**self.request.retries)) from None


@shared_task(name="tailtune.import_trace", acks_late=True)
def import_trace(*, upload_pk: int) -> str:
    """Import an uploaded trace and make what it was uploaded for: the create page's experiment,
    the trace alone, or a gate, started (any worker)."""
    from apps.gate.uploads import gate_upload_import

    return gate_upload_import(upload_pk=upload_pk)
