"""The open-loop streaming load generator.

Each request of a trace is sent at its planned offset from one run origin,
whatever happened to the requests before it: a slow server makes streams
pile up, never makes the client send later. The dispatcher sleeps to
absolute deadlines on the monotonic clock, so rounding errors in one sleep do
not carry into the next.

Every observation is a :class:`~workers.replay.records.RequestRecord`;
anything that goes wrong with one request (HTTP error, refused connection,
timeout, malformed stream) is written into its record, never raised out of
the run loop.

The HTTP side uses aiohttp on uvloop directly: on this project's 2-core
machine a streaming ``httpx.AsyncClient`` loop needed about four times the
CPU for the same load and fell behind at 200 req/s (issue 4), and the send
loop is the one place where the client's own cost becomes measurement error.

Algorithm of a replay (:func:`workers.replay.run.run_replay` is the entry point, which
also fans a replay out over processes through :mod:`workers.replay.shard`):

1. Build one record per request (planned time, class, warm-up flag) and fix
   the origin a little in the future so the first sends are not late.
2. Dispatch: for each request in order, sleep until ``origin + t_offset``,
   then start its stream as its own task (optionally behind a concurrency
   cap, whose wait is recorded as admission delay, not as lag).
3. Each stream timestamps every network read, parses SSE frames, and counts
   tokens from the server's usage (cumulative ``completion_tokens`` with
   continuous usage stats), since one frame can carry several tokens.
4. At the drain deadline, streams still open are closed and marked
   unfinished; if ``stop`` is set, sending stops and open streams are closed
   and marked cancelled. Requests never sent say why.
5. Finished records go to ``on_batch`` from a helper thread, so a slow
   database write never stalls the send loop.
6. The result carries dispatch lag (dispatch - planned) p50/p99/max and
   achieved vs planned rate; a p99 lag above the tolerance makes the run
   invalid: the load generator fell behind, the server is not to blame.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import json
import math
import resource
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from workers.replay import rawhttp
from workers.replay.frames import frame_parse
from workers.replay.records import RequestRecord
from workers.replay.sse import DONE, SSEParser

uvloop: Any
try:  # uvloop halves the loop's own CPU cost; plain asyncio still works.
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency, this is a fallback
    uvloop = None

perf_ns = time.perf_counter_ns

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
# Lead time between building the plan and the origin, so that session setup
# and the first task creations are not counted as lateness.
_ORIGIN_LEAD_NS = 50_000_000
# How often the loop looks at the caller's threading.Event (and checks it still runs on time).
_STOP_POLL_S = 0.02
# Bytes of an error body kept in a record.
_ERROR_TEXT_LIMIT = 500

BatchCallback = Callable[[list[RequestRecord]], None]
ProgressCallback = Callable[[int, int], None]


@dataclass
class ReplayResult:
    run_id: str
    records: list[RequestRecord]
    planned_requests: int
    sent: int
    ok: int
    errors: int
    cancelled: int
    unfinished: int
    not_sent: int
    dispatch_lag_p50_ms: float | None
    dispatch_lag_p99_ms: float | None
    dispatch_lag_max_ms: float | None
    planned_rate_rps: float | None
    achieved_rate_rps: float | None
    valid: bool
    invalid_reason: str
    # True when the caller's stop event ended the run early.
    stopped: bool
    duration_s: float
    tolerance_ms: float
    notes: list[str] = field(default_factory=list)
    # The longest time the event loop could not run during the replay (None: not measured,
    # e.g. sharded). A stall holds back sends and stamps every frame read after it late.
    loop_stall_max_ms: float | None = None
    # A recovery rehearsal's own facts (workers/replay/rehearsal.py): the switch, B0 ready, cuts.
    rehearsal: dict[str, Any] | None = None
    # The fields every request body carried besides its own (the sampling settings): what the
    # server was asked for, recorded with the run so cells can be checked for the same settings.
    extra_body: dict[str, Any] = field(default_factory=dict)
    # exact: every request forced to its length; natural: the length is only a cap.
    output_mode: str = "exact"

    def run_fields(self) -> dict[str, Any]:
        """The Run row's load-generator fields (dispatch lag, achieved rate, requests sent)."""
        return {
            "dispatch_lag_p50_ms": self.dispatch_lag_p50_ms,
            "dispatch_lag_p99_ms": self.dispatch_lag_p99_ms,
            "dispatch_lag_max_ms": self.dispatch_lag_max_ms,
            "achieved_rate_rps": self.achieved_rate_rps,
            "requests_sent": self.sent,
        }

    def summary(self) -> dict[str, Any]:
        """Everything but the records, JSON-ready (for Run.summary and logs)."""
        return {k: v for k, v in self.__dict__.items() if k != "records"}


