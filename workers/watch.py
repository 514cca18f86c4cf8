"""The watch beside a running run: its cancel, its phase, its live values.

A :class:`RunWatcher` thread runs beside each run the pipeline (workers/pipeline.py) or a
rehearsal (workers/rehearsal_run.py) executes. Every ``WATCH_INTERVAL_S`` it looks at the run's row:

- a cancel (of the run or its experiment) sets the run's stop event, which ends the replay
  within a second, and stops a server still starting (:attr:`RunWatcher.server`);
- once the replay has started (:attr:`RunWatcher.origin`), the status follows the trace's
  windows, warming -> measuring -> draining;
- about every ``LIVE_EVERY_S``, the newest gauges the scraper saw and the server log's tail go
  to the run's ``live`` and ``log_tail`` for the live page.

A dropped database connection does not end the watch: the next tick looks again.

:data:`Outcome` is what a run's execution, watched so, hands back to be finished with.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from django.db import DatabaseError, close_old_connections
from django.utils import timezone

from apps.runs.models import Run
from workers.engine.gauges import latest_gauges
from workers.engine.scrape import Scraper
from workers.engine.server import read_tail

log = logging.getLogger(__name__)

WATCH_INTERVAL_S = 0.5
LIVE_EVERY_S = 2.0

# (final status, reason, the run's fields to write with it)
Outcome = tuple[str, str, dict[str, Any]]


class Stoppable(Protocol):
    """What a cancel stops while the servers start: one server, or a rehearsal's two."""

    def stop(self) -> Any: ...


def is_cancelled(run_pk: int) -> bool:
    """The run, or its experiment, was cancelled (or the run is gone)."""
    run = Run.objects.filter(pk=run_pk).values("status", "experiment__status").first()
    return run is None or run["status"] == Run.Status.CANCELLED or run["experiment__status"] == "cancelled"


def advance_phase(run_pk: int, status: str) -> None:
    """Move a run still active to ``status`` (warming, measuring, draining)."""
    fields: dict[str, Any] = {"status": status, "updated_at": timezone.now()}
    if status == Run.Status.MEASURING:
        fields["measuring_at"] = timezone.now()
    Run.objects.filter(pk=run_pk, status__in=Run.ACTIVE).update(**fields)


class RunWatcher(threading.Thread):
    """Polls for a cancel and advances the phase by the trace's windows."""

    def __init__(self, run: Run, stop: threading.Event, server: Stoppable | None) -> None:
        super().__init__(name=f"run-{run.pk}-watch", daemon=True)
        self.run_pk = run.pk
        self.stop_event = stop
        self.server = server
        self.origin: float | None = None  # monotonic time of the replay's start
        self.warmup_s = run.warmup_seconds
        self.observation_s = run.observation_seconds
        self.cancelled = False
        self._done = threading.Event()
        self._phase = ""
        # Set once the replay starts: the live page's gauges and log tail come from these.
        self.scraper: Scraper | None = None
        self.log_path: Path | None = None
        self._live_at = 0.0

    def run(self) -> None:
        try:
            while not self._done.wait(WATCH_INTERVAL_S):
                try:
                    if self._tick():
                        return
                except DatabaseError:
                    # A dropped connection (seen in CI: "server closed the connection
                    # unexpectedly") must not end the watch, or a later cancel goes unseen:
                    # drop the broken connection, as the heartbeat does, and look again at the
                    # next tick (a phase not yet written is written then).
                    log.warning("run %s: the watch could not read or write the run; retrying",
                                self.run_pk, exc_info=True)  # fmt: skip
                    close_old_connections()
        finally:
            close_old_connections()

    def _tick(self) -> bool:
        """One look at the run: True once it is cancelled (the watch then ends)."""
        if is_cancelled(self.run_pk):
            self.cancelled = True
            self.stop_event.set()
            if self.origin is None and self.server is not None:
                self.server.stop()  # still starting: do not wait for it
            return True
        if self.origin is not None:
            elapsed = time.monotonic() - self.origin
            phase = Run.Status.WARMING
            if elapsed >= self.warmup_s:
                phase = Run.Status.MEASURING
            if elapsed >= self.warmup_s + self.observation_s:
                phase = Run.Status.DRAINING
            if phase != self._phase:
                advance_phase(self.run_pk, phase)
                self._phase = phase
            if time.monotonic() - self._live_at >= LIVE_EVERY_S:
                self._live_at = time.monotonic()
                try:
                    self.publish_live()
                except Exception:  # the live view is a courtesy: never stop watching for a cancel
                    log.exception("run %s: publishing live values failed", self.run_pk)
        return False

    def publish_live(self) -> None:
        """The newest gauges the scraper saw and the server log's tail, for the live page."""
        fields: dict[str, Any] = {}
        if self.scraper is not None:
            fields["live"] = {"gauges": latest_gauges(list(self.scraper.samples[-400:])), "at": time.time()}
        if self.log_path is not None:
            fields["log_tail"] = read_tail(self.log_path)
        if fields:
            Run.objects.filter(pk=self.run_pk, status__in=Run.ACTIVE).update(**fields)

    def finish(self) -> None:
        self._done.set()
        self.join(timeout=5)
