"""A minimal HTTP/1.1 client for streamed responses, on asyncio protocols.

Why not aiohttp here: with aiohttp every token frame of every stream wakes a
future, resumes a task and goes through a stream reader before the load
generator sees it, and on this project's 2-core machine that machinery, not
the parsing, was most of the client's CPU (bench/results/replay.md). Here
the body bytes go straight from ``data_received`` to the caller's sink, with
the arrival timestamp taken at that moment; the awaiting coroutine wakes
once for the response head and once at the end.

What it supports is what an OpenAI-compatible server answers: one request
per connection at a time, keep-alive reuse, chunked or Content-Length or
read-until-close bodies, 1xx heads skipped, http and https.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from urllib.parse import urlsplit

perf_ns = time.perf_counter_ns

# Servers close idle keep-alive connections (uvicorn after 5 s); a connection
# idle longer than this is closed rather than risked.
_IDLE_REUSE_NS = 3_000_000_000
# The spare-connection keeper looks this often, and replaces a spare this long before the
# reuse limit.
_KEEP_POLL_S = 0.1
_KEEP_MARGIN_NS = 500_000_000
_MAX_HEAD = 64 * 1024
_HEAD, _CHUNKED, _LENGTH, _UNTIL_CLOSE, _DONE = range(5)

# Called with body bytes and their arrival time (perf_counter_ns); returns
# True when the caller wants the connection dropped (a client-side cancel).
Sink = Callable[[bytes, int], bool]


class ConnectionLost(ConnectionError):
    """The server closed the connection before the response ended."""


class ProtocolError(ValueError):
    """The server's bytes are not a valid HTTP/1.1 response."""


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.response: Response | None = None
        self.closed = False
        self.reusable = True
        self.idle_since_ns = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None:
            # Bytes nobody asked for: the connection can no longer be trusted.
            self.close()
            return
        response._received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.reusable = False
        if self.response is not None:
            self.response._lost(exc)

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None and not self.closed:
            self.transport.close()


