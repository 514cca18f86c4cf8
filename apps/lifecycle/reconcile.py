"""The reconciler: no experiment stays stuck because a message was lost or a task died.

Every worker's heartbeat thread calls :func:`experiments_reconcile` about once a
minute (workers/heartbeat.py). It looks only at what has not moved for
``settings.RECONCILE_AFTER_S`` (5 minutes by default), takes each experiment's row
with ``SKIP LOCKED`` (two workers never repair the same one), and writes every
repair to the audit log as ``experiment.reconciled`` with what it found and did:

1. **Runs all finished, still running**: the analysis message was lost, or the
   analysis failed. It is sent again; after ``MAX_ANALYSIS_FAILURES`` failed
   analyses (``experiment.analysis_failed`` events) the experiment is cancelled
   with the last error as its reason (a final status; its runs and records stay).
   A search whose confirmation is not planned yet is not analysed: its next step is taken
   again (a lost hook after a screening run; apps/lifecycle/search_steps.search_advance).
2. **Freezing and no run ever started**: the freeze task was lost (a broker
   restart). The experiment goes back to planned, to be started again.
3. **Queued runs, nothing running anywhere for them**: their messages were lost.
   They are sent again; claiming a run is conditional (queued → starting), so a
   message that was not lost after all runs nothing twice.
4. **A goodput-capacity search queued and never started** (or a class's capacity search,
   apps/lifecycle/calibration.py): it is marked lost with the reason, so it can be requested again.
5. **A trace upload queued and never imported** (its message was lost), or importing
   for longer than ``IMPORT_LOST_AFTER`` (its worker died): its import is sent again
   (audited as ``upload.reconciled``); the import claims the row, so it runs once.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.audit.services import audit_record
from apps.experiments.models import Experiment
from apps.lifecycle.transition import experiment_transition
from apps.runs import dispatch
from apps.runs.models import Host, Run
from apps.runs.scheduling import hosts_qualifying, runs_dispatch

log = logging.getLogger(__name__)

MAX_ANALYSIS_FAILURES = 3
FREEZING = "freezing the workload"


def _stale_after() -> timedelta:
    return timedelta(seconds=float(getattr(settings, "RECONCILE_AFTER_S", 300)))


def _repaired(
    experiment: Experiment, repair: str, *, to: str | None = None, reason: str = "", **detail: Any
) -> dict[str, Any]:
    """Audit the repair as ``experiment.reconciled``; with ``to``, the repair is that status change
    (from running, the status the caller holds locked), ``reason`` its status reason."""
    if to is None:
        audit_record(
            action="experiment.reconciled", experiment=experiment, detail={"repair": repair, **detail}
        )
    else:
        experiment_transition(
            experiment, to, reason=reason, actor=None, action="experiment.reconciled",
            detail={"repair": repair, **detail}, expect={Experiment.Status.RUNNING},
        )  # fmt: skip
        detail.update({"from": Experiment.Status.RUNNING, "to": to})
    log.warning("reconciled experiment %s: %s %s", experiment.pk, repair, detail)
    return {"experiment": experiment.pk, "repair": repair, **detail}


def _reconcile_one(experiment: Experiment, now: Any) -> dict[str, Any] | None:
    runs = experiment.runs
    last_finished = runs.filter(finished_at__gte=now - _stale_after()).exists()
    from apps.lifecycle.completion import search_unconfirmed

    if not runs.exclude(status__in=Run.FINISHED).exists() and search_unconfirmed(experiment):
        # A search between its screening and its confirmation: its next step, not the analysis.
        if last_finished or experiment.status_reason == FREEZING:
            return None if last_finished else _reconcile_freeze(experiment, runs)
        from apps.lifecycle.search_steps import search_advance

        Experiment.objects.filter(pk=experiment.pk).update(updated_at=now)
        return _repaired(
            experiment, "search step taken again: no trial was running",
            result=search_advance(experiment_id=experiment.pk),
        )  # fmt: skip
    if not runs.exclude(status__in=Run.FINISHED).exists():
        if last_finished:
            return None  # the analysis of a run that just ended is on its way
        failures = AuditEvent.objects.filter(experiment=experiment, action="experiment.analysis_failed")
        if failures.count() >= MAX_ANALYSIS_FAILURES:
            last = failures.order_by("-at").first()
            error = (last.detail or {}).get("error", "") if last else ""
            return _repaired(
                experiment, "cancelled: the analysis keeps failing", error=error,
                to=Experiment.Status.CANCELLED,
                reason=f"the analysis failed {failures.count()} times (last: {error})"[:2000],
            )  # fmt: skip
        Experiment.objects.filter(pk=experiment.pk).update(updated_at=now)
        from apps.lifecycle.completion import analysis_enqueue

        analysis_enqueue(experiment_id=experiment.pk)
        return _repaired(experiment, "analysis sent again: every run had finished", failures=failures.count())
    if experiment.status_reason == FREEZING:
        lost = _reconcile_freeze(experiment, runs)
        if lost is not None:
            return lost
    queued = list(runs.filter(status=Run.Status.QUEUED).exclude(trace_sha256="").select_related("host"))
    if queued and not runs.filter(status__in=Run.ACTIVE).exists():
        recent = last_finished
        busy = Host.objects.filter(current_run__isnull=False, pk__in={r.host_id for r in queued if r.host_id})
        if not recent and not busy.exists():
            if hosts_qualifying(experiment):
                runs_dispatch(queued, experiment)  # sends the hosts' wake-ups on commit
                Experiment.objects.filter(pk=experiment.pk).update(updated_at=now)
                return _repaired(experiment, "queued runs sent again: none was running", runs=len(queued))
    return None


def _reconcile_freeze(experiment: Experiment, runs: Any) -> dict[str, Any] | None:
    """Repair 2: still freezing, no run started and none frozen: back to planned."""
    if runs.exclude(status=Run.Status.QUEUED).exists() or runs.exclude(trace_sha256="").exists():
        return None
    return _repaired(
        experiment, "back to planned: the freeze never ran", to=Experiment.Status.PLANNED,
        reason="the workload was never frozen (its task was lost): start it again",
    )  # fmt: skip


def _reconcile_goodput(now: Any) -> list[dict[str, Any]]:
    from django.db.models import Q

    from apps.experiments.models import Workload
    from apps.runs.selectors import CLASS_CAPACITY, GOODPUT

    out = []
    cutoff = now - _stale_after()
    # A goodput search is stored by mixture, a class's capacity search by class (calibration.py).
    for workload in Workload.objects.select_for_update(skip_locked=True).filter(
        Q(rates_derivation__has_key=GOODPUT) | Q(rates_derivation__has_key=CLASS_CAPACITY)
    ):
        derivation = dict(workload.rates_derivation or {})
        changed = []
        for section in (GOODPUT, CLASS_CAPACITY):
            capacity = dict(derivation.get(section) or {})
            for cell_id, by_key in capacity.items():
                for key, entry in dict(by_key or {}).items():
                    if not isinstance(entry, dict) or entry.get("status") != "queued":
                        continue
                    try:
                        requested = datetime.fromisoformat(str(entry.get("requested_at")))
                    except ValueError:
                        requested = None
                    if requested is not None and requested > cutoff:
                        continue
                    entry = {
                        **entry,
                        "status": "lost",
                        "reason": "the search never started (its task was lost)",
                    }
                    capacity[cell_id] = {**capacity[cell_id], key: entry}
                    changed.append((section, cell_id, key))
            if capacity:
                derivation[section] = capacity
        if changed:
            Workload.objects.filter(pk=workload.pk).update(rates_derivation=derivation)
            for section, cell_id, key in changed:
                where = {"mixture": key} if section == GOODPUT else {"class": key}
                out.append(
                    _repaired(
                        workload.experiment,
                        "goodput search marked lost: it never started"
                        if section == GOODPUT
                        else "class capacity search marked lost: it never started",
                        cell=cell_id,
                        **where,
                    )  # fmt: skip
                )
    return out


def _reconcile_uploads(now: Any) -> list[dict[str, Any]]:
    from django.db.models import Q

    from apps.experiments.models import TraceUpload
    from apps.lifecycle.trace_upload import IMPORT_LOST_AFTER

    stuck = TraceUpload.objects.select_for_update(skip_locked=True).filter(
        Q(status=TraceUpload.Status.QUEUED, updated_at__lt=now - _stale_after())
        | Q(status=TraceUpload.Status.IMPORTING, updated_at__lt=now - IMPORT_LOST_AFTER)
    )
    out = []
    for row in stuck:
        # Queued again, touched: the import sent now takes it, and the next pass leaves it be.
        TraceUpload.objects.filter(pk=row.pk).update(status=TraceUpload.Status.QUEUED, updated_at=now)
        dispatch.send_on_commit(
            dispatch.IMPORT_TRACE, kwargs={"upload_pk": row.pk}, queue=settings.CELERY_TASK_DEFAULT_QUEUE
        )
        detail = {"repair": f"import sent again: it was {row.status} since {row.updated_at:%H:%M:%S}"}
        audit_record(action="upload.reconciled", actor=None, target=f"trace upload {row.pk}", detail=detail)
        log.warning("reconciled trace upload %s: %s", row.pk, detail["repair"])
        out.append({"upload": row.pk, **detail})
    return out


def experiments_reconcile(*, now: Any = None) -> list[dict[str, Any]]:
    """Repair what is stuck (see the module docstring); returns what was repaired."""
    now = now or timezone.now()
    cutoff = now - _stale_after()
    repairs: list[dict[str, Any]] = []
    candidates = list(
        Experiment.objects.filter(status=Experiment.Status.RUNNING, updated_at__lt=cutoff).values_list(
            "pk", flat=True
        )
    )
    for pk in candidates:
        with transaction.atomic():
            experiment = (
                Experiment.objects.select_for_update(skip_locked=True)
                .filter(pk=pk, status=Experiment.Status.RUNNING, updated_at__lt=cutoff)
                .first()
            )
            if experiment is None:
                continue
            repaired = _reconcile_one(experiment, now)
            if repaired:
                repairs.append(repaired)
    with transaction.atomic():
        repairs += _reconcile_goodput(now)
    with transaction.atomic():
        repairs += _reconcile_uploads(now)
    return repairs
