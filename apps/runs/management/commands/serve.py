"""Run the whole service on one machine: migrate, first admin, web and worker together."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand


def web_argv(addr: str, port: int, workers: int) -> list[str]:
    """gunicorn, a production WSGI server, on config.wsgi; whitenoise serves the static files."""
    return [
        sys.executable, "-m", "gunicorn", "config.wsgi:application",
        "--bind", f"{addr}:{port}",
        "--workers", str(workers),
        "--threads", "4",  # pages poll small partials; threads keep a slow poll from blocking others
        "--graceful-timeout", "10",
        "--access-logfile", "-",
    ]  # fmt: skip


def worker_argv(queues: list[str]) -> list[str]:
    return [
        sys.executable, "-m", "celery", "-A", "workers.celery", "worker",
        "--queues", ",".join(queues),
        "--concurrency", "1",  # a host serves one candidate at a time
        "--hostname", f"tailtune-{settings.TAILTUNE_HOST}@%h",
        "--loglevel", "INFO",
    ]  # fmt: skip


class Command(BaseCommand):
    help = "Serve tailtune on embedded defaults: web on http://HOST:PORT plus one worker for this host."

    def add_arguments(self, parser):
        parser.add_argument("--addr", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--no-worker", action="store_true", help="serve the web only")
        parser.add_argument("--web-workers", type=int, default=2, help="gunicorn worker processes")

    def handle(self, *args, **options):
        call_command("migrate", interactive=False, verbosity=0)
        call_command("collectstatic", interactive=False, verbosity=0)
        call_command("ensure_admin")
        from apps.runs.hosts import host_register_local

        host = host_register_local()
        procs: list[subprocess.Popen[bytes]] = []
        if not options["no_worker"]:
            procs.append(subprocess.Popen(worker_argv([settings.CELERY_TASK_DEFAULT_QUEUE, host.queue])))
        web = web_argv(options["addr"], options["port"], options["web_workers"])
        procs.append(subprocess.Popen(web, cwd=settings.BASE_DIR))
        db = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
        self.stdout.write(
            f"tailtune is up: http://{options['addr']}:{options['port']}/  "
            f"(database: {db}, broker: {settings.CELERY_BROKER_URL.split(':')[0]}, host: {host.name}). Ctrl-C stops it."
        )
        stopping = False

        def stop(signum: int, frame: object) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        try:
            while not stopping and all(p.poll() is None for p in procs):
                time.sleep(0.5)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 30
            for p in procs:
                try:
                    p.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
        failed = [_name(p.args) for p in procs if p.returncode not in (0, -15, None)]
        if failed and not stopping:
            self.stderr.write(f"a process exited unexpectedly (pid {os.getpid()}): {failed}")
            sys.exit(1)


def _name(args: Any) -> Any:
    """The program of a child's argv (``python -m <name> ...``), or the argv itself."""
    return args[2] if isinstance(args, (list, tuple)) and len(args) > 2 else args
