"""The client side of a recovery rehearsal: route to B0 at the switch, cut at the deadline.

A rehearsal replays one frozen trace against the candidate and, at
``switch_at_s`` after the origin, rolls back to B0 the way an incident would:

- **tailtune's own client** (the default): requests planned before the switch go
  to the candidate, requests planned at or after it go to B0. With a cold
  standby B0 is started only at the switch, so the client holds each
  post-switch request (as a router with health checks would) until B0's
  ``/health`` first answers 200; the wait is the request's admission delay and
  part of its latency, which is measured from its planned arrival.
- **the operator's router** (the spec's ``recovery.router``, a name the host's
  ``TAILTUNE_ROUTERS`` resolves to a URL and a backend header): every request goes
  to the router, the worker runs the named switch command at the switch, and the
  server that answered is read from the router's ``backend_header`` (else "unknown").

Either way, requests sent before the switch keep streaming until
``switch_at_s + cut_after_s`` (the manifest's drain deadline); the client
then closes the ones still open and records them as **cut** (``cut`` and
``unfinished``: they never ended, and were ended on purpose).

Pure client code: no Django. The options arrive as one JSON mapping
(:class:`workers.replay.config.RehearsalOptions`; it crosses into the replay's own process)::

    {"switch_at_s": 30.0, "cut_after_s": 15.0,
     "b0_url": "http://127.0.0.1:8102",        # own client; None with a router
     "wait_for_b0": true,                      # cold standby: hold until /health is 200
     "backend_header": "x-backend"}            # router mode: who answered
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from workers.replay import rawhttp
from workers.replay.client import _Replay, perf_ns
from workers.replay.config import RehearsalOptions
from workers.replay.records import RequestRecord
from workers.replay.result import RehearsalClientFacts

CUT_ERROR = "cut at the drain deadline after the switch"
# How often a held request's B0 is asked for /health (cold standby).
HEALTH_POLL_S = 0.25


async def health_ok(base_url: str, *, timeout_s: float = 1.0) -> bool:
    """True when ``GET /health`` answers 200 (any failure is False)."""
    parts = urlsplit(base_url)
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(parts.hostname, parts.port or 80), timeout_s
        )
    except (OSError, TimeoutError):
        return False
    try:
        writer.write(f"GET /health HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: close\r\n\r\n".encode())
        line = await asyncio.wait_for(reader.readline(), timeout_s)
        return line.split(b" ")[1:2] == [b"200"]
    except (OSError, TimeoutError, IndexError):
        return False
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


class RehearsalReplay(_Replay):
    """An open-loop replay whose backend changes at the switch (see the module docstring)."""

    def __init__(
        self, requests: Sequence[dict[str, Any]], *, rehearsal: RehearsalOptions, **kwargs: Any
    ) -> None:
        super().__init__(requests, **kwargs)
        self.switch_ns = round(float(rehearsal["switch_at_s"]) * 1e9)
        self.cut_ns = self.switch_ns + round(float(rehearsal["cut_after_s"]) * 1e9)
        self.b0_url: str | None = rehearsal.get("b0_url") or None
        self.wait_for_b0 = bool(rehearsal.get("wait_for_b0")) and self.b0_url is not None
        self.backend_header = str(rehearsal.get("backend_header") or "").lower()
        self._b0_pool: rawhttp.Pool | None = None
        self._b0_ready_ns: int | None = None
        self._b0_waiters: asyncio.Event
        self._open_before: dict[int, asyncio.Task[Any]] = {}
        self._cutting: set[int] = set()
        self.cut_count = 0

    def _after_switch(self, record: RequestRecord) -> bool:
        return record.planned_ns >= self.switch_ns

    # -- the run -----------------------------------------------------------------------------

    async def run(self) -> None:
        self._b0_waiters = asyncio.Event()
        if not self.wait_for_b0:
            self._b0_waiters.set()
        await super().run()

    def _more_pools(self) -> list[rawhttp.Pool]:
        if self.b0_url is None:
            return []
        self._b0_pool = self._new_pool(self.b0_url)
        return [self._b0_pool]

    async def _drive(self, semaphore: asyncio.Semaphore | None) -> None:
        if not self._fixed_origin:
            self.origin_ns = perf_ns() + 50_000_000
            self._fixed_origin = True
        helpers = [asyncio.create_task(self._cut_at_deadline())]
        if self.wait_for_b0:
            helpers.append(asyncio.create_task(self._watch_b0()))
        try:
            await super()._drive(semaphore)
        finally:
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)

    async def _sleep_until(self, offset_ns: int) -> None:
        while (delay := self.origin_ns + offset_ns - perf_ns()) > 0:
            await asyncio.sleep(delay / 1e9)

    async def _watch_b0(self) -> None:
        """Cold standby: from the switch on, ask B0's /health until it first answers 200."""
        assert self.b0_url is not None
        await self._sleep_until(self.switch_ns)
        while not await health_ok(self.b0_url):
            await asyncio.sleep(HEALTH_POLL_S)
        self._b0_ready_ns = perf_ns() - self.origin_ns
        self._b0_waiters.set()

    async def _cut_at_deadline(self) -> None:
        await self._sleep_until(self.cut_ns)
        for index, task in list(self._open_before.items()):
            self._cutting.add(index)
            task.cancel()

    # -- the hooks -----------------------------------------------------------------------------

    def _pool_for(self, record: RequestRecord) -> rawhttp.Pool:
        if self._b0_pool is not None and self._after_switch(record):
            return self._b0_pool
        return self._pool

    def _send_now(self, request: dict[str, Any], record: RequestRecord) -> rawhttp.Response | None:
        if self._after_switch(record) and not self._b0_waiters.is_set():
            return None  # held: its task waits for B0, then sends
        self._label(record)
        return super()._send_now(request, record)

    async def _before_send(self, record: RequestRecord) -> bool:
        self._label(record)
        if self._after_switch(record) and not self._b0_waiters.is_set():
            await self._b0_waiters.wait()
            return True
        return False

    def _label(self, record: RequestRecord) -> None:
        if self.b0_url is not None:
            record.backend = "b0" if self._after_switch(record) else "candidate"
        else:
            record.backend = "unknown"

    def _on_response(self, record: RequestRecord, response: rawhttp.Response) -> None:
        if self.backend_header:
            value = response.headers.get(self.backend_header)
            record.backend = str(value)[:64] if value else "unknown"

    async def _stream(
        self,
        semaphore: asyncio.Semaphore | None,
        request: dict[str, Any],
        record: RequestRecord,
        sent_early: rawhttp.Response | None = None,
    ) -> None:
        before = not self._after_switch(record)
        task = asyncio.current_task()
        if before and task is not None:
            if perf_ns() >= self.origin_ns + self.cut_ns:
                # Dispatched so late (a starved client) that its deadline has passed: cut at once,
                # or recorded unsent if it never left; never served as if the cut had not come.
                self._cutting.add(record.index)
                task.cancel()
            else:
                self._open_before[record.index] = task
        try:
            await super()._stream(semaphore, request, record, sent_early)
        finally:
            self._open_before.pop(record.index, None)
        if before and self._ended_after_cut(record) and self._close_reason != "cancelled":
            # Its [DONE] was stamped after the deadline, and its task ran before the deadline's:
            # a stalled loop read the last frames and fired the cut's timer in one pass.
            self._cut(record, perf_ns())

    def _ended_after_cut(self, record: RequestRecord) -> bool:
        return (
            record.sent
            and not record.cut
            and record.error_kind is None
            and record.end_ns is not None
            and record.end_ns > self.cut_ns
        )

    def _cut(self, record: RequestRecord, now: int) -> None:
        record.cut = True
        record.unfinished = True
        record.error = CUT_ERROR
        record.end_ns = now - self.origin_ns
        self.cut_count += 1

    def _mark_interrupted(self, record: RequestRecord, now: int) -> None:
        if (
            record.index in self._cutting
            and record.end_ns is not None
            and record.error_kind is None
            and record.end_ns <= self.cut_ns
        ):
            return  # its [DONE] had arrived before the cut reached its task: it finished, it is not cut
        # A [DONE] stamped after the deadline was not seen by then (a stalled loop read the last
        # frames and fired the cut's timer in one pass): the stream was open at the deadline.
        if record.index in self._cutting and record.sent and self._close_reason != "cancelled":
            self._cut(record, now)
            return
        super()._mark_interrupted(record, now)

    def facts(self) -> RehearsalClientFacts:
        """What the rehearsal's client saw, for the run's summary (times from the origin, in s)."""
        return {
            "switch_at_s": self.switch_ns / 1e9,
            "cut_at_s": self.cut_ns / 1e9,
            "mode": "own client" if self.b0_url is not None else "router",
            "cold_wait": self.wait_for_b0,
            "b0_ready_at_s": None if self._b0_ready_ns is None else self._b0_ready_ns / 1e9,
            "cut": self.cut_count,
        }
