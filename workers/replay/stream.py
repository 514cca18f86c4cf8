"""Reading one response stream into its record.

:class:`Tally` turns a stream's bytes, each network read stamped with its arrival time, into
the record's tokens, chunks, gaps and end: SSE frames are parsed and tokens counted from the
server's usage (cumulative ``completion_tokens`` with continuous usage stats), since one frame
can carry several tokens. The transport (:mod:`workers.replay.rawhttp`) feeds it from the
connection's ``data_received``. The helpers below write what went wrong
with a request into its record (the send loop never raises it).

This is the per-chunk hot path of the load generator: keep it free of extra work.
"""

from __future__ import annotations

import time

from workers.replay.frames import frame_parse
from workers.replay.records import RequestRecord
from workers.replay.sse import DONE, SSEParser

perf_ns = time.perf_counter_ns

# Bytes of an error body kept in a record.
ERROR_TEXT_LIMIT = 500


class Tally:
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
                record.error = f"error event in stream: {frame.error[:ERROR_TEXT_LIMIT]}"
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


def is_context_error(text: str) -> bool:
    lowered = text.lower()
    return "context length" in lowered or "maximum context" in lowered or "max_model_len" in lowered


def record_failure(record: RequestRecord, kind: str, exc: BaseException, origin: int) -> None:
    record.error_kind = kind
    record.error = f"{type(exc).__name__}: {exc}"[:ERROR_TEXT_LIMIT]
    record.end_ns = perf_ns() - origin
