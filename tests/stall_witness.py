"""A witness of host stalls that does not share code with what it checks.

When a verdict says "the load generator stalled, so this cannot be judged", a
test may not simply skip: the claim "the machine was too busy" must be shown by
evidence the code under test did not produce. ``StallWitness`` gathers two such
pieces over a block of the test:

- a heartbeat in a process of its own (plain ``time.sleep`` of 5 ms in a loop,
  no asyncio, no tailtune code): the longest it overslept;
- the kernel's own counters: CPU pressure (``/proc/pressure/cpu``, "some":
  time at least one runnable task waited for a CPU) and steal time
  (``/proc/stat``: time the hypervisor gave this VM's CPUs to someone else).

``confirms(ms)`` is true when the heartbeat overslept by at least ``ms``: the
host did not run a ready process for that long, as the load generator claims
of itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

_HEARTBEAT = r"""
import json, sys, time
worst = 0.0
last = time.perf_counter()
sys.stdout.write("ready\n"); sys.stdout.flush()
while True:
    time.sleep(0.005)
    now = time.perf_counter()
    late = (now - last - 0.005) * 1000
    last = now
    if late > worst:
        worst = late
        with open(sys.argv[1], "w") as f:
            json.dump({"max_oversleep_ms": worst}, f)
"""


def _psi_some_us() -> int | None:
    try:
        for line in Path("/proc/pressure/cpu").read_text().splitlines():
            if line.startswith("some "):
                return int(line.rpartition("total=")[2])
    except (OSError, ValueError):
        return None
    return None


def _steal_ticks() -> int | None:
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
        return int(fields[8])
    except (OSError, ValueError, IndexError):
        return None


class StallWitness:
    """``with StallWitness(tmp) as w: ...``; then ``w.facts`` and ``w.confirms(ms)``."""

    def __init__(self, tmp: Path) -> None:
        self._out = tmp / f"heartbeat-{os.getpid()}-{id(self)}.json"
        self.facts: dict[str, Any] = {}

    def __enter__(self) -> StallWitness:
        self._psi = _psi_some_us()
        self._steal = _steal_ticks()
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _HEARTBEAT, str(self._out)], stdout=subprocess.PIPE, text=True
        )
        assert self._proc.stdout is not None and self._proc.stdout.readline().strip() == "ready"
        return self

    def __exit__(self, *exc: object) -> None:
        self._proc.kill()
        self._proc.wait()
        psi, steal = _psi_some_us(), _steal_ticks()
        try:
            beat = json.loads(self._out.read_text())
        except (OSError, ValueError):
            beat = {}
        tick = os.sysconf("SC_CLK_TCK")
        self.facts = {
            "heartbeat_max_oversleep_ms": round(float(beat.get("max_oversleep_ms", 0.0)), 1),
            "cpu_pressure_some_ms": None
            if psi is None or self._psi is None
            else round((psi - self._psi) / 1000),
            "steal_ms": None
            if steal is None or self._steal is None
            else round((steal - self._steal) * 1000 / tick),
        }

    def confirms(self, ms: float) -> bool:
        return float(self.facts.get("heartbeat_max_oversleep_ms") or 0.0) >= ms
