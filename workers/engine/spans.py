"""The server's own timings of each request: vLLM's OTLP spans, received on loopback and joined
to the client's records by request id. No Django.

vLLM started with ``--otlp-traces-endpoint`` ends one span named ``llm_request`` per finished
request (vllm/v1/engine/output_processor.py), whose attributes carry the request's id as the
OpenAI server gave it (the client's ``X-Request-Id`` with the endpoint's prefix, ``cmpl-...-0`` or
``chatcmpl-...``) and the latencies the engine measured, in seconds: time in the scheduler's
queue, in the model from the first schedule to the first token (prefill) and from there to the
last token (decode), and from the request's arrival at the server to its first token (TTFT) and
to its end (E2E). The launcher (workers/engine/launcher.py) points the server's exporter here,
over OTLP/HTTP with protobuf bodies, flushing every ``SPAN_FLUSH_MS`` (its ``OTEL_ENV``).

1. :class:`SpanReceiver` is one small OTLP/HTTP endpoint (``POST /v1/traces``,
   ``application/x-protobuf``) on 127.0.0.1 and a free port, owned by the worker's
   :class:`~workers.engine.server.EngineServer` and living as long as the server. Anything else
   is refused with a 4xx: another path or method, another content type or encoding, a body
   without a length or over ``MAX_BODY_BYTES``, a body that is no ``ExportTraceServiceRequest``.
2. :func:`decode_export` reads a body with ``opentelemetry-proto``, the OpenTelemetry project's
   own generated classes for the OTLP schema (the same definitions vLLM's exporter encodes with),
   and keeps the ``llm_request`` spans; any other span (vLLM traces its start-up too) is dropped.
3. :class:`SpanStore` keeps them in memory by run and trace index, parsed from the request id
   (workers/replay/request.py ``server_request_id``): ids of no replay (the warm-up, the quality
   probe) are counted and dropped, a second span of one request is counted and dropped, and past
   ``MAX_SPANS`` kept spans the rest are rejected (the answer says how many, as OTLP's partial
   success). A reused server serves several runs: each run takes its own spans out.
4. :func:`collect_run_spans` waits, boundedly, for the spans of a run's answered requests (a
   server that never exported anything gets only a short grace), then takes them.
5. :func:`join_spans` writes each span's timings onto its record (``server_*_ns``) and counts
   what the join covers; :func:`spans_summary` is the run's ``summary["server_spans"]``: a run
   whose join covers less than ``MIN_SHARE`` of its answered requests, or whose server traced
   nothing, is not used for the per-request split (the analysis falls back to the run's /metrics
   histograms, a split per run).

Over 500 lines on purpose: the receiver is an endpoint other processes reach, so its refusals,
its store's bounds and the join that trusts what it kept are read and reviewed together.
"""

from __future__ import annotations

import contextlib
import http.server
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, cast

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from workers.replay.records import RequestRecord
from workers.replay.request import server_run_key

# The share of a run's answered requests the join must cover for the run's per-request split to
# be used (issue #35's acceptance: queue and prefill measured per request for at least 95%).
MIN_SHARE = 0.95

SPAN_NAME = "llm_request"
PATH = "/v1/traces"
CONTENT_TYPE = "application/x-protobuf"
# One export request's body at most: vLLM's exporter sends at most 512 spans per request
# (OTEL_BSP_MAX_EXPORT_BATCH_SIZE, set by the launcher), well under 1 MiB.
MAX_BODY_BYTES = 8 * 1024 * 1024
# Spans kept at once, over every run on one server: a run takes its own out when it ends, so this
# bounds what runs that never took theirs (a crash) can leave behind, about 200 bytes a span.
MAX_SPANS = 500_000
# After a run: how long to wait for its spans; a server that has exported nothing at all yet
# (its engine is not tracing) gets the grace only.
SPAN_WAIT_S = 5.0
SPAN_GRACE_S = 0.5
_POLL_S = 0.05

# The span's attributes (vLLM's SpanAttributes, the gen_ai semantic conventions).
ATTR_REQUEST_ID = "gen_ai.request.id"
ATTR_QUEUE = "gen_ai.latency.time_in_queue"
ATTR_PREFILL = "gen_ai.latency.time_in_model_prefill"
ATTR_DECODE = "gen_ai.latency.time_in_model_decode"
ATTR_TTFT = "gen_ai.latency.time_to_first_token"
ATTR_E2E = "gen_ai.latency.e2e"
ATTR_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
ATTR_COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"

# A request id of a replay, wherever the server put it: an optional endpoint prefix (``cmpl-``),
# ``tt-<run key>-<index>`` (the run key holds no ``-``: request.server_run_key), and the
# choice's ``-<n>`` that vLLM appends for a completion.
_REPLAY_ID = re.compile(r"(?:^|-)tt-(?P<run>[A-Za-z0-9._:]+)-(?P<index>\d{1,12})(?:-\d{1,6})?$")


