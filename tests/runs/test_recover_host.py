"""A recovering worker signals the pid its predecessor recorded only while it is still that process."""

from __future__ import annotations

import subprocess

import pytest

from apps.runs.hosts import host_register_local
from apps.runs.models import Host
from workers.engine.procs import proc_info
from workers.heartbeat import recover_host


@pytest.mark.django_db
def test_it_signals_a_recorded_worker_pid_only_while_it_names_the_same_process() -> None:
    proc = subprocess.Popen(["sleep", "60"])
    try:
        host = host_register_local()
        info = proc_info(proc.pid)
        assert info is not None
        # The pid was recorded for a process that started at another time: it has been reused.
        Host.objects.filter(pk=host.pk).update(worker_pid=proc.pid, worker_pid_start=info.start_ticks + 1)
        assert recover_host() == []
        assert proc.poll() is None, "an unrelated process that reused the pid was signalled"
        # Recorded without a start time (a row from before it was kept): not signalled either.
        Host.objects.filter(pk=host.pk).update(worker_pid=proc.pid, worker_pid_start=None)
        assert recover_host() == [] and proc.poll() is None
        # The same process: stopped, and the host row cleared.
        Host.objects.filter(pk=host.pk).update(worker_pid=proc.pid, worker_pid_start=info.start_ticks)
        assert recover_host() == [proc.pid]
        assert proc.wait(timeout=10) is not None
        row = Host.objects.get(pk=host.pk)
        assert row.worker_pid is None and row.worker_pid_start is None
    finally:
        if proc.poll() is None:
            proc.kill()
