"""Finished records handed to the caller from a thread of their own.

The send loop only appends finished records to a deque; :class:`Batcher` drains it every
``interval_s`` and calls ``on_batch`` (and ``on_progress``), so a slow database write never
stalls the loop. If a callback raises, the run is stopped and the error is kept for the caller.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

from workers.replay.records import RequestRecord

BatchCallback = Callable[[list[RequestRecord]], None]
ProgressCallback = Callable[[int, int], None]


class Batcher:
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
