"""The server's own timings on the real CPU vLLM: its spans reach the worker's receiver and join
the replay's records (workers/engine/spans.py), for completions and chat completions, two runs
on one server (built by `make engine`; skipped when it is not)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.engine_support import CONTROLS, ENGINE_DIR, ENGINE_MARKS, MODEL
from workers.engine.launcher import cpu_engine_host
from workers.engine.server import EngineServer
from workers.engine.spans import MIN_SHARE, collect_run_spans, join_spans, spans_summary
from workers.replay.config import ReplayConfig
from workers.replay.records import RequestRecord
from workers.replay.request import server_request_id
from workers.replay.run import run_replay

pytestmark = ENGINE_MARKS

# Clock tolerance between two differences taken on the server's own clocks (the engine core's
# monotonic one for queue and prefill, the API server's wall clock for its TTFT).
CLOCKS_NS = 10_000_000


def _trace(count: int, *, chat: bool = False) -> list[dict[str, Any]]:
    requests: list[dict[str, Any]] = []
    for i in range(count):
        request: dict[str, Any] = {
            "index": i,
            "t_offset_s": round(i * 0.15, 6),
            "class": "short" if i % 3 else "long",
            "input_tokens": 32 + 24 * (i % 4),
            "output_tokens": 6 + 2 * (i % 3),
            "priority": 0,
            "warmup": False,
        }
        if chat:
            request["prompt"] = " ".join(f"word{j}" for j in range(10 + i))
        else:
            request["prompt_token_ids"] = [10 + (i * 17 + j) % 1900 for j in range(request["input_tokens"])]
        requests.append(request)
    return requests


def _replay(
    server: EngineServer, run_id: str, requests: list[dict[str, Any]], endpoint: str
) -> list[RequestRecord]:
    result = run_replay(
        requests,
        ReplayConfig(
            base_url=server.base_url,
            model="tiny",
            run_id=run_id,
            warmup_s=0.0,
            observation_s=requests[-1]["t_offset_s"] + 0.1,
            drain_deadline_s=120.0,
            max_dispatch_lag_ms=1000.0,
            endpoint=endpoint,
            isolated=True,
        ),
    )
    assert result.ok == len(requests), [r.error for r in result.records if not r.ok]
    return result.records


def test_the_servers_spans_join_every_answered_request_with_plausible_times(tmp_path: Path) -> None:
    server = EngineServer(
        model=str(MODEL),
        cell_args={"max_num_batched_tokens": 256, "max_num_seqs": 4, "enable_chunked_prefill": True},
        controls=CONTROLS,
        host=cpu_engine_host(ENGINE_DIR),
        log_path=tmp_path / "server.log",
        health_deadline_s=240,
        grace_s=15,
    )
    runs = {"run-completions": "completions", "run-chat": "chat"}
    with server:
        server.start()
        assert server.spans is not None, server.spans_off_reason
        server.confirm()  # the launcher's tracing flag is no mismatch
        server.warm_up(n=2)  # requests of no run: their spans are dropped, not joined
        records = {
            run_id: _replay(server, run_id, _trace(12, chat=endpoint == "chat"), endpoint)
            for run_id, endpoint in runs.items()
        }
        # Each run takes its own spans, one after the other, from the one server's receiver.
        spans = {
            run_id: collect_run_spans(server.spans.store, run_id, recs) for run_id, recs in records.items()
        }
        foreign = server.spans.store.foreign
        # Read while the server is up: its stop may log the engine core's end as a traceback of
        # the API server's output handler, which says nothing of tracing.
        log = (tmp_path / "server.log").read_text()
    joins = {run_id: join_spans(records[run_id], got) for run_id, got in spans.items()}
    # What reaches the span is the id the replay sent, with the endpoint's prefix (and a
    # completion's choice).
    assert {i: s.request_id for i, s in spans["run-completions"].items()} == {
        i: f"cmpl-{server_request_id('run-completions', i)}-0" for i in range(12)
    }
    assert {i: s.request_id for i, s in spans["run-chat"].items()} == {
        i: f"chatcmpl-{server_request_id('run-chat', i)}" for i in range(12)
    }
    for run_id, join in joins.items():
        summary = spans_summary(join)
        assert summary["used"] is True and join.share is not None and join.share >= MIN_SHARE, (
            run_id,
            summary,
        )
        assert join.received == join.joined == join.answered == 12
    assert foreign >= 2  # the warm-up's spans arrived and were told apart
    for run_id, recs in records.items():
        for r in recs:
            assert None not in (
                r.server_queue_ns,
                r.server_prefill_ns,
                r.server_decode_ns,
                r.server_e2e_ns,
            ), r
            assert r.server_ttft_ns is not None and r.first_token_ns is not None and r.sent_ns is not None
            assert r.end_ns is not None
            # Queue and prefill come before the first token, on the server's own clocks.
            assert r.server_queue_ns + r.server_prefill_ns <= r.server_ttft_ns + CLOCKS_NS, (run_id, r.index)
            # The server saw the request after the client sent it and the first token before the
            # client read it: its TTFT and E2E are within the client's.
            assert r.server_ttft_ns <= r.first_token_ns - r.sent_ns + 2_000_000, (run_id, r.index)
            assert r.server_e2e_ns <= r.end_ns - r.sent_ns + 2_000_000, (run_id, r.index)
            assert r.server_decode_ns <= r.server_e2e_ns
            assert spans[run_id][r.index].prompt_tokens == r.prompt_tokens
            assert spans[run_id][r.index].completion_tokens == r.output_tokens
    assert "otlp_traces_endpoint" in log and "Traceback" not in log
    assert "Failed to export" not in log and "Exception while exporting" not in log