class Response:
    """One response being received; ``status`` is set once ``Pool.post`` returns it."""

    def __init__(self, pool: Pool, conn: _Connection) -> None:
        self.pool = pool
        self.conn = conn
        self.status = 0
        # Header names in lower case, values as sent (set with ``status``).
        self.headers: dict[str, str] = {}
        # Sent on a kept-alive connection (which the server may have just closed).
        self.reused = False
        # When the request's bytes were handed to the socket (perf_counter_ns).
        self.written_ns = 0
        self.last_data_ns = perf_ns()
        self.bytes_seen = 0
        self._state = _HEAD
        self._buffer = b""
        self._keep_alive = True
        self._chunk_left = 0
        self._need_crlf = False
        self._trailers = False
        self._length_left = 0
        self._sink: Sink | None = None
        self._pending: list[tuple[bytes, int]] = []
        loop = pool.loop
        self._head: asyncio.Future[None] = loop.create_future()
        self._done: asyncio.Future[None] = loop.create_future()

    # -- called by the caller

    async def head(self) -> None:
        """Wait for the response head (``status``)."""
        await self._head

    async def stream(self, sink: Sink) -> None:
        """Feed the body to ``sink`` as it arrives; returns at its end (or when the sink asks to stop)."""
        self._sink = sink
        pending, self._pending = self._pending, []
        for data, at in pending:
            if sink(data, at):
                self._abort()
                break
        await self._done

    async def read_body(self, limit: int) -> bytes:
        parts: list[bytes] = []
        size = 0

        def collect(data: bytes, _at: int) -> bool:
            nonlocal size
            parts.append(data)
            size += len(data)
            return size >= limit

        await self.stream(collect)
        return b"".join(parts)[:limit]

    def close(self) -> None:
        """Drop the connection unless the response ended cleanly (then it went back to the pool)."""
        if self._state != _DONE or not self._done.done():
            self.conn.close()
            self._finish(ConnectionLost("closed by the client"))

    # -- called by the connection

    def _received(self, data: bytes) -> None:
        now = perf_ns()
        self.last_data_ns = now
        self.bytes_seen += len(data)
        if self._state == _HEAD:
            data = self._parse_head(data)
            if self._state == _HEAD or self._state == _DONE:
                return
        if not data:
            return
        if self._state == _CHUNKED:
            try:
                payload, ended = self._dechunk(data)
            except ProtocolError as exc:
                self.conn.close()
                self._finish(exc)
                return
        elif self._state == _LENGTH:
            payload = data[: self._length_left]
            self._length_left -= len(payload)
            ended = self._length_left <= 0
        elif self._state == _UNTIL_CLOSE:
            payload, ended = data, False
        else:
            return
        if payload:
            self._deliver(payload, now)
        if ended and self._state != _DONE:
            self._state = _DONE
            self._finish(None)

    def _lost(self, exc: Exception | None) -> None:
        if self._state == _UNTIL_CLOSE:
            self._state = _DONE
            self._finish(None)
            return
        if self._state != _DONE:
            self._finish(ConnectionLost(f"server closed the connection ({exc or 'EOF'})"))

    def _timeout(self, seconds: float) -> None:
        self.conn.close()
        self._finish(TimeoutError(f"no data from the server for {seconds:g} s"))

    # -- internals

    def _deliver(self, payload: bytes, now: int) -> None:
        sink = self._sink
        if sink is None:
            self._pending.append((payload, now))
        elif sink(payload, now):
            self._abort()

    def _abort(self) -> None:
        # The caller is done with this stream (cancel after N tokens): a real disconnect.
        self.conn.close()
        self._state = _DONE
        self._finish(None)

    def _finish(self, exc: BaseException | None) -> None:
        for future in (self._head, self._done):
            if not future.done():
                if exc is None:
                    future.set_result(None)
                else:
                    future.set_exception(exc)
                    # Marked retrieved: a future nobody awaits any more must not log
                    # "exception never retrieved"; an awaiting caller still gets it.
                    future.exception()
        self.pool._release(self)

    def _parse_head(self, data: bytes) -> bytes:
        buffer = self._buffer + data if self._buffer else data
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > _MAX_HEAD:
                    self.conn.close()
                    self._finish(ProtocolError("response head too large"))
                self._buffer = buffer
                return b""
            lines = buffer[:end].decode("latin-1").split("\r\n")
            rest = buffer[end + 4 :]
            parts = lines[0].split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
                self.conn.close()
                self._finish(ProtocolError(f"not an HTTP/1.1 status line: {lines[0][:80]!r}"))
                return b""
            status = int(parts[1])
            if 100 <= status < 200:
                buffer = rest  # an interim head (100 Continue): the real one follows
                continue
            break
        self._buffer = b""
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            self.headers[name.strip().lower()] = value.strip()
            headers[name.strip().lower()] = value.strip().lower()
        self.status = status
        self._keep_alive = parts[0] == "HTTP/1.1" and headers.get("connection") != "close"
        if "chunked" in headers.get("transfer-encoding", ""):
            self._state = _CHUNKED
        elif "content-length" in headers:
            self._length_left = int(headers["content-length"])
            self._state = _LENGTH
        else:
            self._state = _UNTIL_CLOSE
            self._keep_alive = False
        if not self._head.done():
            self._head.set_result(None)
        if self._state == _LENGTH and self._length_left == 0:
            self._state = _DONE
            self._finish(None)
        return rest

    def _dechunk(self, data: bytes) -> tuple[bytes, bool]:
        buffer = self._buffer + data if self._buffer else data
        pos = 0
        size = len(buffer)
        out: list[bytes] = []
        while pos < size:
            if self._chunk_left:
                take = min(self._chunk_left, size - pos)
                out.append(buffer[pos : pos + take])
                pos += take
                self._chunk_left -= take
                if self._chunk_left:
                    break
                self._need_crlf = True
            if self._need_crlf:
                if size - pos < 2:
                    break
                pos += 2
                self._need_crlf = False
            end = buffer.find(b"\r\n", pos)
            if end < 0:
                break
            line = buffer[pos:end]
            pos = end + 2
            if self._trailers:
                if not line:  # the blank line after the last chunk (and any trailers)
                    self._buffer = buffer[pos:]
                    return b"".join(out), True
                continue
            try:
                length = int(line.split(b";", 1)[0], 16)
            except ValueError:
                raise ProtocolError(f"bad chunk size line {line[:40]!r}") from None
            if length == 0:
                self._trailers = True
            else:
                self._chunk_left = length
        self._buffer = buffer[pos:]
        return b"".join(out), False