def check_requests(requests: Sequence[dict[str, Any]], *, endpoint: str) -> None:
    """Refuse a request the endpoint cannot send, naming its position."""
    for position, request in enumerate(requests):
        if endpoint == "chat" and not isinstance(request.get("prompt"), str):
            raise ValueError(f"request {position}: the chat endpoint needs a text 'prompt'")
        if request.get("prompt") is None and request.get("prompt_token_ids") is None:
            raise ValueError(f"request {position}: needs prompt_token_ids or prompt")


def drive(
    replay: _Replay,
    *,
    on_batch: BatchCallback | None,
    on_progress: ProgressCallback | None,
    batch_interval_s: float,
    tolerance_ms: float,
) -> ReplayResult:
    """Run one prepared replay on its own event loop, hand its records to ``on_batch``, summarise it."""
    batcher = _Batcher(replay, on_batch=on_batch, on_progress=on_progress, interval_s=batch_interval_s)
    batcher.start()
    started = perf_ns()
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop if uvloop else None) as runner:
            runner.run(replay.run())
    finally:
        batcher.finish()
    duration_s = (perf_ns() - started) / 1e9
    if batcher.error is not None:
        raise batcher.error
    return _result(replay, tolerance_ms=tolerance_ms, duration_s=duration_s)


OUTPUT_MODES = ("exact", "natural")


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
    if endpoint == "chat":
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


