"""Claims and leases: a host takes a queued run, and holds itself for one run at a time.

Every status change is a conditional update (``filter(status=...).update``)
whose row count says whether this caller won, so a redelivered task, a second
worker or a racing cancel can never move a run twice.
"""

from __future__ import annotations

from django.db.models import F
from django.utils import timezone

from apps.runs.models import Host, Run


def run_claim(*, run_pk: int, host: Host) -> Run | None:
    """Move a queued run to starting for this host; None if someone else has it (or it is done)."""
    now = timezone.now()
    won = Run.objects.filter(pk=run_pk, status=Run.Status.QUEUED).update(
        status=Run.Status.STARTING, host=host, attempts=F("attempts") + 1, started_at=now, updated_at=now
    )
    if won != 1:
        return None
    return Run.objects.select_related("experiment", "cell", "trace", "experiment__workload").get(pk=run_pk)


def host_lease(*, host: Host, run: Run) -> bool:
    """Claim the host for this run; a host serves one candidate at a time."""
    return Host.objects.filter(pk=host.pk, current_run__isnull=True).update(current_run=run) == 1


def host_release(*, host: Host, run: Run) -> None:
    Host.objects.filter(pk=host.pk, current_run=run).update(current_run=None)


def host_heartbeat(*, host: Host) -> None:
    Host.objects.filter(pk=host.pk).update(last_heartbeat=timezone.now())
