"""Run the whole service on one machine: migrate, first admin, web and worker together."""

from __future__ import annotations

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
        web = web_argv(options["addr"], options["port"], options["web_workers"])
        worker = (
            None if options["no_worker"] else worker_argv([settings.CELERY_TASK_DEFAULT_QUEUE, host.queue])
        )
        sup = Supervisor(
            web=web, worker=worker, say=lambda line: self.stdout.write(line), cwd=settings.BASE_DIR
        )
        sup.start()
        db = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
        self.stdout.write(
            f"tailtune is up: http://{options['addr']}:{options['port']}/  "
            f"(database: {db}, broker: {settings.CELERY_BROKER_URL.split(':')[0]}, host: {host.name}). Ctrl-C stops it."
        )

        def stop(signum: int, frame: object) -> None:
            sup.stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        try:
            while not sup.stopping and sup.step():
                time.sleep(0.5)
        finally:
            sup.stop_all()
        if sup.web_failed is not None and not sup.stopping:
            self.stderr.write(
                f"the web server (pid {sup.web_failed[0]}) exited with code {sup.web_failed[1]}"
            )
            sys.exit(1)


class Supervisor:
    """Keeps the web up and the worker running: a worker that exits is restarted with a growing
    delay (1 s doubling to 60 s, back to 1 s after 10 minutes up), and each restart is said; the
    web exiting ends the service (it is what people reach)."""

    MAX_BACKOFF_S = 60.0
    STEADY_S = 600.0

    def __init__(
        self,
        *,
        web: list[str],
        worker: list[str] | None,
        say: Any,
        cwd: Any = None,
        popen: Any = subprocess.Popen,
        clock: Any = time.monotonic,
    ) -> None:
        self.web_argv, self.worker_argv, self.say, self.cwd = web, worker, say, cwd
        self.popen, self.clock = popen, clock
        self.web: Any = None
        self.worker: Any = None
        self.worker_started = 0.0
        self.restart_at: float | None = None
        self.backoff = 1.0
        self.restarts = 0
        self.stopping = False
        self.web_failed: tuple[int, int | None] | None = None

    def start(self) -> None:
        if self.worker_argv is not None:
            self._start_worker()
        self.web = self.popen(self.web_argv, cwd=self.cwd)

    def _start_worker(self) -> None:
        self.worker = self.popen(self.worker_argv)
        self.worker_started = self.clock()

    def step(self) -> bool:
        """One look at the children; False once the web is gone."""
        now = self.clock()
        if self.web.poll() is not None:
            self.web_failed = (self.web.pid, self.web.returncode)
            return False
        if self.worker is not None and self.restart_at is None and self.worker.poll() is not None:
            if now - self.worker_started >= self.STEADY_S:
                self.backoff = 1.0
            self.restart_at = now + self.backoff
            self.say(
                f"the worker (pid {self.worker.pid}) exited with code {self.worker.returncode}; "
                f"restarting it in {self.backoff:g} s"
            )
            self.backoff = min(self.MAX_BACKOFF_S, self.backoff * 2)
        if self.restart_at is not None and now >= self.restart_at:
            self.restart_at = None
            self.restarts += 1
            self._start_worker()
            self.say(f"worker restarted (pid {self.worker.pid}; restart {self.restarts})")
        return True

    def stop_all(self) -> None:
        procs = [p for p in (self.worker, self.web) if p is not None]
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
