"""Keep a server's process group from outliving the worker that started it.

Run as ``python guard.py --grace 20 -- <server argv...>`` with the worker's end
of a pipe on stdin. The guard is the leader of a fresh process group (the
worker starts it with ``start_new_session``) and runs the server as its child
in that group. It then waits for one of two things:

1. the server exits: the guard cleans up whatever is left of the group and
   exits with the server's status (128 + signal number if it was killed), so
   the worker sees the server's own exit;
2. stdin reaches end-of-file, which happens exactly when every holder of the
   pipe's write end (the worker) has gone, however it died: the guard sends
   SIGTERM to the group, waits ``--grace`` seconds, then SIGKILLs it.

Standard library only, and not imported by the worker: it runs as a script
under any Python, next to any server command.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys
import time

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # If the guard itself is SIGKILLed, the kernel sends the server SIGTERM.
    # The guard is single-threaded, so this pre-exec hook is safe here.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _others_in_group(pgid: int) -> bool:
    """True while a process other than this guard is in the group."""
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        # fields[0] is the state, fields[2] the process group; zombies hold no resources.
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def _terminate_group(pgid: int, grace: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _others_in_group(pgid):
        time.sleep(0.1)
    if _others_in_group(pgid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grace", type=float, default=20.0)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no server command given")

    pgid = os.getpgrp()
    # SIGTERM to the group reaches the guard too: it must outlive the server
    # long enough to report its status, so it only notes the request.
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGINT, lambda *_: None)
    child = subprocess.Popen(command, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
    print(f"[tailtune-guard] server pid {child.pid} in process group {pgid}", file=sys.stderr, flush=True)

    stdin_fd = sys.stdin.fileno()
    watching_parent = True
    while True:
        code = child.poll()
        if code is not None:
            _terminate_group(pgid, min(args.grace, 5.0))
            return code if code >= 0 else 128 - code
        if watching_parent:
            ready, _, _ = select.select([stdin_fd], [], [], 0.2)
            if ready and not os.read(stdin_fd, 4096):
                print("[tailtune-guard] worker gone: stopping the server", file=sys.stderr, flush=True)
                _terminate_group(pgid, args.grace)
                watching_parent = False
        else:
            time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main())
