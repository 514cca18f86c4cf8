"""Server-sent events framing, apart from any timing.

The load generator timestamps each network read and then hands the bytes to
this parser; the parser only decides where events begin and end. A network
read can end in the middle of a line, or carry several events at once, so the
parser keeps the unfinished tail between reads.

Only the ``data`` field matters for OpenAI-compatible streams: ``event``,
``id`` and ``retry`` are accepted and ignored, and comment lines (``:`` ...,
used as keep-alives) never produce an event.
"""

from __future__ import annotations

# The sentinel payload an OpenAI-compatible stream ends with.
DONE = "[DONE]"


class SSEParser:
    """Incremental parser: ``feed(bytes)`` returns the data payloads completed by those bytes."""

    __slots__ = ("_buffer", "_data", "_skip_lf")

    def __init__(self) -> None:
        # The unfinished last line of the previous read (never holds a "\r").
        self._buffer = b""
        # Data lines of the event being assembled (an event may span several).
        self._data: list[str] = []
        # The previous read ended in "\r": a "\n" opening this one belongs to it.
        self._skip_lf = False

    def feed(self, chunk: bytes) -> list[str]:
        if self._skip_lf and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._skip_lf = False
        buffer = self._buffer + chunk if self._buffer else chunk
        # "\n" is what servers send; "\r\n" and "\r" are legal and normalised.
        if b"\r" in buffer:
            self._skip_lf = buffer.endswith(b"\r")
            buffer = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buffer.split(b"\n")
        self._buffer = lines.pop()
        events: list[str] = []
        for raw in lines:
            if not raw:
                if self._data:
                    events.append("\n".join(self._data))
                    self._data = []
                continue
            if raw[0] == 0x3A:  # ":" comment / keep-alive
                continue
            name, sep, value = raw.partition(b":")
            if name != b"data":
                continue
            if sep and value[:1] == b" ":
                value = value[1:]
            self._data.append(value.decode("utf-8", errors="replace"))
        return events

    def close(self) -> list[str]:
        """Events left when the stream ends without a final blank line."""
        self._skip_lf = False
        events = self.feed(b"\n\n") if (self._buffer or self._data) else []
        self._buffer = b""
        self._data = []
        return events
