"""A request log with chat messages, imported and replayed through /v1/chat/completions on the CPU vLLM.

Issue #34's acceptance for real prompts: every record's prompt tokens are the chat template's
rendered count that the import stored as the request's ``input_tokens``, and the server's own
``usage.prompt_tokens`` for that request says the same.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from apps.workloads.chat_template import ChatRenderer
from apps.workloads.corpus_store import corpus_load, request_log_import
from apps.workloads.redaction import redactor
from apps.workloads.services import trace_load
from tests.engine_support import CONTROLS, ENGINE_DIR, ENGINE_MARKS, MODEL
from workers.engine.launcher import cpu_engine_host
from workers.engine.server import EngineServer
from workers.engine.tinymodel import build_model
from workers.replay.config import ReplayConfig
from workers.replay.run import run_replay

pytestmark = [*ENGINE_MARKS, pytest.mark.django_db]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "traces" / "chat-log.jsonl"


def _model_with_template(tmp_path: Path) -> Path:
    """The engine's tiny model when its build carries the chat template (`make engine` since
    model-v2), else the same model built here with it."""
    config = json.loads((MODEL / "tokenizer_config.json").read_text())
    if config.get("chat_template"):
        return MODEL
    return build_model(tmp_path / "tiny-llama", revision=str(CONTROLS["revision"]))


def test_it_replays_a_chat_log_with_the_template_rendered_prompt_lengths(tmp_path: Path) -> None:
    model = _model_with_template(tmp_path)
    trace_row, corpus_row = request_log_import(
        data=EXAMPLE.read_bytes(),
        model_dir=model,
        tokenizer_revision=str(CONTROLS["tokenizer_revision"]),
        thresholds=[("short", 100), ("long", None)],
        max_model_len=int(CONTROLS["max_model_len"]),
        redact=redactor(rules=["email", "key", "number"]),
        speed=4.0,
        label="chat log",
    )
    trace = trace_load(sha256=trace_row.sha256)
    requests = [r.to_json() for r in trace.requests]
    chats = [r for r in trace.requests if r.messages is not None]
    assert len(requests) == 32 and len(chats) == 28
    assert trace_row.corpus_sha256 == corpus_row.sha256
    assert [e.messages for e in corpus_load(sha256=corpus_row.sha256).entries] == [
        r.messages for r in trace.requests
    ]
    server = EngineServer(
        model=str(model),
        cell_args={"max_num_batched_tokens": 2048, "max_num_seqs": 8},
        controls=CONTROLS,
        host=cpu_engine_host(ENGINE_DIR),
        log_path=tmp_path / "server.log",
        health_deadline_s=240,
        grace_s=15,
    )
    with server:
        server.start()
        result = run_replay(
            requests,
            ReplayConfig(
                base_url=server.base_url,
                model="tiny",
                run_id="chat-log",
                warmup_s=0.0,
                observation_s=float(trace.meta["observation_s"]),
                drain_deadline_s=120.0,
                max_dispatch_lag_ms=1000.0,
                isolated=True,
            ),
        )
    log = (tmp_path / "server.log").read_text(errors="replace")
    renderer = ChatRenderer(model)
    assert result.sent == 32 and result.errors == 0 and result.unfinished == 0
    for record, request in zip(sorted(result.records, key=lambda r: r.index), trace.requests, strict=True):
        assert record.ok, (record.index, record.error)
        # The record's prompt tokens are the rendered count, and the server counted the same.
        assert record.input_tokens == request.input_tokens
        assert record.prompt_tokens == request.input_tokens, (
            record.index,
            request.messages or request.prompt,
        )
        assert record.output_tokens == request.output_tokens
        if request.messages is not None:
            assert request.input_tokens == renderer.count_chat(request.messages)
            # The template's own tokens (roles, BOS, EOS, the assistant's opener) are in the count.
            content = sum(renderer.count_text(m["content"]) - 1 for m in request.messages)
            assert request.input_tokens > content
        else:
            assert request.input_tokens == renderer.count_text(request.prompt or "")
    # Every chat request went to the chat endpoint, every completion to the completions one.
    assert log.count('"POST /v1/chat/completions HTTP/1.1" 200') == len(chats)
    assert log.count('"POST /v1/completions HTTP/1.1" 200') >= len(requests) - len(chats)
