"""The replay in child processes: one protocol, for one process or several.

Why a process of its own: the worker that drives a run also writes records to the
database and parses /metrics scrapes, Python work that holds the interpreter lock for
tens of milliseconds at a time. In the same process that shows up as dispatch lag
(measured: p99 73 ms at 1 req/s against the CPU engine), so the send loop gets its own
interpreter and the parent only receives finished records.

Why several: one event loop on one core can only keep so many streams on schedule; past
that, its dispatch lag grows with every token frame it reads. The parent then deals the
requests round-robin to ``processes`` children, each running the ordinary single-loop
replay on its share. ``time.perf_counter_ns`` is CLOCK_MONOTONIC on Linux, one clock for
every process of the machine, so all children schedule against one origin and their
records are directly comparable; percentiles are computed from the merged records.

The protocol (JSON lines both ways; records in their stored form,
:meth:`RequestRecord.to_json`). Children are plain subprocesses, ``python -m
workers.replay.shard``, not multiprocessing: Celery's pool processes may not fork
children of that kind.

1. The parent starts every child and writes its job on its stdin:
   ``{"requests": [...], "options": {...}}`` (``options`` as :class:`_Replay` takes them,
   with ``rehearsal`` for a recovery rehearsal's client).
2. Each child first asks for the real-time scheduling class (:func:`runtime.realtime_send_loop`),
   then builds its replay, opens its spare connections and answers
   ``{"ready": true}``.
3. Once every child is ready, the parent writes ``{"origin_ns": N}`` to each (the
   caller's origin, or one a moment ahead): no child start-up is counted as lateness.
4. A child prints ``{"batch": [...], "sent": n}`` as its records finish, ``{"sent": n}``
   as it sends (for the caller's progress), then
   ``{"done": {...}}`` (stopped, notes, its longest loop stall, its scheduling class, a
   rehearsal's facts), or
   ``{"error": "..."}``.
5. Closing a child's stdin asks it to stop (the caller's ``stop``); a parent that dies
   closes it too. Requests of a child that dies before reporting them are marked not
   sent, with the reason.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from workers.replay.batches import BatchCallback, Batcher, ProgressCallback
from workers.replay.client import _Replay, drive
from workers.replay.records import RequestRecord
from workers.replay.rehearsal_client import RehearsalReplay
from workers.replay.request import new_record
from workers.replay.result import ReplayResult, summarise
from workers.replay.runtime import realtime_send_loop

perf_ns = time.perf_counter_ns

# From the last child's "ready" to the origin: time for the origin line to reach every child.
_ORIGIN_LEAD_NS = 100_000_000
# How long children may take to start Python, build their records and open connections.
_READY_TIMEOUT_S = 120.0
# How often a child sends its finished records up.
_FLUSH_S = 0.2
# How long a child asked to stop may take to close its streams and report before it is killed.
_STOP_GRACE_S = 30.0


class ReplayProcessError(RuntimeError):
    """A child process failed before it could report its run."""


class Sharded:
    """The parent's view of a run in child processes: what Batcher and summarise read."""

    def __init__(
        self, requests: Sequence[dict[str, Any]], options: dict[str, Any], stop: threading.Event
    ) -> None:
        self.run_id = options["run_id"]
        self.warmup_ns = round(options["warmup_s"] * 1e9)
        self.observation_ns = round(options["observation_s"] * 1e9)
        self.total = len(requests)
        self.extra_body = dict(options.get("extra_body") or {})
        self.output_mode = str(options.get("output_mode") or "exact")
        self.stop = stop
        self.finished: collections.deque[RequestRecord] = collections.deque()
        self.records: list[RequestRecord] = []
        self.notes: list[str] = []
        self.stopped = False
        self.loop_stall_max_ns = 0
        self.send_priority: str | None = None
        self.sent_by_shard: dict[int, int] = {}
        self._lock = threading.Lock()

    @property
    def sent_count(self) -> int:
        return sum(self.sent_by_shard.values())

    def take(self, shard: int, batch: list[RequestRecord], sent: int) -> None:
        with self._lock:
            self.records.extend(batch)
        self.finished.extend(batch)
        self.sent_by_shard[shard] = sent


