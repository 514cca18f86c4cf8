from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest

from tests.replay.helpers import make_requests
from tests.replay.mockserver import Behaviour, MockConfig, MockServer
from tests.waiting import wait_for
from workers.replay.client import ReplayResult, request_body
from workers.replay.config import ReplayConfig
from workers.replay.records import RequestRecord
from workers.replay.request import server_request_id
from workers.replay.run import run_replay

# run_replay's own keywords: the caller's hooks, not the replay's configuration.
HOOKS = ("on_batch", "on_progress", "stop", "origin_ns")


def _replay(requests: list[dict[str, Any]], base_url: str, **overrides: Any) -> ReplayResult:
    options: dict[str, Any] = {
        "base_url": base_url,
        "model": "mock",
        "run_id": "run-1",
        "warmup_s": 0.0,
        "observation_s": max(0.05, requests[-1]["t_offset_s"] + 0.01),
        "drain_deadline_s": 10.0,
        # Generous: these tests check behaviour, not the client's timing quality (bench/ does that).
        "max_dispatch_lag_ms": 1000.0,
        "batch_interval_s": 0.05,
    }
    hooks = {name: overrides.pop(name) for name in HOOKS if name in overrides}
    options.update(overrides)
    return run_replay(requests, ReplayConfig(**options), **hooks)


def _wait_disconnected(entry: Any) -> None:
    # The server notices a disconnect on its own thread, a moment after the client closes.
    wait_for(lambda: entry.disconnected, 5, interval_s=0.01, what="the server saw the client disconnect")


def test_it_counts_tokens_from_usage_when_a_chunk_carries_several(mock_config: MockConfig) -> None:
    mock_config.default = Behaviour(ttft_s=0.01, itl_s=0.002, tokens_per_chunk=4)
    with MockServer(mock_config) as server:
        result = _replay(make_requests(3, output_tokens=10), server.base_url)
    for record in result.records:
        assert record.ok, record.error
        assert record.output_tokens == 10
        # 4 + 4 + 2 tokens in three frames: two gaps between frames, six tokens after the first frame.
        assert record.chunks == 3
        assert record.chunk_gaps.total == 2
        assert record.token_gaps.total == 6
        assert record.finish_reason == "length"
        assert record.prompt_tokens == 4
        assert record.first_token_ns is not None and record.sent_ns is not None
        assert record.sent_ns < record.first_token_ns <= record.last_token_ns <= record.end_ns
        assert record.max_gap_ns is not None and record.max_gap_ns > 0


def test_it_uses_the_closing_usage_when_frames_carry_none(mock_config: MockConfig) -> None:
    mock_config.default = Behaviour(ttft_s=0.01, itl_s=0.002, tokens_per_chunk=3, no_usage=True)
    with MockServer(mock_config) as server:
        result = _replay(make_requests(2, output_tokens=9), server.base_url)
    assert [r.output_tokens for r in result.records] == [9, 9]
    assert all(r.chunks == 3 for r in result.records)


def test_it_parses_streams_split_mid_line_and_with_keepalive_comments(mock_config: MockConfig) -> None:
    mock_config.default = Behaviour(
        ttft_s=0.01, itl_s=0.003, tokens_per_chunk=2, comments=True, split_frames=True
    )
    with MockServer(mock_config) as server:
        result = _replay(make_requests(2, output_tokens=6), server.base_url)
    assert all(r.ok for r in result.records), [r.error for r in result.records]
    assert [r.output_tokens for r in result.records] == [6, 6]


def test_it_streams_chat_completions_without_counting_the_role_frame(mock_server: MockServer) -> None:
    requests = make_requests(2, output_tokens=5)
    for request in requests:
        request["prompt"] = "hello there"
    result = _replay(requests, mock_server.base_url, endpoint="chat")
    assert all(r.ok for r in result.records)
    assert [(r.output_tokens, r.chunks) for r in result.records] == [(5, 5), (5, 5)]
    assert all(e.path == "/v1/chat/completions" for e in mock_server.log)


def test_it_marks_a_cancelled_request_and_the_server_sees_the_disconnect(mock_config: MockConfig) -> None:
    mock_config.default = Behaviour(ttft_s=0.01, itl_s=0.01)
    requests = make_requests(2, output_tokens=50)
    requests[1]["cancel_after_tokens"] = 3
    with MockServer(mock_config) as server:
        result = _replay(requests, server.base_url)
        entry = server.entry(1)
        assert entry is not None
        _wait_disconnected(entry)
        finished = server.entry(0)
    record = result.records[1]
    assert record.cancelled and not record.ok and not record.unfinished
    assert record.output_tokens == 3
    assert entry.tokens_written < 50 and not entry.completed
    assert result.records[0].ok and finished is not None and finished.completed
    assert result.cancelled == 1


