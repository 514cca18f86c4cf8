"""The server a host keeps up between the runs of one cell and series (engine reuse).

:func:`workers.pipeline.host_pull` holds one :class:`ServerSlot`; each run takes the kept
server when it is the same experiment, cell and series (a sweep round, the uniform
companions, the inline probes: :func:`slot_key`) and the server is alive, and the slot
stops it otherwise, when a run on it did not end done or invalid, and when the pull ends.
The stop's time belongs to the last run on the server (``summary["engine_time"]["stop_s"]``).
"""

from __future__ import annotations

import time

from apps.runs.models import Host, Run
from apps.runs.summary_types import EngineTime, run_summary
from workers.engine.server import EngineServer

# (experiment, cell, series): the runs that may share one server. A sweep's series is its round
# (the repeat), the uniform companions are one series, and the inline probes another.
SlotKey = tuple[int, int, int | str]


def slot_key(run: Run) -> SlotKey:
    """Which kept server ``run`` may replay on: its cell's, in its series (a sweep round, the
    uniform companions, or the inline probes)."""
    if run.kind == Run.Kind.SWEEP:
        series: int | str = run.repeat
    elif run.kind in Run.PROBES:
        series = "probes"
    else:
        series = str(run.kind)
    return (run.experiment_id, run.cell_id, series)


class ServerSlot:
    """The server a host keeps up between the runs of one cell and series (engine reuse)."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.server: EngineServer | None = None
        self.key: SlotKey | None = None
        self.kv_idle: float | None = None
        self.started_by = ""  # run_id of the run that started it
        self.last_run_pk: int | None = None
        self.runs = 0

    def take(self, key: SlotKey) -> EngineServer | None:
        """The kept server if it serves ``key`` and is alive; else stop whatever is kept."""
        if self.server is not None and self.key == key and self.server.failure() is None:
            return self.server
        self.close()
        return None

    def keep(self, key: SlotKey, server: EngineServer, run: Run, *, new: bool) -> None:
        if new:
            self.started_by, self.runs = str(run.run_id), 0
        self.server, self.key, self.last_run_pk = server, key, run.pk
        self.runs += 1

    def close(self, *, record: bool = True) -> float:
        """Stop the kept server; returns how long that took, which ``record`` adds to the
        engine time of the last run on it (a run not yet finished records it itself)."""
        server, self.server, self.key, self.kv_idle = self.server, None, None, None
        if server is None:
            return 0.0
        began = time.monotonic()
        try:
            server.close()
        finally:
            took = time.monotonic() - began
            Host.objects.filter(pk=self.host.pk).update(
                server_pids=[], worker_pid=None, worker_pid_start=None
            )
            if record and self.last_run_pk is not None:
                _add_stop_time(self.last_run_pk, took)
        return took


def _add_stop_time(run_pk: int, stop_s: float) -> None:
    """Add the server's stop, measured after, to a finished run's ``summary["engine_time"]``."""
    row = Run.objects.filter(pk=run_pk).values_list("summary", flat=True).first()
    summary = run_summary(row)
    spent: EngineTime = {**(summary.get("engine_time") or {})}
    spent["stop_s"] = round(float(spent.get("stop_s") or 0.0) + stop_s, 3)
    summary["engine_time"] = spent
    Run.objects.filter(pk=run_pk).update(summary=summary)
