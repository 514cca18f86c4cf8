from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from workers.celery import app


class Command(BaseCommand):
    help = "Send the health task through the broker and wait for a worker's answer."

    def add_arguments(self, parser):
        parser.add_argument("--timeout", type=float, default=30.0)
        parser.add_argument("--queue", default=settings.CELERY_TASK_DEFAULT_QUEUE)

    def handle(self, *args, **options):
        result = app.send_task("tailtune.health", queue=options["queue"])
        try:
            answer = result.get(timeout=options["timeout"])
        except Exception as exc:
            raise CommandError(
                f"no worker answered on queue {options['queue']!r} within {options['timeout']} s: {exc}"
            ) from None
        self.stdout.write(f"worker ok: {answer}")
