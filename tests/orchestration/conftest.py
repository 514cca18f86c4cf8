"""Real workers for end-to-end tests: `manage.py run_worker` processes on the test database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from apps.runs.models import Host
from tests.waiting import wait_for


def test_database_url() -> str:
    s = connection.settings_dict
    if connection.vendor == "postgresql":
        user = s.get("USER") or "postgres"
        auth = f"{user}:{s['PASSWORD']}@" if s.get("PASSWORD") else f"{user}@"
        return f"postgres://{auth}{s.get('HOST') or '127.0.0.1'}:{s.get('PORT') or 5432}/{s['NAME']}"
    return f"sqlite:///{s['NAME']}"


class Workers:
    """Start, kill and restart worker processes for one test host."""

    def __init__(self, tmp: Path) -> None:
        tag = uuid.uuid4().hex[:8]
        self.host_name = f"e2e-{tag}"
        self.env = dict(os.environ)
        self.env.update(
            {
                "DATABASE_URL": test_database_url(),
                "TAILTUNE_HOST": self.host_name,
                "TAILTUNE_DEFAULT_QUEUE": f"e2e-default-{tag}",
                "SECRET_KEY": settings.SECRET_KEY,
                "TAILTUNE_DATA": str(settings.DATA_DIR),
            }
        )
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> subprocess.Popen[bytes]:
        """Start a worker and return once it has registered (after its recovery step)."""
        from django.utils import timezone

        started_at = timezone.now()
        path = self.tmp / f"worker-{len(self.procs)}.log"
        log = open(path, "wb")  # closed with the process
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "run_worker"],
            cwd=settings.BASE_DIR,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(proc)
        # A fresh heartbeat: the worker is past its start-up recovery (workers.heartbeat).
        wait_for(
            lambda: Host.objects.filter(name=self.host_name, last_heartbeat__gt=started_at).exists(), 120
        )
        # The heartbeat thread starts just before the consumer: wait for Celery's own word that
        # the consumer is up ("<node> ready." in the worker's log).
        wait_for(lambda: b" ready." in path.read_bytes(), 120)
        return proc

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(self.tmp.glob("worker-*.log")))

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture
def workers(tmp_path: Path, settings: Any) -> Iterator[Workers]:
    w = Workers(tmp_path)
    # What this process sends to the default queue (a trace upload's import, say) must reach the
    # test's own worker, which consumes its own default queue, not "default": else it waits
    # for the reconciler to send it again, minutes later.
    settings.CELERY_TASK_DEFAULT_QUEUE = w.env["TAILTUNE_DEFAULT_QUEUE"]
    yield w
    w.stop_all()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
