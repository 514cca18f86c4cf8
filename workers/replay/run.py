"""Replay a trace: the load generator's entry point.

:func:`run_replay` checks its arguments and drives one event loop in this process
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
from workers.replay.rehearsal import RehearsalReplay
from workers.replay.request import ENDPOINTS, check_requests
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
    *,
    base_url: str,
    model: str,
    run_id: str,
    warmup_s: float,
    observation_s: float,
    drain_deadline_s: float,
    max_dispatch_lag_ms: float,
    on_batch: BatchCallback | None = None,
    batch_interval_s: float = 1.0,
    on_progress: ProgressCallback | None = None,
    stop: threading.Event | None = None,
    endpoint: str = "completions",
    max_concurrency: int | None = None,
    connect_timeout_s: float = 10.0,
    read_timeout_s: float | None = None,
    extra_body: dict[str, Any] | None = None,
    processes: int = 1,
    isolated: bool = False,
    origin_ns: int | None = None,
    output_mode: str = "exact",
    rehearsal: dict[str, Any] | None = None,
) -> ReplayResult:
    """Replay ``requests`` (canonical trace request objects, in arrival order) and wait for the result.

    Synchronous: runs its own event loop (uvloop when installed), so it can
    be called from a Celery task thread. ``on_batch`` receives each record
    exactly once, about every ``batch_interval_s`` and once more at the end;
    if it raises, the run stops and the exception is re-raised here.

    ``isolated`` runs the replay in a child process (``python -m workers.replay.shard``)
    so that the caller's own work (database writes, scrapes) cannot stall its loop: how a
    worker runs every replay. ``processes > 1`` spreads the requests round-robin over that
    many children, each with its own event loop and the same origin on the shared
    monotonic clock, for rates one event loop cannot keep on schedule. Children are plain
    subprocesses, so this also works inside a daemonic Celery worker process.

    ``origin_ns`` fixes the origin on the monotonic clock (``time.perf_counter_ns``, shared by
    every process of the host), so a caller can act at planned offsets too (one process only).
    ``rehearsal`` makes it a recovery rehearsal's client (one process, no concurrency cap; see
    :mod:`workers.replay.rehearsal`); the result's ``rehearsal`` then holds the client's facts.
    """
    if endpoint not in ENDPOINTS:
        raise ValueError(f"endpoint must be one of {sorted(ENDPOINTS)}, not {endpoint!r}")
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError("max_concurrency must be >= 1 (or None for no cap)")
    check_requests(requests, endpoint=endpoint)
    if processes < 1:
        raise ValueError("processes must be >= 1")
    if rehearsal is not None and (processes > 1 or max_concurrency is not None):
        raise ValueError("a rehearsal runs in one process with no concurrency cap")
    options: dict[str, Any] = {
        "base_url": base_url,
        "model": model,
        "run_id": run_id,
        "warmup_s": warmup_s,
        "observation_s": observation_s,
        "drain_deadline_s": drain_deadline_s,
        "endpoint": endpoint,
        "max_concurrency": max_concurrency,
        "connect_timeout_s": connect_timeout_s,
        "read_timeout_s": read_timeout_s,
        "extra_body": extra_body or {},
        "output_mode": output_mode,
    }
    if processes > 1 and origin_ns is not None:
        raise ValueError("origin_ns needs processes=1")
    stop = stop or threading.Event()
    if processes > 1 or isolated:
        return run_in_processes(
            requests,
            options={**options, "rehearsal": rehearsal} if rehearsal is not None else options,
            processes=processes,
            tolerance_ms=max_dispatch_lag_ms,
            on_batch=on_batch,
            batch_interval_s=batch_interval_s,
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
        batch_interval_s=batch_interval_s,
        tolerance_ms=max_dispatch_lag_ms,
    )
    if isinstance(replay, RehearsalReplay):
        result.rehearsal = replay.facts()
    return result
