"""Replay a trace: the load generator's entry point.

:func:`run_replay` takes a :class:`~workers.replay.config.ReplayConfig` (checked when it is built)
and the caller's hooks, and drives one event loop in this process
(:mod:`workers.replay.client`), or runs the replay in child processes
(:mod:`workers.replay.shard`): one, so the caller's own work never stalls the send
loop, or several, when one loop cannot keep a rate on schedule. It sits above both,
so neither imports the other back.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Sequence
from typing import Any

from workers.replay.batches import BatchCallback, ProgressCallback
from workers.replay.client import _Replay, drive
from workers.replay.config import ReplayConfig
from workers.replay.rehearsal_client import RehearsalReplay
from workers.replay.request import check_requests
from workers.replay.result import ReplayResult
from workers.replay.runtime import burst_size
from workers.replay.shard import run_in_processes

# One send loop kept p99 dispatch lag and TTFT error within 5 ms up to this rate in every repeat
# of the bench (bench/results/replay.md; at 800 in two of three); a trace whose busiest second is
# above it gets more processes.
PER_PROCESS_RPS = 600


def processes_for(requests: Sequence[dict[str, Any]], cpus: int | None = None) -> int:
    """The processes a trace's busiest second needs, at most half the host's cores (the rest
    serve the engine and the worker)."""
    peak = burst_size([round(float(r["t_offset_s"]) * 1e9) for r in requests], 1_000_000_000)
    spare = max(1, (cpus or os.cpu_count() or 1) // 2)
    return max(1, min(math.ceil(peak / PER_PROCESS_RPS), spare))


def run_replay(
    requests: Sequence[dict[str, Any]],
    config: ReplayConfig,
    *,
    on_batch: BatchCallback | None = None,
    on_progress: ProgressCallback | None = None,
    stop: threading.Event | None = None,
    origin_ns: int | None = None,
) -> ReplayResult:
    """Replay ``requests`` (canonical trace request objects, in arrival order) as ``config`` says,
    and wait for the result.

    Synchronous: runs its own event loop (uvloop when installed), so it can
    be called from a Celery task thread. ``on_batch`` receives each record
    exactly once, about every ``config.batch_interval_s`` and once more at the end;
    if it raises, the run stops and the exception is re-raised here. ``on_progress``
    hears how many requests were sent; setting ``stop`` ends the run early.

    With ``config.isolated`` or ``config.processes > 1`` the replay runs in child processes
    (plain subprocesses, so this also works inside a daemonic Celery worker process), each
    with its own event loop and the same origin on the shared monotonic clock.

    ``origin_ns`` fixes the origin on the monotonic clock (``time.perf_counter_ns``, shared by
    every process of the host), so a caller can act at planned offsets too (one process only).
    With ``config.rehearsal`` the result's ``rehearsal`` holds the rehearsal client's facts.
    """
    check_requests(requests, endpoint=config.endpoint)
    if config.processes > 1 and origin_ns is not None:
        raise ValueError("origin_ns needs processes=1")
    options = config.client_options()
    rehearsal = config.rehearsal
    stop = stop or threading.Event()
    if config.processes > 1 or config.isolated:
        return run_in_processes(
            requests,
            options={**options, "rehearsal": rehearsal} if rehearsal is not None else options,
            processes=config.processes,
            tolerance_ms=config.max_dispatch_lag_ms,
            on_batch=on_batch,
            batch_interval_s=config.batch_interval_s,
            on_progress=on_progress,
            stop=stop,
            origin_ns=origin_ns,
        )
    replay: _Replay
    if rehearsal is not None:
        replay = RehearsalReplay(requests, rehearsal=rehearsal, **options, stop=stop, origin_ns=origin_ns)
    else:
        replay = _Replay(requests, **options, stop=stop, origin_ns=origin_ns)
    result = drive(
        replay,
        on_batch=on_batch,
        on_progress=on_progress,
        batch_interval_s=config.batch_interval_s,
        tolerance_ms=config.max_dispatch_lag_ms,
    )
    if isinstance(replay, RehearsalReplay):
        result.rehearsal = replay.facts()
    return result
