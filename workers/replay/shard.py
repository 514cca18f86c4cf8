"""The send loop spread over several processes that share one origin.

One event loop on one core can only keep so many streams on schedule; past
that, its dispatch lag grows with every token frame it has to read. Here the
parent deals the requests round-robin to ``processes`` children, each a
``python -m workers.replay.shard`` subprocess running the ordinary
single-loop replay on its share. ``time.perf_counter_ns`` is CLOCK_MONOTONIC
on Linux, one clock for every process of the machine, so the parent fixes
the origin and every child schedules against it; records from all children
are directly comparable.

Parent and children talk over pipes with pickle (both sides are this
module): the job goes down stdin, records come back on stdout in batches as
they finish, then a closing message. SIGTERM asks a child to stop (the
caller's ``stop``); a child that dies leaves its missing requests marked
not sent, with the reason.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

from workers.replay.batches import BatchCallback, Batcher, ProgressCallback
from workers.replay.client import _Replay, uvloop
from workers.replay.records import RequestRecord
from workers.replay.request import new_record
from workers.replay.result import ReplayResult, summarise

perf_ns = time.perf_counter_ns

# Time for the children to start Python, import aiohttp and warm a connection
# before the first request is due; a child that is later than this shows up
# as dispatch lag, never as hidden delay.
_START_LEAD_NS = 1_500_000_000
# How often a child sends its finished records up.
_FLUSH_S = 0.2


class Sharded:
    """The parent's view of a sharded run: what Batcher and summarise read."""

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


def run_sharded(
    requests: Sequence[dict[str, Any]],
    *,
    options: dict[str, Any],
    processes: int,
    tolerance_ms: float,
    on_batch: BatchCallback | None,
    batch_interval_s: float,
    on_progress: ProgressCallback | None,
    stop: threading.Event,
) -> ReplayResult:
    # Keep each request's trace index: a child only sees its own share.
    indexed = [r if "index" in r else {**r, "index": i} for i, r in enumerate(requests)]
    shards = [indexed[k::processes] for k in range(processes)]
    state = Sharded(indexed, options, stop)
    batcher = Batcher(state, on_batch=on_batch, on_progress=on_progress, interval_s=batch_interval_s)
    started = perf_ns()
    origin_ns = started + _START_LEAD_NS
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    children: list[subprocess.Popen[bytes]] = []
    readers: list[threading.Thread] = []
    closing: dict[int, dict[str, Any]] = {}
    batcher.start()
    try:
        for k, shard in enumerate(shards):
            child = subprocess.Popen(
                [sys.executable, "-m", "workers.replay.shard"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
            )
            children.append(child)
            job = {"requests": shard, "options": options, "origin_ns": origin_ns}
            assert child.stdin is not None and child.stdout is not None
            child.stdin.write(pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL))
            child.stdin.close()
            reader = threading.Thread(target=_read_child, args=(k, child.stdout, state, closing), daemon=True)
            reader.start()
            readers.append(reader)
        signalled = False
        while any(child.poll() is None for child in children):
            if stop.is_set() and not signalled:
                for child in children:
                    with contextlib.suppress(ProcessLookupError):
                        child.send_signal(signal.SIGTERM)
                signalled = True
            time.sleep(0.02)
        for reader in readers:
            reader.join()
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
        _mark_lost(state, shards, children, closing)
        batcher.finish()
    if batcher.error is not None:
        raise batcher.error
    state.stopped = stop.is_set() or any(c.get("stopped") for c in closing.values())
    for k in sorted(closing):
        state.notes.extend(closing[k].get("notes", []))
    state.records.sort(key=lambda r: r.index)
    state.notes.append(f"send loop spread over {processes} processes")
    return summarise(state, tolerance_ms=tolerance_ms, duration_s=(perf_ns() - started) / 1e9)


def _read_child(shard: int, stream: BinaryIO, state: Sharded, closing: dict[int, dict[str, Any]]) -> None:
    with contextlib.suppress(EOFError, pickle.UnpicklingError, OSError):
        while True:
            kind, payload, sent = pickle.load(stream)
            if kind == "records":
                state.take(shard, payload, sent)
            elif kind == "done":
                state.sent_by_shard[shard] = sent
                closing[shard] = payload


def _mark_lost(
    state: Sharded,
    shards: list[list[dict[str, Any]]],
    children: list[subprocess.Popen[bytes]],
    closing: dict[int, dict[str, Any]],
) -> None:
    # Requests of a child that died before reporting them: not sent, as far as anyone can tell.
    seen = {r.index for r in state.records}
    for k, shard in enumerate(shards):
        if k in closing:
            continue
        code = children[k].returncode if k < len(children) else None
        state.notes.append(f"load generator process {k} ended without reporting (exit code {code})")
        lost = []
        for request in shard:
            if request["index"] in seen:
                continue
            record = new_record(
                run_id=state.run_id, warmup_ns=state.warmup_ns, position=request["index"], request=request
            )
            record.error = f"load generator process exited ({code}) before reporting this request"
            lost.append(record)
        state.take(k, lost, state.sent_by_shard.get(k, 0))


def _child_main() -> None:
    job = pickle.load(sys.stdin.buffer)
    out = sys.stdout.buffer
    # Nothing else may write to the pickle stream.
    sys.stdout = sys.stderr
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    replay = _Replay(job["requests"], **job["options"], stop=stop, origin_ns=job["origin_ns"])
    lock = threading.Lock()

    def flush() -> None:
        batch = []
        with contextlib.suppress(IndexError):
            while True:
                batch.append(replay.finished.popleft())
        if batch:
            with lock:
                pickle.dump(("records", batch, replay.sent_count), out, protocol=pickle.HIGHEST_PROTOCOL)
                out.flush()

    done = threading.Event()

    def pump() -> None:
        while not done.wait(_FLUSH_S):
            flush()

    pumper = threading.Thread(target=pump, daemon=True)
    pumper.start()
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop if uvloop else None) as runner:
            runner.run(replay.run())
    finally:
        done.set()
        pumper.join()
        flush()
        closing = {"stopped": replay.stopped, "notes": replay.notes}
        with lock:
            pickle.dump(("done", closing, replay.sent_count), out, protocol=pickle.HIGHEST_PROTOCOL)
            out.flush()


if __name__ == "__main__":
    _child_main()