@dataclass(frozen=True, slots=True)
class ServerSpan:
    """One request as the server timed it (seconds; None where the span did not say)."""

    request_id: str
    queue_s: float | None = None
    prefill_s: float | None = None
    decode_s: float | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    # The span's start: the request's arrival at the API server, on the server's wall clock (ns
    # since the epoch; None when the span had none). Only differences between two of them, or a
    # clock aligned to the client's (``_align_clocks``), mean anything here.
    arrival_unix_ns: int | None = None

    def timings(self) -> dict[str, int | None]:
        """The record's ``server_*_ns`` fields (workers/replay/records.py)."""
        return {
            "server_queue_ns": _ns(self.queue_s),
            "server_prefill_ns": _ns(self.prefill_s),
            "server_decode_ns": _ns(self.decode_s),
            "server_ttft_ns": _ns(self.ttft_s),
            "server_e2e_ns": _ns(self.e2e_s),
        }


def _ns(seconds: float | None) -> int | None:
    """Seconds as integer nanoseconds; a duration that is not one (negative, NaN: vLLM subtracts
    timestamps it never set when a request ends before being scheduled) is None."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return None
    return round(seconds * 1e9)


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind in ("double_value", "int_value", "string_value", "bool_value"):
        return getattr(value, kind)
    return None


def _seconds(attrs: Mapping[str, Any], key: str) -> float | None:
    value = attrs.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _count(attrs: Mapping[str, Any], key: str) -> int | None:
    value = attrs.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def decode_export(body: bytes) -> tuple[list[ServerSpan], int]:
    """The ``llm_request`` spans of one OTLP ``ExportTraceServiceRequest`` body, and how many other
    spans it held. Raises ValueError when the body is not such a message."""
    try:
        request = ExportTraceServiceRequest.FromString(body)
    except DecodeError as exc:
        raise ValueError(f"not an OTLP ExportTraceServiceRequest: {exc}") from None
    spans: list[ServerSpan] = []
    other = 0
    for resource in request.resource_spans:
        for scope in resource.scope_spans:
            for span in scope.spans:
                attrs = {a.key: _value(a.value) for a in span.attributes}
                request_id = attrs.get(ATTR_REQUEST_ID)
                if span.name != SPAN_NAME or not isinstance(request_id, str) or not request_id:
                    other += 1
                    continue
                spans.append(
                    ServerSpan(
                        request_id=request_id,
                        queue_s=_seconds(attrs, ATTR_QUEUE),
                        prefill_s=_seconds(attrs, ATTR_PREFILL),
                        decode_s=_seconds(attrs, ATTR_DECODE),
                        ttft_s=_seconds(attrs, ATTR_TTFT),
                        e2e_s=_seconds(attrs, ATTR_E2E),
                        prompt_tokens=_count(attrs, ATTR_PROMPT_TOKENS),
                        completion_tokens=_count(attrs, ATTR_COMPLETION_TOKENS),
                        arrival_unix_ns=span.start_time_unix_nano or None,
                    )
                )
    return spans, other


def replay_key(request_id: str) -> tuple[str, int] | None:
    """(run key, trace index) of a replay's request id as the server reports it, else None."""
    match = _REPLAY_ID.search(request_id)
    if match is None:
        return None
    return match["run"], int(match["index"])


class SpanStore:
    """The received spans of replays, by run key and trace index (step 3 of the module docstring).
    Thread-safe: the receiver's threads add, the worker takes."""

    def __init__(self, *, max_spans: int = MAX_SPANS) -> None:
        self.max_spans = max_spans
        self._runs: dict[str, dict[int, ServerSpan]] = {}
        self._kept = 0
        self._lock = threading.Lock()
        self.exports = 0  # export requests accepted
        self.foreign = 0  # llm_request spans of no replay (warm-up, quality probe), dropped
        self.duplicates = 0  # a second span of one request, dropped
        self.rejected = 0  # refused because MAX_SPANS were kept

    def add(self, spans: Iterable[ServerSpan]) -> int:
        """Keep the replays' spans; returns how many were rejected for want of room."""
        rejected = 0
        with self._lock:
            self.exports += 1
            for span in spans:
                key = replay_key(span.request_id)
                if key is None:
                    self.foreign += 1
                    continue
                run = self._runs.setdefault(key[0], {})
                if key[1] in run:
                    self.duplicates += 1
                    continue
                if self._kept >= self.max_spans:
                    rejected += 1
                    continue
                run[key[1]] = span
                self._kept += 1
            self.rejected += rejected
        return rejected

    def count(self, run_key: str) -> int:
        with self._lock:
            return len(self._runs.get(run_key, ()))

    def covers(self, run_key: str, indexes: Iterable[int]) -> bool:
        """Whether the run has a span of every one of ``indexes``."""
        with self._lock:
            run = self._runs.get(run_key, {})
            return all(i in run for i in indexes)

    def take(self, run_key: str) -> dict[int, ServerSpan]:
        """Remove and return one run's spans, by trace index."""
        with self._lock:
            spans = self._runs.pop(run_key, {})
            self._kept -= len(spans)
            return spans


