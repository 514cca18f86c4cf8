"""Logged chat requests in the replay: their whole message list goes to /v1/chat/completions."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.replay.helpers import make_requests
from tests.replay.mockserver import MockServer
from workers.replay.config import ReplayConfig
from workers.replay.request import check_requests, request_body, request_path
from workers.replay.run import run_replay
from workers.replay.trace import request_problem

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "How long does a kite take?"},
]


def _chat_request(index: int, t: float) -> dict[str, Any]:
    return {
        "index": index,
        "t_offset_s": t,
        "class": "chat",
        "input_tokens": 31,
        "output_tokens": 5,
        "priority": 0,
        "warmup": False,
        "messages": CONVERSATION,
    }


def test_the_body_carries_the_whole_conversation() -> None:
    body = json.loads(request_body(_chat_request(0, 0.0), model="m", endpoint="completions", extra_body={}))
    assert body["messages"] == CONVERSATION
    assert body["max_completion_tokens"] == body["min_tokens"] == 5 and body["ignore_eos"] is True
    assert body["stream"] is True and body["stream_options"]["include_usage"] is True
    assert "prompt" not in body and "max_tokens" not in body


def test_each_request_goes_where_its_kind_says() -> None:
    assert request_path(_chat_request(0, 0.0), endpoint="completions") == "/v1/chat/completions"
    assert request_path(make_requests(1)[0], endpoint="completions") == "/v1/completions"
    # A chat request needs no text prompt, whatever the replay's endpoint.
    check_requests([_chat_request(0, 0.0)], endpoint="chat")
    with pytest.raises(ValueError, match="request 0: the chat endpoint needs a text 'prompt' or 'messages'"):
        check_requests(make_requests(1), endpoint="chat")


def test_the_trace_reader_takes_messages_and_refuses_bad_ones() -> None:
    assert request_problem(_chat_request(0, 0.0), position=0) is None
    assert request_problem({**_chat_request(0, 0.0), "messages": []}, position=0) == (
        "field 'messages' must be a non-empty list of objects with a role"
    )


def test_a_mixed_trace_reaches_both_endpoints(mock_server: MockServer) -> None:
    plain = make_requests(4, spacing_s=0.02)
    requests = [r if i % 2 else {**_chat_request(i, r["t_offset_s"])} for i, r in enumerate(plain)]
    result = run_replay(
        requests,
        ReplayConfig(
            base_url=mock_server.base_url,
            model="mock",
            run_id="mixed",
            warmup_s=0.0,
            observation_s=0.1,
            drain_deadline_s=10.0,
            max_dispatch_lag_ms=1000.0,
        ),
    )
    assert all(r.ok for r in result.records), [r.error for r in result.records]
    paths = {entry.tag: entry.path for entry in mock_server.log}
    assert paths == {
        "mixed:0": "/v1/chat/completions",
        "mixed:1": "/v1/completions",
        "mixed:2": "/v1/chat/completions",
        "mixed:3": "/v1/completions",
    }
    assert [r.output_tokens for r in result.records] == [5, 8, 5, 8]
