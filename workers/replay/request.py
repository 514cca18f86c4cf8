"""One trace request as the replay sends it: the endpoint, the check, the JSON body, the record.

Pure: what goes on the wire and what is written down before a request is sent, with no I/O,
shared by the one-loop send loop (:mod:`workers.replay.client`), the process fan-out
(:mod:`workers.replay.shard`) and the rehearsal client (:mod:`workers.replay.rehearsal_client`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from workers.replay.records import RequestRecord

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


def check_requests(requests: Sequence[dict[str, Any]], *, endpoint: str) -> None:
    """Refuse a request the endpoint cannot send, naming its position."""
    for position, request in enumerate(requests):
        if request.get("messages") is not None:
            continue  # a chat request: /v1/chat/completions whatever the endpoint
        if endpoint == "chat" and not isinstance(request.get("prompt"), str):
            raise ValueError(f"request {position}: the chat endpoint needs a text 'prompt' or 'messages'")
        if request.get("prompt") is None and request.get("prompt_token_ids") is None:
            raise ValueError(f"request {position}: needs prompt_token_ids, prompt or messages")


def request_path(request: dict[str, Any], *, endpoint: str) -> str:
    """Where one request goes: a request with ``messages`` (a logged chat request) to
    ``/v1/chat/completions``, any other to the replay's endpoint."""
    return ENDPOINTS["chat"] if request.get("messages") is not None else ENDPOINTS[endpoint]


OUTPUT_MODES = ("exact", "natural")

# The header vLLM's OpenAI server takes a request's id from; its span of the request carries that
# id (with the endpoint's prefix, ``cmpl-`` or ``chatcmpl-``, and for a completion the choice's
# ``-0``), which is how the server's timings are joined to the record (workers/engine/spans.py).
REQUEST_ID_HEADER = "X-Request-Id"
_UNSAFE_ID_CHARS = re.compile(r"[^A-Za-z0-9._:]")


def server_run_key(run_id: str) -> str:
    """The run's part of its server request ids: the run id with every character that is not a
    letter, digit, ``.``, ``_`` or ``:`` written as ``_`` (a UUID's ``-`` too), so an id is one
    header token and the index after the run key is unambiguous."""
    return _UNSAFE_ID_CHARS.sub("_", run_id)


def server_request_prefix(run_id: str) -> str:
    """What every server request id of one run starts with: ``tt-<run key>-``."""
    return f"tt-{server_run_key(run_id)}-"


def server_request_id(run_id: str, index: int) -> str:
    """The ``X-Request-Id`` of the request with trace index ``index`` in run ``run_id``: unique
    per run and index, so the server's span of it names exactly one record."""
    return f"{server_request_prefix(run_id)}{int(index)}"


def request_body(
    request: dict[str, Any],
    *,
    model: str,
    endpoint: str,
    extra_body: dict[str, Any],
    output_mode: str = "exact",
) -> bytes:
    """The JSON body of one streaming request.

    ``exact``: exactly ``output_tokens`` tokens (``min_tokens`` = the cap, ``ignore_eos``), so
    every cell decodes the same lengths. ``natural``: ``output_tokens`` is only the cap; the
    model stops where it stops, and the record keeps the length and ``finish_reason``.
    """
    output_tokens = int(request["output_tokens"])
    body: dict[str, Any] = {"model": model}
    if request.get("messages") is not None:
        # A logged conversation, sent whole: the server renders it with the chat template,
        # as the trace's input_tokens were counted (apps/workloads/chat_template.py).
        body["messages"] = request["messages"]
        body["max_completion_tokens"] = output_tokens
    elif endpoint == "chat":
        body["messages"] = [{"role": "user", "content": request["prompt"]}]
        body["max_completion_tokens"] = output_tokens
    else:
        prompt = request.get("prompt")
        body["prompt"] = prompt if prompt is not None else request["prompt_token_ids"]
        body["max_tokens"] = output_tokens
    if output_mode == "exact":
        body["min_tokens"] = output_tokens
        body["ignore_eos"] = True
    body["stream"] = True
    body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    # vLLM refuses a priority when its scheduler is FCFS, so 0 (the default) is not sent.
    priority = int(request.get("priority") or 0)
    if priority:
        body["priority"] = priority
    body.update(extra_body)
    return json.dumps(body, separators=(",", ":")).encode()


def new_record(*, run_id: str, warmup_ns: int, position: int, request: dict[str, Any]) -> RequestRecord:
    """The record of a request before it is sent (planned time, class, warm-up flag)."""
    planned_ns = round(float(request["t_offset_s"]) * 1e9)
    warmup = request.get("warmup")
    return RequestRecord(
        run_id=run_id,
        index=int(request.get("index", position)),
        request_class=str(request.get("class", "")),
        warmup=bool(warmup) if warmup is not None else planned_ns < warmup_ns,
        input_tokens=int(request.get("input_tokens") or len(request.get("prompt_token_ids") or ())),
        expected_output_tokens=int(request["output_tokens"]),
        planned_ns=planned_ns,
        sent_ns=None,
        sent=False,
        priority=int(request.get("priority") or 0),
    )
