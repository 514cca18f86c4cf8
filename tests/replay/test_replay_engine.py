"""The replay against the real CPU vLLM (built by `make engine`; skipped when it is not)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from apps.analysis import lengths
from apps.analysis.quality_verdict import quality_check
from tests.engine_support import CONTROLS, ENGINE_DIR, ENGINE_MARKS, MODEL
from workers.engine.launcher import cpu_engine_host
from workers.engine.server import EngineServer
from workers.quality_probe import run_probe
from workers.replay.config import ReplayConfig
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


def test_it_replays_a_trace_with_exact_token_counts(tmp_path: Path) -> None:
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
        # In its own process, as a worker runs it.
        result = run_replay(
            requests,
            ReplayConfig(
                base_url=server.base_url,
                model="tiny",
                run_id="engine",
                warmup_s=0.0,
                observation_s=1.6,
                drain_deadline_s=120.0,
                max_dispatch_lag_ms=1000.0,
                isolated=True,
            ),
        )
        # The same server, the quality probe twice: B0 against itself must agree fully.
        probe_requests = [{**r, "output_tokens": 12} for r in _trace(4)]
        answers = [
            run_probe(base_url=server.base_url, model="tiny", requests=probe_requests) for _ in range(2)
        ]
        # The same server, natural lengths: the cap is all the request forces (greedy decoding).
        capped = [{**r, "output_tokens": 200} for r in _trace(8)]
        natural = run_replay(
            capped,
            ReplayConfig(
                base_url=server.base_url,
                model="tiny",
                run_id="engine-natural",
                warmup_s=0.0,
                observation_s=1.6,
                drain_deadline_s=120.0,
                max_dispatch_lag_ms=1000.0,
                extra_body={"temperature": 0.0},
                output_mode="natural",
            ),
        )
    for record in result.records:
        if record.index == 5:
            assert record.cancelled and record.output_tokens == 3, record
            continue
        assert record.ok, record.error
        assert record.output_tokens == record.expected_output_tokens, record.index
        assert record.prompt_tokens == record.input_tokens
        assert record.finish_reason == "length"
        assert record.first_token_ns is not None and record.last_token_ns is not None
        assert record.token_gaps.total == record.output_tokens - 1 or record.chunks < record.output_tokens
    assert result.sent == 8 and result.errors == 0 and result.unfinished == 0
    for first, second in zip(*answers, strict=True):
        assert first["token_ids"] and 1 <= len(first["token_ids"]) <= 12 and "error" not in first, first
        assert first["finish_reason"] in ("stop", "length")
        assert first["token_ids"] == second["token_ids"]
    self_check = quality_check(
        cells=[{"cell_id": "B0"}],
        classes=[{"name": "short", "quality": {"min_exact_match": 1.0}}, {"name": "long"}],
        baseline="B0",
        probes=[
            {"run": f"r{k}", "cell": "B0", "trace_sha256": "p" * 64, "outputs": out}
            for k, out in enumerate(answers)
        ],
    )
    assert {c: e["exact_match"] for c, e in self_check["cells"]["B0"].items()} == {"short": 1.0, "long": 1.0}
    # Natural lengths: each answer is the model's own length up to the cap, with vLLM's reason.
    assert natural.output_mode == "natural" and natural.sent == 8 and natural.errors == 0
    for record in natural.records:
        assert record.ok and 1 <= record.output_tokens <= 200, record
        assert record.finish_reason in ("stop", "length"), record.finish_reason
        if record.finish_reason == "length":
            assert record.output_tokens == 200
    strata = lengths.strata(
        np.array([r.output_tokens for r in natural.records]), np.array([1.0] * len(natural.records))
    )
    assert sum(s["requests"] for s in strata) == 8
