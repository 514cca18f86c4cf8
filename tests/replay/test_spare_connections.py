"""Sends stamped when their bytes leave, on connections opened before they were due."""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from typing import Any

import pytest

from tests.replay.helpers import make_requests
from tests.replay.mockserver import MockServer
from workers.replay import rawhttp
from workers.replay.config import ReplayConfig
from workers.replay.run import run_replay
from workers.replay.runtime import burst_size, quiet_interpreter

OPTIONS: dict[str, Any] = {
    "model": "mock",
    "run_id": "spare",
    "warmup_s": 0.0,
    "drain_deadline_s": 10.0,
    "max_dispatch_lag_ms": 100.0,
}


def test_burst_size_is_the_most_requests_due_within_the_window() -> None:
    ms = 1_000_000
    assert burst_size([]) == 0
    assert burst_size([0, 0, 0, 1000 * ms]) == 3
    assert burst_size([0, 100 * ms, 200 * ms, 300 * ms], 250 * ms) == 3
    assert burst_size([300 * ms, 0, 200 * ms, 100 * ms], 100 * ms) == 1


def test_a_burst_goes_out_on_connections_opened_before_it_was_due(mock_server: MockServer) -> None:
    # Two bursts of 25 requests, each planned at one instant: 25 spare connections are open before
    # the origin, and every request of either burst rides on a connection the server had accepted
    # before that burst was due. None of them waited on a connect.
    requests = [
        {**r, "index": i, "t_offset_s": 0.3 if i < 25 else 0.8}
        for i, r in enumerate(make_requests(50, output_tokens=3))
    ]
    origin = time.perf_counter_ns() + 500_000_000
    config = ReplayConfig(base_url=mock_server.base_url, observation_s=1.0, **OPTIONS)
    result = run_replay(requests, config, origin_ns=origin)
    assert result.ok == 50, [r.error for r in result.records if not r.ok]
    assert not any("spare connections" in note for note in result.notes), result.notes
    due = {r.index: origin + r.planned_ns for r in result.records}
    for entry in mock_server.log:
        index = int(entry.tag.rpartition(":")[2])  # type: ignore[union-attr]
        assert mock_server.opened_ns(entry.conn) < due[index], index
    # Every send is stamped when its bytes were written, so it never precedes what the server saw.
    for record in result.records:
        entry = mock_server.entry(record.index)
        assert entry is not None and record.sent_ns is not None
        assert origin + record.sent_ns <= entry.arrival_ns


def test_a_send_that_waits_on_a_connect_counts_the_wait_as_lag(
    mock_server: MockServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No spare connection, and every connect takes 300 ms: the request is written 300 ms after it
    # was due, and that is its dispatch lag (the run is invalid at a 100 ms tolerance). Stamping it
    # before the connect would have reported it on time.
    slow_open = rawhttp.Pool._open

    async def open_slowly(self: rawhttp.Pool, timeout_s: float) -> Any:
        await asyncio.sleep(0.3)
        return await slow_open(self, timeout_s)

    async def no_spares(self: rawhttp.Pool, count: int, *, timeout_s: float = 2.0) -> int:
        return 0

    monkeypatch.setattr(rawhttp.Pool, "_open", open_slowly)
    monkeypatch.setattr(rawhttp.Pool, "warm", no_spares)
    config = ReplayConfig(base_url=mock_server.base_url, observation_s=0.1, **OPTIONS)
    result = run_replay(make_requests(1, output_tokens=2), config)
    record = result.records[0]
    assert record.ok, record.error
    assert record.sent_ns is not None and record.sent_ns - record.planned_ns >= 300_000_000
    assert result.dispatch_lag_p99_ms is not None and result.dispatch_lag_p99_ms >= 300
    assert not result.valid and "dispatch lag" in result.invalid_reason


def test_the_interpreter_is_quiet_during_a_replay_and_restored_after() -> None:
    interval = sys.getswitchinterval()
    assert gc.isenabled()
    with quiet_interpreter():
        assert not gc.isenabled()
        assert sys.getswitchinterval() < interval
    assert gc.isenabled() and sys.getswitchinterval() == interval


def test_a_trace_gets_the_processes_its_busiest_second_needs() -> None:
    from workers.replay.run import PER_PROCESS_RPS, processes_for

    def trace(rate: float, seconds: float) -> list[dict[str, Any]]:
        return [{"t_offset_s": i / rate} for i in range(int(rate * seconds))]

    assert processes_for(trace(5, 10), cpus=16) == 1
    assert processes_for(trace(PER_PROCESS_RPS * 2.5, 2), cpus=16) == 3
    # Never more than half the cores: the engine and the worker need the rest.
    assert processes_for(trace(PER_PROCESS_RPS * 10, 2), cpus=16) == 8
    assert processes_for(trace(PER_PROCESS_RPS * 10, 2), cpus=2) == 1