class _Replay:
    def __init__(
        self,
        requests: Sequence[dict[str, Any]],
        *,
        base_url: str,
        model: str,
        run_id: str,
        warmup_s: float,
        observation_s: float,
        drain_deadline_s: float,
        endpoint: str,
        max_concurrency: int | None,
        connect_timeout_s: float,
        read_timeout_s: float | None,
        extra_body: dict[str, Any],
        stop: threading.Event,
        transport: str = "raw",
        origin_ns: int | None = None,
        output_mode: str = "exact",
    ) -> None:
        if output_mode not in OUTPUT_MODES:
            raise ValueError(f"output_mode must be exact or natural, not {output_mode!r}")
        self.output_mode = output_mode
        self.requests = requests
        self.base_url = base_url
        self.url = base_url.rstrip("/") + ENDPOINTS[endpoint]
        self.path = ENDPOINTS[endpoint]
        self.transport = transport
        self._pool: rawhttp.Pool
        self.model = model
        self.run_id = run_id
        self.endpoint = endpoint
        self.warmup_ns = round(warmup_s * 1e9)
        self.observation_ns = round(observation_s * 1e9)
        self.deadline_ns = self.warmup_ns + self.observation_ns + round(drain_deadline_s * 1e9)
        self.max_concurrency = max_concurrency
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.extra_body = extra_body
        self.stop = stop
        self.records = [self._record(i, r) for i, r in enumerate(requests)]
        # Records finished and not yet handed to on_batch (appended by the loop,
        # drained by the batcher thread; deque operations are thread-safe).
        self.finished: collections.deque[RequestRecord] = collections.deque()
        self.total = len(self.records)
        self.sent_count = 0
        # Fixed by the caller when several processes share one origin.
        self.origin_ns = origin_ns or 0
        self._fixed_origin = origin_ns is not None
        self.stopped = False
        self.notes: list[str] = []
        self.loop_stall_max_ns = 0
        self._close_reason = "unfinished"
        self._tasks: set[asyncio.Task[None]] = set()
        self._dispatched = 0
        self._dispatch_done = False
        self._idle: asyncio.Event  # created inside the loop, in run()

    def _body(self, request: dict[str, Any]) -> bytes:
        return request_body(
            request,
            model=self.model,
            endpoint=self.endpoint,
            extra_body=self.extra_body,
            output_mode=self.output_mode,
        )

    def _record(self, position: int, request: dict[str, Any]) -> RequestRecord:
        return new_record(run_id=self.run_id, warmup_ns=self.warmup_ns, position=position, request=request)

    async def run(self) -> None:
        _raise_fd_limit()
        semaphore = asyncio.Semaphore(self.max_concurrency) if self.max_concurrency else None
        self._idle = asyncio.Event()
        if self.transport == "raw":
            self._pool = rawhttp.Pool(
                self.base_url, connect_timeout_s=self.connect_timeout_s, read_timeout_s=self.read_timeout_s
            )
            try:
                await self._drive(None, semaphore)
            finally:
                self._pool.close()
        else:
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=None)
            timeout = aiohttp.ClientTimeout(
                total=None,
                connect=self.connect_timeout_s,
                sock_connect=self.connect_timeout_s,
                sock_read=self.read_timeout_s,
            )
            async with aiohttp.ClientSession(
                connector=connector,
                timeout=timeout,
                auto_decompress=False,
                skip_auto_headers=("Accept-Encoding", "User-Agent"),
            ) as session:
                await _preflight(session, self.url)
                await self._drive(session, semaphore)
        self._mark_unsent()

    async def _drive(
        self, session: aiohttp.ClientSession | None, semaphore: asyncio.Semaphore | None
    ) -> None:
        if not self._fixed_origin:
            self.origin_ns = perf_ns() + _ORIGIN_LEAD_NS
        dispatcher = asyncio.create_task(self._dispatch(session, semaphore))
        watcher = asyncio.create_task(self._watch_stop())
        deadline_s = (self.origin_ns + self.deadline_ns - perf_ns()) / 1e9
        done, _ = await asyncio.wait(
            {dispatcher, watcher}, timeout=max(0.0, deadline_s), return_when="FIRST_COMPLETED"
        )
        if dispatcher in done and watcher not in done and self._tasks:
            # All sent: wait for the last streams, until the deadline or a stop.
            idle = asyncio.create_task(self._idle.wait())
            remaining_s = (self.origin_ns + self.deadline_ns - perf_ns()) / 1e9
            await asyncio.wait({idle, watcher}, timeout=max(0.0, remaining_s), return_when="FIRST_COMPLETED")
            idle.cancel()
        # Loop timers may fire a little early: never close a stream before its deadline.
        deadline = self.origin_ns + self.deadline_ns
        while (self._tasks or not dispatcher.done()) and not self.stop.is_set() and perf_ns() < deadline:
            await asyncio.sleep((deadline - perf_ns()) / 1e9)
        if self.stop.is_set():
            self.stopped = True
            self._close_reason = "cancelled"
        watcher.cancel()
        dispatcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await dispatcher
        await self._close_open_streams()

    async def _watch_stop(self) -> None:
        """Return once the caller's stop event is set; meanwhile record the longest loop stall.

        Each poll sleeps ``_STOP_POLL_S``; whatever it overslept is time in which
        nothing was sent on schedule and no frame was stamped when it arrived (a
        starved process or a stalled host).
        """
        tick_ns = round(_STOP_POLL_S * 1e9)
        last = perf_ns()
        while not self.stop.is_set():
            await asyncio.sleep(_STOP_POLL_S)
            now = perf_ns()
            self.loop_stall_max_ns = max(self.loop_stall_max_ns, now - last - tick_ns)
            last = now

    async def _dispatch(
        self, session: aiohttp.ClientSession | None, semaphore: asyncio.Semaphore | None
    ) -> None:
        loop = asyncio.get_running_loop()
        origin = self.origin_ns
        for position, request in enumerate(self.requests):
            record = self.records[position]
            target = origin + record.planned_ns
            # Sleep to the absolute deadline; the loop's timers are coarse
            # (uvloop rounds to 1 ms) and may wake a little early, hence the loop.
            while True:
                delay = target - perf_ns()
                if delay <= 0:
                    break
                await asyncio.sleep(delay / 1e9)
            sent_early = None
            if session is None and semaphore is None:
                sent_early = self._send_now(request, record)
            task = loop.create_task(self._stream(session, semaphore, request, record, sent_early))
            self._tasks.add(task)
            task.add_done_callback(functools.partial(self._task_done, record, sent_early))
            self._dispatched = position + 1
        self._dispatch_done = True
        if not self._tasks:
            self._idle.set()

    def _task_done(
        self, record: RequestRecord, sent_early: rawhttp.Response | None, task: asyncio.Task[None]
    ) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            # Cancelled before its first step, so _stream never ran to record it.
            if sent_early is not None:
                sent_early.close()
            self._mark_interrupted(record, perf_ns())
            self.finished.append(record)
        if self._dispatch_done and not self._tasks:
            self._idle.set()

    async def _close_open_streams(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def _mark_unsent(self) -> None:
        if self._close_reason == "cancelled":
            reason = "run stopped before this request was due"
        else:
            reason = "not sent by the drain deadline"
        for record in self.records[self._dispatched :]:
            record.sent = False
            record.error = reason
            self.finished.append(record)

    def _mark_interrupted(self, record: RequestRecord, now: int) -> None:
        if not record.sent:
            record.error = (
                "run stopped before this request was sent"
                if self._close_reason == "cancelled"
                else "not sent by the drain deadline (waiting for a concurrency slot)"
            )
        elif self._close_reason == "cancelled":
            record.cancelled = True
            record.error = "run stopped before the stream ended"
            record.end_ns = now - self.origin_ns
        else:
            record.unfinished = True
            record.end_ns = now - self.origin_ns

    # -- hooks a recovery rehearsal (workers/replay/rehearsal.py) overrides -------------------

    def _pool_for(self, record: RequestRecord) -> rawhttp.Pool:
        """The connection pool this request is sent on (one server, so one pool)."""
        return self._pool

    async def _before_send(self, record: RequestRecord) -> bool:
        """Wait, if this request must, before it is sent; True when it waited (admission delay)."""
        return False

    def _on_response(
        self, record: RequestRecord, response: aiohttp.ClientResponse | rawhttp.Response
    ) -> None:
        """Called once the response's status (and headers) arrived."""

    def _headers(self, record: RequestRecord) -> dict[str, str]:
        return {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            # Lets a server (or the test and benchmark mocks) tie its log to this record.
            "X-Tailtune-Request": f"{self.run_id}:{record.index}",
        }

    def _send_now(self, request: dict[str, Any], record: RequestRecord) -> rawhttp.Response | None:
        # Send from the dispatcher itself when a kept-alive connection is idle:
        # a new task would only start one loop pass later, after every frame
        # that arrived meanwhile has been processed.
        try:
            body = self._body(request)
        except Exception:  # the stream task records the error
            return None
        sent = perf_ns()
        response = self._pool_for(record).send_nowait(self.path, body, self._headers(record))
        if response is not None:
            record.sent = True
            record.sent_ns = sent - self.origin_ns
            record.admission_delay_ns = 0
            self.sent_count += 1
        return response

    async def _stream(
        self,
        session: aiohttp.ClientSession | None,
        semaphore: asyncio.Semaphore | None,
        request: dict[str, Any],
        record: RequestRecord,
        sent_early: rawhttp.Response | None = None,
    ) -> None:
        origin = self.origin_ns
        dispatched = perf_ns()
        response: aiohttp.ClientResponse | rawhttp.Response | None = sent_early
        tally: _Tally | None = None
        acquired = False
        try:
            if sent_early is not None:
                try:
                    await sent_early.head()
                except rawhttp.ConnectionLost:
                    if sent_early.bytes_seen:
                        raise
                    # The idle connection had just been closed by the server: nothing
                    # was processed, send again on a fresh one (same sent time).
                    body = self._body(request)
                    response = await self._pool_for(record).post(self.path, body, self._headers(record))
            else:
                if semaphore is not None:
                    await semaphore.acquire()
                    acquired = True
                held = await self._before_send(record)
                body = self._body(request)
                headers = self._headers(record)
                sent = perf_ns()
                record.sent = True
                record.sent_ns = sent - origin
                record.admission_delay_ns = sent - dispatched if semaphore is not None or held else 0
                self.sent_count += 1
                if session is None:
                    response = await self._pool_for(record).post(self.path, body, headers)
                else:
                    response = await session.post(self.url, data=body, headers=headers)
            assert response is not None
            record.http_status = response.status
            self._on_response(record, response)
            if response.status != 200:
                if isinstance(response, rawhttp.Response):
                    raw = await response.read_body(_ERROR_TEXT_LIMIT * 4)
                else:
                    raw = await response.content.read(_ERROR_TEXT_LIMIT * 4)
                text = raw.decode("utf-8", "replace")
                record.error_kind = "context" if _is_context_error(text) else "http"
                record.error = f"HTTP {response.status}: {text[:_ERROR_TEXT_LIMIT]}"
                record.end_ns = perf_ns() - origin
                return
            cancel_after = request.get("cancel_after_tokens")
            if cancel_after is not None and cancel_after <= 0:
                record.cancelled = True
                record.end_ns = perf_ns() - origin
                return
            tally = _Tally(record, origin, cancel_after)
            if isinstance(response, rawhttp.Response):
                # Frames are accounted inside the connection's data_received, stamped on arrival.
                await response.stream(tally.feed)
                if not tally.ended:
                    tally.feed(b"", perf_ns())
            else:
                await self._read_stream(response, tally)
            mark_late(record, self.deadline_ns)
        except asyncio.CancelledError:
            # Only this module cancels stream tasks: at the drain deadline or on stop.
            self._mark_interrupted(record, perf_ns())
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()
        except TimeoutError as exc:
            _fail(record, "timeout", exc, origin)
        except (aiohttp.ClientConnectorError, ConnectionRefusedError) as exc:
            _fail(record, "connect", exc, origin)
        except OSError as exc:
            # ConnectionLost (server hung up mid-stream) is an OSError too; a failed
            # connect has no HTTP status yet.
            kind = (
                "connect"
                if record.http_status is None and not isinstance(exc, rawhttp.ConnectionLost)
                else "protocol"
            )
            _fail(record, kind, exc, origin)
        except (aiohttp.ClientError, ValueError) as exc:
            # Server hung up mid-stream, broken chunked encoding, bad JSON.
            _fail(record, "protocol", exc, origin)
        except Exception as exc:  # a client bug must still become data, not kill the run
            _fail(record, "client", exc, origin)
        finally:
            if tally is not None:
                tally.close()
            if response is not None:
                # close() drops the connection: after a cancel or a deadline the
                # server must see the disconnect. A fully read stream was already
                # released to the pool, so close() is harmless there.
                response.close()
            if acquired and semaphore is not None:
                semaphore.release()
            self.finished.append(record)

    async def _read_stream(self, response: aiohttp.ClientResponse, tally: _Tally) -> None:
        content = response.content
        while True:
            data = await content.readany()
            if tally.feed(data, perf_ns()) or not data:
                return


class _Tally:
    """Turns one stream's bytes into its record: tokens, chunks, gaps, end.

    ``feed`` gets each network read with its arrival time; counts are written
    to the record by ``close`` however the stream ends (done, cancelled, cut,
    timed out, closed at the deadline): partial streams are data too.
    """

    __slots__ = (
        "record",
        "origin",
        "cancel_after",
        "parser",
        "tokens",
        "final_tokens",
        "chunks",
        "first_ns",
        "last_ns",
        "max_gap",
        "done",
        "ended",
    )

    def __init__(self, record: RequestRecord, origin: int, cancel_after: int | None) -> None:
        self.record = record
        self.origin = origin
        self.cancel_after = cancel_after
        self.parser = SSEParser()
        self.tokens = 0
        self.final_tokens: int | None = None
        self.chunks = 0
        self.first_ns: int | None = None
        self.last_ns = 0
        self.max_gap = 0
        # Saw data: [DONE]; and: the stream reached its end (EOF or [DONE] or a cancel).
        self.done = False
        self.ended = False

    def feed(self, data: bytes, now: int) -> bool:
        """Account one read (b"" = end of stream); True when the caller should stop reading."""
        record = self.record
        events = self.parser.feed(data) if data else self.parser.close()
        for event in events:
            if self.done:
                continue
            if event == DONE:
                self.done = True
                record.end_ns = now - self.origin
                continue
            frame = frame_parse(event)
            if frame.error is not None:
                record.error_kind = "http"
                record.error = f"error event in stream: {frame.error[:_ERROR_TEXT_LIMIT]}"
                continue
            delta = 0
            completion = frame.completion_tokens
            if frame.prompt_tokens is not None:
                record.prompt_tokens = frame.prompt_tokens
            if completion is not None:
                if frame.has_choices:
                    delta = completion - self.tokens
                else:
                    # The closing usage-only frame: the authoritative total.
                    self.final_tokens = completion
            elif frame.has_output:
                # No usage on this frame (server ignores continuous usage
                # stats): one frame, one token, corrected by the final usage.
                delta = 1
            if frame.finish_reason is not None:
                record.finish_reason = frame.finish_reason
            if delta > 0:
                if self.first_ns is None:
                    self.first_ns = now
                else:
                    gap = now - self.last_ns
                    gap_us = gap / 1000
                    record.chunk_gaps.add(gap_us)
                    record.token_gaps.add(gap_us / delta, delta)
                    if gap > self.max_gap:
                        self.max_gap = gap
                self.last_ns = now
                self.tokens += delta
                self.chunks += 1
                if self.cancel_after is not None and self.tokens >= self.cancel_after:
                    record.cancelled = True
                    record.end_ns = now - self.origin
                    self.ended = True
                    return True
        if not data:
            self.ended = True
            return True
        return False

    def close(self) -> None:
        record = self.record
        origin = self.origin
        record.output_tokens = self.final_tokens if self.final_tokens is not None else self.tokens
        record.chunks = self.chunks
        if self.first_ns is not None:
            record.first_token_ns = self.first_ns - origin
            record.last_token_ns = self.last_ns - origin
            record.max_gap_ns = self.max_gap if self.chunks > 1 else None
        if self.ended:
            if record.end_ns is None:
                record.end_ns = perf_ns() - origin
            if not self.done and not record.cancelled and record.error_kind is None:
                record.error_kind = "protocol"
                record.error = "stream ended before data: [DONE]"


async def _preflight(session: aiohttp.ClientSession, url: str) -> None:
    # aiohttp's first request pays one-off setup costs (several ms) that would
    # otherwise land on the first planned request. GET /v1/models is harmless
    # on any OpenAI-compatible server; whatever it answers is ignored here,
    # since a server that is down shows up in the records anyway.
    models_url = url.rsplit("/v1/", 1)[0] + "/v1/models"
    with contextlib.suppress(Exception):
        async with session.get(models_url, timeout=aiohttp.ClientTimeout(total=2.0)) as response:
            await response.read()


def mark_late(record: RequestRecord, deadline_ns: int) -> bool:
    """Count a stream that ended after the drain deadline as unfinished at the deadline.

    The deadline timer normally closes such a stream first. But when this
    process is stalled across the deadline (a host that stops scheduling it
    for seconds), the loop may read the rest of a stream before the timer
    runs: the record then ends after the deadline, and at the deadline it had
    not finished. Returns True when it marked the record.
    """
    if record.cancelled or record.error_kind is not None or record.end_ns is None:
        return False
    if record.end_ns <= deadline_ns:
        return False
    record.unfinished = True
    record.error = record.error or "the stream ended after the drain deadline"
    return True


def _is_context_error(text: str) -> bool:
    lowered = text.lower()
    return "context length" in lowered or "maximum context" in lowered or "max_model_len" in lowered


def _fail(record: RequestRecord, kind: str, exc: BaseException, origin: int) -> None:
    record.error_kind = kind
    record.error = f"{type(exc).__name__}: {exc}"[:_ERROR_TEXT_LIMIT]
    record.end_ns = perf_ns() - origin


def _raise_fd_limit() -> None:
    # Each open stream holds a socket; an open-loop run at hundreds of req/s
    # can hold thousands when the server is slow.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(
                resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 65536, hard)
            )


