"""A small OpenAI-compatible streaming server with a known timing, for tests and benchmarks.

It answers ``/v1/completions`` and ``/v1/chat/completions`` with SSE frames
the way vLLM does (cumulative usage on every frame when asked, a usage-only
frame, ``data: [DONE]``), after a configured time to first token and
inter-token delay, and logs what it really did for every request: when the
request's first byte arrived, when it wrote its first and last token, and
whether the client hung up. Comparing a client's numbers with this log is how
the client's own error is measured.

It is a bare HTTP/1.1 protocol on the event loop (keep-alive, Content-Length
request bodies, chunked responses) rather than a web framework, so that at
hundreds of streams per second the mock is not the thing that falls behind.
Token writes are scheduled at absolute times from the request's arrival, so
timer rounding does not accumulate along a stream.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

perf_ns = time.perf_counter_ns

_HEADER_END = b"\r\n\r\n"
_MAX_HEADER = 64 * 1024
# The body fields a request's log entry keeps (what tests check the client sent).
SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
)


@dataclass
class Behaviour:
    """How the server answers; per-request overrides use the same fields."""

    ttft_s: float = 0.01
    itl_s: float = 0.005
    tokens_per_chunk: int = 1
    # Answer with this HTTP status and a JSON error body instead of a stream.
    status: int = 200
    # Accept the request and never answer (for client timeouts).
    hang: bool = False
    # Close the connection after writing this many tokens (a server crash mid-stream).
    drop_after_tokens: int | None = None
    # Leave usage out of the token frames (servers without continuous usage stats).
    no_usage: bool = False
    # Write a ": keep-alive" comment before every frame.
    comments: bool = False
    # Write each frame in two pieces, split mid-line, 1 ms apart.
    split_frames: bool = False
    # Tokens to stream when the request names no max_tokens.
    default_output_tokens: int = 32


@dataclass
class RequestLog:
    """What the server did for one request; times are perf_counter_ns (CLOCK_MONOTONIC)."""

    seq: int
    tag: str | None
    # Which connection (per server process) carried the request: shows keep-alive reuse.
    conn: int
    path: str
    arrival_ns: int
    status: int = 200
    tokens_planned: int = 0
    first_write_ns: int | None = None
    last_write_ns: int | None = None
    tokens_written: int = 0
    chunks_written: int = 0
    completed: bool = False
    disconnected: bool = False
    disconnect_ns: int | None = None
    # The request's sampling fields (temperature, top_p, seed, ...), as the body carried them.
    sampling: dict[str, Any] = field(default_factory=dict)
    # Every token-frame write time, when MockConfig.record_writes is on.
    writes_ns: list[int] | None = None
    # The X-Request-Id header (the id vLLM would give the request and its span).
    request_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class MockConfig:
    model: str = "mock"
    default: Behaviour = field(default_factory=Behaviour)
    # Behaviour by request index, taken from the X-Tailtune-Request header ("run:index").
    by_index: dict[int, Behaviour] = field(default_factory=dict)
    # Keep a RequestLog per request (benchmarks on long runs may turn this off).
    keep_log: bool = True
    # Log every frame's write time (the true inter-token gaps, for benchmarks).
    record_writes: bool = False


class _State:
    def __init__(self, config: MockConfig) -> None:
        self.config = config
        self.log: list[RequestLog] = []
        self.seq = 0
        self.connections = 0
        # When each connection (by its number) was accepted, perf_counter_ns.
        self.opened_ns: dict[int, int] = {}


class _Stream:
    """One streaming response being written on a schedule."""

    __slots__ = (
        "proto",
        "entry",
        "behaviour",
        "chat",
        "usage",
        "final_usage",
        "prompt_tokens",
        "tokens",
        "written",
        "handle",
        "pending",
        "ending",
    )

    def __init__(
        self,
        proto: _Protocol,
        entry: RequestLog,
        behaviour: Behaviour,
        *,
        chat: bool,
        usage: bool,
        final_usage: bool,
        prompt_tokens: int,
        tokens: int,
    ) -> None:
        self.proto = proto
        self.entry = entry
        self.behaviour = behaviour
        self.chat = chat
        # Cumulative usage on every frame (continuous_usage_stats), unless the behaviour drops it.
        self.usage = usage and not behaviour.no_usage
        # A closing usage-only frame (include_usage).
        self.final_usage = final_usage
        self.prompt_tokens = prompt_tokens
        self.tokens = tokens
        self.written = 0
        self.handle: asyncio.TimerHandle | None = None
        self.pending: bytes | None = None
        self.ending = False

    def start(self) -> None:
        head = (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        self.proto.transport.write(head)
        if self.chat:
            # vLLM opens a chat stream with an empty assistant-role frame.
            self._frame({"role": "assistant", "content": ""}, None, 0)
        self._schedule(self.entry.arrival_ns + round(self.behaviour.ttft_s * 1e9))

    def _schedule(self, target_ns: int) -> None:
        loop = self.proto.loop
        self.handle = loop.call_later(max(0.0, (target_ns - perf_ns()) / 1e9), self._tick)

    def _tick(self) -> None:
        self.handle = None
        proto = self.proto
        if proto.closed:
            return
        b = self.behaviour
        n = min(b.tokens_per_chunk, self.tokens - self.written)
        if b.drop_after_tokens is not None and self.written + n > b.drop_after_tokens:
            n = b.drop_after_tokens - self.written
            if n > 0:
                self._tokens(n)
            proto.transport.close()
            return
        self._tokens(n)
        if self.written >= self.tokens:
            self._finish()
            return
        # Next frame at arrival + ttft + (tokens so far) * itl: absolute, so no drift.
        first = self.entry.arrival_ns + round(b.ttft_s * 1e9)
        self._schedule(first + round(self.written * b.itl_s * 1e9))

    def _tokens(self, n: int) -> None:
        self.written += n
        text = " tok" * n
        reason = "length" if self.written >= self.tokens else None
        now = perf_ns()
        entry = self.entry
        if entry.first_write_ns is None:
            entry.first_write_ns = now
        entry.last_write_ns = now
        if entry.writes_ns is not None:
            entry.writes_ns.append(now)
        entry.tokens_written = self.written
        entry.chunks_written += 1
        self._frame({"content": text} if self.chat else text, reason, self.written)

    def _frame(self, payload: Any, reason: str | None, completion_tokens: int) -> None:
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "delta": payload, "logprobs": None, "finish_reason": reason}
            obj: dict[str, Any] = {"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 0}
        else:
            choice = {
                "index": 0,
                "text": payload,
                "logprobs": None,
                "finish_reason": reason,
                "stop_reason": None,
            }
            obj = {"id": "cmpl-mock", "object": "text_completion", "created": 0}
        obj["model"] = self.proto.state.config.model
        obj["choices"] = [choice]
        if self.usage:
            obj["usage"] = self._usage(completion_tokens)
        self._write_event(json.dumps(obj, separators=(",", ":")))

    def _usage(self, completion_tokens: int) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
        }

    def _write_event(self, data: str) -> None:
        event = b"data: " + data.encode() + b"\n\n"
        if self.behaviour.comments:
            event = b": keep-alive\n\n" + event
        transport = self.proto.transport
        if self.pending is not None:
            # The second half of a split frame is still to come: keep the order.
            self.pending += event
        elif self.behaviour.split_frames and len(event) > 8:
            cut = len(event) // 2
            transport.write(b"%x\r\n%s\r\n" % (cut, event[:cut]))
            self.pending = event[cut:]
            self.proto.loop.call_later(0.001, self._write_pending)
        else:
            transport.write(b"%x\r\n%s\r\n" % (len(event), event))

    def _write_pending(self) -> None:
        rest, self.pending = self.pending, None
        if rest and not self.proto.closed:
            self.proto.transport.write(b"%x\r\n%s\r\n" % (len(rest), rest))
        if self.ending:
            self._end()

    def _finish(self) -> None:
        obj = {
            "id": "mock",
            "object": "text_completion",
            "created": 0,
            "model": self.proto.state.config.model,
        }
        obj["choices"] = []
        if self.final_usage:
            obj["usage"] = self._usage(self.written)
            self._write_event(json.dumps(obj, separators=(",", ":")))
        self._write_event("[DONE]")
        if self.pending is not None:
            self.ending = True  # _write_pending ends the response after the last piece
        else:
            self._end()

    def _end(self) -> None:
        if self.proto.closed:
            return
        self.proto.transport.write(b"0\r\n\r\n")
        self.entry.completed = True
        self.proto.stream = None
        self.proto.request_done()

    def abort(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None


class _Protocol(asyncio.Protocol):
    def __init__(self, state: _State) -> None:
        self.state = state
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport
        self.buffer = b""
        self.arrival_ns: int | None = None
        self.closed = False
        self.stream: _Stream | None = None
        self.current: RequestLog | None = None
        self.keep_alive = True
        self.conn = state.connections
        state.connections += 1

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.state.opened_ns[self.conn] = time.perf_counter_ns()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.stream is not None:
            self.stream.abort()
        entry = self.current
        if entry is not None and not entry.completed:
            entry.disconnected = True
            entry.disconnect_ns = perf_ns()

    def data_received(self, data: bytes) -> None:
        if self.arrival_ns is None:
            self.arrival_ns = perf_ns()
        self.buffer += data
        if self.current is None:  # HTTP/1.1 clients wait for the response before the next request
            self._parse()

    def _parse(self) -> None:
        end = self.buffer.find(_HEADER_END)
        if end < 0:
            if len(self.buffer) > _MAX_HEADER:
                self.transport.close()
            return
        head = self.buffer[:end].decode("latin-1")
        lines = head.split("\r\n")
        try:
            method, target, _version = lines[0].split(" ", 2)
        except ValueError:
            self.transport.close()
            return
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length") or 0)
        if len(self.buffer) < end + 4 + length:
            return  # body not complete yet
        body = self.buffer[end + 4 : end + 4 + length]
        self.buffer = self.buffer[end + 4 + length :]
        arrival = self.arrival_ns or perf_ns()
        self.arrival_ns = None
        self.keep_alive = headers.get("connection", "").lower() != "close"
        self._handle(method, target.split("?", 1)[0], headers, body, arrival)

    def request_done(self) -> None:
        self.current = None
        if not self.keep_alive:
            self.transport.close()
        elif self.buffer:
            self.arrival_ns = perf_ns()
            self._parse()

    def _simple(self, status: int, payload: Any) -> None:
        body = json.dumps(payload).encode()
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error"}.get(
            status, "Error"
        )
        self.transport.write(
            b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (status, reason.encode(), len(body), body)
        )
        self.request_done()

    def _handle(self, method: str, path: str, headers: dict[str, str], body: bytes, arrival: int) -> None:
        config = self.state.config
        if method == "GET" and path in ("/health", "/ping"):
            self._simple(200, {})
            return
        if method == "GET" and path == "/v1/models":
            model = {
                "id": config.model,
                "object": "model",
                "created": 0,
                "owned_by": "mock",
                "root": config.model,
            }
            self._simple(200, {"object": "list", "data": [model]})
            return
        if method != "POST" or path not in ("/v1/completions", "/v1/chat/completions"):
            self._simple(404, {"error": {"message": f"no route {method} {path}"}})
            return
        state = self.state
        tag = headers.get("x-tailtune-request")
        entry = RequestLog(
            seq=state.seq,
            tag=tag,
            conn=self.conn,
            path=path,
            arrival_ns=arrival,
            request_id=headers.get("x-request-id"),
        )
        if config.record_writes:
            entry.writes_ns = []
        state.seq += 1
        if config.keep_log:
            state.log.append(entry)
        self.current = entry
        behaviour = config.default
        if tag and config.by_index:
            index = tag.rpartition(":")[2]
            if index.isdigit():
                behaviour = config.by_index.get(int(index), behaviour)
        try:
            request = json.loads(body or b"{}")
        except ValueError:
            entry.status = 400
            self._simple(400, {"error": {"message": "body is not JSON"}})
            return
        entry.sampling = {k: request[k] for k in SAMPLING_FIELDS if k in request}
        if behaviour.hang:
            return
        if behaviour.status != 200:
            entry.status = behaviour.status
            self._simple(behaviour.status, {"error": {"message": "mock error", "code": behaviour.status}})
            return
        chat = path.endswith("/chat/completions")
        tokens = (
            request.get("max_completion_tokens")
            or request.get("max_tokens")
            or behaviour.default_output_tokens
        )
        prompt = request.get("prompt") if not chat else request.get("messages")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            prompt_tokens = len(prompt)
        else:
            prompt_tokens = len(json.dumps(prompt).split())
        entry.tokens_planned = int(tokens)
        options = request.get("stream_options") or {}
        usage = bool(options.get("continuous_usage_stats"))
        if not request.get("stream"):
            self._non_streaming(entry, behaviour, chat, prompt_tokens, int(tokens))
            return
        stream = _Stream(
            self,
            entry,
            behaviour,
            chat=chat,
            usage=usage,
            final_usage=bool(options.get("include_usage")),
            prompt_tokens=prompt_tokens,
            tokens=int(tokens),
        )
        self.stream = stream
        stream.start()

    def _non_streaming(
        self, entry: RequestLog, behaviour: Behaviour, chat: bool, prompt_tokens: int, tokens: int
    ) -> None:
        delay_s = behaviour.ttft_s + behaviour.itl_s * max(0, tokens - 1)

        def answer() -> None:
            if self.closed:
                return
            now = perf_ns()
            entry.first_write_ns = entry.last_write_ns = now
            entry.tokens_written = tokens
            entry.completed = True
            text = " tok" * tokens
            choice: dict[str, Any] = (
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                if chat
                else {"index": 0, "text": text, "finish_reason": "length"}
            )
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": tokens,
                "total_tokens": prompt_tokens + tokens,
            }
            self._simple(
                200, {"id": "mock", "object": "text_completion", "choices": [choice], "usage": usage}
            )

        self.loop.call_later(delay_s, answer)


class MockServer:
    """The mock on 127.0.0.1 in a background thread with its own event loop.

    ``with MockServer(config) as server: ... server.base_url ... server.log``
    """

    def __init__(self, config: MockConfig | None = None, *, port: int = 0, reuse_port: bool = False) -> None:
        self.config = config or MockConfig()
        self._state = _State(self.config)
        self._port = port
        self._reuse_port = reuse_port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> list[RequestLog]:
        return self._state.log

    def opened_ns(self, conn: int) -> int:
        """When the server accepted connection ``conn`` (perf_counter_ns)."""
        return self._state.opened_ns[conn]

    def entry(self, index: int) -> RequestLog | None:
        """The log entry of the request with this trace index (via its X-Tailtune-Request tag)."""
        for entry in self._state.log:
            if entry.tag and entry.tag.rpartition(":")[2] == str(index):
                return entry
        return None

    def start(self) -> MockServer:
        self._thread = threading.Thread(target=self._run, name="mock-openai", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        if not self.port:
            raise RuntimeError("mock server did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> MockServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        sock = bind_socket(port=self._port, reuse_port=self._reuse_port)
        self._server = loop.run_until_complete(loop.create_server(lambda: _Protocol(self._state), sock=sock))
        self.port = sock.getsockname()[1]
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()


def bind_socket(*, port: int, reuse_port: bool = False, host: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        # Several mock processes share one port; the kernel spreads connections.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(4096)
    sock.setblocking(False)
    return sock


async def serve_forever(*, config: MockConfig, sock: socket.socket) -> list[RequestLog]:
    """Serve on an already bound socket until cancelled; returns the log (for benchmark processes)."""
    state = _State(config)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Protocol(state), sock=sock)
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        pass
    finally:
        server.close()
    return state.log
