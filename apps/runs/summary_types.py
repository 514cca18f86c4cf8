"""What a run's ``summary`` holds (``Run.summary``, a JSONField): the facts the worker keeps beside
the run's columns. Types only: no Django, nothing runs here but two readers' casts.

Written when the run ends: by workers/pipeline.py for a sweep, calibration or scenario run (the
replay's :class:`~workers.replay.result.ReplaySummary`, then the engine's time, the server's reuse,
the idle check, the quality probe's answers, the scrape errors and gaps, the server spans' join), by
workers/rehearsal_run.py for a rollback rehearsal (the replay's summary, the rehearsal's facts,
both servers' pids), and once more by workers/slot.py, which adds a kept server's stop to the
last run's ``engine_time``.
tests/runs/test_run_summary.py walks summaries the worker really wrote against these types.

A run that ended before its replay holds less: a reused server that would not go idle leaves
:class:`PreReplaySummary`, a run that failed or was cancelled before that leaves none (null).
Rows written before a key existed lack it. So readers take a stored summary through
:func:`run_summary` and read with ``.get(...)``; the types say what a summary written today holds.

No ``from __future__ import annotations`` here: on Python 3.11 a TypedDict's
``__required_keys__`` ignores ``NotRequired`` written as a string annotation.
"""

from typing import NotRequired, TypedDict, cast

from workers.engine.idle import IdleCheck
from workers.engine.spans import ServerSpansSummary
from workers.replay.result import RehearsalClientFacts, ReplaySummary


class EngineTime(TypedDict, total=False):
    """What the run's server cost it, in seconds (apps/runs/engine_time.py adds them up); a part
    the run did not pay (a reused server's start) is absent."""

    start_s: float
    warmup_s: float  # the warm-up requests, and the quality probe's answers
    idle_check_s: float
    windows_s: float
    drain_s: float
    stop_s: float


class ServerReuse(TypedDict):
    reused: bool
    started_by: str  # the run id of the run whose start the server is


# One quality probe answer (workers/quality_probe.py run_probe); "class" is a keyword, hence this form.
ProbeOutput = TypedDict(
    "ProbeOutput",
    {
        "index": int,
        "class": str,
        "token_ids": list[int],
        "text": str,
        "finish_reason": str | None,
        "error": NotRequired[str],  # the server refused the request
    },
)


class QualityProbeAnswers(TypedDict):
    trace_sha256: str
    outputs: list[ProbeOutput]


class RehearsalWorkerFacts(TypedDict):
    """What the rehearsal's worker (workers/rehearsal_run.py) knows besides its client's facts."""

    standby: str  # warm | cold
    split: str  # how the host was split between the two servers
    candidate_url: str
    b0_url: str
    b0_cell: str
    switch: NotRequired[str]  # the operator's switch and router names, never what they resolve to
    router: NotRequired[str]
    b0_started_at_s: NotRequired[float]  # cold standby: from the origin
    b0_healthy_at_s: NotRequired[float]
    b0_log_tail: NotRequired[str]  # B0 did not start at the switch
    switch_command_started_at_s: NotRequired[float]
    switch_command_exit: NotRequired[int]
    switch_command_ended_at_s: NotRequired[float]


class RehearsalFacts(RehearsalWorkerFacts, RehearsalClientFacts):
    """A rehearsal run's ``summary["rehearsal"]``: the worker's facts and its client's, merged."""


class RehearsalServers(TypedDict):
    """Each server's processes as [pid, start ticks] (EngineServer.tracked_pids)."""

    candidate: list[list[int]]
    b0: list[list[int]]


class MeasurementGaps(TypedDict):
    """The run's longest measurement gaps against their tolerances (apps/analysis/validity.py
    ``measurement_gaps``): any over tolerance makes the run ``invalid`` with that reason."""

    loop_stall_max_ms: float | None  # the replay's own event loop (ReplaySummary.loop_stall_max_ms)
    loop_stall_tolerance_ms: float
    scrape_gap_max_s: float | None  # the longest time without a /metrics scrape
    scrape_gap_tolerance_s: float
    problems: list[str]  # one sentence per gap over tolerance; empty: none


class RunSummary(ReplaySummary, total=False):
    """A run's summary after its replay: the replay's, then what the worker adds. A rehearsal's
    ``rehearsal`` holds :class:`RehearsalFacts` (read it with :func:`rehearsal_facts`)."""

    engine_time: EngineTime
    server: ServerReuse
    idle_check: IdleCheck  # a server kept for the cell's next run (engine reuse)
    quality_probe: QualityProbeAnswers  # a sweep run of an experiment with a probe
    scrape_errors: list[str]  # the first 20
    restarts_t_ns: list[int]  # where the server's counters restarted (workers/engine/scrape.py)
    scrape_gap_max_s: float | None  # the longest time without a /metrics scrape (Scraper.gap_max_s)
    measurement_gaps: MeasurementGaps
    server_spans: ServerSpansSummary  # the per-request server timings' join (workers/engine/spans.py)
    servers: RehearsalServers  # a rehearsal's two servers


class PreReplaySummary(TypedDict):
    """A run that ended before its replay: its reused server would not go idle."""

    idle_check: IdleCheck
    server: ServerReuse
    engine_time: EngineTime


def run_summary(stored: object) -> RunSummary:
    """A stored ``Run.summary`` as its type; {} for none. Read it with ``.get(...)`` (module
    docstring: a summary written before its replay, or before a key existed, lacks keys)."""
    return cast(RunSummary, stored if isinstance(stored, dict) else {})


def rehearsal_facts(summary: RunSummary) -> RehearsalFacts | None:
    """A rehearsal run's facts (its worker's merged with its client's), None on another run."""
    return cast(RehearsalFacts | None, summary.get("rehearsal") or None)
