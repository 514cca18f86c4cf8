"""The worker side of the host registry: register, recover, heartbeat.

When a worker process starts it (1) registers its host, (2) reaps any vLLM
server that a previous worker of this host started and never stopped (killed
with SIGKILL, say), and fails or re-runs the run it left mid-flight, then
(3) keeps a heartbeat thread writing ``Host.last_heartbeat``, failing the
runs of other hosts that went silent and, about once a minute, repairing
experiments left stuck by a lost message or a failed task (apps/lifecycle/reconcile.py).
"""

from __future__ import annotations

import logging
import os
import threading

from celery.signals import worker_ready, worker_shutdown

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 10.0
RECONCILE_EVERY_BEATS = 6  # about once a minute: apps/lifecycle/reconcile.py
_stop = threading.Event()


def recover_host() -> list[int]:
    """Steps 1-2: returns the pids that were reaped."""
    from apps.lifecycle.completion import experiment_check_finished
    from apps.lifecycle.retries import run_requeue_once
    from apps.runs.hosts import host_register_local
    from apps.runs.models import Host, Run
    from workers.engine.confirm import local_hardware_id
    from workers.engine.procs import reap_pids

    host = host_register_local(hardware_id=local_hardware_id())
    reaped: list[int] = []
    # The pool process that ran the last run may have outlived its killed parent. Its pid is
    # signalled only while it still names that process (same start time): a pid reused since
    # by an unrelated process is left alone.
    if host.worker_pid and host.worker_pid != os.getpid():
        if host.worker_pid_start is None:
            log.warning("worker pid %s was recorded without its start time: not signalled", host.worker_pid)
        else:
            reaped += reap_pids([[host.worker_pid, host.worker_pid_start]], grace_s=0.0)
    if host.server_pids:
        reaped += reap_pids(host.server_pids)
    Host.objects.filter(pk=host.pk).update(
        server_pids=[], worker_pid=None, worker_pid_start=None, current_run=None
    )
    for run in Run.objects.filter(host=host, status__in=Run.ACTIVE).select_related("experiment"):
        log.warning("run %s was %s when this host's worker died: failing it", run.pk, run.status)
        run_requeue_once(run=run, reason=f"worker lost mid-run on host {host.name} (was {run.status})")
        experiment_check_finished(experiment_id=run.experiment_id)
    if reaped:
        log.warning("reaped processes left by a previous worker: %s", reaped)
    return reaped


def _beat() -> None:
    from django.db import close_old_connections

    from apps.lifecycle.reconcile import experiments_reconcile
    from apps.lifecycle.retries import hosts_reap_lost
    from apps.runs.hosts import host_register_local
    from apps.runs.services import host_heartbeat

    beats = 0
    while not _stop.wait(HEARTBEAT_INTERVAL_S):
        beats += 1
        try:
            close_old_connections()
            host = host_register_local()
            host_heartbeat(host=host)
            hosts_reap_lost()
            if beats % RECONCILE_EVERY_BEATS == 0:
                experiments_reconcile()
        except Exception:  # a failed beat must not kill the thread; the next one retries
            log.exception("heartbeat failed")


def _pull_on_start() -> None:
    """A worker that starts takes whatever runnable work waits for its hardware (runs re-queued
    while no host was alive, say): it wakes itself once."""
    from apps.runs import dispatch
    from apps.runs.hosts import host_register_local

    try:
        dispatch.send(dispatch.HOST_PULL, kwargs={}, queue=host_register_local().queue)
    except Exception:  # the reconciler sends it again within minutes
        log.exception("could not wake this host's pull")


@worker_ready.connect
def _on_ready(**kwargs: object) -> None:
    recover_host()
    _pull_on_start()
    _stop.clear()
    threading.Thread(target=_beat, name="tailtune-heartbeat", daemon=True).start()


@worker_shutdown.connect
def _on_shutdown(**kwargs: object) -> None:
    _stop.set()
