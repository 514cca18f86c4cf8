"""Run the replay in a process of its own.

The worker that drives a run also writes records to the database and parses
/metrics scrapes: Python work that holds the interpreter lock for tens of
milliseconds at a time. In the same process that shows up as dispatch lag
(measured: p99 73 ms at 1 req/s against the CPU engine), so the send loop
gets its own interpreter and the parent only receives finished records.

Steps of :func:`run_replay_isolated`:

1. Write the requests to a temporary file and start
   ``python -m workers.replay.isolated FILE`` with the replay's keyword
   arguments as JSON on its first stdin line. (A plain subprocess, not
   multiprocessing: Celery's pool processes may not fork children of that kind.)
2. The child prints one JSON line per batch of finished records and a last
   line with its result summary (or an error). It stops early when its stdin
   closes, which is how the parent cancels it, and what happens if the
   parent dies.
3. The parent turns each batch back into records and hands it to
   ``on_batch``; the result's records are exactly those the batches carried.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from typing import Any

from workers.replay.records import RequestRecord
from workers.replay.result import ReplayResult
from workers.replay.run import run_replay


class ReplayProcessError(RuntimeError):
    pass


def run_replay_isolated(
    requests: Sequence[dict[str, Any]],
    *,
    on_batch: Callable[[list[RequestRecord]], None] | None = None,
    stop: threading.Event | None = None,
    **kwargs: Any,
) -> ReplayResult:
    """Same contract as :func:`run_replay` (minus ``on_progress``), in a child process."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(list(requests), fh)
        path = fh.name
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.replay.isolated", path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(kwargs) + "\n")
    proc.stdin.flush()

    def forward_stop() -> None:
        while proc.poll() is None:
            if stop is not None and stop.wait(0.05):
                if proc.stdin is not None:
                    proc.stdin.close()  # the child's signal to stop
                return

    threading.Thread(target=forward_stop, daemon=True).start()
    records: list[RequestRecord] = []
    summary: dict[str, Any] | None = None
    error = ""
    try:
        for line in proc.stdout:
            message = json.loads(line)
            if "batch" in message:
                batch = [RequestRecord.from_json(r) for r in message["batch"]]
                records.extend(batch)
                if on_batch is not None:
                    on_batch(batch)
            elif "result" in message:
                summary = message["result"]
            elif "error" in message:
                error = message["error"]
    finally:
        if proc.poll() is None and stop is not None and stop.is_set():
            proc.wait(timeout=30)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        os.unlink(path)
    if summary is None:
        raise ReplayProcessError(
            error or f"the replay process ended without a result (exit {proc.returncode})"
        )
    return ReplayResult(records=records, **summary)


def _child(path: str) -> int:
    kwargs = json.loads(sys.stdin.readline())
    with open(path) as fh:
        requests = json.load(fh)
    stop = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.read()  # returns at EOF: the parent closed the pipe, or died
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    out = sys.stdout
    lock = threading.Lock()

    def emit(message: dict[str, Any]) -> None:
        with lock:
            out.write(json.dumps(message) + "\n")
            out.flush()

    run = run_replay
    if kwargs.get("rehearsal") is not None:
        from workers.replay.rehearsal import run_rehearsal

        run = run_rehearsal  # type: ignore[assignment]
    try:
        result = run(
            requests,
            on_batch=lambda batch: emit({"batch": [r.to_json() for r in batch]}),
            stop=stop,
            **kwargs,
        )
    except Exception as exc:  # reported to the parent as data, which raises it there
        emit({"error": f"{type(exc).__name__}: {exc}"})
        return 1
    emit({"result": result.summary()})
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1]))
