"""Sending the workers' tasks, by their stable names, once the current transaction commits.

The services name a task; they never import it. ``workers.tasks`` imports the services
(a task is a thin wrapper around one), so importing it back from them would make an import
cycle (docs/ARCHITECTURE.md: imports point down). The names are the ones ``workers.tasks``
registers (``@shared_task(name=...)``); tests/runs/test_dispatch.py checks they match.

``send`` is the one place a message leaves; a unit test that must not reach the broker
replaces it (tests/dispatch_support.py).
"""

from __future__ import annotations

from typing import Any

from celery import current_app
from django.db import transaction

FREEZE_EXPERIMENT = "tailtune.freeze_experiment"
EXECUTE_RUN = "tailtune.execute_run"
HOST_PULL = "tailtune.host_pull"
ANALYSE_EXPERIMENT = "tailtune.analyse_experiment"
CELL_GOODPUT_CAPACITY = "tailtune.cell_goodput_capacity"
IMPORT_TRACE = "tailtune.import_trace"
NOTIFY = "tailtune.notify"
TASKS = (
    FREEZE_EXPERIMENT,
    EXECUTE_RUN,
    HOST_PULL,
    ANALYSE_EXPERIMENT,
    CELL_GOODPUT_CAPACITY,
    IMPORT_TRACE,
    NOTIFY,
)


def send(name: str, *, kwargs: dict[str, Any], queue: str) -> None:
    """Send task ``name`` to ``queue`` now (through tailtune's Celery app: config/__init__.py)."""
    current_app.send_task(name, kwargs=kwargs, queue=queue)


def send_on_commit(name: str, *, kwargs: dict[str, Any], queue: str) -> None:
    """Send task ``name`` once the current transaction commits (at once outside one)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}")
    transaction.on_commit(lambda: send(name, kwargs=kwargs, queue=queue))