class _Handler(http.server.BaseHTTPRequestHandler):
    """POST /v1/traces with a protobuf body of a known length; every other request is a 4xx."""

    protocol_version = "HTTP/1.1"
    timeout = 10  # seconds a connection may sit in one read
    server: _Server

    def do_POST(self) -> None:
        if self.path != PATH:
            self._answer(404, f"only {PATH} is served")
            return
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if content_type != CONTENT_TYPE:
            self._answer(415, f"Content-Type must be {CONTENT_TYPE} (OTLP/HTTP protobuf)")
            return
        if (self.headers.get("Content-Encoding") or "identity").strip().lower() != "identity":
            self._answer(415, "Content-Encoding must be identity (the launcher turns compression off)")
            return
        if self.headers.get("Transfer-Encoding"):
            self._answer(411, "a body of a stated Content-Length is required")
            return
        raw = self.headers.get("Content-Length")
        if raw is None:
            self._answer(411, "Content-Length is required")
            return
        if not re.fullmatch(r"[0-9]{1,15}", raw.strip()):
            self._answer(400, "Content-Length must be a number of bytes")
            return
        length = int(raw)
        if length > self.server.max_body_bytes:
            self._answer(413, f"a body may hold at most {self.server.max_body_bytes} bytes")
            return
        body = self.rfile.read(length)
        if len(body) != length:
            self._answer(400, "the body ended before its Content-Length")
            return
        try:
            spans, _ = decode_export(body)
        except ValueError as exc:
            self._answer(400, str(exc))
            return
        rejected = self.server.store.add(spans)
        response = ExportTraceServiceResponse()
        if rejected:
            response.partial_success.CopyFrom(
                ExportTracePartialSuccess(
                    rejected_spans=rejected,
                    error_message=f"the receiver keeps at most {self.server.store.max_spans} spans",
                )
            )
        self._send(200, response.SerializeToString(), CONTENT_TYPE)

    def __getattr__(self, name: str) -> Any:
        # Every other method (GET, PUT, anything): 405, not http.server's 501.
        if name.startswith("do_"):
            return lambda: self._answer(405, "only POST is served", allow="POST")
        raise AttributeError(name)

    def _answer(self, status: int, message: str, *, allow: str | None = None) -> None:
        # The body may be unread: the connection closes after the answer.
        self.close_connection = True
        self._send(status, message.encode(), "text/plain; charset=utf-8", allow=allow)

    def _send(self, status: int, body: bytes, content_type: str, *, allow: str | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if allow:
            self.send_header("Allow", allow)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the worker's log is not the place for each export


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], store: SpanStore, max_body_bytes: int) -> None:
        self.store = store
        self.max_body_bytes = max_body_bytes
        super().__init__(address, _Handler)


class SpanReceiver:
    """One server's OTLP/HTTP span endpoint on loopback (steps 1-3 of the module docstring).

    The socket is bound when the receiver is made, so its :attr:`endpoint` can go on the server's
    command line; :meth:`start` serves it from a thread, :meth:`close` stops it (idempotent).
    """

    def __init__(
        self, *, max_body_bytes: int = MAX_BODY_BYTES, max_spans: int = MAX_SPANS, host: str = "127.0.0.1"
    ) -> None:
        if host not in ("127.0.0.1", "localhost"):
            raise ValueError(f"the span receiver listens on loopback only, not {host!r}")
        self.store = SpanStore(max_spans=max_spans)
        self._server = _Server(("127.0.0.1", 0), self.store, max_body_bytes)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def endpoint(self) -> str:
        """The URL the server's exporter posts to (``--otlp-traces-endpoint``)."""
        return f"http://127.0.0.1:{self.port}{PATH}"

    def start(self) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("the span receiver is closed")
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._server.serve_forever,
                    kwargs={"poll_interval": 0.1},
                    name="otlp-spans",
                    daemon=True,
                )
                self._thread.start()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._thread is not None:
                self._server.shutdown()
                self._thread.join(timeout=5)
            with contextlib.suppress(OSError):
                self._server.server_close()

    def __enter__(self) -> SpanReceiver:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _answered(records: Iterable[RequestRecord]) -> int:
    return sum(1 for r in records if r.ok)


