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

The HTTP side is :mod:`workers.replay.rawhttp` on uvloop, the one transport:
on this project's 2-core machine a streaming ``httpx.AsyncClient`` loop needed
about four times the CPU for the same load and fell behind at 200 req/s, and
aiohttp a third more than the raw protocol (bench/results/replay.md); the send
loop is the one place where the client's own cost becomes measurement error.

Algorithm of a replay (:func:`workers.replay.run.run_replay` is the entry point, which
also fans a replay out over processes through :mod:`workers.replay.shard`). This module is
the send loop (steps 1, 2 and 4); the request's body and record are in
:mod:`workers.replay.request`, the stream reader in :mod:`workers.replay.stream`, the
batches in :mod:`workers.replay.batches` and the result in :mod:`workers.replay.result`:

1. Build one record per request (planned time, class, warm-up flag); open
   spare keep-alive connections, as many as the trace's largest burst (the
   most requests due within 250 ms), and keep that many fresh while it runs;
   fix the origin a little in the future (or take the parent's) so the first
   sends are not late.
2. Dispatch: for each request in order, sleep until ``origin + t_offset``,
   then send it on an idle connection at once, or start its stream as its
   own task (optionally behind a concurrency cap, whose wait is recorded as
   admission delay, not as lag). A send is stamped when its bytes are
   written, after any connect, so the lag is what the server sees.
3. Each stream timestamps every network read, parses SSE frames, and counts
   tokens from the server's usage (cumulative ``completion_tokens`` with
   continuous usage stats), since one frame can carry several tokens.
4. At the drain deadline, streams still open are closed and marked
   unfinished; if ``stop`` is set, sending stops and open streams are closed
   and marked cancelled. Requests never sent say why.
5. Finished records go to ``on_batch`` from a helper thread, so a slow
   database write never stalls the send loop.
6. While the loop runs the cyclic garbage collector is off (:func:`quiet_interpreter`).
7. The result carries dispatch lag (dispatch - planned) p50/p99/max and
   achieved vs planned rate; a p99 lag above the tolerance makes the run
   invalid: the load generator fell behind, the server is not to blame.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from workers.replay import rawhttp
from workers.replay.batches import BatchCallback, Batcher, ProgressCallback
from workers.replay.records import RequestRecord
from workers.replay.request import (
    OUTPUT_MODES,
    REQUEST_ID_HEADER,
    new_record,
    request_body,
    request_path,
    server_request_prefix,
)
from workers.replay.result import ReplayResult, summarise
from workers.replay.runtime import burst_size, quiet_interpreter, raise_fd_limit
from workers.replay.stream import (
    ERROR_TEXT_LIMIT,
    Tally,
    is_context_error,
    mark_late,
    record_failure,
)

uvloop: Any
try:  # uvloop halves the loop's own CPU cost; plain asyncio still works.
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency, this is a fallback
    uvloop = None

perf_ns = time.perf_counter_ns

# Lead time between building the plan and the origin, so that session setup
# and the first task creations are not counted as lateness.
_ORIGIN_LEAD_NS = 50_000_000
# How often the loop looks at the caller's threading.Event (and checks it still runs on time).
_STOP_POLL_S = 0.02
# Spare connections: at most this many (the trace's largest burst, runtime.burst_size).
_MAX_SPARE = 512


