"""A real Celery worker, started as its own process, answers the health task."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.conf import settings

from apps.runs.management.commands.serve import worker_argv


@pytest.fixture
def worker(tmp_path):  # type: ignore[no-untyped-def]
    env = dict(os.environ)
    queue = f"health-{os.getpid()}"
    proc = subprocess.Popen(
        worker_argv([queue]),
        cwd=settings.BASE_DIR,
        env=env,
        stdout=open(tmp_path / "worker.log", "wb"),
        stderr=subprocess.STDOUT,
    )
    yield queue
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_it_answers_the_health_task_through_the_broker(worker: str) -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "worker_health", "--queue", worker, "--timeout", "60"],
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "worker ok" in result.stdout and "'ok': True" in result.stdout
