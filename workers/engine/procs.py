"""Find, signal and reap a server's processes through /proc (Linux), without psutil.

A process is identified by (pid, start time in clock ticks since boot), so a
pid the kernel has reused for some unrelated process is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    pgid: int
    state: str
    start_ticks: int


def proc_info(pid: int) -> ProcInfo | None:
    """Read /proc/<pid>/stat; None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ")".
    fields = stat[stat.rfind(")") + 2 :].split()
    return ProcInfo(
        pid=pid, ppid=int(fields[1]), pgid=int(fields[2]), state=fields[0], start_ticks=int(fields[19])
    )


def all_procs() -> list[ProcInfo]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            info = proc_info(int(entry))
            if info is not None:
                out.append(info)
    return out


def _alive(info: ProcInfo | None) -> bool:
    return info is not None and info.state not in ("Z", "X")


def tree(root: int, procs: list[ProcInfo] | None = None) -> list[ProcInfo]:
    """The live process root and all its descendants."""
    procs = all_procs() if procs is None else procs
    children: dict[int, list[ProcInfo]] = {}
    by_pid = {p.pid: p for p in procs}
    for p in procs:
        children.setdefault(p.ppid, []).append(p)
    out: list[ProcInfo] = []
    stack = [by_pid[root]] if root in by_pid else []
    while stack:
        p = stack.pop()
        if _alive(p):
            out.append(p)
        stack.extend(children.get(p.pid, []))
    return out


def group(pgid: int, procs: list[ProcInfo] | None = None) -> list[ProcInfo]:
    """The live members of a process group."""
    procs = all_procs() if procs is None else procs
    return [p for p in procs if p.pgid == pgid and _alive(p)]


PidRef = int | tuple[int, int] | list[int]


def _matching(ref: PidRef) -> ProcInfo | None:
    if isinstance(ref, int):
        pid, start = ref, None
    else:
        pid, start = int(ref[0]), int(ref[1])
    info = proc_info(pid)
    if not _alive(info):
        return None
    if start is not None and info is not None and info.start_ticks != start:
        return None  # the pid now belongs to someone else
    return info


def alive_pids(pids: Iterable[PidRef]) -> list[int]:
    """Those of the given processes still running (same start time when one is given)."""
    return [info.pid for ref in pids if (info := _matching(ref)) is not None]


def reap_pids(pids: Iterable[PidRef], *, grace_s: float = 10.0) -> list[int]:
    """Stop processes a previous worker recorded: SIGTERM, then SIGKILL after grace_s.

    Each entry is a pid or a [pid, start_ticks] pair (as ``EngineServer.tracked_pids``
    returns; prefer pairs, a bare pid may have been reused). Returns the pids
    that were still running and were signalled.
    """
    refs = list(pids)
    targets = alive_pids(refs)
    for pid in targets:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and alive_pids(refs):
        time.sleep(0.1)
    for pid in alive_pids(refs):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return targets
