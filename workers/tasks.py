"""Celery tasks: thin wrappers that re-read rows by primary key and call services."""

from __future__ import annotations

import os
import socket

from celery import shared_task
from django.conf import settings


@shared_task(name="tailtune.health")
def health() -> dict[str, object]:
    """Answer who is listening: used by the README's check and the tests."""
    return {"ok": True, "hostname": socket.gethostname(), "pid": os.getpid(), "host": settings.TAILTUNE_HOST}
