from __future__ import annotations

import os
import sys

from django.conf import settings
from django.core.management.base import BaseCommand

from apps.runs.hosts import host_register_local
from apps.runs.management.commands.serve import worker_argv


class Command(BaseCommand):
    help = "Register this machine as a host (TAILTUNE_HOST) and run its Celery worker (concurrency 1)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--no-default-queue", action="store_true", help="serve only this host's run queue"
        )

    def handle(self, *args, **options):
        host = host_register_local()
        queues = (
            [host.queue] if options["no_default_queue"] else [settings.CELERY_TASK_DEFAULT_QUEUE, host.queue]
        )
        self.stdout.write(f"host {host.name}: worker on queues {', '.join(queues)}")
        sys.stdout.flush()
        argv = worker_argv(queues)
        os.execv(argv[0], argv)