def test_it_marks_a_stream_open_at_the_drain_deadline_unfinished_and_closes_it(
    mock_config: MockConfig,
) -> None:
    mock_config.by_index[1] = Behaviour(ttft_s=0.01, itl_s=0.5)
    requests = make_requests(2, output_tokens=20)
    with MockServer(mock_config) as server:
        result = _replay(requests, server.base_url, observation_s=0.05, drain_deadline_s=0.3)
        entry = server.entry(1)
        assert entry is not None
        _wait_disconnected(entry)
    slow = result.records[1]
    assert slow.unfinished and not slow.ok and not slow.cancelled
    # What arrived before the deadline is kept: the first token, not all 20.
    assert slow.output_tokens is not None and 1 <= slow.output_tokens < 20
    assert result.records[0].ok and not result.records[0].unfinished
    assert result.unfinished == 1
    assert slow.end_ns is not None and slow.end_ns >= round((0.05 + 0.3) * 1e9)


def test_it_records_a_server_error_and_carries_on(mock_config: MockConfig) -> None:
    mock_config.by_index[0] = Behaviour(status=500)
    with MockServer(mock_config) as server:
        result = _replay(make_requests(3), server.base_url)
    failed = result.records[0]
    assert failed.http_status == 500 and failed.error_kind == "http"
    assert failed.error is not None and "mock error" in failed.error
    assert [r.ok for r in result.records] == [False, True, True]
    assert result.errors == 1


def test_it_records_a_refused_connection_per_request() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # Nothing listens on the port any more.
    result = _replay(make_requests(3), f"http://127.0.0.1:{port}")
    assert [r.error_kind for r in result.records] == ["connect"] * 3
    assert all(r.sent and r.http_status is None and r.end_ns is not None for r in result.records)
    assert result.errors == 3


def test_it_records_a_read_timeout(mock_config: MockConfig) -> None:
    mock_config.by_index[0] = Behaviour(hang=True)
    with MockServer(mock_config) as server:
        result = _replay(make_requests(2), server.base_url, read_timeout_s=0.2)
    assert result.records[0].error_kind == "timeout"
    assert result.records[1].ok


def test_it_records_a_stream_cut_by_the_server(mock_config: MockConfig) -> None:
    mock_config.by_index[0] = Behaviour(ttft_s=0.01, itl_s=0.002, drop_after_tokens=3)
    with MockServer(mock_config) as server:
        result = _replay(make_requests(2, output_tokens=10), server.base_url)
    cut = result.records[0]
    assert cut.error_kind == "protocol" and cut.output_tokens == 3
    assert result.records[1].ok


def test_it_flags_an_overloaded_run_invalid(mock_config: MockConfig) -> None:
    mock_config.default = Behaviour(ttft_s=0.001, itl_s=0.001)
    requests = make_requests(2000, spacing_s=1 / 20_000, output_tokens=2)
    with MockServer(mock_config) as server:
        result = _replay(
            requests, server.base_url, observation_s=0.1, drain_deadline_s=30, max_dispatch_lag_ms=5.0
        )
    assert not result.valid
    assert "load generator fell behind" in result.invalid_reason
    assert result.dispatch_lag_p99_ms is not None and result.dispatch_lag_p99_ms > 5.0
    assert result.achieved_rate_rps is not None and result.planned_rate_rps == pytest.approx(20_000)
    assert result.achieved_rate_rps < result.planned_rate_rps


def test_it_sends_on_schedule_while_an_earlier_request_is_still_waiting(mock_config: MockConfig) -> None:
    # Request 0's server takes a second to answer; requests 1-4 must go out
    # at their own times, not after it (open loop, no concurrency cap).
    mock_config.by_index[0] = Behaviour(ttft_s=1.0, itl_s=0.001)
    requests = make_requests(5, spacing_s=0.05, output_tokens=2)
    with MockServer(mock_config) as server:
        result = _replay(requests, server.base_url)
        slow = server.entry(0)
        later = [server.entry(i) for i in range(1, 5)]
    assert slow is not None and slow.first_write_ns is not None
    assert all(e is not None and e.arrival_ns < slow.first_write_ns for e in later)
    first_token = result.records[0].first_token_ns
    assert first_token is not None
    assert all(r.sent_ns is not None and r.sent_ns < first_token for r in result.records[1:])
    assert all(r.ok for r in result.records)