def drive(
    replay: _Replay,
    *,
    on_batch: BatchCallback | None,
    on_progress: ProgressCallback | None,
    batch_interval_s: float,
    tolerance_ms: float,
) -> ReplayResult:
    """Run one prepared replay on its own event loop, hand its records to ``on_batch``, summarise it."""
    batcher = Batcher(replay, on_batch=on_batch, on_progress=on_progress, interval_s=batch_interval_s)
    batcher.start()
    started = perf_ns()
    try:
        with (
            quiet_interpreter(),
            asyncio.Runner(loop_factory=uvloop.new_event_loop if uvloop else None) as runner,
        ):
            runner.run(replay.run())
    finally:
        batcher.finish()
    duration_s = (perf_ns() - started) / 1e9
    if batcher.error is not None:
        raise batcher.error
    return summarise(replay, tolerance_ms=tolerance_ms, duration_s=duration_s)


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
        origin_ns: int | None = None,
        output_mode: str = "exact",
        origin_source: Callable[[], int] | None = None,
    ) -> None:
        if output_mode not in OUTPUT_MODES:
            raise ValueError(f"output_mode must be exact or natural, not {output_mode!r}")
        self.output_mode = output_mode
        self.requests = requests
        self.base_url = base_url
        self._pool: rawhttp.Pool
        self.model = model
        self.run_id = run_id
        # request.server_request_id's prefix, built once: the header is written per send.
        self._request_id_prefix = server_request_prefix(run_id)
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
        # Called (off the loop) once the connections are warm; returns the origin. A child
        # process of a replay spread over processes learns its origin this way.
        self.origin_source = origin_source
        # Idle connections kept open ahead of need: the most requests due within any
        # runtime.BURST_WINDOW_NS of the trace, so that a burst never waits on connects.
        self.spare_connections = min(_MAX_SPARE, burst_size([r.planned_ns for r in self.records]))
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
        raise_fd_limit()
        semaphore = asyncio.Semaphore(self.max_concurrency) if self.max_concurrency else None
        self._idle = asyncio.Event()
        self._pool = self._new_pool(self.base_url)
        pools = [self._pool, *self._more_pools()]
        try:
            await self._prepare(self._pool)
            await self._drive(semaphore)
        finally:
            for pool in pools:
                pool.close()
        self._mark_unsent()

    def _new_pool(self, base_url: str) -> rawhttp.Pool:
        return rawhttp.Pool(
            base_url, connect_timeout_s=self.connect_timeout_s, read_timeout_s=self.read_timeout_s
        )

    async def _prepare(self, pool: rawhttp.Pool) -> None:
        """Before the origin: open the spare connections, then learn the origin if a parent sets it."""
        opened = await pool.warm(self.spare_connections)
        if opened < self.spare_connections:
            self.notes.append(
                f"opened {opened} of {self.spare_connections} spare connections before the start"
            )
        if self.origin_source is not None:
            self.origin_ns = await asyncio.get_running_loop().run_in_executor(None, self.origin_source)
            self._fixed_origin = True
        pool.keep_warm(self.spare_connections)

    async def _drive(self, semaphore: asyncio.Semaphore | None) -> None:
        if not self._fixed_origin:
            self.origin_ns = perf_ns() + _ORIGIN_LEAD_NS
        dispatcher = asyncio.create_task(self._dispatch(semaphore))
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

    async def _dispatch(self, semaphore: asyncio.Semaphore | None) -> None:
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
            if semaphore is None:
                sent_early = self._send_now(request, record)
            task = loop.create_task(self._stream(semaphore, request, record, sent_early))
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

    # -- hooks a recovery rehearsal (workers/replay/rehearsal_client.py) overrides -------------------

    def _more_pools(self) -> list[rawhttp.Pool]:
        """Other servers this replay sends to (made inside the loop, closed with the run's)."""
        return []

    def _pool_for(self, record: RequestRecord) -> rawhttp.Pool:
        """The connection pool this request is sent on (one server, so one pool)."""
        return self._pool

    async def _before_send(self, record: RequestRecord) -> bool:
        """Wait, if this request must, before it is sent; True when it waited (admission delay)."""
        return False

    def _on_response(self, record: RequestRecord, response: rawhttp.Response) -> None:
        """Called once the response's status (and headers) arrived."""

    def _headers(self, record: RequestRecord) -> dict[str, str]:
        return {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            # Lets a server (or the test and benchmark mocks) tie its log to this record.
            "X-Tailtune-Request": f"{self.run_id}:{record.index}",
            # vLLM's request id, which its span of the request carries (server timings, joined later).
            REQUEST_ID_HEADER: f"{self._request_id_prefix}{record.index}",
        }

    def _send_now(self, request: dict[str, Any], record: RequestRecord) -> rawhttp.Response | None:
        # Send from the dispatcher itself when a kept-alive connection is idle:
        # a new task would only start one loop pass later, after every frame
        # that arrived meanwhile has been processed.
        try:
            body = self._body(request)
        except Exception:  # the stream task records the error
            return None
        response = self._pool_for(record).send_nowait(
            request_path(request, endpoint=self.endpoint), body, self._headers(record)
        )
        if response is not None:
            record.sent = True
            record.sent_ns = response.written_ns - self.origin_ns
            record.admission_delay_ns = 0
            self.sent_count += 1
        return response

    async def _stream(
        self,
        semaphore: asyncio.Semaphore | None,
        request: dict[str, Any],
        record: RequestRecord,
        sent_early: rawhttp.Response | None = None,
    ) -> None:
        origin = self.origin_ns
        dispatched = perf_ns()
        response: rawhttp.Response | None = sent_early
        tally: Tally | None = None
        acquired = False

        def written(at_ns: int) -> None:
            # The request's bytes went out now, on a connection already open: its sent time.
            record.sent_ns = at_ns - origin

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
                    response = await self._pool_for(record).post(
                        request_path(request, endpoint=self.endpoint), body, self._headers(record)
                    )
            else:
                if semaphore is not None:
                    await semaphore.acquire()
                    acquired = True
                held = await self._before_send(record)
                body = self._body(request)
                headers = self._headers(record)
                released = perf_ns()
                record.sent = True
                # Until the bytes are written (after any connect), the attempt's time stands.
                record.sent_ns = released - origin
                record.admission_delay_ns = released - dispatched if semaphore is not None or held else 0
                self.sent_count += 1
                response = await self._pool_for(record).post(
                    request_path(request, endpoint=self.endpoint), body, headers, on_written=written
                )
            assert response is not None
            record.http_status = response.status
            self._on_response(record, response)
            if response.status != 200:
                raw = await response.read_body(ERROR_TEXT_LIMIT * 4)
                text = raw.decode("utf-8", "replace")
                record.error_kind = "context" if is_context_error(text) else "http"
                record.error = f"HTTP {response.status}: {text[:ERROR_TEXT_LIMIT]}"
                record.end_ns = perf_ns() - origin
                return
            cancel_after = request.get("cancel_after_tokens")
            if cancel_after is not None and cancel_after <= 0:
                record.cancelled = True
                record.end_ns = perf_ns() - origin
                return
            tally = Tally(record, origin, cancel_after)
            # Frames are accounted inside the connection's data_received, stamped on arrival.
            await response.stream(tally.feed)
            if not tally.ended:
                tally.feed(b"", perf_ns())
            mark_late(record, self.deadline_ns)
        except asyncio.CancelledError:
            # Only this module cancels stream tasks: at the drain deadline or on stop.
            self._mark_interrupted(record, perf_ns())
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()
        except TimeoutError as exc:
            record_failure(record, "timeout", exc, origin)
        except ConnectionRefusedError as exc:
            record_failure(record, "connect", exc, origin)
        except OSError as exc:
            # ConnectionLost (server hung up mid-stream) is an OSError too; a failed
            # connect has no HTTP status yet.
            kind = (
                "connect"
                if record.http_status is None and not isinstance(exc, rawhttp.ConnectionLost)
                else "protocol"
            )
            record_failure(record, kind, exc, origin)
        except ValueError as exc:
            # Broken chunked encoding, a bad response head, bad JSON.
            record_failure(record, "protocol", exc, origin)
        except Exception as exc:  # a client bug must still become data, not kill the run
            record_failure(record, "client", exc, origin)
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
