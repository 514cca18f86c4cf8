"""The replay in its own process: same records and result as in-process, and it stops on request."""

from __future__ import annotations

import threading
import time

from tests.replay.helpers import make_requests
from tests.replay.mockserver import MockServer
from workers.replay.isolated import run_replay_isolated

OPTIONS = {
    "model": "mock",
    "run_id": "run-iso",
    "warmup_s": 0.0,
    "drain_deadline_s": 10.0,
    "max_dispatch_lag_ms": 1000.0,
    "batch_interval_s": 0.05,
}


def test_it_returns_every_record_once_through_batches(mock_server: MockServer) -> None:
    requests = make_requests(20, spacing_s=0.01, output_tokens=5)
    batches: list[list[int]] = []
    result = run_replay_isolated(
        requests,
        base_url=mock_server.base_url,
        observation_s=0.5,
        on_batch=lambda batch: batches.append([r.index for r in batch]),
        **OPTIONS,
    )
    seen = [i for batch in batches for i in batch]
    assert sorted(seen) == list(range(20))
    assert sorted(r.index for r in result.records) == list(range(20))
    assert all(r.output_tokens == 5 and r.http_status == 200 for r in result.records)
    assert result.sent == 20 and result.valid


def test_it_stops_when_asked(mock_server: MockServer) -> None:
    requests = make_requests(200, spacing_s=0.05, output_tokens=5)  # 10 s of traffic
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    started = time.monotonic()
    result = run_replay_isolated(
        requests, base_url=mock_server.base_url, observation_s=10.0, stop=stop, **OPTIONS
    )
    assert time.monotonic() - started < 8.0
    assert result.stopped
    assert len(result.records) == 200  # the unsent ones are records too
    assert any(not r.sent for r in result.records)


def test_every_request_carries_the_sampling_fields_and_the_result_says_which(mock_server: MockServer) -> None:
    requests = make_requests(6, spacing_s=0.01, output_tokens=3)
    sampling = {"seed": 5, "temperature": 0.0, "top_p": 0.9}
    result = run_replay_isolated(
        requests, base_url=mock_server.base_url, observation_s=0.2, extra_body=sampling, **OPTIONS
    )
    assert result.sent == 6 and result.extra_body == sampling
    assert [e.sampling for e in mock_server.log] == [sampling] * 6