class Pool:
    """Keep-alive connections to one server, and the read-timeout watchdog of its responses."""

    def __init__(self, base_url: str, *, connect_timeout_s: float, read_timeout_s: float | None) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"base_url must be http:// or https://, not {base_url!r}")
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self.host_header = parts.netloc.rsplit("@", 1)[-1]
        self.prefix = parts.path.rstrip("/")
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.loop = asyncio.get_running_loop()
        self._idle: list[_Connection] = []
        self._active: set[Response] = set()
        self._watchdog: asyncio.Task[None] | None = None
        self._keeper: asyncio.Task[None] | None = None
        if read_timeout_s:
            self._watchdog = self.loop.create_task(self._watch())

    def _message(self, path: str, body: bytes, headers: dict[str, str]) -> bytes:
        lines = [
            f"POST {self.prefix}{path} HTTP/1.1",
            f"Host: {self.host_header}",
            f"Content-Length: {len(body)}",
        ]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body

    def _send(self, conn: _Connection, message: bytes) -> Response:
        response = Response(self, conn)
        conn.response = response
        self._active.add(response)
        assert conn.transport is not None
        response.written_ns = perf_ns()
        conn.transport.write(message)
        return response

    def send_nowait(self, path: str, body: bytes, headers: dict[str, str]) -> Response | None:
        """Send now on an idle keep-alive connection, without yielding to the loop; None if there is none.

        The load generator calls this from its dispatcher, so a request goes out
        in the same loop step that found it due, not one loop pass later.
        """
        conn = self._idle_connection()
        if conn is None:
            return None
        response = self._send(conn, self._message(path, body, headers))
        response.reused = True
        return response

    async def post(
        self,
        path: str,
        body: bytes,
        headers: dict[str, str],
        *,
        on_written: Callable[[int], None] | None = None,
    ) -> Response:
        """Send a POST and return once the response head is in (status known).

        ``on_written`` gets the time the bytes went to the socket, once a connection is open
        (the first attempt's: a retry resends what the server never processed).
        """
        message = self._message(path, body, headers)
        for attempt in (0, 1):
            conn, reused = await self._acquire()
            response = self._send(conn, message)
            if on_written is not None and attempt == 0:
                on_written(response.written_ns)
            try:
                await response._head
                return response
            except ConnectionLost:
                # A reused connection the server had just closed: nothing was
                # processed, so one retry on a fresh connection is safe.
                if reused and attempt == 0 and response.bytes_seen == 0:
                    continue
                raise
        raise AssertionError("unreachable")

    def _idle_connection(self) -> _Connection | None:
        now = perf_ns()
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and conn.reusable and now - conn.idle_since_ns < _IDLE_REUSE_NS:
                return conn
            conn.close()
        return None

    async def _acquire(self) -> tuple[_Connection, bool]:
        conn = self._idle_connection()
        if conn is not None:
            return conn, True
        return await self._open(self.connect_timeout_s), False

    async def _open(self, timeout_s: float) -> _Connection:
        _transport, conn = await asyncio.wait_for(
            self.loop.create_connection(
                _Connection,
                self.host,
                self.port,
                ssl=self.ssl,
                server_hostname=self.host if self.ssl else None,
            ),
            timeout_s,
        )
        assert conn is not None
        return conn

    async def warm(self, count: int, *, timeout_s: float = 2.0) -> int:
        """Open idle connections until ``count`` wait in the pool; how many are there.

        A load generator calls this before its first request is due, so that a burst
        goes out on open connections instead of waiting on connects.
        """
        await self._open_idle(count - len(self._idle), timeout_s)
        return len(self._idle)

    def keep_warm(self, spare: int) -> None:
        """From now on keep ``spare`` fresh idle connections, opened in the background.

        A connection idle past the reuse limit is replaced (the server may close it any
        moment). Connects that fail back off, up to 2 s apart; the requests themselves
        record whatever is wrong with the server.
        """
        if spare > 0 and self._keeper is None:
            self._keeper = self.loop.create_task(self._keep(spare))

    async def _keep(self, spare: int) -> None:
        backoff_s = _KEEP_POLL_S
        while True:
            await asyncio.sleep(backoff_s)
            now = perf_ns()
            fresh = []
            for conn in self._idle:
                if conn.closed or not conn.reusable:
                    continue
                if now - conn.idle_since_ns >= _IDLE_REUSE_NS - _KEEP_MARGIN_NS:
                    conn.close()
                    continue
                fresh.append(conn)
            self._idle[:] = fresh
            opened_all = await self._open_idle(spare - len(fresh), self.connect_timeout_s)
            backoff_s = _KEEP_POLL_S if opened_all else min(2.0, backoff_s * 2)

    async def _open_idle(self, count: int, timeout_s: float) -> bool:
        """Open ``count`` connections at once and park them idle; False when any connect failed."""
        if count <= 0:
            return True
        opened = await asyncio.gather(*(self._open(timeout_s) for _ in range(count)), return_exceptions=True)
        now = perf_ns()
        for conn in opened:
            if isinstance(conn, _Connection):
                conn.idle_since_ns = now
                # At the bottom: connections a stream just released are reused first.
                self._idle.insert(0, conn)
        return all(isinstance(conn, _Connection) for conn in opened)

    def _release(self, response: Response) -> None:
        if response not in self._active:
            return
        self._active.discard(response)
        conn = response.conn
        if conn.response is response:
            conn.response = None
        if response._state == _DONE and response._keep_alive and conn.reusable and not conn.closed:
            conn.idle_since_ns = perf_ns()
            self._idle.append(conn)
        else:
            conn.close()

    async def _watch(self) -> None:
        timeout_s = self.read_timeout_s or 0.0
        limit_ns = round(timeout_s * 1e9)
        while True:
            await asyncio.sleep(min(0.05, timeout_s / 4))
            now = perf_ns()
            for response in [r for r in self._active if now - r.last_data_ns > limit_ns]:
                response._timeout(timeout_s)

    def close(self) -> None:
        for task in (self._watchdog, self._keeper):
            if task is not None:
                task.cancel()
        for conn in self._idle:
            conn.close()
        self._idle.clear()
        for response in list(self._active):
            response.conn.close()
