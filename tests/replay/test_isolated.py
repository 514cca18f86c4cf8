"""The replay in its own process: same records and result as in-process, and it stops on request."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tests.replay.helpers import make_requests
from tests.replay.mockserver import MockServer
from workers.replay.config import ReplayConfig
from workers.replay.run import run_replay
from workers.replay.shard import ReplayProcessError

OPTIONS: dict[str, Any] = {
    "model": "mock",
    "run_id": "run-iso",
    "warmup_s": 0.0,
    "drain_deadline_s": 10.0,
    "max_dispatch_lag_ms": 1000.0,
    "batch_interval_s": 0.05,
    "isolated": True,
}


def _config(base_url: str, observation_s: float, **overrides: Any) -> ReplayConfig:
    return ReplayConfig(base_url=base_url, observation_s=observation_s, **{**OPTIONS, **overrides})


def test_it_returns_every_record_once_through_batches(mock_server: MockServer) -> None:
    requests = make_requests(20, spacing_s=0.01, output_tokens=5)
    batches: list[list[int]] = []
    result = run_replay(
        requests,
        _config(mock_server.base_url, 0.5),
        on_batch=lambda batch: batches.append([r.index for r in batch]),
    )
    seen = [i for batch in batches for i in batch]
    assert sorted(seen) == list(range(20))
    assert sorted(r.index for r in result.records) == list(range(20))
    assert all(r.output_tokens == 5 and r.http_status == 200 for r in result.records)
    assert result.sent == 20 and result.valid


def test_the_result_says_the_send_loops_scheduling_class(
    mock_server: MockServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    requests = make_requests(4, spacing_s=0.01, output_tokens=2)
    result = run_replay(requests, _config(mock_server.base_url, 0.1))
    # As the child reported it (test_runtime.py checks the report against the kernel).
    assert result.send_priority == "realtime" or str(result.send_priority).startswith("normal (")
    assert result.summary()["send_priority"] == result.send_priority
    monkeypatch.setenv("TAILTUNE_REPLAY_REALTIME", "0")
    result = run_replay(requests, _config(mock_server.base_url, 0.1))
    assert result.send_priority == "normal (TAILTUNE_REPLAY_REALTIME=0)"


def test_it_stops_when_asked(mock_server: MockServer) -> None:
    requests = make_requests(200, spacing_s=0.05, output_tokens=5)  # 10 s of traffic
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    started = time.monotonic()
    result = run_replay(requests, _config(mock_server.base_url, 10.0), stop=stop)
    assert time.monotonic() - started < 8.0
    assert result.stopped
    assert len(result.records) == 200  # the unsent ones are records too
    assert any(not r.sent for r in result.records)


def test_every_request_carries_the_sampling_fields_and_the_result_says_which(mock_server: MockServer) -> None:
    requests = make_requests(6, spacing_s=0.01, output_tokens=3)
    sampling = {"seed": 5, "temperature": 0.0, "top_p": 0.9}
    result = run_replay(requests, _config(mock_server.base_url, 0.2, extra_body=sampling))
    assert result.sent == 6 and result.extra_body == sampling
    assert [e.sampling for e in mock_server.log] == [sampling] * 6


def test_a_child_that_dies_fails_the_run_with_its_exit_code(
    mock_server: MockServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The child is killed by its first batch (SIGKILL, no word to the parent): the parent says
    # so rather than returning a result as if the run were whole.
    import subprocess

    real_popen = subprocess.Popen

    def popen_that_dies(args: list[str], **kwargs: Any) -> Any:
        return real_popen([args[0], "-c", "import os, sys; sys.stdin.readline(); os._exit(3)"], **kwargs)

    monkeypatch.setattr("workers.replay.shard.subprocess.Popen", popen_that_dies)
    with pytest.raises(ReplayProcessError, match="exit 3"):
        run_replay(make_requests(5, output_tokens=2), _config(mock_server.base_url, 0.1))


def test_records_of_a_process_that_died_are_marked_not_sent(
    mock_server: MockServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two processes, the second dies before it reports: its share is marked not sent, with why.
    import subprocess

    real_popen = subprocess.Popen
    started: list[int] = []

    def second_dies(args: list[str], **kwargs: Any) -> Any:
        started.append(1)
        if len(started) == 2:
            return real_popen([args[0], "-c", "import os, sys; sys.stdin.readline(); os._exit(4)"], **kwargs)
        return real_popen(args, **kwargs)

    monkeypatch.setattr("workers.replay.shard.subprocess.Popen", second_dies)
    result = run_replay(
        make_requests(6, output_tokens=2), _config(mock_server.base_url, 0.2, processes=2, isolated=False)
    )
    lost = [r for r in result.records if not r.sent]
    assert sorted(r.index for r in lost) == [1, 3, 5]
    assert all("exited (4)" in (r.error or "") for r in lost)
    assert [r.index for r in result.records if r.ok] == [0, 2, 4]
    assert any("process 1 ended without reporting (exit code 4)" in n for n in result.notes)


def test_a_child_that_never_gets_ready_fails_the_run_instead_of_hanging_it(
    mock_server: MockServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A child that reads its job and then hangs (it never says it is ready, nor reads its stdin
    # again): past the ready timeout the parent asks it to stop, kills it after the grace, and
    # the run fails saying why, every request accounted for as not sent.
    import subprocess

    from workers.replay import shard

    real_popen = subprocess.Popen

    def hangs(args: list[str], **kwargs: Any) -> Any:
        return real_popen(
            [args[0], "-c", "import sys, time; sys.stdin.readline(); time.sleep(600)"], **kwargs
        )

    monkeypatch.setattr("workers.replay.shard.subprocess.Popen", hangs)
    monkeypatch.setattr(shard, "_READY_TIMEOUT_S", 0.5)
    monkeypatch.setattr(shard, "_STOP_GRACE_S", 0.5)
    batches: list[int] = []
    started = time.monotonic()
    with pytest.raises(ReplayProcessError, match="not ready within 0.5 s"):
        run_replay(
            make_requests(4, output_tokens=2),
            _config(mock_server.base_url, 0.1),
            on_batch=lambda batch: batches.extend(r.index for r in batch if not r.sent),
        )
    assert time.monotonic() - started < 30
    assert sorted(batches) == [0, 1, 2, 3]
