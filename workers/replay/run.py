"""Replay a trace: the load generator's entry point.

:func:`run_replay` checks its arguments and drives one event loop
(:mod:`workers.replay.client`), or spreads the requests over processes
(:mod:`workers.replay.shard`) when one loop cannot keep a rate on schedule.
It sits above both, so neither imports the other back.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from workers.replay.batches import BatchCallback, ProgressCallback
from workers.replay.client import _Replay, drive
from workers.replay.request import ENDPOINTS, check_requests
from workers.replay.result import ReplayResult
from workers.replay.shard import run_sharded


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
    transport: str = "raw",
    origin_ns: int | None = None,
    output_mode: str = "exact",
) -> ReplayResult:
    """Replay ``requests`` (canonical trace request objects, in arrival order) and wait for the result.

    Synchronous: runs its own event loop (uvloop when installed), so it can
    be called from a Celery task thread. ``on_batch`` receives each record
    exactly once, about every ``batch_interval_s`` and once more at the end;
    if it raises, the run stops and the exception is re-raised here.

    ``processes > 1`` spreads the requests round-robin over that many child
    processes (``python -m workers.replay.shard``), each with its own event
    loop and the same origin on the shared monotonic clock, for rates one
    event loop cannot keep on schedule. Children are plain subprocesses, so
    this also works inside a daemonic Celery worker process.

    ``origin_ns`` fixes the origin on the monotonic clock (``time.perf_counter_ns``, shared by
    every process of the host), so a caller can act at planned offsets too (one process only).
    A recovery rehearsal drives its own replay through :func:`drive`
    (:func:`workers.replay.rehearsal.run_rehearsal`).
    """
    if endpoint not in ENDPOINTS:
        raise ValueError(f"endpoint must be one of {sorted(ENDPOINTS)}, not {endpoint!r}")
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError("max_concurrency must be >= 1 (or None for no cap)")
    check_requests(requests, endpoint=endpoint)
    if processes < 1:
        raise ValueError("processes must be >= 1")
    if transport not in ("raw", "aiohttp"):
        raise ValueError(f"transport must be 'raw' or 'aiohttp', not {transport!r}")
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
        "transport": transport,
        "output_mode": output_mode,
    }
    if processes > 1 and origin_ns is not None:
        raise ValueError("origin_ns needs processes=1")
    if processes > 1:
        return run_sharded(
            requests,
            options=options,
            processes=processes,
            tolerance_ms=max_dispatch_lag_ms,
            on_batch=on_batch,
            batch_interval_s=batch_interval_s,
            on_progress=on_progress,
            stop=stop or threading.Event(),
        )
    replay = _Replay(requests, **options, stop=stop or threading.Event(), origin_ns=origin_ns)
    return drive(
        replay,
        on_batch=on_batch,
        on_progress=on_progress,
        batch_interval_s=batch_interval_s,
        tolerance_ms=max_dispatch_lag_ms,
    )
