"""The replay against the real CPU vLLM (built by `make engine`; skipped when it is not)."""

from __future__ import annotations

from pathlib import Path

from tests.engine_support import CONTROLS, ENGINE_DIR, ENGINE_MARKS, MODEL
from workers.engine.launcher import cpu_engine_host
from workers.engine.server import EngineServer
from workers.replay.run import run_replay

pytestmark = ENGINE_MARKS


def _trace(count: int) -> list[dict[str, object]]:
    return [
        {
            "index": i,
            "t_offset_s": round(i * 0.2, 6),
            "class": "short" if i % 2 else "long",
            "input_tokens": 16 + 8 * i,
            "output_tokens": 6 + 5 * (i % 3),
            "priority": 0,
            "warmup": False,
            "prompt_token_ids": [10 + (i * 31 + j) % 2000 for j in range(16 + 8 * i)],
        }
        for i in range(count)
    ]


def test_it_replays_a_trace_with_exact_token_counts_on_both_transports(tmp_path: Path) -> None:
    server = EngineServer(
        model=str(MODEL),
        cell_args={"max_num_batched_tokens": 2048, "max_num_seqs": 8},
        controls=CONTROLS,
        host=cpu_engine_host(ENGINE_DIR),
        log_path=tmp_path / "server.log",
        health_deadline_s=240,
        grace_s=15,
    )
    requests = _trace(8)
    requests[5]["cancel_after_tokens"] = 3
    with server:
        server.start()
        results = {
            transport: run_replay(
                requests,
                base_url=server.base_url,
                model="tiny",
                run_id=f"engine-{transport}",
                warmup_s=0.0,
                observation_s=1.6,
                drain_deadline_s=120.0,
                max_dispatch_lag_ms=1000.0,
                transport=transport,
            )
            for transport in ("raw", "aiohttp")
        }
    for transport, result in results.items():
        for record in result.records:
            if record.index == 5:
                assert record.cancelled and record.output_tokens == 3, (transport, record)
                continue
            assert record.ok, (transport, record.error)
            assert record.output_tokens == record.expected_output_tokens, (transport, record.index)
            assert record.prompt_tokens == record.input_tokens
            assert record.finish_reason == "length"
            assert record.first_token_ns is not None and record.last_token_ns is not None
            assert record.token_gaps.total == record.output_tokens - 1 or record.chunks < record.output_tokens
        assert result.sent == 8 and result.errors == 0 and result.unfinished == 0