class _Batcher:
    """Hands finished records to the caller from its own thread."""

    def __init__(
        self,
        replay: Any,  # _Replay, or shard.Sharded: anything with finished, sent_count, total, stop, notes
        *,
        on_batch: BatchCallback | None,
        on_progress: ProgressCallback | None,
        interval_s: float,
    ) -> None:
        self.replay = replay
        self.on_batch = on_batch
        self.on_progress = on_progress
        self.interval_s = max(0.01, interval_s)
        self.error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name=f"replay-batches-{replay.run_id}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def finish(self) -> None:
        self._done.set()
        self._thread.join()
        # Whatever finished after the thread's last pass (at least the unsent ones).
        self._flush()

    def _loop(self) -> None:
        while not self._done.wait(self.interval_s):
            self._flush()

    def _flush(self) -> None:
        if self.error is not None:
            return
        replay = self.replay
        batch: list[RequestRecord] = []
        with contextlib.suppress(IndexError):
            while True:
                batch.append(replay.finished.popleft())
        try:
            if batch and self.on_batch is not None:
                self.on_batch(batch)
            if self.on_progress is not None:
                self.on_progress(replay.sent_count, replay.total)
        except BaseException as exc:  # re-raised by run_replay once the loop is down
            self.error = exc
            replay.notes.append(f"on_batch/on_progress raised {type(exc).__name__}: the run was stopped")
            replay.stop.set()


