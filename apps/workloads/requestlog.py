"""Request logs in the OpenAI request format: arrivals, classes by rule, and the prompts as a corpus.

Pure: standard library and numpy, plus a renderer given by the caller (the pinned
tokenizer's chat template, apps/workloads/chat_template.py). A gateway's log is JSONL, one
request per line, in either shape:

- the OpenAI Batch API's line with a time: ``{"timestamp": ..., "url": "/v1/chat/completions",
  "body": {...}}`` (``method``, ``custom_id`` and ``response`` may be present; ``url`` is
  optional and, if given, must agree with the body);
- the request body itself with a ``timestamp`` key.

A body with ``messages`` is a chat request, one with ``prompt`` a completion. ``timestamp``
is a number of seconds (any origin) or an ISO 8601 time, the same kind on every line. The
output length is, first found: the logged response's ``usage.completion_tokens``
(``response.usage`` or ``response.body.usage``), the body's ``max_completion_tokens`` or
``max_tokens``, the importer's default; none is an error naming the line. Tool definitions,
``n`` above 1, other roles and non-text content cannot be replayed as they are rendered and
are refused, naming the line; the remaining fields (model, sampling, stream, user ...) are
not replayed (the experiment's own generation settings apply) and only their names are
kept, in ``meta.ignored_fields``.

Steps of an import (:func:`parse_request_log`, then :func:`trace_from_request_log`):
1. parse every line strictly, redacting every text as it is read (nothing unredacted is
   returned); any problem raises CorpusError naming the line, so a bad file yields nothing;
2. sort by time (stably; reported as a repair) and re-base to the first arrival;
3. cut a window (start and length, or the busiest ``busiest_s`` seconds) and scale time;
4. render each chat request with the chat template and count its tokens (completion text:
   its tokens with the special ones); these counts are the requests' ``input_tokens``;
5. drop a request whose prompt leaves no room for one output token in the context
   (counted), and cap outputs to the rest of the context (counted);
6. classes by rule from the rendered counts (``assign_classes``, as the CSV importers do);
7. the corpus (the prompts in trace order, with their classes) and the trace, whose
   ``corpus_sha256`` is the corpus's.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from apps.workloads.corpus import (
    Corpus,
    CorpusEntry,
    CorpusError,
    Message,
    check_messages,
    check_prompt,
    corpus_dumps,
    corpus_sha256,
)
from apps.workloads.importers import assign_classes
from apps.workloads.redaction import Redactor
from apps.workloads.stats import busiest_start
from apps.workloads.tracefile import T_DECIMALS, Trace, TraceRequest

FORMAT = "openai-log"
GENERATOR = "tailtune.workloads.requestlog/1"
ENVELOPE_KEYS = ("timestamp", "url", "method", "custom_id", "body", "response")
URLS = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}
# Fields whose presence changes what the template renders or what is asked: refused.
REFUSED = ("tools", "functions", "tool_choice", "function_call")


class Renderer(Protocol):
    """What the import needs of the pinned tokenizer (apps/workloads/chat_template.ChatRenderer)."""

    tokenizer_sha256: str
    template_sha256: str

    def count_chat(self, messages: Sequence[dict[str, str]]) -> int: ...

    def count_text(self, prompt: str) -> int: ...


@dataclass
class LoggedRequest:
    """One logged request, redacted: its arrival (seconds from the first) and its prompt."""

    line: int
    t_s: float
    output_tokens: int
    messages: list[Message] | None = None
    prompt: str | None = None


@dataclass
class RequestLog:
    rows: list[LoggedRequest]
    redaction: dict[str, object]
    repairs: list[str] = field(default_factory=list)
    ignored_fields: list[str] = field(default_factory=list)


def _timestamp(value: Any, line: int) -> tuple[float, str]:
    """(seconds, kind) of a timestamp: a number, or an ISO 8601 time (naive read as UTC)."""
    if isinstance(value, bool):
        raise CorpusError(line, f"timestamp must be a number or an ISO 8601 time, got {value!r}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value < 0:
            raise CorpusError(line, f"timestamp must be a finite number >= 0, got {value!r}")
        return float(value), "number"
    if isinstance(value, str):
        try:
            when = dt.datetime.fromisoformat(value.strip())
        except ValueError:
            raise CorpusError(line, f"timestamp {value!r} is not an ISO 8601 time") from None
        kind = "iso-zoned" if when.tzinfo is not None else "iso-naive"
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
        return when.timestamp(), kind
    raise CorpusError(line, f"timestamp must be a number or an ISO 8601 time, got {value!r}")


def _whole(value: Any, name: str, line: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CorpusError(line, f"{name} must be a whole number >= 0, got {value!r}")
    return value


def _logged_output(response: Any, line: int) -> int | None:
    if response is None:
        return None
    if not isinstance(response, dict):
        raise CorpusError(line, "response must be an object")
    inner = response.get("body")
    body: dict[str, Any] = inner if isinstance(inner, dict) else response
    usage = body.get("usage")
    if usage is None:
        return None
    if not isinstance(usage, dict):
        raise CorpusError(line, "response usage must be an object")
    tokens = usage.get("completion_tokens")
    return _whole(tokens, "response usage.completion_tokens", line) if tokens is not None else None


def _request(
    obj: Any, line: int, *, redact: Redactor, default_output: int | None, ignored: set[str]
) -> tuple[LoggedRequest, str]:
    if not isinstance(obj, dict):
        raise CorpusError(line, "each line must be a JSON object")
    if "timestamp" not in obj:
        raise CorpusError(line, "timestamp is required")
    t, kind = _timestamp(obj["timestamp"], line)
    if "body" in obj:
        unknown = sorted(set(obj) - set(ENVELOPE_KEYS))
        if unknown:
            raise CorpusError(line, f"unknown field(s) beside body: {', '.join(unknown)}")
        body = obj["body"]
        if not isinstance(body, dict):
            raise CorpusError(line, "body must be an object")
        url = obj.get("url")
        method = obj.get("method", "POST")
        if method != "POST":
            raise CorpusError(line, f"method must be POST, got {method!r}")
        response = obj.get("response")
    else:
        body = {k: v for k, v in obj.items() if k != "timestamp"}
        url, response = None, None
    if ("messages" in body) == ("prompt" in body):
        raise CorpusError(line, "a request needs messages (chat) or prompt (completion), one of them")
    kind_of_request = "chat" if "messages" in body else "completion"
    if url is not None and URLS.get(str(url)) != kind_of_request:
        raise CorpusError(
            line, f"url {url!r} does not match a {kind_of_request} body (known: {', '.join(URLS)})"
        )
    refused = [k for k in REFUSED if body.get(k)]
    if refused:
        raise CorpusError(
            line, f"{', '.join(refused)} change what the template renders: tailtune does not replay them"
        )
    n = body.get("n", 1)
    if n is not None and n != 1:
        raise CorpusError(line, f"n must be 1 (one completion per request), got {n!r}")
    row = LoggedRequest(line=line, t_s=t, output_tokens=0)
    if kind_of_request == "chat":
        row.messages = check_messages(body["messages"], line, redact=redact)
    else:
        row.prompt = check_prompt(body["prompt"], line, redact=redact)
    output = _logged_output(response, line)
    if not output:
        for key in ("max_completion_tokens", "max_tokens"):
            if body.get(key) is not None:
                output = _whole(body[key], key, line)
                break
    if not output:
        output = default_output
    if not output:
        raise CorpusError(
            line,
            "no output length: the line needs the response's usage.completion_tokens, "
            "max_completion_tokens or max_tokens, or the import a default output length",
        )
    ignored.update(k for k in body if k not in ("messages", "prompt", "max_completion_tokens", "max_tokens"))
    row.output_tokens = int(output)
    return row, kind


def parse_request_log(
    data: bytes, *, redact: Redactor, default_output_tokens: int | None = None
) -> RequestLog:
    """Every line of a request log, checked and redacted, in arrival order from the first (steps 1-2)."""
    if default_output_tokens is not None and default_output_tokens < 1:
        raise CorpusError(None, f"the default output length must be positive, got {default_output_tokens}")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise CorpusError(data[: exc.start].count(b"\n") + 1, "not valid UTF-8") from None
    lines = text.split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise CorpusError(1, "empty file")
    rows: list[LoggedRequest] = []
    ignored: set[str] = set()
    first_kind: str | None = None
    for number, raw in enumerate(lines, start=1):
        raw = raw.removesuffix("\r")
        if not raw.strip():
            raise CorpusError(number, "empty line inside the log")
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise CorpusError(number, f"not valid JSON: {exc.msg}") from None
        row, kind = _request(
            obj, number, redact=redact, default_output=default_output_tokens, ignored=ignored
        )
        if first_kind is None:
            first_kind = kind
        elif kind != first_kind:
            raise CorpusError(number, f"timestamp is {kind} but the first line's is {first_kind}: mixed file")
        rows.append(row)
    log = RequestLog(rows=rows, redaction=redact.summary(), ignored_fields=sorted(ignored))
    times = [r.t_s for r in rows]
    if any(b < a for a, b in zip(times, times[1:], strict=False)):
        order = sorted(range(len(rows)), key=lambda i: times[i])
        moved = sum(1 for pos, i in enumerate(order) if pos != i)
        log.rows = [rows[i] for i in order]
        log.repairs.append(f"sorted requests by arrival time: {moved} moved")
    origin = log.rows[0].t_s
    for r in log.rows:
        r.t_s -= origin
    return log


def _window(
    rows: list[LoggedRequest],
    *,
    busiest_s: float | None,
    window_start_s: float | None,
    window_length_s: float | None,
) -> tuple[list[LoggedRequest], dict[str, float] | None]:
    if busiest_s is not None:
        if window_start_s is not None:
            raise CorpusError(None, "choose a window by start and length or by busiest_s, not both")
        if not busiest_s > 0:
            raise CorpusError(None, f"busiest_s must be positive, got {busiest_s}")
        best, _ = busiest_start(np.array([r.t_s for r in rows]), busiest_s)
        window_start_s, window_length_s = rows[best].t_s, busiest_s
    elif window_start_s is None and window_length_s is None:
        return rows, None
    if window_start_s is None or window_length_s is None:
        raise CorpusError(None, "a window needs both its start and its length")
    if window_start_s < 0 or not window_length_s > 0:
        raise CorpusError(
            None, f"a window needs start >= 0 and length > 0, got {window_start_s}, {window_length_s}"
        )
    start, end = window_start_s, window_start_s + window_length_s
    kept = [
        LoggedRequest(
            line=r.line,
            t_s=r.t_s - start,
            output_tokens=r.output_tokens,
            messages=r.messages,
            prompt=r.prompt,
        )
        for r in rows
        if start <= r.t_s < end
    ]
    if not kept:
        raise CorpusError(None, f"no request arrives in the window [{start}, {end}) s")
    return kept, {"start_s": float(start), "length_s": float(window_length_s)}


def trace_from_request_log(
    log: RequestLog,
    *,
    renderer: Renderer,
    thresholds: Sequence[tuple[str, int | None]],
    tokenizer_revision: str,
    max_model_len: int,
    priorities: Mapping[str, int] | None = None,
    busiest_s: float | None = None,
    window_start_s: float | None = None,
    window_length_s: float | None = None,
    speed: float = 1.0,
    warmup_s: float = 0.0,
    label: str = "",
    source_sha256: str = "",
) -> tuple[Trace, Corpus]:
    """The trace replaying a parsed log and the corpus of its prompts (steps 3-7)."""
    if not (math.isfinite(speed) and speed > 0):
        raise CorpusError(None, f"speed must be positive, got {speed!r}")
    if max_model_len < 2:
        raise CorpusError(None, f"max_model_len must be at least 2, got {max_model_len}")
    rows, window = _window(
        log.rows, busiest_s=busiest_s, window_start_s=window_start_s, window_length_s=window_length_s
    )
    counted: list[tuple[LoggedRequest, int, int]] = []
    too_long = capped = 0
    for r in rows:
        n = renderer.count_chat(r.messages) if r.messages is not None else renderer.count_text(r.prompt or "")
        if n >= max_model_len:
            too_long += 1
            continue
        out = min(r.output_tokens, max_model_len - n)
        capped += out != r.output_tokens
        counted.append((r, n, out))
    if not counted:
        raise CorpusError(None, f"no request of the window fits the context ({max_model_len} tokens)")
    labels = assign_classes(np.array([n for _, n, _ in counted], dtype=np.int64), thresholds)
    prio = dict(priorities or {})
    corpus = Corpus(
        meta={"source": "request-log", "redaction": log.redaction},
        entries=[
            CorpusEntry(klass=c, messages=r.messages, prompt=r.prompt)
            for (r, _, _), c in zip(counted, labels, strict=True)
        ],
    )
    corpus.meta["classes"] = corpus.classes()
    requests = []
    for i, ((r, n, out), klass) in enumerate(zip(counted, labels, strict=True)):
        offset = round(r.t_s / speed, T_DECIMALS)
        requests.append(
            TraceRequest(
                index=i,
                t_offset_s=offset,
                klass=klass,
                input_tokens=n,
                output_tokens=out,
                priority=int(prio.get(klass, 0)),
                warmup=offset < warmup_s,
                prompt=r.prompt,
                messages=r.messages,
            )
        )
    by_class: dict[str, list[int]] = {}
    for req in requests:
        by_class.setdefault(req.klass, []).append(req.input_tokens)
    observation_s = (
        window["length_s"] / speed - warmup_s
        if window is not None
        else round(requests[-1].t_offset_s + 10**-T_DECIMALS - warmup_s, T_DECIMALS)
    )
    if observation_s <= 0:
        raise CorpusError(None, f"warmup_s {warmup_s} leaves no observation window in this log")
    meta: dict[str, Any] = {
        "generator": GENERATOR,
        "kind": "imported",
        "label": label,
        "source_format": FORMAT,
        "source_sha256": source_sha256,
        "window": window,
        "speed": float(speed),
        "repairs": list(log.repairs),
        "class_thresholds": [[name, bound] for name, bound in thresholds],
        # The rendered prompt lengths of each class (its requests' input_tokens).
        "class_input_tokens": {
            k: {"requests": len(v), "median": int(np.median(v)), "max": max(v)} for k, v in by_class.items()
        },
        "tokenizer_revision": tokenizer_revision,
        "tokenizer_sha256": renderer.tokenizer_sha256,
        "chat_template_sha256": renderer.template_sha256,
        "warmup_s": float(warmup_s),
        "observation_s": observation_s,
        "corpus_sha256": corpus_sha256(corpus_dumps(corpus)),
        "requests": len(requests),
        "too_long_dropped": too_long,
        "capped_outputs": int(capped),
        "ignored_fields": list(log.ignored_fields),
        "redaction": log.redaction,
        "synthetic_output": False,
        "prompt_encoding": "chat_template",
    }
    return Trace(meta=meta, requests=requests), corpus