def test_it_reports_a_concurrency_cap_as_admission_delay_not_lag(mock_config: MockConfig) -> None:
    mock_config.default = Behaviour(ttft_s=0.05, itl_s=0.01)
    requests = make_requests(3, spacing_s=0.0, output_tokens=3)
    with MockServer(mock_config) as server:
        result = _replay(requests, server.base_url, max_concurrency=1, max_dispatch_lag_ms=20.0)
    delays = [r.admission_delay_ns for r in result.records]
    assert delays[0] is not None and delays[0] < 20_000_000
    assert all(d is not None and d >= 50_000_000 for d in delays[1:])
    # Each later request waited for the one before it to end.
    ends = [r.end_ns for r in result.records]
    assert result.records[1].sent_ns >= ends[0] and result.records[2].sent_ns >= ends[1]  # type: ignore[operator]
    assert result.valid, result.invalid_reason


def test_it_hands_every_record_to_on_batch_exactly_once(mock_server: MockServer) -> None:
    batches: list[list[RequestRecord]] = []
    progress: list[tuple[int, int]] = []
    result = _replay(
        make_requests(20, spacing_s=0.01),
        mock_server.base_url,
        on_batch=batches.append,
        on_progress=lambda sent, total: progress.append((sent, total)),
    )
    indices = [r.index for batch in batches for r in batch]
    assert sorted(indices) == list(range(20))
    assert len(batches) >= 2  # delivered while the run went on, not only at the end
    assert progress[-1] == (20, 20)
    assert result.sent == 20 and result.ok == 20


def test_it_stops_promptly_and_marks_what_was_left(mock_config: MockConfig) -> None:
    mock_config.default = Behaviour(ttft_s=0.01, itl_s=0.05)
    stop = threading.Event()
    batches: list[list[RequestRecord]] = []
    requests = make_requests(100, spacing_s=0.1, output_tokens=100)  # a 10 s trace
    timer = threading.Timer(0.5, stop.set)
    timer.start()
    with MockServer(mock_config) as server:
        result = _replay(requests, server.base_url, stop=stop, on_batch=batches.append)
    timer.cancel()
    assert result.stopped
    assert result.not_sent > 0 and result.sent > 0
    unsent = [r for r in result.records if not r.sent]
    assert all(r.error is not None and r.error.startswith("run stopped before this request") for r in unsent)
    # Streams open at the stop were closed and marked cancelled (100 tokens take 5 s).
    open_at_stop = [r for r in result.records if r.sent]
    assert open_at_stop and all(r.cancelled for r in open_at_stop)
    assert sorted(r.index for b in batches for r in b) == list(range(100))


def test_it_reraises_an_on_batch_failure_after_stopping(mock_server: MockServer) -> None:
    def broken(batch: list[RequestRecord]) -> None:
        raise RuntimeError("database is down")

    with pytest.raises(RuntimeError, match="database is down"):
        _replay(make_requests(30, spacing_s=0.05), mock_server.base_url, on_batch=broken)


def test_it_marks_requests_due_after_the_drain_deadline_not_sent(mock_server: MockServer) -> None:
    requests = make_requests(3, spacing_s=0.05)
    requests[2]["t_offset_s"] = 5.0
    result = _replay(requests, mock_server.base_url, observation_s=0.1, drain_deadline_s=0.2)
    assert [r.sent for r in result.records] == [True, True, False]
    assert result.records[2].error == "not sent by the drain deadline"
    assert not result.valid


def test_it_excludes_warmup_requests_from_the_lag_and_rate(mock_server: MockServer) -> None:
    requests = make_requests(10, spacing_s=0.02)
    for request in requests[:5]:
        request["warmup"] = True
    result = _replay(requests, mock_server.base_url, warmup_s=0.1, observation_s=0.1)
    assert [r.warmup for r in result.records] == [True] * 5 + [False] * 5
    assert result.planned_rate_rps == pytest.approx(50.0)


def test_it_builds_a_synthetic_exact_length_body() -> None:
    import json

    request = make_requests(1, output_tokens=7)[0]
    request["priority"] = 2
    body = json.loads(request_body(request, model="m", endpoint="completions", extra_body={"temperature": 0}))
    assert body["prompt"] == [11, 12, 13, 14]
    assert body["max_tokens"] == body["min_tokens"] == 7 and body["ignore_eos"] is True
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["priority"] == 2 and body["temperature"] == 0
    request["priority"] = 0
    assert "priority" not in json.loads(
        request_body(request, model="m", endpoint="completions", extra_body={})
    )


def test_it_refuses_chat_requests_without_text_before_sending() -> None:
    with pytest.raises(ValueError, match="request 0: the chat endpoint needs a text 'prompt'"):
        _replay(make_requests(1), "http://127.0.0.1:9", endpoint="chat")