def collect_run_spans(
    store: SpanStore,
    run_id: str,
    records: Sequence[RequestRecord],
    *,
    wait_s: float | None = None,
    grace_s: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[int, ServerSpan]:
    """Step 4: wait until the run has the span of every answered request, at most ``wait_s``
    (default ``SPAN_WAIT_S``; ``grace_s``, default ``SPAN_GRACE_S``, while the server has sent no
    export at all), then take the run's spans out."""
    wait_s = SPAN_WAIT_S if wait_s is None else wait_s
    grace_s = SPAN_GRACE_S if grace_s is None else grace_s
    run_key = server_run_key(run_id)
    expected = [r.index for r in records if r.ok]
    began = clock()
    while not store.covers(run_key, expected):
        limit = wait_s if store.exports else grace_s
        if clock() - began >= limit:
            break
        sleep(_POLL_S)
    return store.take(run_key)


@dataclass(frozen=True)
class SpanJoin:
    """What one run's join covers."""

    received: int  # spans of this run
    joined: int  # answered records that got their span
    answered: int  # records answered in full (RequestRecord.ok)

    @property
    def share(self) -> float | None:
        return self.joined / self.answered if self.answered else None


def join_spans(records: Sequence[RequestRecord], spans: Mapping[int, ServerSpan]) -> SpanJoin:
    """Step 5: set each record's ``server_*_ns`` from the span of its trace index (any record with
    one; only answered ones count towards the share)."""
    joined = 0
    for record in records:
        span = spans.get(record.index)
        if span is None:
            continue
        for name, value in span.timings().items():
            setattr(record, name, value)
        joined += record.ok
    _align_clocks(records, spans)
    return SpanJoin(received=len(spans), joined=joined, answered=_answered(records))


def _align_clocks(records: Sequence[RequestRecord], spans: Mapping[int, ServerSpan]) -> None:
    """Set ``server_arrival_ns`` and ``server_first_token_ns``: when the server received each
    request and when it gave the first token (its arrival plus its TTFT), on the server's own
    clock moved onto the replay's. The move is the smallest (server arrival - client send) over
    the run's requests: no request reaches the server before it is sent, and the quickest took
    next to nothing on loopback. What the server stamped is the server's even while the load
    generator stalled (a stalled client reads a backlog of first tokens in one pass, so its own
    stamps lose their order); apps/analysis/scenario_checks.py reads an order from these."""
    sent = [
        (record, span.arrival_unix_ns)
        for record in records
        if (span := spans.get(record.index)) is not None
        and span.arrival_unix_ns is not None
        and record.sent
        and record.sent_ns is not None
    ]
    if not sent:
        return
    offset = min(arrival - cast(int, record.sent_ns) for record, arrival in sent)
    for record, arrival in sent:
        record.server_arrival_ns = arrival - offset
        ttft = cast(ServerSpan, spans.get(record.index)).timings()["server_ttft_ns"]
        record.server_first_token_ns = None if ttft is None else record.server_arrival_ns + ttft


class ServerSpansSummary(TypedDict):
    """A run's ``summary["server_spans"]``: where its per-request server timings came from and
    whether the per-request split may use them."""

    source: str  # "otlp": the server's spans were collected; "none": tracing off or unavailable
    received: int  # spans of this run's requests that arrived
    joined: int  # answered requests with their span
    answered: int  # requests answered in full
    share: float | None  # joined / answered (None: nothing answered)
    min_share: float  # MIN_SHARE
    used: bool  # the per-request split uses this run's timings
    reason: str


def spans_summary(join: SpanJoin | None, *, off_reason: str = "") -> ServerSpansSummary:
    """The run's ``summary["server_spans"]``: ``join`` None means the server was not tracing
    (``off_reason`` says why)."""
    fallback = "the analysis splits this run's TTFT from its /metrics histograms, per run, not per request"
    if join is None:
        return {
            "source": "none",
            "received": 0,
            "joined": 0,
            "answered": 0,
            "share": None,
            "min_share": MIN_SHARE,
            "used": False,
            "reason": f"{off_reason or 'the server was not tracing'}: {fallback}",
        }
    share = join.share
    if share is None:
        used, reason = False, f"no request was answered, so there is nothing to join: {fallback}"
    elif share < MIN_SHARE:
        used = False
        reason = (
            f"the server's spans cover {join.joined} of {join.answered} answered requests "
            f"({share:.1%}), under the {MIN_SHARE:.0%} the per-request split needs: {fallback}"
        )
        if join.received == 0:
            reason += " (no span of this run arrived: is the engine's OpenTelemetry export working?)"
    else:
        used = True
        reason = f"the server's spans cover {join.joined} of {join.answered} answered requests ({share:.1%})"
    return {
        "source": "otlp",
        "received": join.received,
        "joined": join.joined,
        "answered": join.answered,
        "share": round(share, 6) if share is not None else None,
        "min_share": MIN_SHARE,
        "used": used,
        "reason": reason,
    }
