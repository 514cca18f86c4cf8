# Load the Celery app with Django, so @shared_task sends through tailtune's broker
# (and never through Celery's built-in default, an AMQP server on localhost).
from __future__ import annotations

from workers.celery import app as celery_app

__all__ = ["celery_app"]
