"""The replay process's own conditions: spare connections for bursts, a quiet interpreter, file
limits, and the scheduling class of a send-loop process.

Pure helpers of the send loop (:mod:`workers.replay.client`), kept apart so the loop module
holds only the loop.
"""

from __future__ import annotations

import contextlib
import gc
import os
import resource
import sys
from collections.abc import Iterator, Sequence

# A burst is the requests due within this span (the spare connections kept open for it).
BURST_WINDOW_NS = 250_000_000
_SWITCH_INTERVAL_S = 0.0005
# Set to 0 on a host where the send loop must stay in the normal scheduling class.
REALTIME_ENV = "TAILTUNE_REPLAY_REALTIME"


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


def realtime_send_loop() -> str:
    """Put this process in the real-time class (SCHED_FIFO, the lowest priority); what it got.

    Why: on a host whose cores the engine saturates, the kernel has been measured to leave a
    normal-class thread waiting seconds for a core, nice -15 included, while a SCHED_FIFO one
    never waited more than a few ms (bench/results/send_priority.md). A send loop that waits
    sends late, and the run is invalid for it. The loop sleeps between sends and uses a small
    part of a core, and by default (``kernel.sched_rt_runtime_us``) the kernel keeps 5% of each
    second for the normal class whatever real-time threads do.

    Call it before the process starts any thread: threads inherit the class of the thread that
    creates them, so the loop and its batcher (which can hold the interpreter lock) share it.
    Returns ``"realtime"``, or ``"normal"`` with why (not permitted: the worker is not root and
    has neither CAP_SYS_NICE nor an RLIMIT_RTPRIO of at least 1, which docker-compose.yml gives
    its non-root worker; or turned off with ``TAILTUNE_REPLAY_REALTIME=0``).
    """
    if os.environ.get(REALTIME_ENV, "1") == "0":
        return f"normal ({REALTIME_ENV}=0)"
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(os.sched_get_priority_min(os.SCHED_FIFO)))
    except (AttributeError, OSError) as exc:
        return f"normal (real-time scheduling refused: {exc.strerror if isinstance(exc, OSError) else exc})"
    return "realtime"