def test_it_spreads_the_send_loop_over_processes_with_one_origin(mock_config: MockConfig) -> None:
    mock_config.default = Behaviour(ttft_s=0.01, itl_s=0.002, tokens_per_chunk=2)
    mock_config.by_index[3] = Behaviour(status=500)
    batches: list[list[RequestRecord]] = []
    with MockServer(mock_config) as server:
        # 50 ms apart: two processes' sends 10 ms apart could swap on a loaded 2-core
        # machine; with separate origins they would be off by a process start-up (>100 ms).
        result = _replay(
            make_requests(12, spacing_s=0.05, output_tokens=6),
            server.base_url,
            processes=2,
            on_batch=batches.append,
        )
        arrivals = {int(e.tag.rpartition(":")[2]): e.arrival_ns for e in server.log if e.tag}
        request_ids = {int(e.tag.rpartition(":")[2]): e.request_id for e in server.log if e.tag}
    assert [r.index for r in result.records] == list(range(12))
    # Each request carried vLLM's X-Request-Id, one per run and index, from whichever process sent it.
    assert request_ids == {i: server_request_id("run-1", i) for i in range(12)}
    assert len(set(request_ids.values())) == 12
    assert sorted(r.index for b in batches for r in b) == list(range(12))
    assert all(r.output_tokens == 6 for r in result.records if r.index != 3)
    assert result.records[3].error_kind == "http"
    assert result.sent == 12 and result.ok == 11
    # Both children scheduled against the same origin: the server saw the trace order.
    assert sorted(arrivals, key=arrivals.__getitem__) == list(range(12))
    assert "send loop spread over 2 processes" in result.notes


def test_it_stops_every_process_when_asked(mock_config: MockConfig) -> None:
    mock_config.default = Behaviour(ttft_s=0.01, itl_s=0.05)
    stop = threading.Event()

    def stop_once_sending(sent: int, _total: int) -> None:
        # Asked to stop mid-run, however long the children took to start on a busy machine.
        if sent >= 4:
            stop.set()

    with MockServer(mock_config) as server:
        result = _replay(
            make_requests(100, spacing_s=0.1, output_tokens=100),
            server.base_url,
            stop=stop,
            processes=2,
            on_progress=stop_once_sending,
        )
    assert result.stopped
    assert result.sent > 0 and result.not_sent > 0
    assert len(result.records) == 100
    assert all(r.cancelled for r in result.records if r.sent)


def test_it_counts_a_stream_that_ended_after_the_drain_deadline_as_unfinished() -> None:
    from workers.replay.client import mark_late
    from workers.replay.records import RequestRecord

    def record(end_ns: int | None, **kw: Any) -> RequestRecord:
        return RequestRecord(
            run_id="r", index=0, request_class="c", warmup=False, input_tokens=1,
            expected_output_tokens=4, planned_ns=0, end_ns=end_ns, output_tokens=4, http_status=200, **kw,
        )  # fmt: skip

    # A stalled process read the whole stream after the deadline: it had not finished by then.
    late = record(6_000_000_000)
    assert mark_late(late, deadline_ns=5_000_000_000) and late.unfinished
    assert "after the drain deadline" in (late.error or "")
    for kept in (record(4_000_000_000), record(6_000_000_000, cancelled=True), record(None)):
        assert not mark_late(kept, deadline_ns=5_000_000_000) and not kept.unfinished
    failed = record(6_000_000_000, error_kind="http")
    assert not mark_late(failed, deadline_ns=5_000_000_000)


def test_it_measures_how_long_its_loop_could_not_run() -> None:
    import asyncio
    from types import SimpleNamespace

    from workers.replay.client import _Replay

    state = SimpleNamespace(loop_stall_max_ns=0, stop=threading.Event())

    async def main() -> None:
        watch = asyncio.create_task(_Replay._watch_stop(state))  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
        time.sleep(0.3)  # the process stalls: nothing on this loop runs
        await asyncio.sleep(0.05)
        state.stop.set()
        await watch

    asyncio.run(main())
    assert 250e6 <= state.loop_stall_max_ns < 2e9


def test_it_reports_the_longest_loop_stall_in_its_summary(mock_config: MockConfig) -> None:
    with MockServer(mock_config) as server:
        result = _replay(make_requests(2), server.base_url)
    assert result.loop_stall_max_ms is not None and result.loop_stall_max_ms >= 0
    assert result.summary()["loop_stall_max_ms"] == result.loop_stall_max_ms


def test_the_drain_ends_when_the_last_request_finishes_not_at_its_deadline(mock_config: MockConfig) -> None:
    # Engine time (docs/ARCHITECTURE.md): a drain that always waited its deadline would be waste.
    mock_config.default = Behaviour(ttft_s=0.05, itl_s=0.01)
    requests = make_requests(3, output_tokens=10)
    with MockServer(mock_config) as server:
        result = _replay(requests, server.base_url, observation_s=0.1, drain_deadline_s=20.0)
    assert all(r.ok for r in result.records)
    # Every stream ended about 0.2 s after its send; the replay returned then, far inside the 20 s.
    assert result.duration_s < 0.1 + 20.0 / 2, result.duration_s
