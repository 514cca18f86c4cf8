"""The replay process's own conditions: spare connections for bursts, a quiet interpreter, file limits.

Pure helpers of the send loop (:mod:`workers.replay.client`), kept apart so the loop module
holds only the loop.
"""

from __future__ import annotations

import contextlib
import gc
import resource
import sys
from collections.abc import Iterator, Sequence

# A burst is the requests due within this span (the spare connections kept open for it).
BURST_WINDOW_NS = 250_000_000
_SWITCH_INTERVAL_S = 0.0005


def burst_size(planned_ns: Sequence[int], window_ns: int | None = None) -> int:
    """The most requests planned within any ``window_ns`` (default ``BURST_WINDOW_NS``) of a trace."""
    window = BURST_WINDOW_NS if window_ns is None else window_ns
    ordered = sorted(planned_ns)
    most = start = 0
    for end, at in enumerate(ordered):
        while at - ordered[start] >= window:
            start += 1
        most = max(most, end - start + 1)
    return most


@contextlib.contextmanager
def quiet_interpreter() -> Iterator[None]:
    """Keep the interpreter's own pauses out of the send loop while a replay runs.

    - The cyclic garbage collector is off: a collection walks every live record and stalls
      the loop for milliseconds; the replay's objects are freed by reference counting, and
      one collection runs at the end.
    - The GIL switch interval is 0.5 ms instead of 5: a helper thread (the batcher writing
      records) hands the interpreter back to the loop sooner.
    """
    enabled = gc.isenabled()
    interval = sys.getswitchinterval()
    gc.disable()
    sys.setswitchinterval(_SWITCH_INTERVAL_S)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)
        if enabled:
            gc.enable()
            gc.collect()


def raise_fd_limit() -> None:
    # Each open stream holds a socket; an open-loop run at hundreds of req/s
    # can hold thousands when the server is slow.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(
                resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 65536, hard)
            )
