"""The Celery app: configured from Django settings under the CELERY namespace."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("tailtune")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["workers"], related_name="tasks")
# Register, recover and heartbeat when a worker starts (signal handlers).
app.conf.imports = ("workers.heartbeat",)