def _percentile(sorted_values: list[int], q: float) -> float:
    # Nearest-rank: the reported p99 is a lag that some request really had.
    rank = max(1, math.ceil(q * len(sorted_values)))
    return float(sorted_values[rank - 1])


def _result(replay: Any, *, tolerance_ms: float, duration_s: float) -> ReplayResult:
    """Summarise a finished replay (single loop or sharded: records, windows, stopped, notes)."""
    records = replay.records
    sent = [r for r in records if r.sent and r.sent_ns is not None]
    observed = [r for r in sent if not r.warmup] or sent
    lags = sorted(r.sent_ns - (r.admission_delay_ns or 0) - r.planned_ns for r in observed)
    p50 = _percentile(lags, 0.50) / 1e6 if lags else None
    p99 = _percentile(lags, 0.99) / 1e6 if lags else None
    lag_max = lags[-1] / 1e6 if lags else None

    planned_obs = [r for r in records if not r.warmup]
    window_s = replay.observation_ns / 1e9
    planned_rate = len(planned_obs) / window_s if window_s > 0 and planned_obs else None
    achieved_rate = None
    sent_obs = [r for r in sent if not r.warmup]
    if planned_rate is not None and sent_obs:
        last_dispatch = max(r.sent_ns - (r.admission_delay_ns or 0) for r in sent_obs)
        span_s = max(window_s, (last_dispatch - replay.warmup_ns) / 1e9)
        achieved_rate = len(sent_obs) / span_s

    not_sent = len(records) - len(sent)
    reasons = []
    if p99 is not None and p99 > tolerance_ms:
        reasons.append(
            f"load generator fell behind: p99 dispatch lag {p99:.1f} ms > tolerance {tolerance_ms:g} ms"
        )
    behind = [r for r in records if not r.sent and r.error == "not sent by the drain deadline"]
    if behind and not replay.stopped:
        reasons.append(f"load generator fell behind: {len(behind)} requests not sent by the drain deadline")
    return ReplayResult(
        run_id=replay.run_id,
        records=records,
        planned_requests=len(records),
        sent=len(sent),
        ok=sum(1 for r in records if r.ok),
        errors=sum(1 for r in records if r.error_kind is not None),
        cancelled=sum(1 for r in records if r.cancelled),
        unfinished=sum(1 for r in records if r.unfinished),
        not_sent=not_sent,
        dispatch_lag_p50_ms=p50,
        dispatch_lag_p99_ms=p99,
        dispatch_lag_max_ms=lag_max,
        planned_rate_rps=planned_rate,
        achieved_rate_rps=achieved_rate,
        valid=not reasons,
        invalid_reason="; ".join(reasons),
        stopped=replay.stopped,
        duration_s=duration_s,
        tolerance_ms=tolerance_ms,
        notes=replay.notes,
        extra_body=dict(replay.extra_body),
        output_mode=replay.output_mode,
        loop_stall_max_ms=(
            round(replay.loop_stall_max_ns / 1e6, 3) if hasattr(replay, "loop_stall_max_ns") else None
        ),
    )