class _Child:
    """One child process and what it said."""

    def __init__(self, k: int, share: list[dict[str, Any]], env: dict[str, str]) -> None:
        self.k = k
        self.share = share
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "workers.replay.shard"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        self.ready = threading.Event()
        self.closing: dict[str, Any] | None = None
        self.error = ""

    def write(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError, ValueError):  # a child that died already: reported below
            self.proc.stdin.write(json.dumps(message, separators=(",", ":")) + "\n")
            self.proc.stdin.flush()

    def close_stdin(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()

    def read(self, state: Sharded) -> None:
        assert self.proc.stdout is not None
        with contextlib.suppress(OSError, ValueError):
            for line in self.proc.stdout:
                message = json.loads(line)
                if "batch" in message:
                    state.take(
                        self.k, [RequestRecord.from_json(r) for r in message["batch"]], message["sent"]
                    )
                elif "sent" in message:
                    state.sent_by_shard[self.k] = message["sent"]
                elif "ready" in message:
                    self.ready.set()
                elif "done" in message:
                    self.closing = message["done"]
                    state.sent_by_shard[self.k] = self.closing.get("sent", 0)
                elif "error" in message:
                    self.error = message["error"]
        self.ready.set()  # a child that ended before it was ready must not hold the others up


def run_in_processes(
    requests: Sequence[dict[str, Any]],
    *,
    options: dict[str, Any],
    processes: int,
    tolerance_ms: float,
    on_batch: BatchCallback | None,
    batch_interval_s: float,
    on_progress: ProgressCallback | None,
    stop: threading.Event,
    origin_ns: int | None = None,
) -> ReplayResult:
    """Replay ``requests`` in ``processes`` children (checked by :func:`workers.replay.run.run_replay`).

    ``options`` are :class:`_Replay`'s, plus ``rehearsal`` for a recovery rehearsal's client.
    """
    # Keep each request's trace index: a child only sees its own share.
    indexed = [r if "index" in r else {**r, "index": i} for i, r in enumerate(requests)]
    state = Sharded(indexed, options, stop)
    batcher = Batcher(state, on_batch=on_batch, on_progress=on_progress, interval_s=batch_interval_s)
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    started = perf_ns()
    children: list[_Child] = []
    readers: list[threading.Thread] = []
    started_together = False
    batcher.start()
    try:
        children = [_Child(k, indexed[k::processes], env) for k in range(processes)]
        for child in children:
            readers.append(threading.Thread(target=child.read, args=(state,), daemon=True))
            readers[-1].start()
            child.write({"requests": child.share, "options": options})
        started_together = _start_together(children, stop, origin_ns)
        _wait(children, stop, stop_now=not started_together)
        for reader in readers:
            reader.join()
    finally:
        for child in children:
            child.close_stdin()
            if child.proc.poll() is None:
                child.proc.kill()
            child.proc.wait()
        _mark_lost(state, children)
        batcher.finish()
    if batcher.error is not None:
        raise batcher.error
    if not started_together and not stop.is_set():
        why = "; ".join(f"process {c.k}: {c.error}" for c in children if c.error) or "not ready"
        raise ReplayProcessError(f"the load generator's processes never started sending: {why}")
    if processes == 1 and children and children[0].closing is None:
        child = children[0]
        raise ReplayProcessError(
            child.error or f"the replay process ended without a result (exit {child.proc.returncode})"
        )
    state.stopped = stop.is_set() or any(c.closing and c.closing.get("stopped") for c in children)
    rehearsal = None
    for child in children:
        closing = child.closing or {}
        state.notes.extend(closing.get("notes", []))
        state.loop_stall_max_ns = max(state.loop_stall_max_ns, closing.get("loop_stall_max_ns", 0))
        priority = closing.get("send_priority")
        if priority and state.send_priority in (None, "realtime"):
            state.send_priority = priority  # any child left in the normal class says so
        rehearsal = rehearsal or closing.get("rehearsal")
        if child.error:
            state.notes.append(f"load generator process {child.k}: {child.error}")
    state.records.sort(key=lambda r: r.index)
    if processes > 1:
        state.notes.append(f"send loop spread over {processes} processes")
    result = summarise(state, tolerance_ms=tolerance_ms, duration_s=(perf_ns() - started) / 1e9)
    result.rehearsal = rehearsal
    return result


def _start_together(children: list[_Child], stop: threading.Event, origin_ns: int | None) -> bool:
    """Step 3: once every child is ready (or gone), give them all one origin; False when the
    caller stopped first, or a child was not ready in time (each such child says so)."""
    deadline = time.monotonic() + _READY_TIMEOUT_S
    for child in children:
        while not child.ready.wait(0.02):
            if stop.is_set():
                return False
            if time.monotonic() > deadline:
                for late in children:
                    if not late.ready.is_set():
                        late.error = late.error or f"not ready within {_READY_TIMEOUT_S:g} s"
                return False
    origin = origin_ns if origin_ns is not None else perf_ns() + _ORIGIN_LEAD_NS
    for child in children:
        child.write({"origin_ns": origin})
    return True


def _wait(children: list[_Child], stop: threading.Event, *, stop_now: bool = False) -> None:
    """Until every child ends. The caller's stop (or ``stop_now``) closes their stdin (step 5);
    a child still running ``_STOP_GRACE_S`` later is killed, its unreported requests marked lost."""
    stopped_at: float | None = None
    while any(child.proc.poll() is None for child in children):
        if stopped_at is None and (stop_now or stop.is_set()):
            for child in children:
                child.close_stdin()
            stopped_at = time.monotonic()
        if stopped_at is not None and time.monotonic() - stopped_at > _STOP_GRACE_S:
            for child in children:
                if child.proc.poll() is None:
                    child.error = (
                        child.error or f"still running {_STOP_GRACE_S:g} s after it was asked to stop"
                    )
                    child.proc.kill()
        time.sleep(0.02)


def _mark_lost(state: Sharded, children: list[_Child]) -> None:
    # Requests of a child that died before reporting them: not sent, as far as anyone can tell.
    seen = {r.index for r in state.records}
    for child in children:
        if child.closing is not None:
            continue
        code = child.proc.returncode
        state.notes.append(f"load generator process {child.k} ended without reporting (exit code {code})")
        lost = []
        for request in child.share:
            if request["index"] in seen:
                continue
            record = new_record(
                run_id=state.run_id, warmup_ns=state.warmup_ns, position=request["index"], request=request
            )
            record.error = f"load generator process exited ({code}) before reporting this request"
            lost.append(record)
        state.take(child.k, lost, state.sent_by_shard.get(child.k, 0))


def _child_main() -> int:
    # First, before any thread starts: every thread of this process inherits the class.
    priority = realtime_send_loop()
    stdin = sys.stdin
    out: IO[str] = sys.stdout
    sys.stdout = sys.stderr  # nothing else may write to the protocol's stream
    lock = threading.Lock()

    def emit(message: dict[str, Any]) -> None:
        with lock:
            out.write(json.dumps(message, separators=(",", ":")) + "\n")
            out.flush()

    stop = threading.Event()

    def watch_stdin() -> None:
        stdin.read()  # returns at EOF: the parent closed the pipe, or died
        stop.set()

    def origin() -> int:
        emit({"ready": True})
        line = stdin.readline()
        if not line:  # closed before the start: run nothing, report every request unsent
            stop.set()
            return perf_ns()
        threading.Thread(target=watch_stdin, daemon=True).start()
        return int(json.loads(line)["origin_ns"])

    try:
        job = json.loads(stdin.readline())
        options = dict(job["options"])
        rehearsal = options.pop("rehearsal", None)
        replay: _Replay
        if rehearsal is not None:
            replay = RehearsalReplay(
                job["requests"], rehearsal=rehearsal, **options, stop=stop, origin_source=origin
            )
        else:
            replay = _Replay(job["requests"], **options, stop=stop, origin_source=origin)
        said = [0]

        def progress(sent: int, _total: int) -> None:
            if sent != said[0]:
                said[0] = sent
                emit({"sent": sent})

        drive(
            replay,
            on_batch=lambda batch: emit({"batch": [r.to_json() for r in batch], "sent": replay.sent_count}),
            on_progress=progress,
            batch_interval_s=_FLUSH_S,
            tolerance_ms=float("inf"),  # judged by the parent, over every child's records
        )
    except Exception as exc:  # reported to the parent as data, which raises it there
        with contextlib.suppress(OSError, ValueError):
            emit({"error": f"{type(exc).__name__}: {exc}"})
        return 1
    closing = {
        "stopped": replay.stopped,
        "notes": replay.notes,
        "sent": replay.sent_count,
        "loop_stall_max_ns": replay.loop_stall_max_ns,
        "send_priority": priority,
        "rehearsal": replay.facts() if isinstance(replay, RehearsalReplay) else None,
    }
    emit({"done": closing})
    return 0


if __name__ == "__main__":
    sys.exit(_child_main())
